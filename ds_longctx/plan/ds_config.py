"""Run config -> DeepSpeed JSON dict. A pure function: no I/O, no torch, unit-tested.

Batch math: with `sequence_parallel_size` in the JSON DeepSpeed counts data-parallel replicas as
world_size / sp_size, so `train_batch_size = micro_batch * grad_accum * dp` (dp = world / sp).
"""

from __future__ import annotations

from ds_longctx.config import RunConfig
from ds_longctx.levers.offload import activation_checkpointing_block


def build_ds_config(cfg: RunConfig, world_size: int, on_gpu: bool) -> dict:
    """The DeepSpeed config for `cfg` on `world_size` ranks (bf16 on GPU, fp32 on CPU unless forced)."""
    if world_size % cfg.sp_size:
        raise ValueError(f"sp_size={cfg.sp_size} does not divide world_size={world_size}")
    dp = world_size // cfg.sp_size
    bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and on_gpu)
    opt_params = {"lr": cfg.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": cfg.weight_decay}
    if cfg.torch_adam:
        opt_params["torch_adam"] = True
    ds = {
        "train_batch_size": cfg.micro_batch * dp,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": 1,
        "sequence_parallel_size": cfg.sp_size,
        "gradient_clipping": cfg.grad_clip,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW", "params": opt_params},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": cfg.lr,
                                                     "warmup_num_steps": cfg.warmup_steps,
                                                     "warmup_type": "linear"}},
        "bf16": {"enabled": bf16},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": on_gpu,
            "contiguous_gradients": True,
            "reduce_bucket_size": 5e7,
            "stage3_prefetch_bucket_size": 5e7,
            "stage3_param_persistence_threshold": 1e5,
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    if cfg.optimizer_offload:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        opt_params.pop("torch_adam", None)  # offloaded Adam is DeepSpeedCPUAdam (built on first use)
    if cfg.activation_checkpointing:
        ds["activation_checkpointing"] = activation_checkpointing_block(cfg.activation_offload, on_gpu)
    if cfg.warmup_steps == 0:
        del ds["scheduler"]
    return ds
