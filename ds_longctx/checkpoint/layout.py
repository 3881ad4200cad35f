"""A run's directory and its checkpoints, and which run may load a checkpoint: the one statement of
both.

Every other module names its files from here. A tag is `step<N>`; meta.json's FORMAT says how its
files are checked and READS the formats this version loads. `ds-longctx eval` loads partitions only
at the saved world and sp size; a resume at another layout reads the universal form. The full layout
and rule: docs/design/checkpoint.md."""

from __future__ import annotations

import re
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint or output directory that cannot be used: the message names the value and the
    fix."""


CKPT_SUBDIR = "checkpoints"
LATEST = "latest"
TAG = re.compile(r"^step(\d+)$")  # the tags a save writes
PARTIAL_PREFIX = (
    ".tmp-"  # a save in progress: checkpoints/.tmp-<tag>, renamed to <tag> when complete
)
# a tag's universal form (checkpoint/universal.py), its conversion in progress, and the form it
# replaces, renamed aside until the new one is in place: checked by their own manifest
UNIVERSAL_DIRS = ("universal", ".tmp-universal", ".old-universal")
META = "meta.json"
FORMAT = (
    2  # 2: every file's sha256 in meta.json, RNG as tensors; 1: sizes only, RNG pickled with numpy
)
READS = (1, 2)
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "eval_curve.jsonl"
ANSWER_LOSS_FILE = "answer_loss.jsonl"
ANSWERS_FILE = "answer_loss_answers.jsonl"  # one line per answer per evaluation
RECALL_FILE = "recall.jsonl"  # one line per (stage, step, bucket): run/recall.py
RECALL_ANSWERS_FILE = "recall_answers.jsonl"  # one line per answer per recall evaluation
# a fresh run refuses an output_dir holding any of these (another run's), unless overwrite
RUN_FILES = (CKPT_SUBDIR, "run.yaml", "ds_config.json", METRICS_FILE, CURVE_FILE, "tensorboard")
RUN_CONFIGS = (
    "run.yaml",
    "ds_config.json",
)  # what a run (re)writes in output_dir, recorded in RUN_MARKER
RUN_MARKER = (
    ".ds_longctx-run"  # their sha256 as the run wrote them: one without is a user's, never replaced
)


def ckpt_root(output_dir) -> Path:
    return Path(output_dir) / CKPT_SUBDIR


def tag_for(step: int) -> str:
    return f"step{step}"


def loadable(run: dict, world_size: int, sp_size: int) -> bool:
    """Whether a run of `world_size` processes at `sp_size` may load the checkpoint whose meta.json
    "run" is `run` as saved, without resharding (`ds-longctx eval`; module doc)."""
    return (run["world_size"], run["sp_size"]) == (world_size, sp_size)
