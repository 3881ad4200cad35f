"""Ulysses sequence parallelism around attention, plugged into transformers' attention interface.

Design notes: docs/design/parallel.md, section `ulysses.py`.
"""

from __future__ import annotations

# transformers is imported where the attention function is registered: the engine's checks import
# this module before any model exists.
import logging
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ds_longctx import families
from ds_longctx.parallel import attention, kernel_rules
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.shared_prefix import SharedLayout

ATTN_IMPLEMENTATION = "ds_longctx"
log = logging.getLogger("ds_longctx")


class _SeqAllToAll(torch.autograd.Function):
    """all_to_all_single over the SP group that moves the split from one dim to another.

    Notes: docs/design/parallel.md, `ulysses.py`.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (
            _all_to_all(grad.contiguous(), ctx.group, ctx.gather_dim, ctx.scatter_dim),
            None,
            None,
            None,
        )


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    sp = dist.get_world_size(group)
    shape = list(x.shape)
    if shape[scatter_dim] % sp:
        raise ValueError(
            f"dim {scatter_dim} of size {shape[scatter_dim]} is not divisible by sp={sp}"
        )
    # [.., S, ..] -> [sp, .., S/sp, ..]: chunk j of the scatter dim leads, goes to rank j
    chunks = x.reshape(
        shape[:scatter_dim] + [sp, shape[scatter_dim] // sp] + shape[scatter_dim + 1 :]
    )
    send = chunks.movedim(scatter_dim, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] came from rank j: put it back in place of the gather dim, rank-major
    out = recv.movedim(0, gather_dim)  # [.., sp, G, ..] with G the old gather-dim size
    new_shape = list(out.shape)
    new_shape[gather_dim : gather_dim + 2] = [new_shape[gather_dim] * new_shape[gather_dim + 1]]
    return out.reshape(new_shape)


def seq_to_head(x: torch.Tensor, group) -> torch.Tensor:
    """`[b, heads, s/sp, d] -> [b, heads/sp, s, d]`."""
    return _SeqAllToAll.apply(x, group, 1, 2)


def head_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """`[b, s, heads/sp, d] -> [b, s/sp, heads, d]`."""
    return _SeqAllToAll.apply(x, group, 1, 2)


def seq_to_head_bshd(x: torch.Tensor, group) -> torch.Tensor:
    """`[b, s/sp, heads, d] -> [b, s, heads/sp, d]` (the sequence-major layout the gated DeltaNet
    layers use)."""
    return _SeqAllToAll.apply(x, group, 2, 1)


class UlyssesAttention:
    """The attention function transformers calls (registered under `ATTN_IMPLEMENTATION`).

    Notes: docs/design/parallel.md, `ulysses.py`.
    """

    def __init__(self, state: ParallelState, num_heads: int, num_kv_heads: int):
        self.state = state
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        sp = state.sp_size
        self.kv_rep = sp // num_kv_heads if sp > num_kv_heads else 1
        self.cu_seqlens: Optional[torch.Tensor] = None
        self.max_seqlen: Optional[int] = None
        self.shared: Optional[SharedLayout] = (
            None  # documents that branch (parallel/shared_prefix.py), per batch
        )
        self.calls = 0

    def __call__(
        self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
    ):
        # query [b, h, s/sp, d]; key/value [b, hk, s/sp, d]; the mask is None (no mask function
        # registered).
        self.calls += 1
        if dropout:
            raise ValueError(
                f"attention dropout={dropout} is not supported; set attention_dropout=0.0"
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        window, s = kwargs.get("sliding_window"), query.shape[2] * self.state.sp_size
        if window is not None and s > window:  # full causal equals the window only within it
            raise ValueError(
                f"a sliding-window layer (window {window:,}) at sequence length {s:,}: this "
                "attention is "
                f"full causal; use seq_len <= {window:,}, or set sliding_window null in the model "
                "config"
            )
        group = self.state.sp_group
        slot = _slot_lookup[0](module)  # this layer's kept output (set_slot_lookup), or None
        if group is None:  # sp_size == 1: no exchange
            return self._attend(query, key, value, scale, slot), None
        if self.kv_rep > 1:
            # [b, hk, s/sp, d] -> [b, hk*r = sp, s/sp, d]: each rank receives the KV head its
            # queries read
            key = key.repeat_interleave(self.kv_rep, dim=1)
            value = value.repeat_interleave(self.kv_rep, dim=1)
        q = seq_to_head(query, group)  # [b, h, s/sp, d] -> [b, h/sp, s, d]
        k = seq_to_head(key, group)  # [b, hk', s/sp, d] -> [b, hk'/sp, s, d]
        v = seq_to_head(value, group)
        out = self._attend(q, k, v, scale, slot)  # [b, s, h/sp, d]
        out = head_to_seq(out, group)  # [b, s, h/sp, d] -> [b, s/sp, h, d]
        return out, None

    def _attend(self, q, k, v, scale, slot):
        """Causal attention of the whole sequence `[b, h', s, d]` -> `[b, s, h', d]`, its documents
        kept apart; a branching one's keys and values through its virtual sequence
        (parallel/shared_prefix.py)."""
        lay = self.shared
        if lay is None:
            return attention.attend(q, k, v, scale, self.cu_seqlens, self.max_seqlen, slot=slot)
        if lay.gather.device != q.device:  # moved once per batch: every layer reads it
            lay.gather = lay.gather.to(q.device)
        g = lay.gather
        k, v = (t[:, :, g] for t in (k, v))  # [b, hk', s, d] -> [b, hk', s', d]
        # queries stay the row's: S+B1 and B2 read their keys aligned bottom-right
        if attention.separate_keys():
            cu_k = dict(cu_seqlens_k=lay.cu_seqlens, max_seqlen_k=lay.max_seqlen)
            return attention.attend(
                q, k, v, scale, lay.cu_seqlens_q, lay.max_seqlen_q, slot, **cu_k
            )
        if not _WARNED_VIRTUAL[0]:
            _WARNED_VIRTUAL[0] = True
            log.warning(
                "shared prompt: attention backend %s takes no separate key documents; the prompt's "
                "queries run twice (the virtual sequence)",
                attention.current().backend,
            )
        out = attention.attend(
            q[:, :, g], k, v, scale, lay.cu_seqlens, lay.max_seqlen, slot=slot
        )  # [b, s', h', d]
        return out[:, lay.take.to(out.device)]  # [b, s', h', d] -> [b, s, h', d]


_WARNED_VIRTUAL = [False]
_REGISTERED: Optional[UlyssesAttention] = None


def _no_slot(module) -> None:
    return None


_slot_lookup = [_no_slot]


def set_slot_lookup(lookup: Optional[Callable]) -> None:
    """How the attention function finds a layer's cache slot: `lookup(attention_module)` returns the
    slot (parallel/kernel_pairs.py's `_Attend` keeps or hands back the output there) or None. More:
    docs/design/parallel.md."""
    _slot_lookup[0] = lookup or _no_slot


def register(model, state: ParallelState) -> UlyssesAttention:
    """Route `model`'s attention through Ulysses (also for sp_size 1: same kernel choice, packed
    docs).

    Notes: docs/design/parallel.md, `ulysses.py`.
    """
    global _REGISTERED
    from transformers import AttentionInterface

    check_wrappable(model)
    cfg = model.config.get_text_config()
    fn = UlyssesAttention(state, cfg.num_attention_heads, cfg.num_key_value_heads)
    AttentionInterface.register(ATTN_IMPLEMENTATION, fn)
    model._ds_longctx_prev_attn = (
        model.config._attn_implementation
    )  # on the module: config.json never holds it
    _set_attn(model, ATTN_IMPLEMENTATION)
    _REGISTERED = fn
    return fn


def unregister(model) -> None:
    """Restore the model's previous attention implementation and remove ours from transformers."""
    global _REGISTERED
    from transformers import AttentionInterface

    prev = getattr(model, "_ds_longctx_prev_attn", None)
    if prev is not None:
        _set_attn(model, prev)
        del model._ds_longctx_prev_attn
    AttentionInterface._global_mapping.pop(ATTN_IMPLEMENTATION, None)
    _REGISTERED = None


