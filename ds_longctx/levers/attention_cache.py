"""Attention cache: a layer keeps its attention output + LSE from the forward, so the checkpoint
recompute skips attention.

Design notes: docs/design/levers.md, section `attention_cache.py`.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from ds_longctx.levers.offload import ALIGN, attention_cache_key, pool
from ds_longctx.parallel import ulysses

log = logging.getLogger("ds_longctx")


class _HostBuffer:
    """Exact-size pinned host memory for one tensor: a pageable allocation registered with CUDA."""

    def __init__(self, like: torch.Tensor):
        self.tensor = torch.empty(like.shape, dtype=like.dtype, device="cpu")
        nbytes = self.tensor.numel() * self.tensor.element_size()
        err = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(
                f"cudaHostRegister of {nbytes} bytes failed ({err}): not enough pinnable host "
                "memory "
                "for the offloaded attention cache; use placement 'cache' or 'keep' for some layers"
            )
        self.registered = True

    def release(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.registered = False


def carve(region: torch.Tensor, tensors) -> Optional[list]:
    """Views of `region` (bytes) shaped and typed like `tensors`, each at an offset aligned as the
    pool aligns its regions (offload.ALIGN); None when they do not fit."""
    views, off = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        off = -(-off // ALIGN) * ALIGN
        if off + n > region.numel():
            return None
        views.append(region[off : off + n].view(t.dtype).view(t.shape))
        off += n
    return views


class Slot:
    """One layer's kept attention output: on the GPU, or in host buffers reused every step (its
    region of the pinned pool, else its own)."""

    def __init__(self, on_host: bool, key=None):
        self.on_host, self.key = on_host, key  # key: the layer index (its region of the pool)
        self.kept = None  # (out, saved tensors, meta) on the GPU, or the host copies' event
        self._bufs = None  # the host tensors the kept ones are copied into (on_host)
        self._own: list = []  # _HostBuffer of the slot's own (when no pool region takes them)
        self._shapes = None
        self._event = None

    def _host_buffers(self, tensors) -> Optional[list]:
        """This slot's host tensors for `tensors`: carved from its pool region, else its own
        registered buffers (on a GPU), else None (CPU without a pool: clones)."""
        region = pool().region(attention_cache_key(self.key)) if self.key is not None else None
        views = carve(region, tensors) if region is not None else None
        if views is not None:
            return views
        if region is not None:
            log.warning(
                "attention cache: layer %s keeps %.3f GB, more than its pool region (%.3f GB): "
                "buffers of its own, registered now",
                self.key,
                sum(t.numel() * t.element_size() for t in tensors) / 1e9,
                region.numel() / 1e9,
            )
        if not tensors[0].is_cuda:
            return None
        self._own = [_HostBuffer(t) for t in tensors]
        return [b.tensor for b in self._own]

    def keep(self, value) -> None:
        out, saved, meta = value
        if not self.on_host:
            self.kept = value
            return
        tensors = (out, *saved)
        shapes = [(t.shape, t.dtype) for t in tensors]
        if self._shapes != shapes:
            self._release_own()
            self._bufs, self._shapes = self._host_buffers(tensors), shapes
        if (
            not out.is_cuda
        ):  # CPU (tests): copied into the pool region, or cloned; the mechanism is the same
            if self._bufs is None:
                self.kept = ("host", [t.clone() for t in tensors], meta)
                return
            for buf, t in zip(self._bufs, tensors):
                buf.copy_(t)
            self._event = None
            self.kept = ("host", [t.device for t in tensors], meta)
            return
        side = _side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for buf, t in zip(self._bufs, tensors):
                buf.copy_(t, non_blocking=True)
                t.record_stream(
                    side
                )  # the GPU copy may be freed once the side stream is done with it
        self._event = torch.cuda.Event()
        self._event.record(side)
        self.kept = ("host", [t.device for t in tensors], meta)

    def take(self):
        value, self.kept = self.kept, None
        if value is None or not self.on_host:
            return value
        _, devices, meta = value
        if not isinstance(devices[0], torch.device):  # the CPU clones
            return devices[0], tuple(devices[1:]), meta
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)
        # to the device (a copy); a tensor that lives on the CPU is cloned, never handed out as the
        # reused buffer
        out, *saved = [
            buf.to(dev, non_blocking=True) if dev.type != "cpu" else buf.clone()
            for buf, dev in zip(self._bufs, devices)
        ]
        return out, tuple(saved), meta

    def clear(self) -> None:
        self.kept = None

    def _release_own(self) -> None:
        for buf in self._own:
            buf.release()
        self._own = []

    def release(self) -> None:
        self._release_own()
        self._bufs, self._shapes = None, None


_SIDE: dict = {}


def _side_stream() -> torch.cuda.Stream:
    dev = torch.cuda.current_device()
    if dev not in _SIDE:
        _SIDE[dev] = torch.cuda.Stream()
    return _SIDE[dev]


_SLOT_ATTR = "_ds_longctx_attention_slot"


def attention_module(layer):
    """A decoder layer's attention module (transformers' `self_attn`), which the attention function
    is called with."""
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        raise ValueError(
            f"{type(layer).__name__} has no `self_attn` (a linear-attention layer has none): the "
            "attention cache keeps a softmax-attention layer's output; cache full-attention "
            "layers only"
        )
    return attn


def attach(layer, on_host: bool, key=None) -> None:
    """Give `layer` a slot (placement_apply.apply_placement calls this for cache / cache+offload
    layers; `key`: the layer's index, whose region of the pinned pool an on-host slot uses when one
    is reserved)."""
    detach(layer)
    setattr(attention_module(layer), _SLOT_ATTR, Slot(on_host, key))
    ulysses.set_slot_lookup(
        slot_of
    )  # the attention function asks `slot_of` for every layer from now on


def detach(layer) -> None:
    """Take `layer`'s slot away (a layer without softmax attention has none)."""
    slot = (
        getattr(layer, "self_attn", None).__dict__.pop(_SLOT_ATTR, None)
        if hasattr(layer, "self_attn")
        else None
    )
    if slot is not None:
        slot.release()


def slot_of(module) -> Optional[Slot]:
    """The slot the attention function uses for attention module `module`: None if its layer does
    not cache or it is not training (an eval forward has no recompute)."""
    return getattr(module, _SLOT_ATTR, None) if getattr(module, "training", False) else None


def layer_slot(layer) -> Optional[Slot]:
    """`layer`'s slot whatever the mode (placement_apply.applied_placement reads it back); None for
    a layer without softmax attention."""
    return getattr(getattr(layer, "self_attn", None), _SLOT_ATTR, None)


def new_step(layers) -> None:
    """Empty every slot before a step's forward: an output kept by a step that never ran its
    backward is never handed to another."""
    for layer in layers:
        slot = layer_slot(layer)
        if slot is not None:
            slot.clear()


def kept_bytes(layers) -> int:
    """GPU bytes the slots of `layers` hold now."""
    total = 0
    for layer in layers:
        slot = layer_slot(layer)
        if slot is not None and slot.kept is not None and not slot.on_host:
            out, saved, _ = slot.kept
            total += sum(t.numel() * t.element_size() for t in (out, *saved))
    return total
