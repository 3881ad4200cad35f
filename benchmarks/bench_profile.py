"""Where a training step's time goes: one profiled step of `ds-longctx`'s engine, GPU time by
category.

    torchrun --nproc_per_node 2 benchmarks/bench_profile.py --label base --seq_len 131072 \\
        --model qwen3-8b --sp_size 2 [--key value ...]  [--out DIR]

Runs `--steps` steps (default 3) of the engine on synthetic rows, profiles the last one with
torch.profiler (CPU + CUDA activities, rank 0), and sorts every GPU kernel's time into:
    attn_fwd, attn_recompute, attn_bwd      attention kernels (FA4, cuDNN, flash, efficient);
                                            forward kernels past the first one per layer are the
                                            checkpoint recompute
    matmul                                  cuBLAS / CUTLASS GEMMs outside attention
    all_to_all                              the Ulysses exchange (NCCL AllToAll / SendRecv)
    zero_gather, zero_reduce                ZeRO-3 parameter all-gathers, gradient reduce-scatters /
                                            all-reduces
    memcpy_h2d, memcpy_d2h, memcpy_d2d      copies: checkpoint / cache offload and back, staging
    loss                                    kernels launched under the loss head's range (chunked
                                            lm_head + CE)
    optimizer                               kernels launched under the optimizer step's range
    other                                   norms, rotary, SwiGLU, residual adds, casts, the rest
and reports idle = the step's wall time minus the union of kernel intervals on the GPU. Each kernel
is counted once (device-side events); the loss and optimizer ranges are the engine's
`record_function`s (`ds_longctx.loss`, `ds_longctx.optimizer`). Writes
`<out>/profile_<label>_<seq_len>.json` (the table, the top 30 kernels, the run config) and prints
the table. Any further `--key value` goes to the run config (`--attn_backend fa4
--attention_cache_layers all`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

from harness import git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs

ATTN_HINTS = ("flash", "fmha", "sdpa", "attention", "cudnn_generated")
CATEGORIES = (
    "attn_fwd",
    "attn_recompute",
    "attn_bwd",
    "matmul",
    "all_to_all",
    "zero_gather",
    "zero_reduce",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "loss",
    "optimizer",
    "other",
)


def classify(name: str) -> str:
    """The category of one GPU kernel by its name (loss, optimizer and the recompute split come from
    `table`)."""
    low = name.lower()
    if low.startswith("memcpy"):
        return "memcpy_h2d" if "htod" in low else "memcpy_d2h" if "dtoh" in low else "memcpy_d2d"
    if "nccl" in low:
        if "alltoall" in low or "sendrecv" in low:
            return "all_to_all"
        if "allgather" in low:
            return "zero_gather"
        return "zero_reduce"
    if any(h in low for h in ATTN_HINTS) and "gemm" not in low:
        backward = any(b in low for b in ("bwd", "backward", "bprop", "dq", "dkdv", "dot_do_o"))
        return "attn_bwd" if backward else "attn_fwd"
    if any(g in low for g in ("gemm", "nvjet", "xmma", "cutlass", "cublas")):
        return "matmul"
    return "other"


def union_ms(intervals: list) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1000.0


def table(prof, wall_s: float, num_layers: int) -> dict:
    """{category: ms} + idle + the top kernels, from one profiled step.

    Every kernel is counted once, from the device-side events (name, interval). Attention forward
    kernels in time order: the first `num_layers` are the forward, the rest the checkpoint
    recompute. Loss and optimizer kernels are those launched by a CPU op inside the engine's
    `ds_longctx.loss` / `ds_longctx.optimizer` ranges (matched by kernel name and duration to the
    device events). Busy time is the union of the kernels' intervals."""
    from torch.autograd import DeviceType

    events = prof.events()
    device = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in events
        if ev.device_type == DeviceType.CUDA
    )
    # (kernel name, duration us) -> "loss" | "optimizer", from the CPU ops that launched them
    tagged: dict = {}
    for ev in events:
        if ev.device_type == DeviceType.CUDA or not ev.kernels:
            continue
        tag, node = None, ev
        while node is not None and tag is None:
            if node.name in ("ds_longctx.loss", "ds_longctx.optimizer"):
                tag = node.name.split(".", 1)[1]
            node = node.cpu_parent
        if tag is not None:
            for k in ev.kernels:
                tagged.setdefault((k.name, round(k.duration)), tag)
    by_cat = {c: 0.0 for c in CATEGORIES}
    kernels: dict = {}
    attn_forwards = 0
    for start, end, name in device:
        ms = (end - start) / 1000.0
        cat = tagged.get((name, round(end - start))) or classify(name)
        if cat == "attn_fwd":
            attn_forwards += 1
            if attn_forwards > num_layers:
                cat = "attn_recompute"
        by_cat[cat] += ms
        kernels[name] = kernels.get(name, 0.0) + ms
    busy = union_ms([(a, b) for a, b, _ in device])
    out = {c: round(v, 1) for c, v in by_cat.items()}
    out["gpu_busy_ms"] = round(busy, 1)
    out["wall_ms"] = round(wall_s * 1000, 1)
    out["idle_ms"] = round(wall_s * 1000 - busy, 1)
    out["attention_forward_kernels"] = attn_forwards
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:30]
    return {"ms": out, "top_kernels": [[n[:160], round(v, 1)] for n, v in top]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument(
        "--commit", default=None, help="the tree's commit (a device copy can carry a stale .git)"
    )
    a, rest = ap.parse_known_args()

    import logging

    logging.basicConfig(
        level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
        format="[ds_longctx] %(message)s",
    )
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from ds_longctx.config import RunConfig
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.run.engine import build_engine

    cfg = RunConfig.from_cli(["--steps", str(a.steps), *rest])
    eng = build_engine(cfg)
    st = eng.state
    data = SyntheticRetrieval(cfg.train.seq_len, eng.model.config.vocab_size, seed=0)
    rows = []
    cuda = torch.cuda.is_available()  # CPU runs only check the script (no GPU kernels to sort)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for step in range(a.steps):
        last = step == a.steps - 1
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        prof = profile(activities=activities) if last and st.rank == 0 else None
        if prof is not None:
            prof.__enter__()
        t0 = time.perf_counter()
        res = eng.train_step([data.get(step, 1, st.dp_rank, st.dp_size)])
        sync()
        sec = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
        peak = torch.tensor(
            [torch.cuda.max_memory_reserved() if cuda else 0],
            dtype=torch.float64,
            device=eng.device,
        )
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        rows.append(
            {
                "step": step + 1,
                "seconds": round(sec, 3),
                "loss": res.loss,
                "peak_reserved_gib": round(peak.item() / 2**30, 2),
            }
        )
        if st.rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if st.rank == 0:
        try:
            result = table(prof, rows[-1]["seconds"], len(eng.layers))
        except Exception as e:  # keep the step times even if the profile cannot be read
            result = {
                "ms": {c: 0.0 for c in (*CATEGORIES, "gpu_busy_ms", "idle_ms")},
                "top_kernels": [],
                "profile_error": f"{type(e).__name__}: {e}",
            }
        commit = git_commit(a.commit)
        record = {
            "label": a.label,
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "gpus": st.world_size,
            "torch": torch.__version__,
            "placement": eng.placement.spec(),
            "steps": rows,
            **result,
            "config": cfg.flat(),
        }
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"profile_{a.label}_{cfg.train.seq_len}.json").write_text(
            json.dumps(record, indent=1) + "\n"
        )
        ms = result["ms"]
        print(
            f"profile {a.label} @ {cfg.train.seq_len:,} tokens, step {a.steps}: "
            f"{rows[-1]['seconds']:.2f} s"
        )
        for c in (*CATEGORIES, "gpu_busy_ms", "idle_ms"):
            print(f"  {c:<16}{(ms[c] or 0) / 1000:>9.2f} s")
        if "profile_error" in result:
            print("profile not read:", result["profile_error"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
