"""Tiled layer: a decoder layer's token-wise work in sequence tiles; only attention sees the whole
slice.

Design notes: docs/design/levers.md, section `tiled_layer.py`.
"""

from __future__ import annotations

# transformers' modules are imported where a model is patched, not at import.
import copy
import importlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ds_longctx.levers.tiled_mlp import TiledRows, _check_tile_tokens, _gathered, restore_forwards
from ds_longctx.parallel.patching import own_forward

log = logging.getLogger("ds_longctx")

_PATCH_ATTR = "_ds_longctx_tiled_layer"
_CACHE_KWARGS = ("cache", "past_key_value", "past_key_values")
_NO_ATTENTION_KWARGS = (
    "position_embeddings",
    "use_cache",
    "output_attentions",
    "cache_position",
) + _CACHE_KWARGS


@dataclass(frozen=True)
class _Saved:
    """The instance-level forwards apply_tiled_layer replaced on one layer (`MISSING`: the
    class's)."""

    forwards: tuple  # ((module, previous instance forward or MISSING), ...)
    tile_tokens: int


def _plain_linear(m) -> bool:
    return (
        isinstance(m, nn.Linear)
        and type(m).forward is nn.Linear.forward
        and "forward" not in m.__dict__
        and not getattr(m, "_z3_leaf", False)
    )


