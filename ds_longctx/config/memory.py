"""`memory` section: the memory levers and the per-layer placement (owner: ds_longctx/levers/)."""

from __future__ import annotations

import os
from typing import Literal, Optional, Union

from pydantic import Field, model_validator

from ds_longctx.config.base import Section
from ds_longctx.levers.gpu_budget import allocator_fraction
from ds_longctx.levers.placement import PlacementPlan, check_request
from ds_longctx.parallel.disk import unwritable, user_path


class MemoryConfig(Section):
    """The memory levers and where each layer keeps its checkpoint."""

    chunked_loss: bool = True
    """lm_head + cross-entropy over row chunks: the L x V logits never exist in full
    (levers/chunked_loss.py). False: plain lm_head then F.cross_entropy."""
    loss_chunk_rows: int = Field(4096, gt=0)
    """Rows per chunk of the chunked loss."""
    activation_checkpointing: bool = True
    """Keep only each decoder layer's input; recompute the layer in backward."""
    offload_layers: Union[int, Literal["all", "auto"]] = 0
    """How many decoder layers' checkpoints go to pinned host memory, the first ones
    (levers/offload.py): a number, all, or auto (the planner's fewest that fit this GPU). 0: none.
    (The old pair `activation_offload: true` + `offload_layers` still reads: activation_offload
    false means 0, true alone means all.)"""
    attention_cache_layers: Union[int, Literal["all"]] = 0
    """The last N layers keep their attention output through the checkpoint, so the recompute skips
    attention (levers/attention_cache.py); all = every layer not offloaded. Costs one more
    checkpoint-sized tensor per layer."""
    placement: Optional[str] = None
    """Every layer's place, instead of the two counts above: run lengths such as
    `offload:30,keep:4,cache:2` (keep, offload, cache; levers/placement.py). The plan the run uses
    is printed at start and in plan.txt."""
    pinned_pool: bool = False
    """Offloaded checkpoints in our own exact-size pinned pool (levers/offload.py) instead of
    DeepSpeed's offload, whose pinned buffers are rounded up to a power of two (a 2.16 GB checkpoint
    holds 4 GiB): the same data in up to half the host memory. `ds-longctx plan` turns it on where
    the host needs it. Its GPU test passes (tests/gpu/test_attention_gpu.py); its host memory at
    scale is not yet measured."""
    tiled_mlp: bool = False
    """Run each MLP over sequence tiles with recompute (levers/tiled_mlp.py)."""
    tiled_layer: bool = False
    """Run each decoder layer's token-wise work (both norms, the q/k/v projections, q/k norms,
    rotary and the MLP) over sequence tiles with recompute, so the layer's backward holds its
    inputs, not its token-wise tensors (levers/tiled_layer.py; includes the tiled MLP). Qwen3 /
    Qwen2 / Llama / Mistral layers; not with LoRA. `ds-longctx plan` turns it on where nothing fits
    without it."""
    tile_tokens: Optional[int] = Field(None, gt=0)
    """Tokens per tile of the tiled MLP / tiled layer (default: hidden size)."""
    attn_bwd_head_groups: int = Field(1, ge=1)
    """The attention backward over this many groups of KV heads, one after another
    (parallel/attention.py): the kernel's fp32 accumulators (dQ; dK / dV with grouped heads) exist
    for one group at a time. It must divide the KV heads each rank attends (KV heads / sp_size, or
    1). Needs a kernel pair (FlashAttention 4 on Hopper; SDPA's flash kernel on CPU); other kernels
    run ungrouped. `ds-longctx plan` turns it on where nothing fits without it. Its step-time cost
    is not yet measured."""
    gpu_budget_gb: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    """GPU memory per GPU this run may use, GB (1e9 bytes): the CUDA allocator is capped there less
    the CUDA context (levers/gpu_budget.py), so freed blocks are waited for and cached ones returned
    before the process grows past it; past it is an out-of-memory error naming this value.
    `ds-longctx plan` writes its --gpu_mem_gb. null: the whole GPU."""
    run_ahead_layers: int = Field(2, ge=0)
    """On a GPU the host enqueues at most this many decoder layers ahead of the GPU
    (levers/gpu_budget.py): memory freed while another stream still used it (offload copies,
    ZeRO-3's all-gathers) is reused instead of piling up. 0: unbounded."""

    nvme_path: Optional[str] = None
    """A directory on a local NVMe disk for the disk tier (levers/disk_tier.py): `disk` layers'
    checkpoints and, with nvme_optimizer / nvme_params, DeepSpeed ZeRO-Infinity's swap files. It
    must exist or be creatable, and be writable. The run makes its own scratch directory inside and
    removes it at exit. null: no disk tier."""
    nvme_gb: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    """GB (1e9 bytes) of nvme_path the run may fill; `ds-longctx plan --nvme_gb` plans within it."""
    nvme_optimizer: bool = False
    """With optimizer_offload: the fp32 master weights, grads and Adam state on nvme_path (DeepSpeed
    offload_optimizer device nvme; needs DeepSpeed's async_io op, i.e. libaio)."""
    nvme_params: bool = False
    """With offload_params: the bf16 parameter partitions on nvme_path (DeepSpeed offload_param
    device nvme)."""

    @model_validator(mode="after")
    def _nvme(self) -> "MemoryConfig":
        uses = [k for k in ("nvme_optimizer", "nvme_params") if getattr(self, k)]
        if self.placement is not None and PlacementPlan.parse(self.placement).on_disk:
            uses.append(f"placement={self.placement!r} (disk layers)")
        if self.nvme_path is None:
            if uses or self.nvme_gb is not None:
                raise ValueError(
                    f"{', '.join(uses) or 'nvme_gb'} needs nvme_path: set nvme_path to a directory "
                    f"on a local disk (e.g. /local_nvme/ds_longctx), or drop the disk tier"
                )
            return self
        if problem := nvme_path_problem(self.nvme_path):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _placement_request(self) -> "MemoryConfig":
        check_request(
            self.offload_layers,
            self.attention_cache_layers,
            self.activation_checkpointing,
            self.placement,
        )
        if self.gpu_budget_gb is not None:
            allocator_fraction(
                self.gpu_budget_gb, total_bytes=2**62
            )  # refuses a budget the context fills
        return self


def nvme_path_problem(path: str) -> Optional[str]:
    """Why `path` cannot hold the disk tier (a file, or no directory can be made or written there),
    or None."""
    p = user_path(path)
    if os.path.exists(p) and not os.path.isdir(p):
        return f"nvme_path={path!r} is a file, not a directory; give a directory on a local disk"
    if why := unwritable(os.path.join(p, "probe")):
        return (
            f"nvme_path={path!r} cannot be written: {why}; give a directory you can write to, e.g. "
            f"one on the machine's local NVMe"
        )
    return None


DISK_KEYS = ("nvme_path", "nvme_gb", "nvme_optimizer", "nvme_params")


def drop_unset_disk_keys(memory: dict) -> None:
    """A dumped `memory` section without the disk keys when no disk tier is set (run.yaml unchanged
    by them)."""
    if memory.get("nvme_path") is None:
        for key in DISK_KEYS:
            memory.pop(key, None)
