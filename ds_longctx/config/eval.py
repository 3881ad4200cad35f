"""`eval` section: held-out evaluation during training and by `ds-longctx eval` (owner:
run/evaluate.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator, model_validator

from ds_longctx.config.base import Section

# the lowest value of each count, and what it counts (the refusal names both)
_LOWEST = {
    "every": (0, "steps between evaluations; 0: after the last step only"),
    "rows": (
        1,
        "held-out rows per evaluation, e.g. eval_rows: 8; to turn evaluation off drop eval_data",
    ),
    "buckets": (1, "position buckets of the loss curve, e.g. eval_buckets: 32"),
}


class EvalConfig(Section):
    """Held-out evaluation: which rows, how often, and the buckets of the per-position loss
    curve."""

    USER_PATHS = ("data",)

    data: Optional[str] = Field(None, json_schema_extra={"flat": "eval_data"})
    """Held-out data. None: no evaluation. `synthetic`: the synthetic task drawn from another seed
    stream than training's (data/synthetic.py `held_out`); or a file, directory or hub name read
    like `data` (same tokenizer, data_layout and fields; its first eval_rows rows in the run's
    order); a corpus directory of `ds-longctx data prepare`: its eval.jsonl."""
    every: int = Field(0, json_schema_extra={"flat": "eval_every"})
    """Evaluate every N optimizer steps and after the last one; 0: after the last step only. Needs
    eval_data."""
    rows: int = Field(8, json_schema_extra={"flat": "eval_rows"})
    """Held-out rows per evaluation (the same rows every time), split over the data-parallel
    replicas."""
    buckets: int = Field(32, json_schema_extra={"flat": "eval_buckets"})
    """Position buckets of the per-position loss curve (eval_curve.jsonl): equal spans of the
    sequence, at most seq_len."""
    answer_loss: bool = Field(False, json_schema_extra={"flat": "eval_answer_loss"})
    """Also the loss on the answers of long agent sessions by answer-to-evidence distance, before
    the first step and at every evaluation, to answer_loss.jsonl (run/answer_loss.py): eval_data
    must be a `data prepare --sessions` directory (or its jsonl); its first eval_rows sessions, each
    forwarded whole. `ds-longctx eval --answer_loss true` writes the same lines at the checkpoint's
    step."""
    recall: bool = Field(False, json_schema_extra={"flat": "eval_recall"})
    """Also recall: per distance bucket, the share of answers whose value greedy decoding gives
    back, with the answer loss with and without the evidence, at the same evaluations as
    eval_answer_loss, to recall.jsonl (run/recall.py; the same sessions and forwards). `ds-longctx
    eval --recall true` writes them for a checkpoint or a model."""

    @field_validator("every", "rows", "buckets")
    @classmethod
    def _at_least(cls, v: int, info) -> int:
        low, what = _LOWEST[info.field_name]
        if v < low:
            raise ValueError(f"eval_{info.field_name}={v} must be >= {low} ({what})")
        return v

    @model_validator(mode="after")
    def _every_needs_data(self) -> "EvalConfig":
        if self.every and self.data is None:
            raise ValueError(
                f"eval_every={self.every} is set but eval_data is not; add --eval_data synthetic "
                f"(or a path) or drop eval_every"
            )
        if self.answer_loss and self.data is None:
            raise ValueError(
                "eval_answer_loss is set but eval_data is not; add --eval_data DIR (a `ds-longctx "
                "data prepare --sessions` directory) or drop eval_answer_loss"
            )
        if self.recall and self.data is None:
            raise ValueError(
                "eval_recall is set but eval_data is not; add --eval_data DIR (a `ds-longctx data "
                "prepare --sessions` directory) or drop eval_recall"
            )
        return self
