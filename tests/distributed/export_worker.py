"""Worker for test_export.py: train 2 steps (SP=2, fp32, YaRN), save a checkpoint, and write the
engine's logits for a probe sequence.

    torchrun --nproc_per_node 2 tests/distributed/export_worker.py --out DIR [--set key=value ...]

"The engine's logits": the full-sequence forward under Ulysses SP of the trained (ZeRO-3
partitioned) model, each rank running its slice through `engine.model`'s decoder and lm_head, the
slices all-gathered over the SP group (`sp_logits`, also used by benchmarks/bench_long_range.py).
"""

import argparse

import torch
import torch.distributed as dist

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


def sp_logits(engine, input_ids: torch.Tensor) -> torch.Tensor:
    """`[b, L]` -> fp32 logits `[b, L, V]` of the engine's model, computed under SP and gathered."""
    from ds_longctx.parallel.sharding import shard_batch

    st = engine.state
    shard = shard_batch(input_ids, st.sp_size, st.sp_rank)
    engine.attn.cu_seqlens = engine.attn.max_seqlen = None
    with torch.no_grad():
        hidden = engine.model.base_model(
            input_ids=shard.input_ids.to(engine.device),
            position_ids=shard.position_ids.to(engine.device),
            use_cache=False,
        ).last_hidden_state  # [b, L/sp, H]
        local = engine.model.lm_head(hidden).float().contiguous()  # [b, L/sp, V]
    if st.sp_group is None:
        return local[:, : input_ids.shape[1]]
    parts = [torch.empty_like(local) for _ in range(st.sp_size)]
    dist.all_gather(parts, local, group=st.sp_group)  # sp x [b, L/sp, V]
    return torch.cat(parts, dim=1)[:, : input_ids.shape[1]]  # [b, L, V]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--set", action="append", default=[], help="run-config override key=value (YAML value)"
    )
    a = ap.parse_args()

    import yaml

    from ds_longctx.checkpoint.save import save
    from ds_longctx.config import RunConfig
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.parallel.parallel_state import init_distributed
    from ds_longctx.run.engine import build_engine

    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    cfg = RunConfig(
        model="qwen3-tiny",
        seq_len=64,
        sp_size=2,
        dtype="fp32",
        lr=1e-3,
        seed=0,
        output_dir=a.out,
        rope_scaling=YARN,
        save_every=2,
        **overrides,
    )
    init_distributed(cfg.parallel.collective_timeout_s)
    engine = build_engine(cfg)
    st = engine.state
    data = SyntheticRetrieval(cfg.train.seq_len, engine.model.config.vocab_size, seed=0)
    for step in range(2):
        engine.train_step([data.get(step, 1, st.dp_rank, st.dp_size)])
    save(engine, cfg, 2, data.signature())
    probe = data.batch(1000, 1, 0, 1)
    logits = sp_logits(engine, probe)
    if st.rank == 0:
        torch.save({"input_ids": probe, "logits": logits}, f"{a.out}/engine_logits.pt")
    # leave together, groups torn down (as grad_worker.py does)
    from ds_longctx.parallel.parallel_state import leave

    leave(0)  # barrier, groups torn down, no teardown


if __name__ == "__main__":
    main()
