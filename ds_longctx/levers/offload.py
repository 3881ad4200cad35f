"""CPU activation offload through DeepSpeed's activation checkpointing, with a layer budget.

With activation checkpointing every decoder layer keeps one tensor, its input `[b, s/sp, H]`, from its
forward until its backward (288 KiB per token of the full sequence for Qwen3-8B, split over sp ranks).
Offload moves those to pinned host memory and brings each back when backward reaches its layer.

What is DeepSpeed's and what is ours:
- The offload itself is DeepSpeed's: the DeepSpeed JSON's `activation_checkpointing` block
  (`cpu_checkpointing: true`) configures `deepspeed.checkpointing`, and an offloaded layer's
  `_gradient_checkpointing_func` is `deepspeed.checkpointing.checkpoint`. In DeepSpeed 0.19.8 that path
  already copies on a side stream into a pool of pinned buffers (`_ActivationOffloadEngine`) and keeps the
  newest checkpoint on the GPU (its backward comes first).
- The budget is ours (`offload_layers`): only the first N layers, whose checkpoints live longest, leave
  the GPU; the other layers keep torch's non-reentrant checkpoint on the GPU. `auto` asks the planner for
  the fewest layers that fit. Offloading layers that fit anyway costs PCIe traffic and host memory
  (DeepSpeed ALST offloads all layers: ~290 GiB of host memory at 1M tokens).
- Restore is on demand (no prefetch): one layer's checkpoint is `s/sp * H * 2` bytes, e.g. 0.5 GiB at
  131k tokens over sp=2, ~10 ms at the 55 GB/s measured for pinned copies, against ~0.5 s of backward
  per layer; benchmarks/bench_levers.py measures what it costs in step time.

On CPU there is nothing to offload to (and DeepSpeed's CPU->CPU copy path crashes, see KNOWN.md):
`cpu_checkpointing` stays off there and only the routing through DeepSpeed's checkpoint is exercised.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # annotations only: `ds-longctx plan` builds the DeepSpeed JSON without importing torch
    import torch.nn as nn

log = logging.getLogger("ds_longctx")


def activation_checkpointing_block(offload: bool, on_gpu: bool) -> dict:
    """The DeepSpeed JSON `activation_checkpointing` block."""
    return {"partition_activations": False, "cpu_checkpointing": bool(offload and on_gpu),
            "contiguous_memory_optimization": False, "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False, "profile": False}


def decoder_layers(model: nn.Module) -> list:
    """The model's decoder layers (transformers' GradientCheckpointingLayer instances)."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer decoder layers; "
                         f"activation offload needs transformers' checkpointing layers")
    return layers


def resolve_offload_layers(offload_layers: Union[int, str], num_layers: int, auto_layers: int = None) -> int:
    if offload_layers == "all":
        return num_layers
    if offload_layers == "auto":
        if auto_layers is None:
            raise ValueError("offload_layers='auto' needs the planner's answer (auto_layers)")
        return min(num_layers, auto_layers)
    if not 0 <= offload_layers <= num_layers:
        raise ValueError(f"offload_layers={offload_layers} is outside 0..{num_layers} (the model's layers); "
                         f"use a number in that range, 'all' or 'auto'")
    return offload_layers


def apply_activation_offload(model: nn.Module, ds_config: dict, n_layers: int) -> int:
    """Route the first `n_layers` decoder layers' checkpoints through DeepSpeed's (offloading) checkpoint.

    Needs `model.gradient_checkpointing_enable()` first. Returns how many layers were routed. Undo with
    `remove_activation_offload`.
    """
    import deepspeed
    layers = decoder_layers(model)
    if not getattr(layers[0], "gradient_checkpointing", False):
        raise ValueError("activation offload needs activation checkpointing: call "
                         "model.gradient_checkpointing_enable() first (activation_checkpointing: true)")
    deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
    for layer in layers[:n_layers]:
        layer._ds_longctx_prev_ckpt = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = deepspeed.checkpointing.checkpoint
    block = ds_config.get("activation_checkpointing", {})
    log.info("activation offload: %d of %d layers through deepspeed.checkpointing (cpu_checkpointing=%s)",
             n_layers, len(layers), block.get("cpu_checkpointing"))
    return n_layers


def offloaded_layer_indices(model: nn.Module) -> list:
    """Indices of the decoder layers `apply_activation_offload` routed through DeepSpeed's checkpoint."""
    return [i for i, layer in enumerate(decoder_layers(model)) if "_ds_longctx_prev_ckpt" in layer.__dict__]


def remove_activation_offload(model: nn.Module) -> None:
    """Give every routed layer back its previous checkpoint function."""
    for layer in decoder_layers(model):
        prev = layer.__dict__.pop("_ds_longctx_prev_ckpt", None)
        if prev is not None:
            layer._gradient_checkpointing_func = prev
