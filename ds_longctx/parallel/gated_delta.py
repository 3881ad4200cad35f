"""A gated DeltaNet layer's token mixing on whole sequences, documents kept apart: the causal
depthwise conv1d and the gated delta rule, on the kernel chosen once per process
(`linear_attn_backend`: FLA on a CUDA GPU, torch elsewhere).

Design notes: docs/design/parallel.md, section `gated_delta.py`.
"""

from __future__ import annotations

# FLA, Triton and tilelang are optional: imported where the FLA backend is resolved or runs.
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ds_longctx.parallel import kernel_rules

log = logging.getLogger("ds_longctx")

LINEAR_BACKENDS = ("auto", "fla", "torch")
CHUNK = 64  # the torch path's chunk of the gated delta rule (transformers' and FLA's default)
# What a GPU pays for the torch fallback, said in its warning. measured: see
# docs/calibration.md#gated-delta
FALLBACK_COST = (
    "FLA's chunk_gated_delta_rule runs 1,048,576 tokens x 4 heads fwd+bwd in 0.10 s on an H200; "
    "the "
    "torch path is a Python loop over 64-token chunks, one document at a time, in fp32: orders of "
    "magnitude slower and several times the memory"
)


@dataclass(frozen=True)
class LinearChoice:
    backend: str  # "fla" or "torch"
    reason: str


def fla_available() -> bool:
    """FLA's gated-delta kernel and its conv1d import (they need Triton)."""
    try:
        from fla.modules.convolution import causal_conv1d  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401

        return True
    except Exception:
        return False


def _fla_refusal() -> Optional[str]:
    """kernel_rules.fla_triton_refusal for this process's GPU, Triton and tilelang."""

    try:
        import triton

        version = triton.__version__
    except Exception:
        version = None
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    tilelang = (
        importlib.util.find_spec("tilelang") is not None and os.environ.get("FLA_TILELANG") != "0"
    )
    return kernel_rules.fla_triton_refusal(version, hopper, tilelang)


def resolve_linear_backend(name: str) -> LinearChoice:
    """The kernel `name` means here, or ValueError naming the fix (FLA asked for without CUDA or
    without FLA; FLA on an unsafe Triton)."""
    if name not in LINEAR_BACKENDS:
        raise ValueError(
            f"linear_attn_backend={name!r} is unknown; use one of {list(LINEAR_BACKENDS)}"
        )
    on_cuda = torch.cuda.is_available()
    if name == "torch":
        return LinearChoice("torch", "asked for")
    if name == "fla" and not on_cuda:
        raise ValueError(
            "linear_attn_backend='fla' needs a CUDA GPU; use linear_attn_backend='torch' (or "
            "'auto') on CPU"
        )
    if name == "fla" and not fla_available():
        raise ValueError(
            "linear_attn_backend='fla' but flash-linear-attention does not import (`pip install "
            "ds-longctx[gpu]`: fla-core / flash-linear-attention 0.6.0); use "
            "linear_attn_backend='auto'"
        )
    if not on_cuda:
        return LinearChoice("torch", "auto: no CUDA")
    if not fla_available():
        return LinearChoice(
            "torch",
            "auto: CUDA GPU but flash-linear-attention does not import (`pip install "
            "ds-longctx[gpu]`)",
        )
    if (why := _fla_refusal()) is not None:
        raise ValueError(why)
    return LinearChoice(
        "fla", "asked for" if name == "fla" else "auto: CUDA GPU and flash-linear-attention imports"
    )


_CHOICE: list = [None]


def select_linear(name: str, announce: bool = True) -> LinearChoice:
    """Choose the gated-delta kernel for this process; log it once, and warn once with the cost when
    a GPU runs the torch path."""
    choice = _CHOICE[0] = resolve_linear_backend(name)
    if announce:
        log.info("linear attention: %s (%s)", choice.backend, choice.reason)
        if choice.backend == "torch" and torch.cuda.is_available():
            log.warning(
                "linear attention: the gated DeltaNet layers run the torch fallback on this GPU "
                "(%s). %s. Install flash-linear-attention (ds-longctx[gpu]) for the kernels",
                choice.reason,
                FALLBACK_COST,
            )
    return choice


def current_linear() -> LinearChoice:
    return _CHOICE[0] if _CHOICE[0] is not None else select_linear("auto", announce=False)


