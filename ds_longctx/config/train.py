"""`train` section: the length, the step count, the seed and where the run writes (owner:
run/train_loop.py)."""

from __future__ import annotations

import math
import re
from typing import Literal, Optional

from pydantic import Field, model_validator

from ds_longctx.config.base import Section

_SCALED = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG])")
_POWERS = {"k": 1, "m": 2, "g": 3}


def _trl_defaults(objective) -> dict:
    """TRL's beta and loss_type of an objective (DPOConfig's for sft, as before grpo existed)."""
    return (
        {"beta": 0.0, "loss_type": "dapo"}
        if objective == "grpo"
        else {"beta": 0.1, "loss_type": "sigmoid"}
    )


def whole_number_hint(text: str) -> str:
    """How to write `text` (a count given as `128k`, `1M`, `1e6`) as the whole number a length or
    count is: both readings of a k / M / G suffix (powers of 1024 and of 1000), which this config
    does not guess between."""
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

    USER_PATHS = ("output_dir", "ref_model")

    seq_len: int = Field(256, gt=0)
    """Tokens per sequence (one sequence per rank group per step)."""
    micro_batch: int = Field(1, ge=1)
    """Sequences per SP group per forward (1 for long context)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches per optimizer step (gradient accumulation): a step trains micro_batch x
    grad_accum x dp sequences, micro_batch x grad_accum x dp x seq_len tokens (the plan and the log
    say so)."""
    steps: int = Field(3, ge=1)
    """Optimizer steps to run (or `epochs`)."""
    epochs: Optional[float] = Field(None, gt=0)
    """Passes over the data instead of `steps`: steps = epochs x (rows // (dp x micro_batch x
    grad_accum)), the rows being the data's rows of seq_len (the log says how many); not with an
    explicit `steps`."""
    loss_average: Literal["tokens", "sequences"] = "tokens"
    """tokens: a step's loss is the cross-entropy summed over every trained token of the step (all
    SP ranks, data-parallel replicas and micro-batches) over their count; sequences: each sequence's
    token mean, averaged over the step's sequences that train any token. A rank or replica without
    trained tokens adds zero either way."""
    objective: Literal["sft", "dpo", "grpo"] = "sft"
    """sft: cross-entropy on the trained tokens. dpo: TRL's DPO on preference pairs (prompt, chosen,
    rejected). grpo: TRL's GRPO loss on scored rollouts (prompt, completion, reward and group, or
    advantage). docs/workflows.md."""
    beta: Optional[float] = Field(None, ge=0)
    """dpo: the weight of the log-ratio to the reference (TRL's DPOConfig.beta; unset: 0.1); grpo:
    the weight of
    the KL to the reference (GRPOConfig.beta; unset: 0, no reference pass)."""
    loss_type: Optional[Literal["sigmoid", "hinge", "ipo", "grpo", "dapo", "dr_grpo"]] = None
    """TRL's loss_type names: dpo sigmoid (unset: sigmoid), hinge, ipo; grpo dapo (unset: dapo),
    grpo, dr_grpo."""
    epsilon: float = Field(0.2, ge=0)
    """grpo: the clip's lower epsilon (ratio kept above 1 - epsilon; TRL's GRPOConfig.epsilon)."""
    epsilon_high: Optional[float] = Field(None, ge=0)
    """grpo: the clip's upper epsilon (ratio below 1 + epsilon_high); None: epsilon (TRL's
    GRPOConfig)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """grpo rows with reward and group: advantage = (reward - group mean) / (std + 1e-4), std of the
    group, of all rewards (batch) or none (not divided); TRL's GRPOConfig.scale_rewards."""
    max_completion_length: Optional[int] = Field(None, ge=1)
    """grpo loss_type dr_grpo: the constant a micro-batch's token sum is divided by (x its
    sequences), the rollout engine's cap; None: the longest completion of the rows (the log says
    which)."""
    shared_prompt: bool = True
    """DPO rows hold each pair's prompt once, then both completions, each attending to the prompt
    and to itself (the prompt's layers run once, its attention twice); false: each completion after
    its own copy of the prompt."""
    ref_model: Optional[str] = None
    """The reference model of dpo (and of grpo's KL): a HF directory of the model's architecture and
    vocabulary; its log-probs are computed once, before training; None: the starting weights."""

    @model_validator(mode="before")
    @classmethod
    def _objective_defaults(cls, data):
        """Unset (or null) beta and loss_type take the objective's TRL defaults
        (`_trl_defaults`)."""
        if isinstance(data, dict):
            unset = {
                k: v for k, v in _trl_defaults(data.get("objective")).items() if data.get(k) is None
            }
            data = {**data, **unset} if unset else data
        return data

    seed: int = Field(0, ge=0, lt=2**32)
    """Seed for random init and synthetic data; identical for any world size / sp_size. A 32-bit
    number (torch's generators take seed x 1,000,003 + epoch, which must fit 64 bits)."""
    output_dir: str = "runs/latest"
    """Where metrics.jsonl (one JSON line per step), run.yaml and checkpoints are written."""
    overwrite: bool = False
    """Start a fresh run in an output_dir that holds another run's files (checkpoints, run.yaml,
    metrics.jsonl, ...): its checkpoints are deleted, its metrics.jsonl kept aside. Without it such
    an output_dir is refused, naming what it holds. Not with resume (which continues that run)."""


