"""Attention cache: a layer keeps its attention output + LSE from the forward, so the checkpoint recompute skips attention.

With activation checkpointing every decoder layer runs its forward twice: once in the forward pass (keeping
only its input) and again in backward, to rebuild what backward needs. At long lengths attention dominates
that recompute: Qwen3-8B at 131,072 tokens spends ~72% of its model FLOPs in attention, so the second
attention forward is ~1/4 of all attention work in a step. Its backward needs only q, k, v (cheap to rebuild:
projections, norms, RoPE, the all-to-all) and the kernel's output and log-sum-exp.

How. Attention runs through our own autograd Function around a kernel pair (parallel/attention.py: a forward that
returns the LSE and a backward that takes it). For a cached layer the Ulysses attention function hands that
Function this layer's `Slot`: the first call of a step (the forward, under whichever checkpoint the placement
gave the layer, torch's or DeepSpeed's) runs the kernel and keeps (out, LSE, ...) in the slot; the second call
(the recompute, inside backward) takes them instead of running the kernel. The cache is independent of how the
layer's checkpoint is kept, so it composes with offloaded checkpoints.

Where the kept tensors live (the placement plan, levers/placement.py): `cache` layers keep them on the GPU (per
cached layer S·(hq/sp)·d·2 + (hq/sp)·S·4 bytes per GPU: the size of one more layer checkpoint for Qwen3-8B);
`cache+offload` layers copy them to pinned host memory on a side stream as soon as the forward made them and
back when the recompute asks (a layer's output at 524,288 tokens, SP=2, is 2.1 GB: ~40 ms each way at the
55 GB/s of pinned copies, against seconds of that layer's backward). Host buffers are exact-size pinned memory
(pageable memory registered with cudaHostRegister: no power-of-two rounding), allocated at a layer's first
forward and reused every step.

A step that ends without its backward (an exception, an eval forward) leaves slots full; `new_step()` (the
engine calls it before every forward) empties them, so a stale output is never handed to another step.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

log = logging.getLogger("ds_longctx")


class _HostBuffer:
    """Exact-size pinned host memory for one tensor: a pageable allocation registered with CUDA."""

    def __init__(self, like: torch.Tensor):
        self.tensor = torch.empty(like.shape, dtype=like.dtype, device="cpu")
        nbytes = self.tensor.numel() * self.tensor.element_size()
        err = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed ({err}): not enough pinnable host memory "
                               f"for the offloaded attention cache; use placement 'cache' or 'keep' for some layers")
        self.registered = True

    def release(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.registered = False


class Slot:
    """One layer's kept attention output: on the GPU, or in host buffers reused every step."""

    def __init__(self, on_host: bool):
        self.on_host = on_host
        self.kept = None          # (out, saved tensors, meta) on the GPU, or the host copies' event
        self._host: list = []     # _HostBuffer per tensor (on_host)
        self._shapes = None
        self._event = None

    def keep(self, value) -> None:
        out, saved, meta = value
        if not self.on_host:
            self.kept = value
            return
        tensors = (out, *saved)
        if not out.is_cuda:  # CPU (tests): the "host" copy is a clone; the mechanism is the same
            self.kept = ("host", [t.clone() for t in tensors], meta)
            return
        shapes = [(t.shape, t.dtype) for t in tensors]
        if self._shapes != shapes:
            for buf in self._host:
                buf.release()
            self._host, self._shapes = [_HostBuffer(t) for t in tensors], shapes
        side = _side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for buf, t in zip(self._host, tensors):
                buf.tensor.copy_(t, non_blocking=True)
                t.record_stream(side)  # the GPU copy may be freed once the side stream is done with it
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
        torch.cuda.current_stream().wait_event(self._event)
        out, *saved = [buf.tensor.to(dev, non_blocking=True) for buf, dev in zip(self._host, devices)]
        return out, tuple(saved), meta

    def clear(self) -> None:
        self.kept = None

    def release(self) -> None:
        for buf in self._host:
            buf.release()
        self._host, self._shapes = [], None


_SIDE: dict = {}


def _side_stream() -> torch.cuda.Stream:
    dev = torch.cuda.current_device()
    if dev not in _SIDE:
        _SIDE[dev] = torch.cuda.Stream()
    return _SIDE[dev]


_SLOT_ATTR = "_ds_longctx_attention_slot"


def attention_module(layer):
    """A decoder layer's attention module (transformers' `self_attn`), which the attention function is called with."""
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        raise ValueError(f"{type(layer).__name__} has no `self_attn`; the attention cache needs transformers' "
                         f"decoder-layer layout")
    return attn


def attach(layer, on_host: bool) -> None:
    """Give `layer` a slot (placement.apply_placement calls this for cache / cache+offload layers)."""
    detach(layer)
    setattr(attention_module(layer), _SLOT_ATTR, Slot(on_host))


def detach(layer) -> None:
    slot = attention_module(layer).__dict__.pop(_SLOT_ATTR, None)
    if slot is not None:
        slot.release()


def slot_of(module) -> Optional[Slot]:
    """The slot the attention function uses for attention module `module`: None if its layer does not cache or it
    is not training (an eval forward has no recompute)."""
    return getattr(module, _SLOT_ATTR, None) if getattr(module, "training", False) else None


def layer_slot(layer) -> Optional[Slot]:
    """`layer`'s slot whatever the mode (placement.applied_placement reads it back)."""
    return getattr(attention_module(layer), _SLOT_ATTR, None)


def new_step(layers) -> None:
    """Empty every slot before a step's forward: an output kept by a step that never ran its backward is never
    handed to another."""
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
