"""`kernels` section: which kernels run the model's hot ops (owners: parallel/attention.py,
parallel/gated_delta.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from ds_longctx.config.base import Section

ATTN_BACKENDS = (
    "auto",
    "fa4",
    "sdpa",
    "sdpa_cudnn",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_math",
    "flash_attn",
)


class KernelsConfig(Section):
    """Which kernels run the model's hot ops."""

    attn_backend: str = "auto"
    """Attention kernel: auto (FlashAttention 4 on Hopper when installed, else cuDNN SDPA there;
    flash-attn 2 when installed on other GPUs, else SDPA's flash kernel), fa4, sdpa (SDPA, kernel
    picked per device), sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math, flash_attn (flash-attn
    2). The choice and its reason are logged."""

    linear_attn_backend: Literal["auto", "fla", "torch"] = "auto"
    """A hybrid model's gated DeltaNet layers (Qwen3.5's linear attention): fla
    (flash-linear-attention's kernels, CUDA), torch (the chunked torch path, any device, slow), or
    auto (fla on a CUDA GPU when it imports, else torch, with one warning naming the cost on a GPU).
    A Hopper GPU whose Triton FLA's gated backward gets wrong (>= 3.4, < 3.7.1) without tilelang is
    refused. The choice and its reason are logged (parallel/gated_delta.py)."""

    fused_ops: Literal["auto", "none", "liger", "compile"] = "auto"
    """Token-wise work (RMSNorm, SwiGLU, rotary) as fused kernels: liger (Liger-Kernel's Triton
    kernels, CUDA), compile (TorchInductor compiling HF's own math for them; the first step pays the
    compilation), none (HF's own ops), or auto (compile on a CUDA GPU, where it measured fastest,
    none on CPU); levers/fused_ops.py. The choice and its reason are logged."""

    @field_validator("attn_backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend={v!r} is unknown; use one of {list(ATTN_BACKENDS)}")
        return v
