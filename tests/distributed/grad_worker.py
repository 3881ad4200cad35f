"""Worker for test_ulysses.py: one forward/backward through the engine, rank 0 saves loss + full
grads.

torchrun --nproc_per_node N tests/distributed/grad_worker.py --sp 2 --length 64 --out grads.pt
[--packed]
"""

import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sp", type=int, required=True)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--packed", type=str, default="")  # comma-separated document lengths
    ap.add_argument(
        "--mask_from", type=int, default=None, help="labels ignored from this position on"
    )
    ap.add_argument(
        "--set", action="append", default=[], help="run-config override key=value (YAML value)"
    )
    ap.add_argument(
        "--micro",
        type=int,
        default=1,
        help="micro-batches of the step (samples 0..N-1; grad_accum N)",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--placement",
        action="store_true",
        help="also save each layer's checkpoint function, by kind",
    )
    a = ap.parse_args()

    import deepspeed

    from ds_longctx.config import RunConfig
    from ds_longctx.data.rows import Batch
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.run.engine import build_engine

    seq_len = (
        a.length - a.length % a.sp
    )  # the config needs a multiple of sp; the batch may be longer
    import yaml

    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    cfg = RunConfig(
        **{
            "model": "qwen3-tiny",
            "seq_len": max(seq_len, a.sp),
            "sp_size": a.sp,
            "dtype": "fp32",
            "seed": 0,
            "output_dir": os.path.dirname(a.out),
            "grad_accum": a.micro,
            **overrides,
        }
    )
    eng = build_engine(cfg)
    st = eng.state
    data = SyntheticRetrieval(a.length, eng.model.config.vocab_size, seed=0)
    ids = data.batch(0, 1, st.dp_rank, st.dp_size)
    pos = None
    if a.packed:
        lens = [int(x) for x in a.packed.split(",")]
        assert sum(lens) == a.length
        pos = torch.cat([torch.arange(n) for n in lens])[None]
    labels = None
    if a.mask_from is not None:
        labels = ids.clone()
        labels[:, a.mask_from :] = -100
    more = [
        data.batch(i, 1, st.dp_rank, st.dp_size) for i in range(1, a.micro)
    ]  # micro-batches 2..N
    res = eng.forward_backward(
        [Batch(ids, position_ids=pos, labels=labels)] + [Batch(m) for m in more]
    )
    grads = {}
    for name, p in eng.module.named_parameters():
        if not p.requires_grad:  # a frozen base (LoRA) has no gradient
            continue
        g = deepspeed.utils.safe_get_full_grad(p)
        grads[name.removeprefix("model.")] = g.detach().float().cpu()
    # every parameter ZeRO-3 partitioned: the model's at birth (zero.Init), LoRA adapters at
    # deepspeed.initialize
    out = {
        "loss": res.loss,
        "tokens": res.tokens,
        "grads": grads,
        "not_partitioned": [n for n, p in eng.module.named_parameters() if not hasattr(p, "ds_id")],
        # DeepSpeed's own view of parameter offload (offload_params) and of its one flat host buffer
        "offload_param": bool(getattr(eng.ds.optimizer, "offload_param", False)),
        "param_host_buffer": sum(
            t.numel() for t in getattr(eng.ds.optimizer, "param_groups_fp16_flat_cpu_memory", [])
        ),
    }
    if (
        a.placement
    ):  # what each layer really runs, read off the layers (not the plan's labels): its checkpoint
        # function (DeepSpeed's offloads) and its attention module's cache slot (on the host or not)
        from ds_longctx.levers import attention_cache
        from ds_longctx.levers.placement_apply import decoder_layers
        from ds_longctx.run.placement_plan import run_placement

        kinds = []
        for layer in decoder_layers(eng.model):
            fn = layer.__dict__.get("_gradient_checkpointing_func")
            offloaded = fn is deepspeed.checkpointing.checkpoint or getattr(
                fn, "pinned_pool", False
            )
            slot = attention_cache.layer_slot(layer)
            kinds.append(
                "disk"
                if getattr(fn, "disk_tier", False)
                else "none"
                if not layer.gradient_checkpointing
                else ("cache+offload" if offloaded and slot.on_host else "cache")
                if slot is not None
                else "offload"
                if offloaded
                else "keep"
            )
        out["applied"] = kinds
        out["planned"] = [
            p.value for p in run_placement(cfg, len(kinds), st.world_size, None).layers
        ]
        out["engine_plan"] = [p.value for p in eng.placement.layers]
        from ds_longctx.levers import offload

        pool = offload.pool()
        if (
            pool._block is not None
        ):  # memory.pinned_pool: the engine's one reservation and what the step used of it
            base = pool._block.data_ptr()
            from ds_longctx.levers import attention_cache

            kept = {
                i: [t.data_ptr() - base for t in s._bufs]
                for i, layer in enumerate(decoder_layers(eng.model))
                if (s := attention_cache.layer_slot(layer)) is not None
                and s.on_host
                and s._bufs is not None
            }
            out["pool"] = {
                "block_bytes": pool._block.numel() * pool._block.element_size(),
                "own": sorted(pool._own),
                "slots": {k: (tuple(v.shape), v.data_ptr() - base) for k, v in pool._slots.items()},
                "regions": {k: (v.data_ptr() - base, v.numel()) for k, v in pool._regions.items()},
                "cache_kept_at": kept,
            }
    if st.rank == 0:
        torch.save(out, a.out)
    # leave together, groups torn down: a rank exiting with gloo threads still up can abort the
    # others ("terminate called without an active exception", seen at start-up and exit of 4-process
    # runs)
    from ds_longctx.parallel.parallel_state import leave

    leave(0)  # barrier, groups torn down, no teardown


if __name__ == "__main__":
    main()
