"""Applying a placement plan to a model: the only place a decoder layer's checkpoint function is
chosen.

    # route every layer as `plan` says; remove_placement undoes it:
    apply_placement(model, plan, ds_config)
    # read back from the layers (tests compare it with the plan):
    applied_placement(model) == plan

The plan itself (`PlacementPlan`, its rules) is placement.py's; keep layers get torch's checkpoint,
offloaded ones DeepSpeed's or our pinned pool's (offload.py), cached ones an attention slot
(attention_cache.py).
"""

from __future__ import annotations

# transformers, deepspeed and the attention cache (which imports torch) are imported inside the
# functions that use them.
import logging
from typing import TYPE_CHECKING, Optional

from ds_longctx.levers.disk_tier import disk_checkpoint_function
from ds_longctx.levers.offload import offload_checkpoint_function, pool_checkpoint_function
from ds_longctx.levers.placement import CACHED, ON_HOST, Place, PlacementPlan

if TYPE_CHECKING:
    import torch.nn as nn

log = logging.getLogger("ds_longctx")

_PLACE_ATTR = "_ds_longctx_place"
_PREV_ATTR = "_ds_longctx_prev_ckpt"
_ENABLED_ATTR = "_ds_longctx_enabled_ckpt"
_MISSING = object()  # a layer that had no checkpoint function of its own before apply_placement


def decoder_layers(model: nn.Module) -> list:
    """The model's decoder layers (transformers' GradientCheckpointingLayer instances), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no GradientCheckpointingLayer decoder layers; activation "
            "checkpointing, offload and the attention cache need transformers' checkpointing layers"
        )
    return layers


def apply_placement(
    model: nn.Module,
    plan: PlacementPlan,
    ds_config: Optional[dict] = None,
    pinned_pool: bool = False,
    nvme_path: Optional[str] = None,
) -> PlacementPlan:
    """Route every decoder layer as `plan` says: the only place a layer's checkpoint function is
    chosen.

    Notes: docs/design/levers.md, `placement_apply.py`.
    """
    layers = decoder_layers(model)
    if len(layers) != len(plan):
        raise ValueError(
            f"placement plan has {len(plan)} entries, {type(model).__name__} has {len(layers)} "
            f"decoder layers"
        )
    if not plan.checkpointed:
        return applied_placement(model)
    originals = [layer.__dict__.get("_gradient_checkpointing_func", _MISSING) for layer in layers]
    if not getattr(layers[0], "gradient_checkpointing", False):
        _checkpointing(model, on=True)
        model.__dict__[_ENABLED_ATTR] = True
    funcs = {Place.KEEP: None, Place.CACHE: None}
    if plan.on_disk and nvme_path is None:
        raise ValueError(
            f"placement {plan.spec()} puts {plan.on_disk} layers on disk: set memory.nvme_path"
        )
    if plan.offloaded and not pinned_pool:
        if ds_config is None:
            raise ValueError(
                "offloaded layers need the DeepSpeed config (its activation_checkpointing block)"
            )
        funcs[Place.OFFLOAD] = funcs[Place.CACHE_OFFLOAD] = offload_checkpoint_function(ds_config)
    from ds_longctx.levers import attention_cache

    for i, (layer, place, original) in enumerate(zip(layers, plan.layers, originals)):
        layer.__dict__.setdefault(_PREV_ATTR, original)
        if place == Place.DISK:
            fn = disk_checkpoint_function(i, nvme_path)
        else:
            fn = pool_checkpoint_function(i) if pinned_pool and place in ON_HOST else funcs[place]
        layer._gradient_checkpointing_func = (
            fn or layer._gradient_checkpointing_func
        )  # keep / cache: torch's
        if place in CACHED:
            attention_cache.attach(layer, on_host=place == Place.CACHE_OFFLOAD, key=i)
        else:
            attention_cache.detach(layer)
    applied = applied_placement(model)
    log.info("placement: %s", applied.describe())
    return applied


def applied_placement(model: nn.Module) -> PlacementPlan:
    """What the layers were given, read off them. More: docs/design/levers.md."""
    from ds_longctx.levers import attention_cache

    out = []
    for layer in decoder_layers(model):
        if not getattr(layer, "gradient_checkpointing", False):
            out.append(Place.NONE)
            continue
        fn = layer.__dict__.get("_gradient_checkpointing_func")
        if getattr(fn, "disk_tier", False):
            out.append(Place.DISK)
            continue
        offloaded = _is_offload_function(fn)
        slot = attention_cache.layer_slot(layer)
        if slot is None:
            out.append(Place.OFFLOAD if offloaded else Place.KEEP)
        else:
            out.append(
                Place.CACHE_OFFLOAD
                if offloaded and slot.on_host
                else Place.CACHE
                if not offloaded and not slot.on_host
                else _mixed(offloaded, slot.on_host)
            )
    return PlacementPlan(tuple(out))


def _is_offload_function(fn) -> bool:
    if getattr(fn, "pinned_pool", False):
        return True
    if fn is None or "deepspeed" not in getattr(fn, "__module__", ""):
        return False
    import deepspeed

    return fn is deepspeed.checkpointing.checkpoint


def _mixed(offloaded: bool, on_host: bool):
    raise RuntimeError(
        f"a layer has its checkpoint {'offloaded' if offloaded else 'on the GPU'} and its "
        f"attention cache {'on the host' if on_host else 'on the GPU'}: no placement applies that"
    )


def remove_placement(model: nn.Module) -> None:
    """Give every layer back the checkpoint function it had before `apply_placement` (and turn
    checkpointing off again if `apply_placement` turned it on)."""
    from ds_longctx.levers import attention_cache

    if model.__dict__.pop(_ENABLED_ATTR, False):
        _checkpointing(model, on=False)
    for layer in decoder_layers(model):
        attention_cache.detach(layer)
        prev = layer.__dict__.pop(_PREV_ATTR, None)
        if prev is _MISSING:
            layer.__dict__.pop("_gradient_checkpointing_func", None)
        elif prev is not None:
            layer._gradient_checkpointing_func = prev
        layer.__dict__.pop(_PLACE_ATTR, None)


def _checkpointing(model: nn.Module, on: bool) -> None:
    """transformers' non-reentrant activation checkpointing on or off (the name changed in
    transformers 5.2x)."""
    if on:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