# ----------------------------------------------------------------------------- the conv1d
def positions_in_document(
    cu_seqlens: Optional[torch.Tensor], s: int, device
) -> Optional[torch.Tensor]:
    """int64 `[s]`: each token's index in its document (None without documents)."""
    if cu_seqlens is None:
        return None
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts = torch.zeros(s, dtype=torch.long, device=device)
    starts[cu[1:-1]] = (
        cu[1:-1] - cu[:-2]
    )  # at each document's first token: the length of the one before
    idx = torch.arange(s, device=device)
    return idx - starts.cumsum(0)


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """SiLU(causal depthwise conv1d) of x `[b, s, c]` with weight `[c, K]` (transformers' Conv1d
    weight `[c, 1, K]` squeezed), the window cut at each document's start -> `[b, s, c]`."""
    if current_linear().backend == "fla" and x.is_cuda:
        from fla.modules.convolution import causal_conv1d as fla_conv

        cu = None if cu_seqlens is None else cu_seqlens.to(device=x.device, dtype=torch.long)
        return fla_conv(x, weight, activation="silu", cu_seqlens=cu)[0]
    s, K = x.shape[1], weight.shape[1]
    pos = positions_in_document(cu_seqlens, s, x.device)
    out = (
        x * weight[:, K - 1]
    )  # tap j reads token t - j with weight[:, K-1-j] (F.conv1d with K-1 left padding)
    for j in range(1, min(K, s)):
        shifted = F.pad(x, (0, 0, j, 0))[
            :, :s
        ]  # [b, s, c]: token t - j, zero before the row's start
        if pos is not None:
            shifted = (
                shifted * (pos >= j).to(x.dtype)[None, :, None]
            )  # zero where t - j is in an earlier document
        out = out + shifted * weight[:, K - 1 - j]
    return F.silu(out)


# ----------------------------------------------------------------------------- the gated delta rule
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The gated delta rule with q / k L2-normalised in the kernel (as Qwen3.5 calls it), state from
    zero at each row and each document. More: docs/design/parallel.md."""
    if current_linear().backend == "fla" and q.is_cuda:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        cu = None if cu_seqlens is None else cu_seqlens.to(device=q.device, dtype=torch.long)
        return chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu
        )[0]
    if cu_seqlens is None:
        return _torch_rule(q, k, v, g, beta)
    bounds = cu_seqlens.tolist()
    parts = [
        _torch_rule(*(t[:, a:e] for t in (q, k, v, g, beta)))
        for a, e in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(parts, dim=1)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _torch_rule(q, k, v, g, beta) -> torch.Tensor:
    """One segment from a zero state, chunked (CHUNK tokens): inside a chunk the delta rule's
    updates are one triangular solve (the WY form), across chunks a recurrence on the [dk, dv] state
    per value head. fp32."""
    dtype, (b, s, hv, dv) = v.dtype, v.shape
    rep = hv // q.shape[2]
    # [b, s, h, d] -> [b, hv, s, d] fp32, q / k repeated to the value heads, L2-normalised, q scaled
    # by dk^-0.5
    q, k = (_l2norm(t.repeat_interleave(rep, dim=2).transpose(1, 2).float()) for t in (q, k))
    q = q * q.shape[-1] ** -0.5
    v, g, beta = v.transpose(1, 2).float(), g.transpose(1, 2).float(), beta.transpose(1, 2).float()
    pad = (-s) % CHUNK
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (s + pad) // CHUNK
    # [b, hv, s', d] -> [b, hv, n, C, d]; decay g [b, hv, n, C] summed within each chunk
    q, k, v = (t.reshape(b, hv, n, CHUNK, -1) for t in (q, k, v))
    beta, gc = beta.reshape(b, hv, n, CHUNK), g.reshape(b, hv, n, CHUNK).cumsum(-1)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (
        (gc[..., :, None] - gc[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    )  # [b, hv, n, C, C]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    # the WY form: (I + strictly-lower(beta k k^T . decay)) u = v beta, and the same for the decayed
    # keys
    system = ((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(~lower.tril(-1), 0.0)
    system = system + torch.eye(CHUNK, device=q.device)
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * gc.exp()[..., None], upper=False, unitriangular=True
    )
    state = q.new_zeros(b, hv, q.shape[-1], dv)  # [b, hv, dk, dv]
    out = torch.empty_like(v)
    for i in range(n):
        qi, ki = q[:, :, i], k[:, :, i]
        v_new = u[:, :, i] - w[:, :, i] @ state  # what the state does not already predict
        intra = (qi @ ki.transpose(-1, -2)) * decay[
            :, :, i
        ]  # causal within the chunk (decay is 0 above)
        out[:, :, i] = (qi * gc[:, :, i, :, None].exp()) @ state + intra @ v_new
        last = gc[:, :, i, -1, None]  # [b, hv, 1]
        state = (
            state * last[..., None].exp()
            + (ki * (last - gc[:, :, i]).exp()[..., None]).transpose(-1, -2) @ v_new
        )
    # [b, hv, n, C, dv] -> [b, s, hv, dv]
    return out.reshape(b, hv, n * CHUNK, dv)[:, :, :s].transpose(1, 2).to(dtype)
