"""CPU activation offload: `offload` layers' checkpoint function and our exact-size pinned pool.

Design notes: docs/design/levers.md, section `offload.py`.
"""

from __future__ import annotations

# torch and deepspeed are imported lazily: `ds-longctx plan` imports this module without them.
import logging
import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ds_longctx")


def activation_checkpointing_block(offload: bool, on_gpu: bool) -> dict:
    """The DeepSpeed JSON `activation_checkpointing` block (`offload`: some layer's checkpoint goes
    to the host)."""
    return {
        "partition_activations": False,
        "cpu_checkpointing": bool(offload and on_gpu),
        "contiguous_memory_optimization": False,
        "number_checkpoints": None,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def offload_checkpoint_function(ds_config: dict) -> Callable:
    """DeepSpeed's checkpoint, configured from `ds_config`'s activation_checkpointing block: the
    `_gradient_checkpointing_func` of an `offload` layer (placement_apply.apply_placement sets
    it)."""
    import deepspeed

    deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
    log.info(
        "activation offload through deepspeed.checkpointing (cpu_checkpointing=%s)",
        ds_config.get("activation_checkpointing", {}).get("cpu_checkpointing"),
    )
    return deepspeed.checkpointing.checkpoint


# ----------------------------------------------------------------------------- our own pinned pool
ALIGN = 512  # bytes: start of each pool region and carved tensor (any dtype views from it)


class PinnedPool:
    """Exact-size pinned host memory for offloaded checkpoints and offloaded attention caches.

    Notes: docs/design/levers.md, `offload.py`.
    """

    def __init__(self):
        self._reserved: dict = {}  # key -> its slice of the block
        self._own: dict = {}  # key -> a slot of its own (a shape other than reserved)
        self._regions: dict = {}  # key -> its byte region of the block (attention caches)
        self._block = None  # the reserved allocation (bytes), registered as one
        self._pinned: set = set()  # ids of the buffers this pool registered with CUDA
        self._planned = None  # (keys, shape, dtype, pin, regions): the reservation to make
        self.registered_bytes = 0

    def plan(self, keys, shape: tuple, dtype, pin: bool, regions: dict | None = None) -> int:
        """Remember the reservation to make (`reserve_planned`); returns its bytes."""
        self._planned = (list(keys), tuple(shape), dtype, pin, dict(regions or {}))
        return self.planned_bytes()

    def planned_bytes(self) -> int:
        """The bytes of the planned reservation (0 if none is planned)."""
        if self._planned is None:
            return 0
        keys, shape, dtype, _, regions = self._planned
        return self._layout(keys, shape, dtype, regions)[0]

    def _layout(self, keys, shape, dtype, regions) -> tuple:
        """(total bytes, bytes per slot, {region key: (offset, bytes)}): the slots first, then each
        region aligned."""
        import torch

        per = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        off, where = len(keys) * per, {}
        for key, nbytes in regions.items():
            off = -(-off // ALIGN) * ALIGN
            where[key] = (off, int(nbytes))
            off += int(nbytes)
        return off, per, where

    def reserve_planned(self) -> int:
        """Make the planned reservation now (once); returns its bytes (0 if none was planned)."""
        return self.reserve(*self._planned) if self._planned else 0  # reserve() clears the plan

    @property
    def _slots(self) -> dict:
        """The slot each key uses now: its own if it has one, else its slice of the block."""
        return {**self._reserved, **self._own}

    def reserve(self, keys, shape: tuple, dtype, pin: bool, regions: dict | None = None) -> int:
        """One exact-size allocation of len(keys) slots of `shape`/`dtype` (slot i = keys[i]) and
        one byte region per `regions` entry (key -> bytes), registered with CUDA when `pin`;
        replaces whatever the pool held. Returns its bytes."""
        import torch

        self.release()
        self._planned = None
        keys, regions = list(keys), dict(regions or {})
        total, per, where = self._layout(keys, shape, dtype, regions)
        if not total:
            return 0
        block = torch.empty(total, dtype=torch.uint8, device="cpu")
        if pin:
            what = [f"{len(keys)} offloaded checkpoints of {tuple(shape)}"] if keys else []
            what += [f"{len(regions)} offloaded attention caches"] if regions else []
            self._register(block, " and ".join(what))
        self._block = block
        self._reserved = {
            key: block[i * per : (i + 1) * per].view(dtype).view(shape)
            for i, key in enumerate(keys)
        }
        self._regions = {key: block[o : o + n] for key, (o, n) in where.items()}
        return total

    def holds(self, key) -> bool:
        """Whether `key`'s slot or region is in the block reserved (at build, or at first use)."""
        return key in self._reserved or key in self._regions

    def region(self, key):
        """The byte region reserved for `key` (a uint8 tensor), or None; makes a planned reservation
        first (the HF Trainer path)."""
        if self._planned is not None and key in self._planned[4]:
            self.reserve_planned()
        return self._regions.get(key)

    def slot(self, key, like: "torch.Tensor") -> "torch.Tensor":
        import torch

        # not made at build (the HF Trainer path): make it now if this is its shape
        if self._planned is not None:
            _, shape, dtype, _, _ = self._planned
            if tuple(like.shape) == shape and like.dtype == dtype:
                self.reserve_planned()
            else:  # a block of another shape would sit beside per-layer slots: keep only the slots
                log.warning(
                    "pinned pool: planned for %s %s, the first offloaded input is %s %s: one slot "
                    "per layer instead",
                    list(shape),
                    dtype,
                    list(like.shape),
                    like.dtype,
                )
                self._planned = None

        def fits(buf) -> bool:
            return buf is not None and buf.shape == like.shape and buf.dtype == like.dtype

        if fits(self._reserved.get(key)):
            self._drop_own(key)
            return self._reserved[key]
        if fits(self._own.get(key)):
            return self._own[key]
        self._drop_own(key)
        buf = torch.empty(like.shape, dtype=like.dtype, device="cpu")
        if like.is_cuda:
            self._register(buf, f"the offloaded checkpoint of {tuple(like.shape)}")
        self._own[key] = buf
        return buf

    def _register(self, buf: "torch.Tensor", what: str) -> None:
        import torch

        nbytes = buf.numel() * buf.element_size()
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(
                f"cudaHostRegister of {nbytes / 1e9:.2f} GB for {what} failed ({err}): not enough "
                "pinnable host memory; offload fewer layers (plan with a larger --gpu_mem_gb "
                f"share on the GPU, or more host RAM)"
            )
        self._pinned.add(id(buf))
        self.registered_bytes += nbytes

    def _unregister(self, buf) -> None:
        if buf is not None and id(buf) in self._pinned:
            import torch

            torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
            self._pinned.discard(id(buf))
            self.registered_bytes -= buf.numel() * buf.element_size()

    def _drop_own(self, key) -> None:
        self._unregister(self._own.pop(key, None))

    def release(self) -> None:
        """Give everything back (unregister what was registered)."""
        for key in list(self._own):
            self._drop_own(key)
        self._unregister(self._block)
        self._block, self._reserved, self._regions = None, {}, {}


def plan_pool(
    layer_indices,
    micro_batch: int,
    local_tokens: int,
    hidden: int,
    dtype,
    pin: bool,
    cache_regions: dict | None = None,
) -> int:
    """The engine's pool: one slot per pool-offloaded layer for its input [b, s/sp, H], and one byte
    region per `cache+offload` layer (`cache_regions`: layer index -> bytes, `cache_region_bytes`),
    made by `reserve_pool`."""
    regions = {attention_cache_key(i): n for i, n in (cache_regions or {}).items()}
    return _POOL.plan(layer_indices, (micro_batch, local_tokens, hidden), dtype, pin, regions)


def cache_region_bytes(
    micro_batch: int, seq_len: int, local_heads: int, head_dim: int, elem_bytes: int
) -> int:
    """Pool bytes for one `cache+offload` layer (the engine's region, the planner's host term).
    More: docs/design/levers.md."""
    return (
        micro_batch * seq_len * local_heads * head_dim * elem_bytes
        + micro_batch * local_heads * (seq_len + 128) * 4
        + 64 * 1024
    )


def attention_cache_key(layer_index: int) -> tuple:
    """The pool key of a layer's offloaded attention cache (its checkpoint's: the bare index)."""
    return ("attention", layer_index)


def reserve_pool() -> int:
    """Make the planned pool now (the engine, after deepspeed.initialize); returns its bytes."""
    planned = _POOL._planned
    # one cudaHostRegister of the whole block: minutes for hundreds of GB, no progress
    if planned and planned[3]:
        log.info(
            "pinned pool: allocating and registering %.2f GB of host memory with CUDA (one call; "
            "at a few GB/s this can take minutes)",
            _POOL.planned_bytes() / 1e9,
        )
    n = _POOL.reserve_planned()
    if n:
        keys, shape, dtype, pin, regions = planned
        dtype_name = str(dtype).replace("torch.", "")
        what = [f"{len(keys)} offloaded checkpoints of {list(shape)} {dtype_name}"] if keys else []
        what += [f"{len(regions)} offloaded attention caches"] if regions else []
        log.info(
            "pinned pool: %s in one exact-size %s allocation (%.2f GB)",
            " and ".join(what),
            "pinned" if pin else "host",
            n / 1e9,
        )
    return n


_POOL = PinnedPool()


def pool_checkpoint_function(layer_index: int) -> Callable:
    """The `_gradient_checkpointing_func` of an offloaded layer with our own pool
    (memory.pinned_pool). More: docs/design/levers.md."""
    checkpoint = store_checkpoint_function(_POOL_STORE, layer_index)
    # placement_apply.applied_placement reads a layer's offload back by this
    checkpoint.pinned_pool = True
    return checkpoint


def store_checkpoint_function(store, key) -> Callable:
    """A checkpoint function keeping the layer input in `store` (`put(key, hidden) -> handle` after
    the forward, `get(handle) -> hidden` before the recompute): the pinned pool's, or the disk
    tier's (levers/disk_tier.py)."""

    def checkpoint(function, *args, **kwargs):
        import torch

        kwargs.pop("use_reentrant", None)
        if kwargs:
            raise ValueError(
                "pool offload takes the layer function and positional tensors, got kwargs "
                f"{list(kwargs)}"
            )
        if not torch.is_grad_enabled():  # no backward will come for it: nothing to keep
            return function(*args)
        return _PooledCheckpoint.apply(function, store, key, *args)

    return checkpoint


class _PoolStore:
    """The pinned pool as a checkpoint store: a slot per key, filled on a side stream on CUDA."""

    @staticmethod
    def put(key, hidden):
        host = _POOL.slot(key, hidden)
        if not hidden.is_cuda:
            host.copy_(hidden)
            return host, None, hidden.device
        return host, copy_to_host(host, hidden), hidden.device

    @staticmethod
    def get(handle):
        import torch

        host, event, device = handle
        if event is None:
            return host.clone()
        torch.cuda.current_stream().wait_event(event)
        return host.to(device, non_blocking=True)


_POOL_STORE = _PoolStore()


def pool() -> PinnedPool:
    """This process's pool (tests read its slots)."""
    return _POOL


def copy_to_host(host, gpu):
    """Start copying the CUDA tensor `gpu` into the pinned `host` on this device's side stream,
    after the work queued so far (the compute stream goes on beside it); `gpu`'s storage is held
    until the copy ends. Returns the event that marks its end (the pinned pool's and the disk
    tier's)."""
    import torch

    dev = torch.cuda.current_device()
    if dev not in _STREAMS:
        _STREAMS[dev] = torch.cuda.Stream()
    side = _STREAMS[dev]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        host.copy_(gpu, non_blocking=True)
        gpu.record_stream(side)
    event = torch.cuda.Event()
    event.record(side)
    return event


_STREAMS: dict = {}


class _PooledCheckpoint:
    """Built lazily (torch is imported only when an offloaded layer runs)."""

    _fn = None

    @classmethod
    def apply(cls, function, store, key, *args):
        if cls._fn is None:
            cls._fn = _make_function()
        return cls._fn.apply(function, store, key, *args)


def _make_function():
    import torch

    class PooledCheckpoint(torch.autograd.Function):
        @staticmethod
        def forward(ctx, function, store, key, *args):
            ctx.function, ctx.store = function, store
            ctx.grad_mask = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
            with torch.no_grad():
                outputs = function(*args)
            # the layer input: the one tensor worth offloading (others are small: cos/sin, ids)
            ctx.handle = store.put(key, args[0])
            ctx.rest = args[1:]
            return outputs

        @staticmethod
        def backward(ctx, *grads):
            inputs = [ctx.store.get(ctx.handle), *ctx.rest]
            ctx.handle = None
            inputs = [
                t.detach().requires_grad_(need) if isinstance(t, torch.Tensor) else t
                for t, need in zip(inputs, ctx.grad_mask)
            ]
            with torch.enable_grad():
                outputs = ctx.function(*inputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            pairs = [
                (o, g)
                for o, g in zip(outputs, grads)
                if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
            ]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            grads_in = [
                t.grad if isinstance(t, torch.Tensor) and need else None
                for t, need in zip(inputs, ctx.grad_mask)
            ]
            return (None, None, None, *grads_in)

    return PooledCheckpoint