DPO_LOSSES, GRPO_LOSSES = ("sigmoid", "hinge", "ipo"), ("grpo", "dapo", "dr_grpo")
# The train keys each objective reads; a dumped run.yaml holds only its own objective's.
OBJECTIVE_KEYS = {
    "sft": (),
    "dpo": ("beta", "loss_type", "shared_prompt", "ref_model"),
    "grpo": (
        "beta",
        "loss_type",
        "epsilon",
        "epsilon_high",
        "scale_rewards",
        "max_completion_length",
        "ref_model",
    ),
}


def drop_other_objective_keys(train: dict) -> None:
    """A dumped `train` section without the keys its objective does not read."""
    own = OBJECTIVE_KEYS[train.get("objective", "sft")]
    for key in {k for keys in OBJECTIVE_KEYS.values() for k in keys} - set(own):
        train.pop(key, None)


def objective_terms(train: TrainConfig) -> tuple[float, str]:
    """(beta, loss_type) of the run's objective (set, or TRL's defaults: `_trl_defaults`)."""
    unset = _trl_defaults(train.objective)
    beta = unset["beta"] if train.beta is None else train.beta
    return beta, unset["loss_type"] if train.loss_type is None else train.loss_type


def _terms_problem(train: TrainConfig) -> Optional[str]:
    """What the objective refuses of beta, loss_type and the grpo keys (None: nothing)."""
    beta, loss = objective_terms(train)
    if train.objective == "sft":
        return (
            None
            if train.ref_model is None
            else "ref_model applies to objective dpo or grpo; leave it unset"
        )
    if loss not in (DPO_LOSSES if train.objective == "dpo" else GRPO_LOSSES):
        ok = DPO_LOSSES if train.objective == "dpo" else GRPO_LOSSES
        return f"loss_type={loss!r} is not a {train.objective} loss; use one of {list(ok)}"
    if train.objective == "dpo" and beta == 0:
        return "objective=dpo takes beta > 0 (TRL's default 0.1)"
    if train.objective == "grpo" and beta == 0 and train.ref_model is not None:
        return (
            f"ref_model={train.ref_model!r} with beta 0: grpo reads a reference only for its KL; "
            "set beta > 0"
        )
    return None


def objective_problem(train: TrainConfig, data, eval_data: Optional[str]) -> Optional[str]:
    """What the train section's objective keys refuse with the data and eval_data (None:
    nothing)."""
    if msg := _terms_problem(train):
        return msg
    if train.objective == "sft":
        return None
    if train.micro_batch != 1:
        return (
            f"objective={train.objective} packs its sequences into rows of seq_len and takes "
            f"micro_batch=1, got {train.micro_batch}"
        )
    if eval_data is not None:
        return (
            f"eval_data={eval_data!r} with objective={train.objective}: a held-out evaluation is "
            f"not built for it yet; leave eval_data unset"
        )
    if data.source == "synthetic":
        what = "prompt, chosen and rejected" if train.objective == "dpo" else "scored rollouts"
        return f"objective={train.objective} trains on a .jsonl file of {what}; set data to one"
    return None
