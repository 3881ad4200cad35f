"""`train` section: the length, the step count, the seed and where the run writes (owner: run/train_loop.py)."""

from __future__ import annotations

import math
import re
from typing import Literal, Optional

from pydantic import Field

from ds_longctx.config.base import Section

_SCALED = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG])")
_POWERS = {"k": 1, "m": 2, "g": 3}


def whole_number_hint(text: str) -> str:
    """How to write `text` (a count given as `128k`, `1M`, `1e6`) as the whole number a length or count is: both
    readings of a k / M / G suffix (powers of 1024 and of 1000), which this config does not guess between."""
    if m := _SCALED.fullmatch(text.strip()):
        n, p = float(m[1]), _POWERS[m[2].lower()]
        ways = [f"{int(v)}" for v in (n * 1024**p, n * 1000**p) if v == int(v)]
    else:
        try:
            v = float(text)
        except ValueError:
            v = 0.5
        ways = [f"{int(v)}"] if math.isfinite(v) and v == int(v) else []
    return f"; give the whole number, e.g. {' or '.join(ways)}" if ways else "; give a whole number"


class TrainConfig(Section):
    """The sequence length, the step count, the seed and the output directory."""

    USER_PATHS = ("output_dir",)

    seq_len: int = Field(256, gt=0)
    """Tokens per sequence (one sequence per rank group per step)."""
    micro_batch: int = Field(1, ge=1)
    """Sequences per SP group per forward (1 for long context)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches per optimizer step (gradient accumulation): a step trains micro_batch x grad_accum x dp
    sequences, micro_batch x grad_accum x dp x seq_len tokens (the plan and the log say so)."""
    steps: int = Field(3, ge=1)
    """Optimizer steps to run (or `epochs`)."""
    epochs: Optional[float] = Field(None, gt=0)
    """Passes over the data instead of `steps`: steps = epochs x (rows // (dp x micro_batch x grad_accum)), the rows
    being the data's rows of seq_len (the log says how many); not with an explicit `steps`."""
    loss_average: Literal["tokens", "sequences"] = "tokens"
    """tokens: a step's loss is the cross-entropy summed over every trained token of the step (all SP ranks,
    data-parallel replicas and micro-batches) over their count; sequences: each sequence's token mean, averaged over
    the step's sequences that train any token. A rank or replica without trained tokens adds zero either way."""
    objective: Literal["sft", "dpo", "grpo"] = "sft"
    """sft: cross-entropy on the trained tokens. dpo: TRL's DPO on preference pairs (rows of prompt, chosen and
    rejected; docs/workflows.md), the reference log-probs computed once from the starting weights and stored in
    output_dir. grpo is not built yet."""
    beta: float = Field(0.1, gt=0)
    """DPO's beta: the weight of the log-ratio to the reference (TRL's DPOConfig.beta)."""
    loss_type: Literal["sigmoid", "hinge", "ipo"] = "sigmoid"
    """DPO's per-pair loss, by TRL's DPOConfig.loss_type names."""
    shared_prompt: bool = True
    """DPO rows hold each pair's prompt once, then both completions, each attending to the prompt and to itself (the
    prompt's layers run once, its attention twice); false: each completion after its own copy of the prompt."""
    ref_model: Optional[str] = None
    """DPO's reference model; None: the starting weights (the only reference built so far)."""
    seed: int = Field(0, ge=0, lt=2**32)
    """Seed for random init and synthetic data; identical for any world size / sp_size. A 32-bit number (torch's
    generators take seed x 1,000,003 + epoch, which must fit 64 bits)."""
    output_dir: str = "runs/latest"
    """Where metrics.jsonl (one JSON line per step), run.yaml and checkpoints are written."""
    overwrite: bool = False
    """Start a fresh run in an output_dir that holds another run's files (checkpoints, run.yaml, metrics.jsonl, ...):
    its checkpoints are deleted, its metrics.jsonl kept aside. Without it such an output_dir is refused, naming what
    it holds. Not with resume (which continues that run)."""


def objective_problem(train: TrainConfig, data, eval_data: Optional[str]) -> Optional[str]:
    """What the train section's objective keys refuse with the data and eval_data (None: nothing)."""
    if train.objective == "grpo":
        return "objective=grpo is not built yet; use objective: sft or dpo"
    if train.objective != "dpo":
        return (
            "ref_model applies to objective: dpo; leave it unset"
            if train.ref_model is not None
            else None
        )
    if train.ref_model is not None:
        return (
            f"ref_model={train.ref_model!r}: a reference other than the starting weights is not built yet; leave "
            f"ref_model unset (the reference log-probs come from the starting weights)"
        )
    if train.micro_batch != 1:
        return f"objective=dpo packs pairs into rows of seq_len and takes micro_batch=1, got {train.micro_batch}"
    if eval_data is not None:
        return (
            f"eval_data={eval_data!r} with objective=dpo: a held-out evaluation of preference pairs is not built "
            f"yet; leave eval_data unset"
        )
    if data.source == "synthetic":
        return (
            "objective=dpo trains on preference pairs; set data to a .jsonl file of prompt, chosen and rejected "
            "rows"
        )
    return None
