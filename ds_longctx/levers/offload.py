"""CPU activation offload through DeepSpeed's activation checkpointing: the checkpoint function of `offload` layers.

With activation checkpointing every decoder layer keeps one tensor, its input `[b, s/sp, H]`, from its
forward until its backward (288 KiB per token of the full sequence for Qwen3-8B, split over sp ranks).
Offload moves those to pinned host memory and brings each back when backward reaches its layer.

What is DeepSpeed's and what is ours:
- The offload itself is DeepSpeed's: the DeepSpeed JSON's `activation_checkpointing` block
  (`cpu_checkpointing: true`) configures `deepspeed.checkpointing`, and an offloaded layer's
  `_gradient_checkpointing_func` is `deepspeed.checkpointing.checkpoint`. In DeepSpeed 0.19.8 that path
  already copies on a side stream into a pool of pinned buffers (`_ActivationOffloadEngine`) and keeps the
  newest checkpoint on the GPU (its backward comes first).
- The budget is ours: which layers offload is the placement plan's (placement.py): only the first N layers,
  whose checkpoints live longest, leave the GPU; `auto` asks the planner for the fewest that fit. Offloading
  layers that fit anyway costs PCIe traffic and host memory (DeepSpeed ALST offloads all layers: ~290 GiB of
  host memory at 1M tokens).
- Restore is on demand (no prefetch): one layer's checkpoint is `s/sp * H * 2` bytes, e.g. 0.5 GiB at
  131k tokens over sp=2, ~10 ms at the 55 GB/s measured for pinned copies, against ~0.5 s of backward
  per layer; benchmarks/bench_levers.py measures what it costs in step time.

On CPU there is nothing to offload to (and DeepSpeed's CPU->CPU copy path crashes: `cpu_checkpointing` with no
partitioning empties the tensor it copied onto itself), so `cpu_checkpointing` stays off there and only the
routing through DeepSpeed's checkpoint is exercised.
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("ds_longctx")


def activation_checkpointing_block(offload: bool, on_gpu: bool) -> dict:
    """The DeepSpeed JSON `activation_checkpointing` block (`offload`: some layer's checkpoint goes to the host)."""
    return {"partition_activations": False, "cpu_checkpointing": bool(offload and on_gpu),
            "contiguous_memory_optimization": False, "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False, "profile": False}


def offload_checkpoint_function(ds_config: dict) -> Callable:
    """DeepSpeed's checkpoint, configured from `ds_config`'s activation_checkpointing block: the
    `_gradient_checkpointing_func` of an `offload` layer (placement.apply_placement sets it)."""
    import deepspeed
    deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
    log.info("activation offload through deepspeed.checkpointing (cpu_checkpointing=%s)",
             ds_config.get("activation_checkpointing", {}).get("cpu_checkpointing"))
    return deepspeed.checkpointing.checkpoint
