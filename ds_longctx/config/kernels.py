"""`kernels` section: which kernels run the model's hot ops (owner: parallel/attention.py)."""

from __future__ import annotations

from pydantic import field_validator

from ds_longctx.config.base import Section

ATTN_BACKENDS = ("auto", "sdpa", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flash_attn")


class KernelsConfig(Section):
    """Which kernels run the model's hot ops."""

    attn_backend: str = "auto"
    """Attention kernel: auto (flash-attn if installed and not on Hopper, else SDPA with cuDNN on Hopper, flash
    elsewhere), sdpa (SDPA, kernel picked as auto), sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math,
    flash_attn."""

    @field_validator("attn_backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend={v!r} is unknown; use one of {list(ATTN_BACKENDS)}")
        return v