def _set_attn(model, name: str) -> None:
    # set on every sub-config too (text config of multimodal models)
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name


def check_wrappable(model) -> None:
    check_wrappable_class(type(model), model.config)


def check_wrappable_class(model_cls, config) -> None:
    """Refuse, before any work, a model whose attention does not go through transformers'
    interface."""
    name = model_cls.__name__
    text_type = getattr(config.get_text_config(), "model_type", None)
    if not (
        getattr(model_cls, "_supports_attention_backend", False)
        or getattr(families.of(text_type), "interface_unflagged", False)
    ):
        raise ValueError(
            f"model {name} does not dispatch attention through transformers' AttentionInterface "
            "(_supports_attention_backend is False), so Ulysses cannot wrap it; use a model that "
            f"does (Qwen3, Llama, Mistral, ...)"
        )
    cfg = config.get_text_config()
    kinds = set(kernel_rules.layer_types(cfg))
    if not kinds <= {*kernel_rules.LAYER_KINDS, kernel_rules.SLIDING_ATTENTION}:
        raise ValueError(
            f"model {name} has layer types {sorted(kinds)}; supported are full causal attention "
            "and "
            f"gated DeltaNet linear attention {list(kernel_rules.LAYER_KINDS)}, and sliding-window "
            "layers "
            f"within their window (chunked layers are not); give full_attention for those layers"
        )
    for key in ("num_attention_heads", "num_key_value_heads"):
        if not getattr(cfg, key, None):
            raise ValueError(f"model {name}'s config lacks {key}; Ulysses needs the head counts")
    if kernel_rules.LINEAR_ATTENTION in kinds:
        for key in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        ):
            if not getattr(cfg, key, None):
                raise ValueError(
                    f"model {name}'s config lacks {key}; its linear-attention layers need it"
                )
        kernel_rules.check_linear_heads(*kernel_rules.linear_heads(cfg), f"model {name}")
