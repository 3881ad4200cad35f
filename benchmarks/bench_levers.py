"""Step time and peak memory of one model/length with each memory lever on and off, one engine
build.

    torchrun --nproc_per_node 2 benchmarks/bench_levers.py --model qwen3-8b --seq_len 131072 \\
        --sp_size 2 --variants base,offload,tiled,offload+tiled --steps 2 --out $OUT

The engine is built once (checkpointing on, chunked loss on, DeepSpeed checkpointing configured for
CPU offload with 0 layers routed); each variant then toggles levers in place (offload = route all
layers through DeepSpeed's offloading checkpoint, tiled = tiled MLP, layer = tiled layer
(levers/tiled_layer.py: the whole layer's token-wise work in tiles), cache = the attention cache on
every layer (attention_cache.py), plain_loss = unchunked CE, run last since it may OOM). Per variant
and step: seconds, peak reserved/allocated GPU bytes (max over ranks), host RSS, loss, MFU, and the
planner's predicted per-GPU peak for the same levers. One JSON line per step in
`<out>/levers_<model>_<seq_len>.jsonl`, and a markdown table printed and written beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import time
from pathlib import Path

from harness import git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs

# As train.py: the planner models reserved memory under expandable segments (the entry point's
# setting).
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s, vendor datasheet (SXM); MFU is against this


def model_flops(geom, seq_len: int) -> float:
    """Training FLOPs of one sequence, no recompute: 6·N·T for every matmul weight (embedding lookup
    excluded) plus causal attention 6·S²·h·d per layer (fwd 2·S²·h·d, bwd twice that)."""
    n_matmul = geom.layers * geom.layer_params + geom.vocab * geom.hidden
    return 6 * n_matmul * seq_len + 6 * seq_len**2 * geom.heads * geom.head_dim * geom.layers


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--seq_len", type=int, default=131072)
    ap.add_argument("--sp_size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1, help="measured steps per variant")
    ap.add_argument(
        "--first_steps",
        type=int,
        default=2,
        help="steps of the first variant (its first step "
        "allocates the optimizer state, so its peak is not a steady-state peak)",
    )
    ap.add_argument("--variants", default="base,offload,tiled,offload+tiled")
    ap.add_argument("--loss_chunk_rows", type=int, default=4096)
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument(
        "--commit", default=None, help="the tree's commit (a device copy can carry a stale .git)"
    )
    a = ap.parse_args()
    for v in a.variants.split(","):
        if {"cache", "offload"} <= set(v.split("+")):
            ap.error(
                f"variant {v!r}: offload routes every layer through DeepSpeed's checkpoint here, "
                f"which leaves no layer for the attention cache; run them as separate variants"
            )
    return a


def set_variant(eng, geom, variant: str, loss_chunk_rows: int, retrace: bool):
    """Turn the built engine's levers to `variant` in place; the planner's Levers for the same
    choice."""
    import torch

    from ds_longctx.levers.offload import activation_checkpointing_block
    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.levers.placement_apply import apply_placement, decoder_layers, remove_placement
    from ds_longctx.levers.tiled_layer import apply_tiled_layer, remove_tiled_layer
    from ds_longctx.levers.tiled_mlp import apply_tiled_mlp, remove_tiled_mlp
    from ds_longctx.plan.planner import Levers

    model, parts = eng.model, set(variant.split("+"))
    n_layers = len(decoder_layers(model))
    remove_placement(model)
    remove_tiled_layer(model)  # before the tiled MLP's: it restores the MLP forward it replaced
    remove_tiled_mlp(model)
    eng.module.loss.chunked = "plain_loss" not in parts
    if "tiled" in parts:
        apply_tiled_mlp(model, geom.hidden)
    if "layer" in parts:
        apply_tiled_layer(model, geom.hidden)
    placement = PlacementPlan.from_counts(
        n_layers,
        offload=n_layers if "offload" in parts else 0,
        cache=n_layers if "cache" in parts else 0,
    )
    # the engine was built with nothing offloaded: offloaded variants get cpu_checkpointing on here
    ds_config = {
        **eng.ds_config,
        "activation_checkpointing": activation_checkpointing_block(True, torch.cuda.is_available()),
    }
    apply_placement(model, placement, ds_config)
    # the layers' code changed: ZeRO-3's recorded fetch order (and its prefetches) no longer match
    # it; a tiled MLP / layer refuses params DeepSpeed is still prefetching, so the trace is
    # recorded afresh
    coordinator = getattr(
        getattr(eng.ds.optimizer, "parameter_offload", None), "get_param_coordinator", None
    )
    if retrace and coordinator is not None and not coordinator().is_invalid_trace():
        coordinator()._invalidate_trace()
    return Levers(
        chunked_loss="plain_loss" not in parts,
        loss_chunk_rows=loss_chunk_rows,
        tiled_mlp="tiled" in parts or "layer" in parts,
        tiled_layer="layer" in parts,
        tile_tokens=geom.hidden,
        placement=placement,
    )


def measure_step(eng, batch) -> dict:
    """One training step, timed (cuda-synchronized), with its peaks: GPU reserved/allocated and RSS
    (max over ranks), the job's host peak (every rank's ru_maxrss, summed) and the machine's used
    memory."""
    import psutil
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    try:
        res, err = eng.train_step(batch), None
    except torch.OutOfMemoryError as e:
        res, err = None, f"OOM: {str(e)[:120]}"
    if cuda:
        torch.cuda.synchronize()
    sec = time.perf_counter() - t
    m = torch.tensor(
        [
            torch.cuda.max_memory_reserved() if cuda else 0,
            torch.cuda.max_memory_allocated() if cuda else 0,
            psutil.Process().memory_info().rss,
        ],
        dtype=torch.float64,
        device=eng.device,
    )
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    # Host peak of the job: every rank's peak RSS (ru_maxrss, KiB on Linux), summed over the node.
    hp = torch.tensor(
        [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0],
        dtype=torch.float64,
        device=eng.device,
    )
    dist.all_reduce(hp, op=dist.ReduceOp.SUM)
    host = torch.tensor([psutil.virtual_memory().used], dtype=torch.float64, device=eng.device)
    return {
        "seconds": sec,
        "loss": res.loss if res else None,
        "error": err,
        "peak_reserved_gib": round(m[0].item() / 2**30, 2),
        "peak_allocated_gib": round(m[1].item() / 2**30, 2),
        "max_rank_rss_gib": round(m[2].item() / 2**30, 2),
        "host_used_gib": round(host.item() / 2**30, 1),
        "host_peak_rss_sum_gib": round(hp.item() / 2**30, 2),
    }


def levers_table(rows: list) -> str:
    """Markdown: each variant's last step."""
    last = {r["variant"]: r for r in rows}
    lines = [
        "| variant | s/step | MFU | peak reserved GiB | predicted GiB | max rank RSS GiB | loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for v, r in last.items():
        lines.append(
            f"| {v} | {r['seconds']} | {r['mfu']} | {r['peak_reserved_gib']} | "
            f"{r['predicted_gpu_gib']} | {r['max_rank_rss_gib']} | {r['error'] or r['loss']} |"
        )
    return "\n".join(lines)


def main():
    a = parse_args()
    import logging

    logging.basicConfig(
        level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
        format="%(message)s",
    )  # the engine's build stages (time, host RSS, GPU memory)

    import torch
    import torch.distributed as dist

    from ds_longctx.config import RunConfig
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.plan.planner import ModelGeometry, plan_memory
    from ds_longctx.run.engine import build_engine

    cfg = RunConfig(
        model=a.model,
        seq_len=a.seq_len,
        sp_size=a.sp_size,
        steps=a.steps,
        lr=1e-5,
        activation_checkpointing=True,
        offload_layers=0,
        chunked_loss=True,
        loss_chunk_rows=a.loss_chunk_rows,
        tiled_mlp=False,
    )
    t0 = time.perf_counter()
    eng = build_engine(cfg)
    build_s = time.perf_counter() - t0
    st = eng.state
    geom = ModelGeometry.from_name_or_path(a.model)
    data = SyntheticRetrieval(a.seq_len, eng.model.config.vocab_size, seed=0)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"levers_{a.model}_{a.seq_len}.jsonl"
    cuda = torch.cuda.is_available()
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(a.commit),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "gpus": st.world_size,
        "torch": torch.__version__,
        "build_seconds": round(build_s, 1),
    }
    flops = model_flops(geom, a.seq_len) * st.dp_size
    rows, step_no = [], 0
    for vi, variant in enumerate(a.variants.split(",")):
        levers = set_variant(eng, geom, variant, a.loss_chunk_rows, retrace=vi > 0)
        plan = plan_memory(geom, a.seq_len, st.world_size, a.sp_size, levers)
        for i in range(a.first_steps if vi == 0 else a.steps):
            m = measure_step(eng, [data.get(step_no, 1, st.dp_rank, st.dp_size)])
            sec = m["seconds"]
            row = {
                **meta,
                "model": a.model,
                "seq_len": a.seq_len,
                "sp_size": a.sp_size,
                "variant": variant,
                "step": i + 1,
                **m,
                "seconds": round(sec, 3),
                "predicted_gpu_gib": round(plan.gpu_peak_bytes / 2**30, 2),
                "predicted_host_gib": round(plan.host_peak_bytes / 2**30, 2),
                "levers": {
                    "chunked_loss": levers.chunked_loss,
                    "loss_chunk_rows": levers.loss_chunk_rows,
                    "tiled_mlp": levers.tiled_mlp,
                    "tiled_layer": levers.tiled_layer,
                    "tile_tokens": levers.tile_tokens,
                    "placement": levers.placement.spec(),
                },
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "tflops_per_gpu": round(flops / sec / st.world_size / 1e12, 1),
                "mfu": round(flops / sec / st.world_size / H200_BF16_PEAK, 3),
            }
            step_no += 1
            rows.append(row)
            if st.rank == 0:
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
            if m["error"]:
                break
        if rows[-1]["error"]:
            break
    if st.rank == 0:
        table = levers_table(rows)
        (out / f"levers_{a.model}_{a.seq_len}.md").write_text(table + "\n")
        print(table)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
