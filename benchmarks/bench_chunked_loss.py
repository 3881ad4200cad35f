"""Benchmark (a): the loss alone at Qwen3-8B's V=151,936, H=4096, bf16 -- peak memory and time of
chunked vs plain cross-entropy vs DeepSpeed's TiledFusedLogitsLoss vs Liger's fused linear CE, one
run.

    python benchmarks/bench_chunked_loss.py  # N = 8192, 32768, 131072; < 4 min on one H200
    python benchmarks/bench_chunked_loss.py --n 8192 --reps 2      # a quick look

CUDA only. Writes chunked_loss.json and chunked_loss.md to --out (default $OUT, else
benchmarks/results/sessions/<date>).

Per N and method: forward+backward time (median of --reps after --warmup, CUDA events), peak memory
over the baseline (max_memory_allocated after reset_peak_memory_stats, minus what was allocated
before: the inputs), and relative errors ||a - b|| / ||b|| of loss, dL/dhidden, dL/dweight against
an fp32 reference fed the same bf16 inputs: plain fp32 cross-entropy where it fits, else our chunked
path in fp32 (which tests/levers/test_chunked_loss.py holds to 1e-6 of plain). The peak includes the
bf16 gradients every method returns (N x H x 2 + V x H x 2 bytes). At the smallest N each method is
also run with loss * 0.5 to check that both gradients halve ("grad_output ok").
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import statistics
import sys
from pathlib import Path

from harness import raw_dir  # benchmarks/ is sys.path[0] when this file runs

from ds_longctx.parallel.units import IGNORE_INDEX as IGNORE

GIB = 2**30


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--n", type=int, nargs="+", default=[8192, 32768, 131072], help="rows (tokens) to sweep"
    )
    p.add_argument("--vocab", type=int, default=151936, help="V (Qwen3: 151936)")
    p.add_argument("--hidden", type=int, default=4096, help="H (Qwen3-8B: 4096)")
    p.add_argument(
        "--chunk-sizes", type=int, nargs="+", default=[4096, 8192], help="ours: rows per chunk"
    )
    p.add_argument("--ds-chunk", type=int, default=4096, help="DeepSpeed: shards = ceil(N / this)")
    p.add_argument(
        "--methods",
        default="plain,chunked,deepspeed,liger",
        help="comma list from plain, chunked, deepspeed, liger",
    )
    p.add_argument("--ignore-frac", type=float, default=0.05, help="fraction of labels set to -100")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        default=raw_dir(),
        help="output directory (default: $OUT, else benchmarks/results/sessions/<date>)",
    )
    return p.parse_args(argv)


def build_methods(args, torch, F):
    """name -> (loss_fn(hidden [N, H], weight [V, H], labels [N]) -> 0-dim sum, note, chunk rows or
    None)."""
    from ds_longctx.levers.chunked_loss import chunked_cross_entropy, plain_cross_entropy

    wanted = set(args.methods.split(","))
    methods = {}
    if "plain" in wanted:
        methods["plain"] = (plain_cross_entropy, "F.linear + F.cross_entropy(fp32 logits)", None)
    if "chunked" in wanted:
        for c in args.chunk_sizes:
            methods[f"chunked c={c}"] = (
                lambda h, w, y, c=c: chunked_cross_entropy(h, w, y, chunk_size=c),
                "ds_longctx.levers.chunked_loss",
                c,
            )
    if "deepspeed" in wanted:
        try:
            from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss
        except Exception as e:  # noqa: BLE001 -- report any import failure as a row
            methods["deepspeed tiled"] = (None, f"import failed: {type(e).__name__}: {e}", None)
        else:

            def ds_loss(h, w, y):
                # its API: apply(fn, self, x [b, s, H], y [b, s], mask, shards, compute_params,
                # reduction); it writes weight.grad during forward and returns only the hidden
                # gradient from backward
                lm_head = torch.nn.Module()
                lm_head.weight = w

                def fn(m, xs, ys):
                    return F.cross_entropy(
                        F.linear(xs, m.weight).float(), ys, ignore_index=IGNORE, reduction="sum"
                    )

                shards = math.ceil(h.shape[0] / args.ds_chunk)
                return TiledFusedLogitsLoss.apply(
                    fn, lm_head, h.unsqueeze(0), y.unsqueeze(0), None, shards, [w], "sum"
                )  # [N, H] -> [1, N, H], [N] -> [1, N]

            methods["deepspeed tiled"] = (
                ds_loss,
                f"TiledFusedLogitsLoss, shards=ceil(N/{args.ds_chunk})",
                args.ds_chunk,
            )
    if "liger" in wanted:
        try:
            from liger_kernel.transformers.fused_linear_cross_entropy import (
                LigerFusedLinearCrossEntropyLoss,
            )
        except Exception as e:  # noqa: BLE001
            methods["liger"] = (
                None,
                f"not importable ({type(e).__name__}: {e}); pip install liger-kernel",
                None,
            )
        else:
            variants = {"liger": {}, "liger fp32-accum": {"accum_dtype": torch.float32}}
            for name, extra in variants.items():
                try:
                    mod = LigerFusedLinearCrossEntropyLoss(
                        ignore_index=IGNORE, reduction="sum", **extra
                    )
                except TypeError as e:  # older Liger: no accum_dtype
                    methods[name] = (None, f"unsupported by this Liger: {e}", None)
                    continue

                def liger_loss(h, w, y, mod=mod):
                    out = mod(w, h, y)
                    return (
                        out if isinstance(out, torch.Tensor) else out[0]
                    )  # newer Liger may return a tuple

                methods[name] = (liger_loss, f"LigerFusedLinearCrossEntropyLoss{extra or ''}", None)
    return methods


def rel_err(torch, got, ref_cpu, rows=16384):
    """||got - ref|| / ||ref||, with ref kept on the host and brought over ``rows`` rows at a
    time."""
    if not isinstance(got, torch.Tensor):
        return float("nan")
    diff2 = ref2 = 0.0
    for s in range(0, ref_cpu.shape[0], rows):
        r = ref_cpu[s : s + rows].to(got.device)
        diff2 += (got[s : s + rows].float() - r).square().sum().item()
        ref2 += r.square().sum().item()
    return math.sqrt(diff2 / ref2) if ref2 > 0 else math.sqrt(diff2)


def step(torch, fn, hidden, weight, labels, scale=1.0):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, labels)
    (loss * scale if scale != 1.0 else loss).backward()
    return loss.detach()


def reference(torch, F, hidden, weight, labels):
    """fp32 loss and gradients (on the host) from the same bf16 inputs; plain where it fits."""
    from ds_longctx.levers.chunked_loss import chunked_cross_entropy, plain_cross_entropy

    h32 = hidden.detach().float().requires_grad_()
    w32 = weight.detach().float().requires_grad_()
    n, v = hidden.shape[0], weight.shape[0]
    free = torch.cuda.mem_get_info()[0]
    kind, fn = (
        ("plain fp32", plain_cross_entropy)
        if 4 * n * v * 4 < 0.9 * free
        else ("chunked fp32", lambda h, w, y: chunked_cross_entropy(h, w, y, chunk_size=4096))
    )
    loss = fn(h32, w32, labels)
    loss.backward()
    out = (loss.item(), h32.grad.cpu(), w32.grad.cpu(), kind)
    del h32, w32, loss
    gc.collect()
    torch.cuda.empty_cache()
    return out


def measure(torch, fn, hidden, weight, labels, ref, args, check_scale):
    """One method at one N: time, peak over baseline, errors vs ref. Raises OutOfMemoryError."""
    for _ in range(args.warmup):
        step(torch, fn, hidden, weight, labels)
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = step(torch, fn, hidden, weight, labels)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    row = {
        "peak_gib": peak / GIB,
        "loss_rel_err": abs(loss.item() - ref[0]) / abs(ref[0]),
        "hidden_grad_rel_err": rel_err(torch, hidden.grad, ref[1]),
        "weight_grad_rel_err": rel_err(torch, weight.grad, ref[2]),
    }
    if check_scale:  # both gradients must halve with loss * 0.5 (0.5 is exact in bf16)
        gh, gw = hidden.grad.clone(), weight.grad.clone()
        step(torch, fn, hidden, weight, labels, scale=0.5)
        row["grad_output_ok"] = bool(
            torch.allclose(hidden.grad.float() * 2, gh.float(), rtol=1e-2, atol=1e-6)
            and torch.allclose(weight.grad.float() * 2, gw.float(), rtol=1e-2, atol=1e-6)
        )
        del gh, gw
    times = []
    for _ in range(args.reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(torch, fn, hidden, weight, labels)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    row["time_ms"] = statistics.median(times)
    return row


def fmt(x, spec):
    if isinstance(x, str):
        return x
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def write_results(out_dir, meta, rows):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "chunked_loss.json").write_text(json.dumps({**meta, "results": rows}, indent=2))
    lines = [
        f"# Chunked loss: loss alone, V={meta['V']}, H={meta['H']}, bf16",
        "",
        f"{meta['date']} -- {meta['device']} -- torch {meta['torch']}, deepspeed "
        f"{meta['deepspeed']}, liger {meta['liger']}",
        "",
        f"`{meta['command']}`",
        "",
        f"Median of {meta['reps']} fwd+bwd after {meta['warmup']} warm-up; "
        f"{meta['ignore_frac']:.0%} labels "
        "ignored. Peak is over the inputs and includes the returned bf16 gradients. Errors are "
        "||a-b||/||b|| vs the fp32 reference named in the last column. Predicted (ours): "
        "N*H*2 + V*H*4 + 6*c*V bytes.",
        "",
        "| N | method | time ms | peak GiB | predicted GiB | loss err | dhidden err | dweight err "
        "| grad_output ok | reference / note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = r.get("grad_output_ok")
        lines.append(
            f"| {r['N']} | {r['method']} | {fmt(r.get('time_ms'), '.1f')} | "
            f"{fmt(r.get('peak_gib'), '.2f')} "
            f"| {fmt(r.get('predicted_gib'), '.2f')} | {fmt(r.get('loss_rel_err'), '.1e')} "
            f"| {fmt(r.get('hidden_grad_rel_err'), '.1e')} | "
            f"{fmt(r.get('weight_grad_rel_err'), '.1e')} "
            f"| {'-' if ok is None else ('yes' if ok else '**no**')} | "
            f"{r.get('status') or r['reference']} |"
        )
    (out_dir / "chunked_loss.md").write_text("\n".join(lines) + "\n")
    return out_dir


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        sys.exit(
            "bench_chunked_loss.py measures CUDA memory and time and needs a GPU; none is visible "
            "(torch.cuda.is_available() is False). The CPU numerics are in "
            "tests/levers/test_chunked_loss.py."
        )
    torch.set_float32_matmul_precision("highest")  # the fp32 reference must not use TF32
    try:
        import deepspeed

        ds_version = deepspeed.__version__
    except Exception:  # noqa: BLE001
        ds_version = "not importable"
    try:
        import importlib.metadata

        liger_version = importlib.metadata.version("liger-kernel")
    except Exception:  # noqa: BLE001
        liger_version = "not installed"
    dev = torch.device("cuda")
    methods = build_methods(args, torch, F)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv),
        "torch": torch.__version__,
        "deepspeed": ds_version,
        "liger": liger_version,
        "device": torch.cuda.get_device_name(),
        "V": args.vocab,
        "H": args.hidden,
        "dtype": "bfloat16",
        "ignore_frac": args.ignore_frac,
        "warmup": args.warmup,
        "reps": args.reps,
    }
    rows = []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    weight = torch.nn.Parameter(
        (
            torch.randn(args.vocab, args.hidden, device=dev, generator=gen)
            * (2.5 / args.hidden**0.5)
        ).bfloat16()
    )  # logits of std ~2.5
    for n in sorted(args.n):
        hidden = torch.randn(n, args.hidden, device=dev, generator=gen).bfloat16().requires_grad_()
        labels = torch.randint(0, args.vocab, (n,), device=dev, generator=gen)
        labels[torch.rand(n, device=dev, generator=gen) < args.ignore_frac] = IGNORE
        ref = reference(torch, F, hidden, weight, labels)
        print(f"N={n}: reference {ref[3]}, loss {ref[0]:.6g}", flush=True)
        for name, (fn, note, chunk) in methods.items():
            row = {"N": n, "method": name, "note": note, "reference": ref[3], "status": None}
            if name.startswith("chunked"):
                row["predicted_gib"] = (
                    n * args.hidden * 2 + args.vocab * args.hidden * 4 + 6 * chunk * args.vocab
                ) / GIB
            if fn is None:
                row["status"] = note
            else:
                try:
                    row.update(
                        measure(
                            torch,
                            fn,
                            hidden,
                            weight,
                            labels,
                            ref,
                            args,
                            check_scale=n == min(args.n),
                        )
                    )
                except torch.cuda.OutOfMemoryError:
                    row["status"] = "OOM"
            hidden.grad = weight.grad = None
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(row)
            print(
                f"  {name:18s} "
                + ", ".join(
                    f"{k}={fmt(v, '.3g') if isinstance(v, float) else v}"
                    for k, v in row.items()
                    if k not in ("N", "method", "note")
                ),
                flush=True,
            )
        del hidden, labels, ref
        gc.collect()
        torch.cuda.empty_cache()
    out = write_results(args.out, meta, rows)
    print(f"wrote {out / 'chunked_loss.json'} and {out / 'chunked_loss.md'}")


if __name__ == "__main__":
    main()
