"""Worker for test_optimizer_state.py: build the engine (qwen3-tiny, ZeRO-3, SP=2, fp32) with or
without the optimizer state made at build, then run two train steps on one fixed batch; each rank
saves its ZeRO-3 optimizer's fp32 sub-groups and their state right after the build (with the GPU
memory allocated then, on CUDA) and after the steps.

torchrun --nproc_per_node 2 tests/distributed/optimizer_state_worker.py --at_build true --out dir
[--set key=value]
"""

import argparse
import os

import torch


def snapshot(zo) -> dict:
    """Each fp32 sub-group (the master weights ZeRO-3 steps) and each of its optimizers' state,
    copied to the CPU."""
    opts = [zo.optimizer] + (
        [zo.backup_optimizer] if getattr(zo, "backup_optimizer", None) is not None else []
    )
    out = {"master": [], "state": [], "optimizers": sorted({type(o).__name__ for o in opts})}
    for p in zo.fp32_partitioned_groups_flat:
        out["master"].append(p.detach().float().cpu().clone())
        st = next((o.state[p] for o in opts if p in o.state and len(o.state[p])), {})
        row = {
            k: (v.detach().float().cpu().clone() if torch.is_tensor(v) and v.dim() else float(v))
            for k, v in st.items()
        }
        if "exp_avg" in st:
            row["device"] = st[
                "exp_avg"
            ].device.type  # where the moments live: "cuda", or "cpu" when offloaded
        out["state"].append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--at_build", required=True, choices=("true", "false"))
    ap.add_argument(
        "--set", action="append", default=[], help="run-config override key=value (YAML value)"
    )
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import yaml

    from ds_longctx.config import RunConfig
    from ds_longctx.data.rows import Batch
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.run.engine import build_engine

    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    cfg = RunConfig(
        **{
            "model": "qwen3-tiny",
            "seq_len": 64,
            "sp_size": 2,
            "dtype": "fp32",
            "seed": 0,
            "lr": 1e-2,
            "weight_decay": 0.1,
            "optimizer_state_at_build": a.at_build == "true",
            "output_dir": a.out,
            **overrides,
        }
    )
    eng = build_engine(cfg)
    built = snapshot(eng.ds.optimizer)
    built["allocated"] = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
    ids = SyntheticRetrieval(64, eng.model.config.vocab_size, seed=0).batch(
        0, 1, eng.state.dp_rank, eng.state.dp_size
    )
    losses = [eng.train_step([Batch(ids)]).loss for _ in range(2)]
    torch.save(
        {"built": built, "stepped": snapshot(eng.ds.optimizer), "losses": losses},
        os.path.join(a.out, f"rank{eng.state.rank}.pt"),
    )
    from ds_longctx.parallel.parallel_state import leave

    leave(0)


if __name__ == "__main__":
    main()
