"""Which attention kernel runs: chosen once per process, logged once, used by every layer.

Design notes: docs/design/parallel.md, section `attention.py`.
"""

from __future__ import annotations

# FlashAttention 4 and 2 and torch's varlen kernel are optional: imported where a backend that has
# them runs.
import importlib.util
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.kernel_pairs import _FA4, _Attend, _CpuFlashSDPA, _CudnnSDPA, _Pair
from ds_longctx.parallel.kernel_pairs import (
    set_head_groups as set_head_groups,
)  # the attention module's entry

log = logging.getLogger("ds_longctx")

_SDPA_KERNELS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_math": "MATH",
}
MAX_MASKED_TOKENS = 16384  # block-diagonal mask fallback is O(s^2): refuse beyond this


@dataclass(frozen=True)
class AttentionChoice:
    backend: str  # "fa4", "flash_attn" or "sdpa"
    sdpa_kernels: tuple  # SDPBackend names in priority order (sdpa only)
    reason: str


def flash_attn_available() -> bool:
    """flash-attn 2 (its CUDA extension; FA4 installs a `flash_attn` package too, without it)."""
    try:
        return importlib.util.find_spec("flash_attn_2_cuda") is not None
    except (ImportError, ValueError):
        return False


def fa4_available() -> bool:
    """FlashAttention 4's CuTe-DSL interface imports (needs CUDA, the CUTLASS DSL and an SM90/SM100
    GPU)."""
    try:
        from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd  # noqa: F401

        return True
    except Exception:
        return False


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def resolve_backend(name: str, head_dim: Optional[int] = None) -> AttentionChoice:
    """Map a config name to a concrete kernel for a model of `head_dim` (None: not known here).
    Raises for a backend that cannot run here."""
    on_cuda = torch.cuda.is_available()
    if name == "fa4":
        if not on_cuda or torch.cuda.get_device_capability()[0] not in (9, 10):
            raise ValueError(
                "attn_backend='fa4' needs an SM90 (Hopper) or SM100 (Blackwell) GPU; use "
                "attn_backend='auto' or 'sdpa'"
            )
        if not fa4_available():
            raise ValueError(
                "attn_backend='fa4' but FlashAttention 4 does not import (`pip install "
                "flash-attn-4`, with nvidia-cutlass-dsl); use attn_backend='auto' or 'sdpa'"
            )
        if (why := kernel_rules.fa4_refusal(head_dim)) is not None:
            raise ValueError(why)
        return AttentionChoice(
            "fa4",
            (),
            "asked for"
            + (
                ""
                if kernel_rules.fa4_verified(head_dim)
                else f" (head_dim {head_dim} not yet verified here)"
            ),
        )
    if name == "flash_attn":
        if not flash_attn_available():
            raise ValueError(
                "attn_backend='flash_attn' but flash-attn is not installed; "
                "`pip install ds-longctx[flash]` or use attn_backend='sdpa'"
            )
        if not on_cuda:
            raise ValueError(
                "attn_backend='flash_attn' needs a CUDA GPU; use attn_backend='sdpa' on CPU"
            )
        return AttentionChoice("flash_attn", (), "asked for")
    if name in _SDPA_KERNELS:
        if not on_cuda and name != "sdpa_math":
            return AttentionChoice("sdpa", (), f"{name} asked for but no CUDA: SDPA's CPU kernel")
        return AttentionChoice("sdpa", (_SDPA_KERNELS[name],), "asked for")
    if name == "auto" and _is_hopper() and fa4_available() and kernel_rules.fa4_verified(head_dim):
        return AttentionChoice(
            "fa4",
            (),
            "auto: Hopper GPU and FlashAttention 4 imports (faster than cuDNN SDPA "
            "at Ulysses shapes: benchmarks/bench_attention.py)",
        )
    unverified = (
        f" (FlashAttention 4 not verified at head_dim {head_dim}: "
        f"{list(kernel_rules.FA4_VERIFIED_HEAD_DIMS)})"
        if name == "auto" and _is_hopper() and fa4_available()
        else ""
    )
    if name == "auto" and on_cuda and flash_attn_available() and not _is_hopper():
        return AttentionChoice("flash_attn", (), "auto: flash-attn installed, GPU is not Hopper")
    if not on_cuda:
        return AttentionChoice("sdpa", (), f"{name}: no CUDA, SDPA's CPU kernel")
    if _is_hopper():
        return AttentionChoice(
            "sdpa",
            ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"),
            f"{name}: Hopper GPU, cuDNN SDPA"
            + (unverified or (" (FlashAttention 4 not installed)" if name == "auto" else "")),
        )
    return AttentionChoice(
        "sdpa",
        ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"),
        f"{name}: non-Hopper GPU, SDPA flash kernel",
    )


