"""Attention kernels at Ulysses shapes: forward and backward TFLOP/s of each backend's kernel pair
(one GPU).

    python benchmarks/bench_attention.py --seq_lens 131072,524288 --heads 16 --kv_heads 4 --out $OUT

Shapes: what one GPU runs for Qwen3-8B under SP=2 (32 q / 8 kv heads split over 2 ranks: 16 / 4),
head_dim 128, causal, bf16, one sequence of S tokens. FLOPs: causal forward 2·S²·h·d (half of
4·S²·h·d), backward 2.5× that. Backends: cuDNN SDPA (`F.scaled_dot_product_attention` pinned to
cuDNN, `enable_gqa`) and FlashAttention 4 (the kernel pair parallel/attention.py runs), each timed
with CUDA events (median of `--reps` after a warm-up), forward alone and backward alone (backward
from saved forward outputs). The outputs are compared with each other (max |diff|, bf16). Appends
one JSON line per (backend, S) to `<out>/attention_<date>.jsonl` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from harness import git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def timed(fn, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` calls (cuda events), after one warm-up call."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def at_length(S: int, h: int, hk: int, d: int, reps: int) -> list:
    """One row per backend at sequence length S: forward and backward ms (and, with both backends,
    their outputs' largest difference)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ds_longctx.parallel import attention

    rows = []
    g = torch.Generator(device="cuda").manual_seed(S)
    q = torch.randn(1, h, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, hk, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, hk, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(1, S, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = d**-0.5
    outs = {}

    # cuDNN SDPA through torch's own autograd (what `sdpa` runs without the cache)
    qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):

        def cudnn_fwd():
            return F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
            )

        fwd_ms = timed(cudnn_fwd, reps)
        out = cudnn_fwd()
        bwd_ms = timed(
            lambda: torch.autograd.grad(out, (qs, ks, vs), dout.transpose(1, 2), retain_graph=True),
            reps,
        )
    outs["sdpa_cudnn"] = out.transpose(1, 2).detach()
    rows.append({"backend": "sdpa_cudnn", "seq_len": S, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms})
    del out
    torch.cuda.empty_cache()

    if attention.fa4_available():
        pair = attention._FA4()
        out, saved, meta = pair.fwd(q, k, v, scale, None, None)
        fwd_ms = timed(lambda: pair.fwd(q, k, v, scale, None, None), reps)
        bwd_ms = timed(lambda: pair.bwd(dout, q, k, v, out, saved, meta, scale, None, None), reps)
        outs["fa4"] = pair.out_bshd(out).detach()
        rows.append({"backend": "fa4", "seq_len": S, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms})
        del out, saved
    if len(outs) == 2:
        diff = (outs["fa4"].float() - outs["sdpa_cudnn"].float()).abs().max().item()
        for r in rows:
            r["max_abs_diff_vs_other"] = diff
    del q, k, v, dout, outs
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq_lens", default="131072,524288")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument(
        "--commit", default=None, help="the tree's commit (a device copy can carry a stale .git)"
    )
    a = ap.parse_args()

    import torch

    h, hk, d = a.heads, a.kv_heads, a.head_dim
    commit = git_commit(a.commit)
    rows = [
        r for S in (int(x) for x in a.seq_lens.split(",")) for r in at_length(S, h, hk, d, a.reps)
    ]
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "heads": h,
        "kv_heads": hk,
        "head_dim": d,
        "dtype": "bf16",
        "causal": True,
    }
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"attention_{meta['date']}.jsonl"
    lines = [
        f"{'backend':<12}{'seq_len':>10}{'fwd ms':>10}"
        f"{'fwd TF/s':>10}{'bwd ms':>10}{'bwd TF/s':>10}"
    ]
    with path.open("a") as f:
        for r in rows:
            S = r["seq_len"]
            r["fwd_tflops"] = round(tflops(2.0 * S * S * h * d, r["fwd_ms"]), 1)
            r["bwd_tflops"] = round(tflops(5.0 * S * S * h * d, r["bwd_ms"]), 1)
            f.write(json.dumps({**meta, **r}) + "\n")
            lines.append(
                f"{r['backend']:<12}{S:>10,}{r['fwd_ms']:>10.1f}{r['fwd_tflops']:>10.1f}{r['bwd_ms']:>10.1f}"
                f"{r['bwd_tflops']:>10.1f}"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
