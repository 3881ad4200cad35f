"""Tiled MLP: the decoder MLP computed over sequence tiles, recomputed tile by tile in backward.

    n = apply_tiled_mlp(model, tile_tokens=8192)   # patches every decoder layer's mlp.forward
    remove_tiled_mlp(model)                        # restores the original forwards

Design notes: docs/design/levers.md, section `tiled_mlp.py`.
"""

from __future__ import annotations

# deepspeed is imported lazily, where ZeRO-3 params are gathered.
import contextlib
import logging
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ds_longctx.parallel.patching import MISSING, own_forward, restore_forward

log = logging.getLogger("ds_longctx")

_PATCH_ATTR = "_ds_longctx_tiled_mlp"
_GATED_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class _Patch:
    """What apply_tiled_mlp changed on one MLP module, so remove_tiled_mlp can undo it exactly."""

    instance_forward: (
        object  # mlp.__dict__["forward"] before patching, or MISSING (the class forward)
    )
    untiled: Callable  # the forward the tiles call (the bound original)
    tile_tokens: int


def _tile_bounds(n: int, tile_tokens: int) -> list[tuple[int, int]]:
    """Row ranges [start, stop) of the k = ceil(n / T) tiles; all of length T but the last."""
    return [(start, min(start + tile_tokens, n)) for start in range(0, n, tile_tokens)]


def _check_tile_tokens(tile_tokens) -> None:
    if not isinstance(tile_tokens, int) or isinstance(tile_tokens, bool) or tile_tokens < 1:
        raise ValueError(
            f"tile_tokens={tile_tokens!r} must be an int >= 1 (tokens per MLP tile); try 8192 "
            "(it need not divide the sequence length; the last tile is shorter)"
        )


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def _inflight(params: tuple) -> list[int]:
    """ds_ids of the ZeRO-3 params being prefetched by DeepSpeed's coordinator, which alone can wait
    on them."""
    zero = [p for p in params if hasattr(p, "ds_id")]
    if not zero:
        return []
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return [p.ds_id for p in zero if p.ds_status == ZeroParamStatus.INFLIGHT]