_CHOICE: Optional[AttentionChoice] = None


def select(name: str, announce: bool = True, head_dim: Optional[int] = None) -> AttentionChoice:
    """Choose the kernel for this process (once); log it on the first call."""
    global _CHOICE
    _CHOICE = resolve_backend(name, head_dim)
    if announce:
        kern = "/".join(_CHOICE.sdpa_kernels) or "default"
        log.info(
            "attention: %s%s (%s)",
            _CHOICE.backend,
            f"[{kern}]" if _CHOICE.backend == "sdpa" else "",
            _CHOICE.reason,
        )
    return _CHOICE


def model_head_dim(hf_config) -> int:
    """The attention head dim of an HF config (its text config's `head_dim`, else hidden /
    heads)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return kernel_rules.head_dim(text)


def current() -> AttentionChoice:
    return _CHOICE if _CHOICE is not None else select("auto", announce=False)


# The cuDNN pair matched SDPA alone on H200 (tests/gpu/test_attention_gpu.py, dense, GQA) but
# training through it failed on the device, so cuDNN SDPA keeps its own autograd (no attention
# cache) until the engine's GPU tests pass with this on. measured: see
# docs/calibration.md#cudnn-pair
CUDNN_PAIR = False


def kernel_pair(q: torch.Tensor, cu_seqlens) -> Optional[_Pair]:
    """The pair the current backend runs for these inputs, None where it has none (see the module
    doc)."""
    choice = current()
    if choice.backend == "fa4" and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return _FA4()
    if cu_seqlens is not None or choice.backend != "sdpa":
        return None
    if not q.is_cuda:
        return _CpuFlashSDPA() if not choice.sdpa_kernels else None
    if (
        CUDNN_PAIR
        and choice.sdpa_kernels[:1] == ("CUDNN_ATTENTION",)
        and q.dtype in (torch.bfloat16, torch.float16)
    ):
        return _CudnnSDPA()
    return None


_WARNED_SLOT = [False]


# ----------------------------------------------------------------------------- the kernels' own
# autograd
def _sdpa(q, k, v, scale, mask=None):
    choice = current()
    kwargs = dict(scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if mask is None:
        kwargs["is_causal"] = True
    else:
        kwargs["attn_mask"] = mask
    if choice.sdpa_kernels and q.is_cuda:
        kernels = [getattr(SDPBackend, n) for n in choice.sdpa_kernels]
        if q.dtype == torch.float32:
            # fp32 (tests, references) runs on no fused kernel with GQA: expand KV, mem-efficient or
            # math
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


def _block_causal_mask(cu_q: torch.Tensor, s: int, device, cu_k=None, s_k=None) -> torch.Tensor:
    """[s, s_k] bool: True where query i may attend key j, both of one document and j at most i
    counted from the documents' ends (causal aligned bottom-right, as flash-attn's varlen does where
    q and k lengths differ)."""
    cu_k, s_k = (cu_q, s) if cu_k is None else (cu_k, s_k)
    if max(s, s_k) > MAX_MASKED_TOKENS:
        raise ValueError(
            f"packed documents at s={max(s, s_k)} need a varlen kernel (FA4, flash-attn, or "
            "varlen_attn on "
            f"CUDA); the masked SDPA fallback is O(s^2) and limited to {MAX_MASKED_TOKENS} tokens"
        )

    def doc_and_to_end(cu, n):  # each token's document and its offset from that document's end
        cu = cu.to(device=device, dtype=torch.long)
        doc = torch.zeros(n, dtype=torch.long, device=device)
        doc[cu[1:-1]] = 1
        doc = doc.cumsum(0)
        return doc, torch.arange(n, device=device) - cu[1:][doc]

    dq, eq = doc_and_to_end(cu_q, s)
    dk, ek = doc_and_to_end(cu_k, s_k)
    return (dq[:, None] == dk[None, :]) & (ek[None, :] <= eq[:, None])


def _own_autograd(q, k, v, scale, cu_seqlens, max_seqlen, cu_k=None, max_k=None):
    """The paths without a kernel pair: the kernel's own autograd, `[b, s, h, d]` out (`cu_k`,
    `max_k`: the keys' documents where they differ from the queries', causal aligned
    bottom-right)."""
    choice = current()
    cu_k, max_k = (cu_seqlens, max_seqlen) if cu_k is None else (cu_k, max_k)
    if choice.backend == "flash_attn":
        from flash_attn import flash_attn_func, flash_attn_varlen_func

        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d] -> [b, s, h, d]
        if cu_seqlens is None:
            return flash_attn_func(qt, kt, vt, softmax_scale=scale, causal=True)
        out = flash_attn_varlen_func(
            qt[0],
            kt[0],
            vt[0],
            cu_seqlens,
            cu_k,
            max_seqlen,
            max_k,
            softmax_scale=scale,
            causal=True,
        )
        return out.unsqueeze(0)
    if cu_seqlens is None:
        return _sdpa(q, k, v, scale).transpose(1, 2)
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        qt, kt, vt = (t[0].transpose(0, 1) for t in (q, k, v))  # [1, h, s, d] -> [s, h, d]
        if kt.shape[1] != qt.shape[1]:
            rep = qt.shape[1] // kt.shape[1]
            kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
        cu, cuk = (c.to(device=q.device, dtype=torch.int32) for c in (cu_seqlens, cu_k))
        out = varlen_attn(qt, kt, vt, cu, cuk, max_seqlen, max_k, scale=scale, window_size=(-1, 0))
        return out.unsqueeze(0)
    mask = _block_causal_mask(cu_seqlens, q.shape[2], q.device, cu_k, k.shape[2])
    return _sdpa(q, k, v, scale, mask=mask).transpose(1, 2)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
    slot=None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_k: Optional[int] = None,
) -> torch.Tensor:
    """Causal attention. q `[b, h, s, d]`, k/v `[b, hk, s_k, d]` -> `[b, s, h, d]`; `cu_seqlens_k`
    (default `cu_seqlens`) splits the keys into the queries' documents, causal aligned bottom-right.

    Notes: docs/design/parallel.md, `attention.py`.
    """
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"packed documents need micro_batch=1, got batch {q.shape[0]}")
    if cu_seqlens_k is None and k.shape[2] != q.shape[2]:
        raise ValueError(f"{q.shape[2]} queries and {k.shape[2]} keys need cu_seqlens_k")
    pair = kernel_pair(q, cu_seqlens)
    if pair is None:
        if slot is not None and not _WARNED_SLOT[0]:
            _WARNED_SLOT[0] = True
            log.warning(
                "attention cache: backend %s (%s, %s) has no kernel pair with its LSE here; cached "
                "layers recompute attention",
                current().backend,
                q.dtype,
                "packed" if cu_seqlens is not None else "dense",
            )
        return _own_autograd(q, k, v, scale, cu_seqlens, max_seqlen, cu_seqlens_k, max_seqlen_k)
    if not pair.gqa and k.shape[1] != q.shape[1]:
        rep = (
            q.shape[1] // k.shape[1]
        )  # [b, hk, s, d] -> [b, h, s, d]; autograd sums the grads back
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    lens = None, None
    if cu_seqlens is not None:  # the pair reads (queries', keys') documents
        cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
        cus = tuple(c.to(device=q.device, dtype=torch.int32) for c in (cu_seqlens, cu_k))
        lens = cus, (max_seqlen, max_seqlen if cu_seqlens_k is None else max_seqlen_k)
    out = _Attend.apply(q, k, v, pair, scale, *lens, slot)
    return pair.out_bshd(out)


# Backends whose varlen kernels take the keys' own documents (`attend`'s cu_seqlens_k), causal
# aligned bottom-right: FA4, flash-attn 2 (>= 2.1), torch's varlen_attn on CUDA, the masked SDPA on
# CPU.
SEPARATE_KEYS = ("fa4", "flash_attn", "sdpa")


def separate_keys() -> bool:
    """Whether the current backend runs queries and keys of different documents (`cu_seqlens_k`)."""
    return current().backend in SEPARATE_KEYS