def layer_parts(layer: nn.Module) -> dict:
    """The modules the tiles compute from, or ValueError naming what is missing (the layer is not
    supported)."""
    name = type(layer).__name__
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    need = {
        "input_layernorm": getattr(layer, "input_layernorm", None),
        "post_attention_layernorm": getattr(layer, "post_attention_layernorm", None),
        "self_attn": attn,
        "mlp": mlp,
    }
    missing = [k for k, v in need.items() if not isinstance(v, nn.Module)]
    if missing:
        raise ValueError(
            f"tiled_layer: {name} has no {', '.join(missing)}; it supports pre-norm decoder layers "
            f"(Qwen3, Qwen2, Llama, Mistral); set memory.tiled_layer: false (tiled_mlp still works)"
        )
    # the tiles reproduce the pre-norm layer `h = x + attn(norm1(x)); y = h + mlp(norm2(h))`; a
    # layer with other modules (Gemma's pre/post-feedforward norms, a cross-attention) computes
    # something else: refused
    extra = sorted(set(dict(layer.named_children())) - set(need))
    if extra:
        raise ValueError(
            f"tiled_layer: {name} has {', '.join(extra)} besides {', '.join(need)}; the tiles "
            "reproduce "
            f"the pre-norm layer x + attn(norm(x)), then + mlp(norm(.)) only (Qwen3, Qwen2, Llama, "
            f"Mistral); set memory.tiled_layer: false"
        )
    if isinstance(getattr(mlp, "experts", None), nn.Module):
        raise ValueError(
            f"tiled_layer: {name}'s MLP is a mixture of experts ({type(mlp).__name__}); the tiled "
            "layer "
            "tiles gated MLPs only. Set memory.tiled_layer: false and memory.tiled_mlp: true (it "
            f"tiles the sparse block: router, experts and combine per tile)"
        )
    projs = {p: getattr(attn, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    mlps = {p: getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")}
    odd = [f"self_attn.{p}" for p, m in projs.items() if not _plain_linear(m)] + [
        f"mlp.{p}" for p, m in mlps.items() if not _plain_linear(m)
    ]
    if odd:
        raise ValueError(
            f"tiled_layer: {name}'s {', '.join(odd)} are not plain nn.Linear (LoRA adapters or "
            "another "
            f"layer type); the tiles compute from the weights. Set memory.tiled_layer: false"
        )
    act = getattr(mlp, "act_fn", None)
    if not callable(act) or (isinstance(act, nn.Module) and any(True for _ in act.parameters())):
        raise ValueError(
            f"tiled_layer: {name}'s mlp.act_fn is {act!r}; a parameter-free activation is needed"
        )
    modeling = importlib.import_module(type(layer).__module__)
    if not callable(getattr(modeling, "apply_rotary_pos_emb", None)):
        raise ValueError(
            f"tiled_layer: {type(layer).__module__} has no apply_rotary_pos_emb; set "
            f"memory.tiled_layer: false"
        )
    head_dim = getattr(attn, "head_dim", None)
    if not isinstance(head_dim, int):
        raise ValueError(f"tiled_layer: {name}.self_attn has no integer head_dim")
    return dict(
        need,
        **projs,
        **mlps,
        act=act,
        modeling=modeling,
        head_dim=head_dim,
        q_norm=getattr(attn, "q_norm", None),
        k_norm=getattr(attn, "k_norm", None),
    )


def check_tiled_layer(model_cls, hf_config) -> int:
    """`layer_parts` for every decoder layer of a meta-device instance (nothing allocated): the
    engine's check before any work (run/preflight.validate). Returns how many layers; raises
    ValueError."""
    with torch.device("meta"):
        model = model_cls(copy.deepcopy(hf_config))
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(
            f"tiled_layer: {model_cls.__name__} has no decoder layers (transformers' "
            f"GradientCheckpointingLayer); set memory.tiled_layer: false"
        )
    for layer in layers:
        layer_parts(layer)
    return len(layers)


def _params(*modules) -> tuple:
    seen, out = set(), []
    for m in modules:
        if m is None:
            continue
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return tuple(out)


def _pre_tile_fn(parts: dict, norm_fn: Callable) -> Callable:
    """One tile of x -> norm -> q/k/v -> q/k norms -> rotary: (q [t, hq·d], k [t, hkv·d], v [t,
    hkv·d])."""
    qp, kp, vp, d, modeling = (
        parts["q_proj"],
        parts["k_proj"],
        parts["v_proj"],
        parts["head_dim"],
        parts["modeling"],
    )
    q_norm, k_norm = parts["q_norm"], parts["k_norm"]
    q_norm_fn = q_norm.forward if q_norm is not None else None
    k_norm_fn = k_norm.forward if k_norm is not None else None

    def tile(x, cos, sin):  # [t, H], [t, d], [t, d]
        t = x.shape[0]
        h = norm_fn(x)  # [t, H]
        q = F.linear(h, qp.weight, qp.bias).view(1, t, -1, d)  # [1, t, hq, d]
        k = F.linear(h, kp.weight, kp.bias).view(1, t, -1, d)  # [1, t, hkv, d]
        v = F.linear(h, vp.weight, vp.bias)  # [t, hkv·d]
        if q_norm_fn is not None:
            q = q_norm_fn(q)
        if k_norm_fn is not None:
            k = k_norm_fn(k)
        # the modeling module's rotary, looked up now (fused_ops may have routed it to a fused
        # kernel)
        q, k = modeling.apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None]
        )
        return (
            q.transpose(1, 2).reshape(t, -1),
            k.transpose(1, 2).reshape(t, -1),
            v,
        )  # [t, hq·d], [t, hkv·d] x 2

    return tile


def _mlp_tile_fn(parts: dict, norm_fn: Callable) -> Callable:
    """One tile of h -> post_attention_layernorm -> gated MLP."""
    gate, up, down, act = parts["gate_proj"], parts["up_proj"], parts["down_proj"], parts["act"]
    act = act.forward if isinstance(act, nn.Module) else act

    def tile(h):  # [t, H] -> [t, H]
        y = norm_fn(h)
        return F.linear(
            act(F.linear(y, gate.weight, gate.bias)) * F.linear(y, up.weight, up.bias),
            down.weight,
            down.bias,
        )

    return tile


def _attention_interface(attn: nn.Module, modeling):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = attn.config._attn_implementation
    eager = getattr(modeling, "eager_attention_forward", None)
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):
        return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)
    return eager if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]


def _passthrough(x, *args, **kwargs):
    return x


