"""`ds-longctx plan`'s objective options: --objective and --completion_len; their checks, levers and
plan lines.

ds-longctx plan --model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --objective dpo
--completion_len 4096
"""

from __future__ import annotations

import argparse

from ds_longctx.plan.levers import DEFAULT_COMPLETION_LEN, Levers, default_completion_len
from ds_longctx.plan.preference_terms import OBJECTIVES, dpo_row

# run.yaml's data for an objective that reads a file (the run config refuses synthetic data there):
# a placeholder
DATA_PLACEHOLDER = {"dpo": "pairs.jsonl", "grpo": "rollouts.jsonl"}


def add_objective_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="sft",
        help="train.objective: sft; "
        "dpo (a row is one shared prompt, then chosen and rejected, plus a reference pass); "
        "grpo (sft's terms and the per-token log-probs)",
    )
    p.add_argument(
        "--completion_len",
        type=int,
        default=None,
        help="with --objective dpo: tokens of each completion of a row, the prompt the rest of "
        f"seq_len (default {DEFAULT_COMPLETION_LEN}, at most seq_len // 4)",
    )


def completion_len(a: argparse.Namespace) -> int:
    """The completion length the levers carry: dpo's (given or the default), else 0."""
    if a.objective != "dpo":
        return 0
    return default_completion_len(a.seq_len) if a.completion_len is None else a.completion_len


def check_objective_args(a: argparse.Namespace, geom) -> None:
    """Refuse what the run would refuse of the objective on this model, and a completion that leaves
    no prompt."""
    if a.completion_len is not None and a.objective != "dpo":
        raise ValueError(
            f"--completion_len {a.completion_len} applies to --objective dpo; add it, or drop "
            f"--completion_len"
        )
    if a.objective == "sft":
        return
    if geom.moe is not None:
        raise ValueError(
            f"--objective {a.objective} on {geom.name}, a mixture of experts: not built yet (its "
            f"load-balancing loss); plan a dense model"
        )
    if a.objective == "dpo" and geom.hybrid is not None:
        raise ValueError(
            f"--objective dpo on {geom.name}: its linear-attention layers would carry the chosen "
            "completion "
            f"into the rejected one under a shared prompt; plan a model of full-attention layers"
        )
    if a.objective == "dpo" and a.seq_len is None:
        raise ValueError("--objective dpo with --find_max_len: give --seq_len, the row's length")
    if a.objective == "dpo":
        dpo_row(a.seq_len, Levers(objective="dpo", completion_len=completion_len(a)))


def objective_flags(a: argparse.Namespace) -> list:
    if a.objective == "sft":
        return []
    parts = [f"--objective {a.objective}"]
    return parts + ([f"--completion_len {a.completion_len}"] if a.completion_len else [])


def objective_data_keys(a: argparse.Namespace) -> dict:
    """run.yaml's data for the objective (DATA_PLACEHOLDER); the objective itself comes with the
    levers."""
    return {"data": DATA_PLACEHOLDER[a.objective]} if a.objective != "sft" else {}


def placeholder_lines(a: argparse.Namespace) -> list:
    if a.objective == "sft":
        return []
    return [
        f"data: {DATA_PLACEHOLDER[a.objective]} and tokenizer null are placeholders: give the run "
        "your "
        f"{'preference pairs' if a.objective == 'dpo' else 'scored rollouts'} (.jsonl) and the "
        f"model's tokenizer (`ds-longctx train --config run.yaml --data FILE --tokenizer DIR`)"
    ]