@contextlib.contextmanager
def _gathered(params: tuple):
    """Hold the ZeRO-3-partitioned ones among `params` gathered for the block; a no-op for other
    params.

    Notes: docs/design/levers.md, `tiled_mlp.py`.
    """
    zero = [p for p in params if hasattr(p, "ds_id")]
    if not zero:
        yield
        return
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

    inflight = _inflight(params)
    if inflight:  # tiled_mlp_forward sends such MLPs per tile; a backward cannot switch paths
        raise RuntimeError(
            f"tiled MLP: ZeRO-3 params ds_id={inflight} are being prefetched by DeepSpeed while "
            "the tiled MLP "
            "gathers them, which only its module hooks can wait on; DeepSpeed's fetch trace still "
            "lists this "
            "MLP's Linears. Re-run with tiled MLP applied before the first step, or turn it off"
        )
    partitioned = [p for p in zero if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    # modifier_rank=None: read-only; exit re-partitions and frees the gathered copies (every rank
    # alike)
    with GatheredParameters(partitioned, modifier_rank=None, enabled=bool(partitioned)):
        yield


class TiledRows(torch.autograd.Function):
    """y = fn(*xs) over row tiles of the inputs xs (each [n, ...], row i of y from row i of each);
    saves only the inputs and recomputes each tile in backward. The tiled MLP's one input is x;
    levers/tiled_layer.py's blocks take two or three (hidden rows, attention rows, rotary cos / sin
    rows). Inputs that need no grad (cos / sin) are only sliced. `fn` may return a tuple of [t, W_i]
    tiles (the q/k/v tiles): then the output is a tuple of [n, W_i] tensors, each with its own grad
    in backward (no joined grad buffer).

    `gathered()` is entered once around each pass's tile loop (forward; recompute + backward).
        y = TiledRows.apply(fn, params, tile_tokens, gathered, x0, x1, ...)
    """

    @staticmethod
    def forward(
        ctx,
        fn: Callable,
        params: tuple,
        tile_tokens: int,
        gathered: Callable[[], ContextManager],
        *xs: torch.Tensor,
    ):
        n = xs[0].shape[0]
        ctx.fn, ctx.params, ctx.tile_tokens, ctx.gathered = fn, params, tile_tokens, gathered
        ctx.autocast = _autocast_state(xs[0].device.type)
        ctx.save_for_backward(*xs)
        outs: Optional[list] = None
        with torch.no_grad(), gathered():
            for start, stop in _tile_bounds(n, tile_tokens):
                ys = fn(*(x[start:stop] for x in xs))  # [t, ...] -> [t, W] or ([t, W_i], ...)
                ctx.many = isinstance(ys, tuple)
                ys = ys if ctx.many else (ys,)
                if outs is None:  # dtype/width from fn itself (autocast)
                    outs = [y.new_empty((n, y.shape[-1])) for y in ys]  # [n, W_i]
                for out, y in zip(outs, ys):
                    out[start:stop] = y
        return tuple(outs) if ctx.many else outs[0]

    @staticmethod
    def backward(ctx, *grad_outs: torch.Tensor):
        xs = ctx.saved_tensors
        need = ctx.needs_input_grad[4:]
        grad_xs = [
            torch.empty_like(x) if nd else None for x, nd in zip(xs, need)
        ]  # every row written below
        wanted = [i for i, nd in enumerate(need) if nd]
        params = [p for p in ctx.params if p.requires_grad]
        sums: list[Optional[torch.Tensor]] = [None] * len(params)  # tiles 0..k-2, fp32 or wider
        tiles = _tile_bounds(xs[0].shape[0], ctx.tile_tokens)
        enabled, dtype = ctx.autocast
        with ctx.gathered():  # held until the last tile's reduce hooks have fired
            for i, (start, stop) in enumerate(tiles):
                x_tiles = [
                    x[start:stop].detach().requires_grad_(nd) for x, nd in zip(xs, need)
                ]  # [t, ...]
                with (
                    torch.enable_grad(),
                    torch.autocast(xs[0].device.type, dtype=dtype, enabled=enabled),
                ):
                    ys = ctx.fn(*x_tiles)  # [t, W] or ([t, W_i], ...)
                ys = ys if ctx.many else (ys,)
                # outputs autograd gave no grad (unused downstream) are left out
                y = [yy for yy, go in zip(ys, grad_outs) if go is not None]
                g = [go[start:stop] for go in grad_outs if go is not None]  # [t, W_i]
                if i < len(tiles) - 1:
                    # autograd.grad: no .grad accumulation, so no ZeRO/DDP hook fires for this tile
                    grads = torch.autograd.grad(
                        y, [x_tiles[j] for j in wanted] + params, g, allow_unused=True
                    )
                    tile_x_grads, grads = grads[: len(wanted)], grads[len(wanted) :]
                    for j, pg in enumerate(grads):
                        if pg is not None:
                            wide = torch.promote_types(pg.dtype, torch.float32)
                            sums[j] = pg.to(wide) if sums[j] is None else sums[j].add_(pg)
                else:
                    # the last tile accumulates for real; each param's hook adds the earlier tiles
                    # on the way in, so the post-accumulate (ZeRO reduce) hook fires once, with the
                    # whole grad
                    handles = [
                        p.register_hook(lambda pg, s=s: s.add_(pg).to(pg.dtype))
                        for p, s in zip(params, sums)
                        if s is not None
                    ]
                    try:
                        torch.autograd.backward(y, g)
                    finally:
                        for h in handles:
                            h.remove()
                    tile_x_grads = [x_tiles[j].grad for j in wanted]
                for j, tg in zip(wanted, tile_x_grads):
                    if tg is None:
                        grad_xs[j][start:stop].zero_()
                    else:
                        grad_xs[j][start:stop].copy_(tg)
        return (None, None, None, None, *grad_xs)


def _untiled_forward(mlp: nn.Module) -> Callable:
    patch = mlp.__dict__.get(_PATCH_ATTR)
    return patch.untiled if patch is not None else mlp.forward


def _gated_parts(mlp: nn.Module) -> Optional[tuple]:
    """(gate_proj, up_proj, down_proj, act) when the tiles can compute `mlp` from its weights, else
    None.

    Notes: docs/design/levers.md, `tiled_mlp.py`.
    """
    patch = mlp.__dict__.get(_PATCH_ATTR)
    if (patch.instance_forward if patch is not None else own_forward(mlp)) is not MISSING:
        return None
    parts = [getattr(mlp, name, None) for name in _GATED_MLP_PARTS]
    act = getattr(mlp, "act_fn", None)
    if not all(
        isinstance(m, nn.Linear)
        and type(m).forward is nn.Linear.forward
        and "forward" not in m.__dict__
        and not getattr(m, "_z3_leaf", False)
        for m in parts
    ):
        return None
    if not callable(act) or (isinstance(act, nn.Module) and "forward" in act.__dict__):
        return None
    if {id(p) for p in mlp.parameters()} != {id(p) for m in parts for p in m.parameters()}:
        return None  # act_fn or the MLP itself holds params the gated form would not use
    return (*parts, act.forward if isinstance(act, nn.Module) else act)


def _gated_tile_fn(gate: nn.Linear, up: nn.Linear, down: nn.Linear, act: Callable) -> Callable:
    """One tile of the gated MLP on the weight tensors (read at call time: the gathered ones under
    ZeRO-3)."""

    def tile(x: torch.Tensor) -> torch.Tensor:  # [t, H] -> [t, H_out]
        h = act(F.linear(x, gate.weight, gate.bias)) * F.linear(x, up.weight, up.bias)  # [t, I]
        return F.linear(h, down.weight, down.bias)

    return tile


def tiled_mlp_forward(mlp: nn.Module, x: torch.Tensor, tile_tokens: int) -> torch.Tensor:
    """`mlp(x)` computed over tiles of `tile_tokens` rows of the flattened [b*s, H] input.

    Notes: docs/design/levers.md, `tiled_mlp.py`.
    """
    _check_tile_tokens(tile_tokens)
    lead, hidden = x.shape[:-1], x.shape[-1]
    x_rows = x.reshape(-1, hidden)  # [b, s, H] -> [b*s, H]
    if x_rows.shape[0] <= tile_tokens:
        return _untiled_forward(mlp)(x)
    params = tuple(mlp.parameters())
    gated = _gated_parts(mlp)
    if gated is not None and not _inflight(params):
        # in flight (applied after DeepSpeed's trace was recorded): the per-tile path lets its hooks
        # wait
        fn, gathered = _gated_tile_fn(*gated), (lambda: _gathered(params))
    else:
        fn, gathered = _untiled_forward(mlp), contextlib.nullcontext
    y_rows = TiledRows.apply(fn, params, tile_tokens, gathered, x_rows)  # [b*s, H_out]
    return y_rows.reshape(*lead, y_rows.shape[-1])  # [b*s, H_out] -> [b, s, H_out]


def _decoder_mlps(model: nn.Module) -> list[nn.Module]:
    """Every `<layer>.mlp` that is a gated MLP (gate_proj, up_proj, down_proj), in module order."""
    return [
        m.mlp
        for m in model.modules()
        if isinstance(getattr(m, "mlp", None), nn.Module)
        and all(isinstance(getattr(m.mlp, part, None), nn.Module) for part in _GATED_MLP_PARTS)
    ]


def apply_tiled_mlp(model: nn.Module, tile_tokens: int, required: bool = True) -> int:
    """Patch every decoder layer's gated `mlp.forward` to run tiled; returns how many MLPs were
    patched.

    Notes: docs/design/levers.md, `tiled_mlp.py`.
    """
    _check_tile_tokens(tile_tokens)
    mlps = _decoder_mlps(model)
    if not mlps and not required:
        return 0
    if not mlps:
        raise ValueError(
            f"apply_tiled_mlp found no decoder-layer MLP in {type(model).__name__}: it looks for "
            "modules "
            f"named `mlp` with {'/'.join(_GATED_MLP_PARTS)} (Qwen3MLP, LlamaMLP, ...; MoE blocks: "
            "levers/moe.py). Other MLP shapes are not supported; turn tiled MLP off for this model"
        )
    patched = [m for m in mlps if _PATCH_ATTR in m.__dict__]
    if patched:
        raise RuntimeError(
            f"tiled MLP is already applied to {len(patched)} MLPs of {type(model).__name__} "
            f"(tile_tokens={patched[0].__dict__[_PATCH_ATTR].tile_tokens}); "
            "call remove_tiled_mlp(model) before applying it again"
        )
    for mlp in mlps:
        patch = _Patch(
            instance_forward=own_forward(mlp), untiled=mlp.forward, tile_tokens=tile_tokens
        )
        mlp.__dict__[_PATCH_ATTR] = patch

        def forward(x, _mlp=mlp, _t=tile_tokens):
            return tiled_mlp_forward(_mlp, x, _t)

        mlp.forward = forward
    log.info(
        "tiled MLP: %d MLPs of %s run in tiles of %d tokens",
        len(mlps),
        type(model).__name__,
        tile_tokens,
    )
    return len(mlps)


def restore_forwards(model: nn.Module, attr: str) -> int:
    """Undo a lever that kept, under `attr` of each module it patched, a record whose `forwards` are
    ((module, previous instance forward or MISSING), ...): every one put back; returns how many
    records."""
    restored = 0
    for owner in model.modules():
        patch = owner.__dict__.pop(attr, None)
        if patch is None:
            continue
        for m, prev in patch.forwards:
            restore_forward(m, prev)
        restored += 1
    return restored


def remove_tiled_mlp(model: nn.Module) -> int:
    """Restore the forwards apply_tiled_mlp replaced; returns how many were restored (0 if none)."""
    restored = 0
    for mlp in model.modules():
        patch = mlp.__dict__.pop(_PATCH_ATTR, None)
        if patch is None:
            continue
        restore_forward(mlp, patch.instance_forward)
        restored += 1
    return restored
