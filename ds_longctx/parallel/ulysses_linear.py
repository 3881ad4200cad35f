"""Ulysses sequence parallelism around a hybrid model's gated DeltaNet layers (Qwen3.5's
`linear_attention`).

Design notes: docs/design/parallel.md, section `ulysses_linear.py`.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ds_longctx.parallel import gated_delta, kernel_rules
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.patching import own_forward, restore_saved
from ds_longctx.parallel.ulysses import head_to_seq, seq_to_head_bshd

# on a patched module: its instance-level forward before (patching.py)
_SAVED = "_ds_longctx_linear_forward"
_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "norm", "out_proj")


def is_gated_delta(module: nn.Module) -> bool:
    """A gated DeltaNet token mixer (transformers' `*GatedDeltaNet`)."""
    return type(module).__name__.endswith("GatedDeltaNet")


def linear_modules(model: nn.Module) -> list:
    return [m for m in model.modules() if is_gated_delta(m)]


def check_linear_module(module: nn.Module) -> None:
    """Refuse a gated DeltaNet whose layout this wrapper does not compute (Qwen3-Next's fused
    in_proj_qkvz, a conv bias), naming it."""
    missing = [p for p in _PARTS if not isinstance(getattr(module, p, None), nn.Module)]
    if missing or getattr(module.conv1d, "bias", None) is not None:
        raise ValueError(
            f"{type(module).__name__} has no {', '.join(missing) or 'bias-free conv1d'}: the "
            "Ulysses "
            "wrapper computes Qwen3.5's gated DeltaNet (in_proj_qkv / z / b / a, a bias-free "
            "depthwise "
            "conv1d, gated RMSNorm, out_proj); this model's linear-attention layers are not "
            "supported"
        )
    kernel_rules.check_linear_heads(module.num_k_heads, module.num_v_heads, type(module).__name__)


class LinearMixing:
    """The exchange and the two mixers for every gated DeltaNet layer of one model. `calls` counts
    layer calls."""

    def __init__(
        self,
        state: ParallelState,
        attn,
        key_heads: int,
        value_heads: int,
        key_dim: int,
        value_dim: int,
    ):
        self.state, self.attn = (
            state,
            attn,
        )  # attn: the Ulysses attention function (the batch's cu_seqlens)
        self.hk, self.hv, self.dk, self.dv = key_heads, value_heads, key_dim, value_dim
        sp = state.sp_size
        self.rep = sp // key_heads if sp > key_heads else 1
        self.calls = 0
        self._channels: Optional[torch.Tensor] = None

    def channels(self, device) -> Optional[torch.Tensor]:
        """int64 `[c / sp-ish]`: the depthwise conv's channels this rank convolves (its q, k and v
        heads' channels in that order); None at sp 1 (all of them)."""
        sp, r = self.state.sp_size, self.state.sp_rank
        if sp == 1:
            return None
        if self._channels is None:
            hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
            keys = [r // self.rep] if self.rep > 1 else range(r * hk // sp, (r + 1) * hk // sp)
            q = [h * dk + i for h in keys for i in range(dk)]
            k = [hk * dk + c for c in q]
            v = [
                2 * hk * dk + h * dv + i
                for h in range(r * hv // sp, (r + 1) * hv // sp)
                for i in range(dv)
            ]
            self._channels = torch.tensor(q + k + v, dtype=torch.long)
        if self._channels.device != torch.device(device):
            self._channels = self._channels.to(device)  # moved once, kept there
        return self._channels

    def mix(self, module: nn.Module, q, k, v, g, beta) -> torch.Tensor:
        """conv1d + SiLU and the gated delta rule over the whole sequence for this rank's heads.
        More: docs/design/parallel.md."""
        self.calls += 1
        group, cu = self.state.sp_group, self.attn.cu_seqlens
        if cu is not None and q.shape[0] != 1:
            raise ValueError(f"packed documents need micro_batch=1, got batch {q.shape[0]}")
        if group is not None:
            if (
                self.rep > 1
            ):  # [b, s/sp, hk, dk] -> [b, s/sp, hk·r = sp, dk]: each rank gets its value heads' key
                q, k = q.repeat_interleave(self.rep, dim=2), k.repeat_interleave(self.rep, dim=2)
            qk = seq_to_head_bshd(
                torch.cat([q, k], dim=-1), group
            )  # [b, s/sp, hk', 2dk] -> [b, s, hk'/sp, 2dk]
            q, k = qk.split(self.dk, dim=-1)
            v = seq_to_head_bshd(v, group)  # [b, s/sp, hv, dv] -> [b, s, hv/sp, dv]
            gb = seq_to_head_bshd(
                torch.stack([g, beta.float()], dim=-1), group
            )  # [b, s/sp, hv, 2] -> [b, s, hv/sp, 2]
            g, beta = gb[..., 0], gb[..., 1].to(beta.dtype)
        b, s, hk_l, hv_l = q.shape[0], q.shape[1], q.shape[2], v.shape[2]
        # [b, s, h, d] -> [b, s, c_local]: the conv's channel order (q heads, k heads, v heads)
        x = torch.cat([q.reshape(b, s, -1), k.reshape(b, s, -1), v.reshape(b, s, -1)], dim=-1)
        x = module.conv1d(
            x, self.channels(x.device), cu
        )  # the conv1d module called: ZeRO-3 gathers its weight
        q, k, v = x.split([hk_l * self.dk, hk_l * self.dk, hv_l * self.dv], dim=-1)
        out = gated_delta.gated_delta_rule(
            q.reshape(b, s, hk_l, self.dk),
            k.reshape(b, s, hk_l, self.dk),
            v.reshape(b, s, hv_l, self.dv),
            g,
            beta,
            cu,
        )  # [b, s, hv', dv]
        if group is not None:
            out = head_to_seq(out, group)  # [b, s, hv/sp, dv] -> [b, s/sp, hv, dv]
        return out


def _layer_forward(
    module: nn.Module,
    mixing: LinearMixing,
    hidden_states: torch.Tensor,
    cache=None,
    attention_mask=None,
    **kwargs,
) -> torch.Tensor:
    """Qwen3.5's `Qwen3_5GatedDeltaNet.forward` (training: no cache, no padding mask) with `mixing`
    between the projections and the gated norm. hidden_states `[b, s/sp, H]` -> `[b, s/sp, H]`."""
    if cache is not None or kwargs.get("past_key_values") is not None:
        raise ValueError(
            "the Ulysses gated DeltaNet wrapper trains; a recurrent / KV cache is not supported "
            "here"
        )
    if attention_mask is not None:
        raise ValueError(
            "the Ulysses gated DeltaNet wrapper takes no padding mask (rows are padded with "
            "ignored labels after the last token, parallel/sharding.py); pass attention_mask=None"
        )
    b, n, _ = hidden_states.shape
    hk, hv, dk, dv = mixing.hk, mixing.hv, mixing.dk, mixing.dv
    qkv = module.in_proj_qkv(hidden_states)  # [b, s/sp, 2·hk·dk + hv·dv]
    z = module.in_proj_z(hidden_states).reshape(b, n, hv, dv)
    beta = module.in_proj_b(hidden_states).sigmoid()  # [b, s/sp, hv]
    g = -module.A_log.float().exp() * F.softplus(
        module.in_proj_a(hidden_states).float() + module.dt_bias
    )
    q, k, v = qkv.split([hk * dk, hk * dk, hv * dv], dim=-1)
    out = mixing.mix(
        module, q.reshape(b, n, hk, dk), k.reshape(b, n, hk, dk), v.reshape(b, n, hv, dv), g, beta
    )
    out = module.norm(out.reshape(-1, dv), z.reshape(-1, dv)).reshape(
        b, n, hv * dv
    )  # gated RMSNorm per head
    return module.out_proj(out)


def _conv_forward(
    conv: nn.Module, x: torch.Tensor, channels: Optional[torch.Tensor], cu_seqlens
) -> torch.Tensor:
    """The depthwise conv1d of this rank's channels: x `[b, s, c']` -> SiLU(conv) `[b, s, c']`."""
    weight = conv.weight[:, 0, :]  # [c, 1, K] -> [c, K]
    if channels is not None:
        weight = weight[channels]
    return gated_delta.causal_conv1d(x, weight, cu_seqlens)


def _replace(module: nn.Module, forward) -> None:
    module.__dict__.setdefault(_SAVED, own_forward(module))
    module.forward = forward


def install(model: nn.Module, state: ParallelState, attn) -> Optional[LinearMixing]:
    """Route every gated DeltaNet layer of `model` through the exchange (also at sp 1: the same
    kernels and document bounds). More: docs/design/parallel.md."""
    layers = linear_modules(model)
    if not layers:
        return None
    for m in layers:
        check_linear_module(m)
    first = layers[0]
    mixing = LinearMixing(
        state, attn, first.num_k_heads, first.num_v_heads, first.head_k_dim, first.head_v_dim
    )
    for m in layers:
        _replace(m, functools.partial(_layer_forward, m, mixing))
        _replace(m.conv1d, functools.partial(_conv_forward, m.conv1d))
    return mixing


def uninstall(model: nn.Module) -> int:
    """Give every patched module back the forward it had before `install`; returns how many
    layers."""
    return sum(is_gated_delta(m) for m in restore_saved(model, _SAVED))
