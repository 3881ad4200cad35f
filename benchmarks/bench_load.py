"""The host memory of loading a real-weights checkpoint directory into ZeRO-3 partitions on one
node: N ranks each building the model as `ds-longctx train --model DIR` does
(`run.model.build_partitioned_model`: `from_pretrained` under DeepSpeed's zero.Init), their summed
peak RSS over the load.

    python benchmarks/bench_load.py --geometry qwen3-8b --nproc 8 --dir /tmp/qwen3-8b-hf \\
        --cpu --commit C

A geometry's random-init checkpoint (bf16 safetensors, 5 GB shards) is written to --dir first when
it holds none. --cpu runs the ranks on gloo (a one-GPU machine cannot hold N NCCL ranks): each
rank's bf16 partition (2P/N bytes) then sits in host memory too, and the row says so. The row goes
to results/load.jsonl under $OUT (or the session folder): each rank's peak RSS, the tree's summed
peak (harness.RankMemory), the load's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import harness


def write_checkpoint(geometry: str, d: Path) -> float:
    """A random-init bf16 checkpoint of `geometry` in `d`; its seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    cfg = AutoConfig.from_pretrained(
        str(harness.ROOT / "ds_longctx" / "models" / f"{geometry}.json")
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(str(d), max_shard_size="5GB", safe_serialization=True)
    return time.perf_counter() - t0


def worker(a) -> None:
    """One rank: the partitioned model of --dir; rank 0 prints every rank's peak RSS as one JSON
    line."""
    import torch.distributed as dist

    from ds_longctx.config import RunConfig
    from ds_longctx.parallel.parallel_state import init_distributed
    from ds_longctx.plan.ds_config import build_ds_config
    from ds_longctx.run.model import build_partitioned_model, load_hf_config

    init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = RunConfig(model=a.dir, dtype="bf16", seq_len=4096)
    hf_cfg = load_hf_config(a.dir)
    t0 = time.perf_counter()
    model = build_partitioned_model(cfg, hf_cfg, build_ds_config(cfg, world, on_gpu=not a.cpu))
    seconds = time.perf_counter() - t0
    local = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    mine = {
        "rank": rank,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "partition_bytes": local,
        "seconds": round(seconds, 1),
    }
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        print("LOAD " + json.dumps(ranks), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--geometry", default="qwen3-8b")
    ap.add_argument(
        "--dir", required=True, help="the checkpoint directory (written from --geometry if empty)"
    )
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument(
        "--cpu", action="store_true", help="gloo ranks on the host (partitions in host memory)"
    )
    ap.add_argument("--commit", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return 0
    d = Path(a.dir)
    wrote = None if (d / "config.json").is_file() else round(write_checkpoint(a.geometry, d), 1)
    ckpt = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    out = Path(harness.raw_dir())
    out.mkdir(parents=True, exist_ok=True)
    if a.cpu:
        os.environ.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(a.nproc),
        "--master_port",
        str(harness.free_port()),
        str(Path(__file__).resolve()),
        "--worker",
        "--dir",
        a.dir,
        *(["--cpu"] if a.cpu else []),
    ]
    rc, host, wall = harness.run_job(argv, out / "load.log", 3600)
    line = next(
        (x for x in (out / "load.log").read_text().splitlines() if x.startswith("LOAD ")), None
    )
    ranks = json.loads(line[5:]) if line else []
    row = {
        "what": (
            f"load a {a.geometry} checkpoint directory into ZeRO-3 partitions, {a.nproc} ranks on "
            "one node"
        ),
        "checkpoint_bytes": ckpt,
        "ranks": a.nproc,
        "placement": "gloo ranks, partitions in host memory" if a.cpu else "one GPU per rank",
        "host_peak_bytes": host,
        "rank_peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
        "partition_bytes": [r["partition_bytes"] for r in ranks],
        "load_s": max((r["seconds"] for r in ranks), default=None),
        "wrote_checkpoint_s": wrote,
        "wall_s": round(wall, 1),
        "rc": rc,
        "device": harness.gpu_name(),
        "commit": harness.git_commit(a.commit),
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
    }
    with (out / "load.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return 0 if rc == 0 and ranks else 1


if __name__ == "__main__":
    sys.exit(main())
