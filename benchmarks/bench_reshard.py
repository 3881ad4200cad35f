"""`ds-longctx checkpoint reshard` on a large ZeRO-3 checkpoint: its seconds and peak host memory.

    python benchmarks/bench_reshard.py --geometry qwen3-8b --world 8 --layers 4 \\
        --dir /tmp/reshard --commit C

The checkpoint is written here first, in DeepSpeed 0.19.8's ZeRO-3 file layout (what
`_rigid_state_dict` saves and run/checkpoint_save.py hashes into meta.json: per rank the fp32 flat
sub-groups, their Adam moments and step, the model file's `param_shapes`), cut into DeepSpeed's
default sub-groups (plan/zero_buffers.sub_groups), values the rank's number (checked after the
conversion). `--layers` keeps that many decoder layers of the geometry (the whole model needs 12
bytes a parameter twice on disk: source and universal form); the time is then scaled to the whole
model by bytes, and the host memory is a fragment's whatever the size (checkpoint/universal.py). The
row goes to reshard.jsonl under $OUT (or the session folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import harness


def param_shapes(geometry: str, layers: int) -> list:
    """[(name, shape)] of the engine's parameters (`model.` + HF's names), in order, with `layers`
    decoder layers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(
        str(harness.ROOT / "ds_longctx" / "models" / f"{geometry}.json")
    )
    cfg.num_hidden_layers = layers
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return [(f"model.{n}", tuple(p.shape)) for n, p in model.named_parameters()]


def groups_of(shapes: list, world: int, sub_group: int) -> list:
    """The sub-groups DeepSpeed cuts: parameters in order, closed at `sub_group` partition elements
    or the end."""
    out, cur, size = [], [], 0
    for i, (name, shape) in enumerate(shapes):
        cur.append((name, shape))
        size += math.ceil(math.prod(shape) / world)
        if size >= sub_group or i == len(shapes) - 1:
            out.append(cur)
            cur, size = [], 0
    return out


def write_rank(d: Path, rank: int, groups: list, world: int) -> None:
    import torch
    from deepspeed.runtime.zero.config import ZeroStageEnum

    flat, state = [], {}
    for gi, group in enumerate(groups):
        n = sum(math.ceil(math.prod(s) / world) for _, s in group)
        flat.append(torch.full((n,), float(rank)))
        state[gi] = {
            "step": torch.tensor(7.0),
            "exp_avg": torch.full((n,), rank + 0.5),
            "exp_avg_sq": torch.full((n,), rank + 0.25),
        }
    optim = {
        "optimizer_state_dict": {
            "zero_stage": ZeroStageEnum.weights,
            "partition_count": world,
            "optimizer_state_dict": {"state": state, "param_groups": [{"lr": 1e-5}]},
            "fp32_flat_groups": flat,
        }
    }
    torch.save(optim, d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    model = {
        "param_shapes": [OrderedDict((n, torch.Size(s)) for n, s in g) for g in groups],
        "global_steps": 7,
    }
    torch.save(model, d / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")


def check(tag: Path, shapes: list, world: int) -> None:
    """Each parameter's universal fp32 holds rank r's value over its r-th partition (first, last,
    middle one)."""
    from ds_longctx.checkpoint import universal

    for name, shape in (shapes[0], shapes[len(shapes) // 2], shapes[-1]):
        numel = math.prod(shape)
        part = math.ceil(numel / world)
        for r in range(world):
            lo, hi = r * part, min((r + 1) * part, numel)
            if lo < hi:
                got = universal.read_slices(tag, name, lo, hi, ("exp_avg",))["exp_avg"]
                assert bool((got == r + 0.5).all()), (name, r)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--geometry", default="qwen3-8b")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dir", required=True)
    p.add_argument("--commit", default=None)
    a = p.parse_args()
    from ds_longctx.checkpoint import files
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.zero_buffers import DS_SUB_GROUP_ELEMS

    d = Path(a.dir) / "checkpoints" / "step7"
    d.mkdir(parents=True, exist_ok=True)
    shapes = param_shapes(a.geometry, a.layers)
    groups = groups_of(shapes, a.world, DS_SUB_GROUP_ELEMS)
    t0 = time.perf_counter()
    for r in range(a.world):
        write_rank(d, r, groups, a.world)
    wrote = time.perf_counter() - t0
    run = {
        "model": a.geometry,
        "world_size": a.world,
        "sp_size": a.world,
        "dp_size": 1,
        "micro_batch": 1,
        "grad_accum": 1,
        "seed": 0,
    }
    names = sorted(f.name for f in d.iterdir() if f.name.endswith(".pt"))
    meta = {
        "format": 2,
        "step": 7,
        "tag": "step7",
        "run": run,
        "data": {},
        "samples": 7,
        "files": files.entries(d, names),
    }
    (d / "meta.json").write_text(json.dumps(meta, indent=1))
    (d.parent / "latest").write_text("step7")
    source_bytes = sum((d / n).stat().st_size for n in names)
    cmd = [sys.executable, "-m", "ds_longctx.cli", "checkpoint", "reshard", str(a.dir)]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=harness.ROOT)
    wall = time.perf_counter() - t0
    if res.returncode:
        sys.exit(f"reshard failed:\n{res.stderr[-3000:]}")
    line = res.stdout.strip().splitlines()[-1]
    seconds = float(re.search(r"written in ([\d.]+) s", line).group(1))
    peak = float(re.search(r"peak host RSS ([\d.]+) GB", line).group(1))
    check(d, shapes, a.world)
    whole = ModelGeometry.from_name_or_path(a.geometry)
    part = sum(math.prod(s) for _, s in shapes)
    row = {
        "what": (
            f"ds-longctx checkpoint reshard of a {a.geometry} ZeRO-3 checkpoint over {a.world} "
            "ranks"
        ),
        "geometry": a.geometry,
        "layers": a.layers,
        "of_layers": whole.layers,
        "params": part,
        "source_bytes": source_bytes,
        "seconds": seconds,
        "wall_s": round(wall, 1),
        "peak_host_rss_gb": peak,
        "gb_per_s": round(source_bytes / 1e9 / seconds, 3),
        "whole_params": whole.num_params,
        "whole_predicted_s": round(seconds * whole.num_params / part, 1),
        "wrote_source_s": round(wrote, 1),
        "report": line,
        "device": f"{harness.gpu_name()} host ({os.cpu_count()} cores)",
        "commit": harness.git_commit(a.commit),
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["benchmarks/bench_reshard.py", *sys.argv[1:]]),
    }
    out = Path(harness.raw_dir())
    out.mkdir(parents=True, exist_ok=True)
    with (out / "reshard.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
