"""`optimizer` section: AdamW's settings and where its state lives (owner: plan/ds_config.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ds_longctx.config.base import Section


class OptimizerConfig(Section):
    """AdamW's settings and where its state lives."""

    lr: float = Field(1e-4, gt=0, le=1)
    """AdamW's peak learning rate, in (0, 1]: AdamW moves every weight by about lr per step, so
    above 1 each step rewrites the model (fine-tuning uses 1e-6 to 1e-3)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up steps (from 0 to lr), before `schedule`."""
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", json_schema_extra={"flat": "lr_schedule"}
    )
    """After the warm-up: lr held (constant), or decayed to `min_lr` at the last step along a half
    cosine or a line (plan/lr_schedule.py)."""
    min_lr: float = Field(0.0, ge=0)
    """The floor a cosine or linear schedule reaches at the last step; at most lr."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW weight decay, in [0, 1]: each step scales the weights by 1 - lr·weight_decay (commonly
    0 to 0.1)."""
    grad_clip: float = Field(1.0, ge=0)
    """Gradient-norm clipping, a finite norm (0 disables)."""
    torch_adam: bool = True
    """Use torch's AdamW inside DeepSpeed (no JIT build); False uses DeepSpeed's fused Adam (GPU) /
    CPU Adam (optimizer offload), built on first use."""
    state_at_build: bool = Field(True, json_schema_extra={"flat": "optimizer_state_at_build"})
    """Create the Adam moments at build (`run/optimizer_state.py`), so step 1 holds what every step
    holds: a plan that does not fit fails at build, not at step 2, and a one-step run measures the
    steady peak. False leaves them to DeepSpeed's lazy default (made in step 1's optimizer step).
    The weights and the trajectory are the same either way
    (tests/distributed/test_optimizer_state.py)."""
    offload: bool = Field(False, json_schema_extra={"flat": "optimizer_offload"})
    """Keep the fp32 master weights, gradients and Adam state in pinned host memory (DeepSpeed
    offload_optimizer: cpu, DeepSpeedCPUAdam)."""
    offload_params: bool = False
    """The bf16 parameter partitions in pinned host memory too (DeepSpeed ZeRO-3 offload_param:
    cpu), each layer's
    fetched to the GPU when it runs and freed after: frees 2·P/world bytes per GPU for one flat
    pinned host buffer of the same size (power-of-two rounded). `ds-longctx plan` adds it after the
    optimizer offload where nothing fits without it. Not with LoRA or a partial optimizer offload.
    Its memory against the plan: docs/calibration.md#offload-params; its step-time cost is not
    measured."""
    offload_ratio: float = Field(
        1.0, ge=0.0, le=1.0, json_schema_extra={"flat": "optimizer_offload_ratio"}
    )
    """With optimizer_offload: the share of the optimizer state (fp32 master, grads, Adam moments)
    on the host, stepped by CPU Adam; the rest stays on the GPU and steps there (DeepSpeed ZeRO-3
    partial offload, offload_optimizer.ratio, split at its sub-groups, about OFFLOAD_SUB_GROUPS per
    rank: plan/zero_buffers.py). 1: all on the host. It trains as the full offload does (tests/gpu);
    its memory against the plan: docs/calibration.md#partial-offload."""

    @model_validator(mode="after")
    def _floor_under_peak(self) -> "OptimizerConfig":
        if self.min_lr > self.lr:
            raise ValueError(
                f"min_lr={self.min_lr:g} is above lr={self.lr:g}: the schedule decays from lr down "
                f"to min_lr; set min_lr <= {self.lr:g}"
            )
        return self