def _attn_forward(parts: dict, tile_tokens: int, norm_fn: Callable) -> Callable:
    attn, d, modeling = parts["self_attn"], parts["head_dim"], parts["modeling"]
    pre_params = _params(
        parts["input_layernorm"],
        parts["q_proj"],
        parts["k_proj"],
        parts["v_proj"],
        parts["q_norm"],
        parts["k_norm"],
    )
    pre = _pre_tile_fn(parts, norm_fn)

    def forward(hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        if args:
            raise TypeError(
                f"tiled_layer: {type(attn).__name__}.forward got {len(args)} unexpected positional "
                f"arguments"
            )
        if any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
            raise RuntimeError(
                "tiled_layer is for training: a KV cache was passed; remove_tiled_layer(model) "
                "before generating"
            )
        if position_embeddings is None:
            raise ValueError("tiled_layer: the attention got no position_embeddings (cos, sin)")
        b, s, hidden = hidden_states.shape
        cos, sin = position_embeddings  # [b or 1, s, d]
        cos = cos.expand(b, s, cos.shape[-1]).reshape(b * s, -1)  # [n, d] (a view when b = 1)
        sin = sin.expand(b, s, sin.shape[-1]).reshape(b * s, -1)
        x = hidden_states.reshape(b * s, hidden)  # [n, H]
        qkv = TiledRows.apply(
            pre, pre_params, tile_tokens, lambda: _gathered(pre_params), x, cos, sin
        )
        q, k, v = (z.view(b, s, -1, d).transpose(1, 2) for z in qkv)  # [n, h·d] -> [b, h, s, d]
        extra = {"sliding_window": attn.sliding_window} if hasattr(attn, "sliding_window") else {}
        rest = {k: v for k, v in kwargs.items() if k not in _NO_ATTENTION_KWARGS}
        out, weights = _attention_interface(attn, modeling)(
            attn,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not attn.training else attn.attention_dropout,
            scaling=attn.scaling,
            **extra,
            **rest,
        )
        out = out.reshape(b, s, -1).contiguous()  # [b, s, hq·d]
        return attn.o_proj(out), weights

    return forward


def _mlp_forward(parts: dict, tile_tokens: int, norm_fn: Callable) -> Callable:
    params = _params(
        parts["post_attention_layernorm"], parts["gate_proj"], parts["up_proj"], parts["down_proj"]
    )
    tile = _mlp_tile_fn(parts, norm_fn)

    def forward(h):
        lead, hidden = h.shape[:-1], h.shape[-1]
        y = TiledRows.apply(
            tile, params, tile_tokens, lambda: _gathered(params), h.reshape(-1, hidden)
        )
        return y.reshape(*lead, y.shape[-1])

    return forward


def _decoder_layers(model: nn.Module) -> list:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_tiled_layer(model: nn.Module, tile_tokens: int) -> int:
    """Tile every decoder layer's token-wise work (module doc); returns how many layers. More:
    docs/design/levers.md."""
    _check_tile_tokens(tile_tokens)
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(
            f"tiled_layer: {type(model).__name__} has no decoder layers (transformers' "
            f"GradientCheckpointingLayer); set memory.tiled_layer: false"
        )
    if any(_PATCH_ATTR in layer.__dict__ for layer in layers):
        raise RuntimeError("tiled_layer is already applied; call remove_tiled_layer(model) first")
    all_parts = [layer_parts(layer) for layer in layers]
    for layer, parts in zip(layers, all_parts):
        norm1, norm2 = parts["input_layernorm"], parts["post_attention_layernorm"]
        attn, mlp = parts["self_attn"], parts["mlp"]
        # the norms' current forwards (fused_ops may have set them) are what the tiles call
        norm1_fn, norm2_fn = norm1.forward, norm2.forward
        saved = _Saved(tuple((m, own_forward(m)) for m in (norm1, norm2, attn, mlp)), tile_tokens)
        layer.__dict__[_PATCH_ATTR] = saved
        norm1.forward = _passthrough
        norm2.forward = _passthrough
        attn.forward = _attn_forward(parts, tile_tokens, norm1_fn)
        mlp.forward = _mlp_forward(parts, tile_tokens, norm2_fn)
    log.info(
        "tiled layer: %d decoder layers of %s run norms, projections, rotary and MLP in tiles of "
        "%d tokens",
        len(layers),
        type(model).__name__,
        tile_tokens,
    )
    return len(layers)


def remove_tiled_layer(model: nn.Module) -> int:
    """Restore every forward apply_tiled_layer replaced; returns how many layers (0 if none)."""
    return restore_forwards(model, _PATCH_ATTR)
