"""Worker for test_optimizer_offload.py: build the engine with an offloaded optimizer
(DeepSpeedCPUAdam, JIT-built on first use) split by `--ratio`, and have rank 0 write what DeepSpeed
made of it: each ZeRO-3 sub-group's size, the ratio, which sub-groups it put on the host, and
whether it built the second (non-offloaded) optimizer.

torchrun --nproc_per_node 2 tests/distributed/offload_worker.py --ratio 0.5 --out info.json
"""

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ratio", type=float, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from ds_longctx.config import RunConfig
    from ds_longctx.run.engine import build_engine

    cfg = RunConfig(
        model="qwen3-tiny",
        seq_len=64,
        sp_size=2,
        dtype="fp32",
        optimizer_offload=True,
        optimizer_offload_ratio=a.ratio,
        torch_adam=False,
        output_dir=os.path.dirname(a.out),
    )
    eng = build_engine(cfg)
    opt = eng.ds.optimizer
    if eng.state.rank == 0:
        with open(a.out, "w") as f:
            json.dump(
                {
                    "world": eng.state.world_size,
                    "numels": [int(n) for n in opt.fp16_partitioned_groups_flat_numel],
                    "ratio": opt.partial_offload,
                    "sub_groups": len(opt.subgroup_to_device),
                    "backup_optimizer": hasattr(opt, "backup_optimizer"),
                    "optimizer": type(opt.optimizer).__name__,
                },
                f,
            )
    from ds_longctx.parallel.parallel_state import leave

    leave(0)


if __name__ == "__main__":
    main()
