"""`checkpoint` section: when the run saves and what it resumes from (owner:
checkpoint/resume.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from ds_longctx.config.base import Section


class CheckpointConfig(Section):
    """When the run saves and what it resumes from."""

    save_every: int = Field(0, ge=0)
    """Save a DeepSpeed checkpoint every N steps and at the last step (0: only when stopped by
    SIGTERM). Written atomically under output_dir/checkpoints."""
    keep: int = Field(2, ge=0, json_schema_extra={"flat": "keep_checkpoints"})
    """Keep the newest N checkpoints, delete older ones (0: keep all)."""
    resume: bool = False
    """Continue from the latest checkpoint in output_dir: weights, optimizer, RNG and data order;
    metrics.jsonl is appended to. Which world size and sp_size may resume it:
    checkpoint/layout.py."""
    resume_tag: Optional[str] = None
    """With resume: a checkpoint tag under output_dir/checkpoints (e.g. step300) instead of the
    latest."""
    allow_batch_change: bool = False
    """With resume: let this run train another number of sequences a step (dp x micro_batch x
    grad_accum) than the checkpoint's; the sample stream continues from the samples it consumed.
    Off: such a resume is refused."""

    @model_validator(mode="after")
    def _tag_needs_resume(self) -> "CheckpointConfig":
        if self.resume_tag is not None and not self.resume:
            raise ValueError(
                f"resume_tag={self.resume_tag!r} is set but resume is false; add --resume true or "
                f"drop resume_tag"
            )
        return self
