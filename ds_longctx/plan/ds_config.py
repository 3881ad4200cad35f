"""Run config -> DeepSpeed JSON dict. A pure function: no I/O, no torch, unit-tested.

Batch math: with `sequence_parallel_size` in the JSON DeepSpeed counts data-parallel replicas as
world_size / sp_size, so `train_batch_size = micro_batch * grad_accum * dp` (dp = world / sp).
`hf_trainer_ds_config` is the same dict for the HF Trainer (integrations/hf_trainer.py), less that
one key.
"""

from __future__ import annotations

from ds_longctx.config import RunConfig
from ds_longctx.levers.offload import activation_checkpointing_block
from ds_longctx.levers.placement import requests_offload
from ds_longctx.parallel.parallel_state import dp_size
from ds_longctx.plan.disk_terms import (
    NVME_OPTIMIZER_BUFFERS,
    NVME_PARAM_BUFFER_ELEMS,
    NVME_PARAM_BUFFERS,
    NVME_SUB_GROUP_ELEMS,
)
from ds_longctx.plan.geometry import ModelGeometry, as_geometry
from ds_longctx.plan.zero_buffers import PARAM_PERSISTENCE_ELEMS, offload_sub_group_elems


def build_ds_config(
    cfg: RunConfig, world_size: int, on_gpu: bool, geom: ModelGeometry | None = None
) -> dict:
    """The DeepSpeed config for `cfg` on `world_size` ranks (bf16 on GPU, fp32 on CPU unless
    forced). `geom`: the model's (`RunShape.geometry`), else read here where needed."""
    dp = dp_size(world_size, cfg.parallel.sp_size)
    bf16 = cfg.model.dtype == "bf16" or (cfg.model.dtype == "auto" and on_gpu)
    opt_params = {
        "lr": cfg.optimizer.lr,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": cfg.optimizer.weight_decay,
    }
    if cfg.optimizer.torch_adam:
        opt_params["torch_adam"] = True
    ds = {
        "train_batch_size": cfg.train.micro_batch * cfg.train.grad_accum * dp,
        "train_micro_batch_size_per_gpu": cfg.train.micro_batch,
        "gradient_accumulation_steps": cfg.train.grad_accum,
        "sequence_parallel_size": cfg.parallel.sp_size,
        "gradient_clipping": cfg.optimizer.grad_clip,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW", "params": opt_params},
        "bf16": {"enabled": bf16},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": on_gpu,
            "contiguous_gradients": True,
            "reduce_bucket_size": 5e7,
            "stage3_prefetch_bucket_size": 5e7,
            "stage3_param_persistence_threshold": PARAM_PERSISTENCE_ELEMS,
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    if cfg.optimizer.offload:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if cfg.optimizer.offload_ratio < 1:
            ds["zero_optimization"]["offload_optimizer"]["ratio"] = cfg.optimizer.offload_ratio
            ds["zero_optimization"]["sub_group_size"] = offload_sub_group_elems(
                as_geometry(cfg.model.name if geom is None else geom), world_size
            )
        opt_params.pop("torch_adam", None)  # offloaded Adam is DeepSpeedCPUAdam
    if cfg.optimizer.offload_params:
        # unpinned: see docs/design/plan.md (DeepSpeed config)
        ds["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": False}
    if cfg.memory.nvme_path and (cfg.memory.nvme_optimizer or cfg.memory.nvme_params):
        nvme_blocks(ds["zero_optimization"], cfg)
        ds["aio"] = dict(AIO_BLOCK)
    if cfg.memory.activation_checkpointing:
        ds["activation_checkpointing"] = activation_checkpointing_block(
            requests_offload(cfg.memory.offload_layers, cfg.memory.placement), on_gpu
        )
    return ds


def optimizer_on_nvme(cfg: RunConfig) -> bool:
    """Whether a run of `cfg` keeps its offloaded optimizer state on NVMe (ZeRO-Infinity)."""
    return bool(cfg.memory.nvme_path and cfg.memory.nvme_optimizer and cfg.optimizer.offload)


def nvme_blocks(zero: dict, cfg: RunConfig) -> None:
    """ZeRO-Infinity: the offloaded optimizer state / parameters swapped to memory.nvme_path (the
    swap buffer sizes are the planner's: plan/disk_terms.py)."""
    path = cfg.memory.nvme_path
    if optimizer_on_nvme(cfg):
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": NVME_OPTIMIZER_BUFFERS,
        }
        zero["sub_group_size"] = NVME_SUB_GROUP_ELEMS
    if cfg.memory.nvme_params and cfg.optimizer.offload_params:
        zero["offload_param"] = {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": NVME_PARAM_BUFFERS,
            "buffer_size": NVME_PARAM_BUFFER_ELEMS,
        }


# DeepSpeed's async I/O op settings (its documented defaults, written out so the plan shows them)
AIO_BLOCK = {
    "block_size": 1048576,
    "queue_depth": 8,
    "thread_count": 1,
    "single_submit": False,
    "overlap_events": True,
}


def hf_trainer_ds_config(
    cfg: RunConfig, world_size: int, on_gpu: bool, geom: ModelGeometry | None = None
) -> dict:
    """`build_ds_config` for the HF Trainer: the same dict without `train_batch_size`, which the
    Trainer would check against a world size that ignores sp (docs/design/plan.md)."""
    ds = build_ds_config(cfg, world_size, on_gpu, geom)
    del ds["train_batch_size"]
    return ds
