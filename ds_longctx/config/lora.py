"""`lora` section: LoRA adapters on a frozen base (owner: levers/lora.py)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, field_validator

from ds_longctx.config.base import Section
from ds_longctx.levers.lora import ALL_LINEAR, DEFAULT_TARGETS, check_targets


class LoraConfig(Section):
    """LoRA adapters on a frozen base: only the adapters train (rank 0: full fine-tuning)."""

    rank: int = Field(0, json_schema_extra={"flat": "lora_rank"})
    """LoRA rank r: each targeted Linear W gets W + (alpha / r)·B·A with A [r, in], B [out, r],
    trained while every base weight stays frozen (and partitioned by ZeRO-3). 0: LoRA off, full
    fine-tuning."""
    alpha: float = Field(16.0, json_schema_extra={"flat": "lora_alpha"})
    """LoRA scaling numerator: the adapter output is multiplied by alpha / rank."""
    dropout: float = Field(0.0, json_schema_extra={"flat": "lora_dropout"})
    """Dropout on the adapters' input, in [0, 1). Must be 0 with tiled_mlp (its tile recompute does
    not replay the RNG)."""
    target_modules: Union[Literal["all-linear"], list[str]] = Field(
        list(DEFAULT_TARGETS), json_schema_extra={"flat": "lora_target_modules"}
    )
    """Which Linears get adapters: module-name suffixes (`q_proj` matches every
    `...self_attn.q_proj`; on the command line a comma-separated list, `--lora_target_modules
    q_proj,v_proj`) or all-linear (every Linear but the output layer). The output layer (lm_head)
    cannot be targeted: the chunked loss reads its weight."""
    init: Literal["zero_b", "random_b"] = Field("zero_b", json_schema_extra={"flat": "lora_init"})
    """zero_b: A drawn, B = 0 (PEFT's default: step 0 is the base model); random_b: B drawn too (a
    non-zero adapter from the first step, as PEFT's init_lora_weights=False; the gradient tests use
    it, since B = 0 makes A's gradient 0). Drawn per parameter name from `seed`: the same adapters
    for any world size or sp_size."""

    @field_validator("rank")
    @classmethod
    def _rank(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"lora_rank={v} must be >= 0 (0 turns LoRA off); try 8 or 16")
        return v

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(
                f"lora_alpha={v} must be > 0 (the adapter output is scaled by alpha / rank); try "
                f"16 or twice the rank"
            )
        return v

    @field_validator("dropout")
    @classmethod
    def _dropout(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"lora_dropout={v} must be in [0, 1); try 0.0 or 0.05")
        return v

    @field_validator("target_modules", mode="before")
    @classmethod
    def _targets(cls, v):
        if isinstance(v, str) and v != ALL_LINEAR:  # the command line's comma-separated spelling
            v = [t.strip() for t in v.split(",")]
        if isinstance(v, (list, tuple)):
            check_targets(list(v))
            return list(v)
        return v
