"""Which attention kernel runs: chosen once per process, logged once, used by every layer.

Dimensions: b batch, h query heads (local), hk KV heads (local), s full sequence, d head dim.
`attend(q, k, v, ...)` takes `[b, h, s, d]` / `[b, hk, s, d]` and returns `[b, s, h, d]` (transformers'
attention-function convention), always causal.

Backends (`kernels.attn_backend` in the run config):
- `flash_attn`: the flash-attn package (`flash_attn_func`, `flash_attn_varlen_func` for packed documents).
- `sdpa_cudnn` / `sdpa_flash` / `sdpa_efficient` / `sdpa_math`: PyTorch SDPA pinned to one kernel.
- `sdpa`, `auto`: SDPA with the kernel picked per device: cuDNN on Hopper (on H200 at Ulysses shapes it ran
  the causal forward + backward faster than SDPA's flash kernel; no committed benchmark of ours yet), else the
  flash kernel; on CPU whatever SDPA has. `auto` takes flash-attn first when it is installed and the GPU is not
  Hopper.

Packed documents (`cu_seqlens` of the full sequence, b == 1): flash-attn varlen, or
`torch.nn.attention.varlen.varlen_attn` on CUDA, or (CPU / tests, small s only) SDPA with a block-diagonal
causal mask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

log = logging.getLogger("ds_longctx")

_SDPA_KERNELS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}
MAX_MASKED_TOKENS = 16384  # block-diagonal mask fallback is O(s^2): refuse beyond this


@dataclass(frozen=True)
class AttentionChoice:
    backend: str          # "flash_attn" or "sdpa"
    sdpa_kernels: tuple   # SDPBackend names in priority order (sdpa only)
    reason: str


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
        return True
    except Exception:
        return False


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def resolve_backend(name: str) -> AttentionChoice:
    """Map a config name to a concrete kernel. Raises for a backend that cannot run here."""
    on_cuda = torch.cuda.is_available()
    if name == "flash_attn":
        if not flash_attn_available():
            raise ValueError("attn_backend='flash_attn' but flash-attn is not installed; "
                             "`pip install ds-longctx[flash]` or use attn_backend='sdpa'")
        if not on_cuda:
            raise ValueError("attn_backend='flash_attn' needs a CUDA GPU; use attn_backend='sdpa' on CPU")
        return AttentionChoice("flash_attn", (), "asked for")
    if name in _SDPA_KERNELS:
        if not on_cuda and name != "sdpa_math":
            return AttentionChoice("sdpa", (), f"{name} asked for but no CUDA: SDPA's CPU kernel")
        return AttentionChoice("sdpa", (_SDPA_KERNELS[name],), "asked for")
    if name == "auto" and on_cuda and flash_attn_available() and not _is_hopper():
        return AttentionChoice("flash_attn", (), "auto: flash-attn installed, GPU is not Hopper")
    if not on_cuda:
        return AttentionChoice("sdpa", (), f"{name}: no CUDA, SDPA's CPU kernel")
    if _is_hopper():
        return AttentionChoice("sdpa", ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"),
                               f"{name}: Hopper GPU, cuDNN SDPA")
    return AttentionChoice("sdpa", ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"),
                           f"{name}: non-Hopper GPU, SDPA flash kernel")


_CHOICE: Optional[AttentionChoice] = None


def select(name: str, announce: bool = True) -> AttentionChoice:
    """Choose the kernel for this process (once); log it on the first call."""
    global _CHOICE
    _CHOICE = resolve_backend(name)
    if announce:
        kern = "/".join(_CHOICE.sdpa_kernels) or "default"
        log.info("attention: %s%s (%s)", _CHOICE.backend,
                 f"[{kern}]" if _CHOICE.backend == "sdpa" else "", _CHOICE.reason)
    return _CHOICE


def current() -> AttentionChoice:
    return _CHOICE if _CHOICE is not None else select("auto", announce=False)


def _sdpa(q, k, v, scale, mask=None):
    choice = current()
    kwargs = dict(scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if mask is None:
        kwargs["is_causal"] = True
    else:
        kwargs["attn_mask"] = mask
    if choice.sdpa_kernels and q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernels = [getattr(SDPBackend, n) for n in choice.sdpa_kernels]
        if q.dtype == torch.float32:
            # fp32 (tests, references) runs on no fused kernel with GQA: expand KV, mem-efficient or math
            if kwargs["enable_gqa"]:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
                kwargs["enable_gqa"] = False
            kernels = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(kernels, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if q.shape[1] != k.shape[1] and not q.is_cuda:
        # CPU SDPA handles enable_gqa only in the math path; expand KV explicitly.
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        kwargs["enable_gqa"] = False
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _block_causal_mask(cu_seqlens: torch.Tensor, s: int, device) -> torch.Tensor:
    """[s, s] bool: True where query i may attend key j (same document, j <= i)."""
    if s > MAX_MASKED_TOKENS:
        raise ValueError(f"packed documents at s={s} need a varlen kernel (flash-attn, or varlen_attn on CUDA); "
                         f"the masked SDPA fallback is O(s^2) and limited to {MAX_MASKED_TOKENS} tokens")
    doc = torch.zeros(s, dtype=torch.long, device=device)
    doc[cu_seqlens[1:-1].to(device)] = 1
    doc = doc.cumsum(0)
    idx = torch.arange(s, device=device)
    return (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None) -> torch.Tensor:
    """Causal attention. q `[b, h, s, d]`, k/v `[b, hk, s, d]` -> `[b, s, h, d]`.

    `cu_seqlens` (int32 `[n_docs + 1]`, offsets of documents in the full sequence) keeps packed documents
    apart; it needs b == 1.
    """
    choice = current()
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"packed documents need micro_batch=1, got batch {q.shape[0]}")
    if choice.backend == "flash_attn":
        from flash_attn import flash_attn_func, flash_attn_varlen_func
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d] -> [b, s, h, d]
        if cu_seqlens is None:
            return flash_attn_func(qt, kt, vt, softmax_scale=scale, causal=True)
        out = flash_attn_varlen_func(qt[0], kt[0], vt[0], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                     softmax_scale=scale, causal=True)
        return out.unsqueeze(0)
    if cu_seqlens is None:
        return _sdpa(q, k, v, scale).transpose(1, 2)
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn
        qt, kt, vt = (t[0].transpose(0, 1) for t in (q, k, v))  # [1, h, s, d] -> [s, h, d]
        if kt.shape[1] != qt.shape[1]:
            rep = qt.shape[1] // kt.shape[1]
            kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        out = varlen_attn(qt, kt, vt, cu, cu, max_seqlen, max_seqlen, scale=scale, window_size=(-1, 0))
        return out.unsqueeze(0)
    mask = _block_causal_mask(cu_seqlens, q.shape[2], q.device)
    return _sdpa(q, k, v, scale, mask=mask).transpose(1, 2)
