"""A run's directory and its checkpoints: what they hold, and which run may load a checkpoint. This is the one
statement of that layout and that rule; every other module names its files from here.

    <output_dir>/                        on one filesystem that every node mounts at the same path
        checkpoints/latest               tag of the newest complete checkpoint, replaced atomically
        checkpoints/step300/             DeepSpeed's files (ZeRO-3: one partition per rank), and ours:
            meta.json                    step, run layout, data signature and every file's size and sha256; last
            config.json                  the HF config the engine built (YaRN included): export's config
            run.yaml                     the run config
            rng_rank00000.pt             each rank's RNG states (checkpoint/rng.py)
            universal/                   the layout-free form a resume at another layout reads, with its own
                                         manifest (checkpoint/universal.py; `ds-longctx checkpoint reshard`)
        checkpoints/.tmp-step300/        a save in progress, marked as ours; renamed to step300 once complete
        run.yaml, ds_config.json         the run's config and its DeepSpeed JSON (RUN_MARKER: their digests)
        metrics.jsonl, eval_curve.jsonl  one line per step / evaluation (run/metrics_log.py), answer_loss.jsonl
        tensorboard/                     report_to's events
        LOCK_FILE                        the one writer's lock (checkpoint/run_lock.py)

A tag is `step<N>`, N the completed optimizer steps; meta.json's FORMAT says how its files are checked
(checkpoint/files.py) and READS the formats this version loads.

Which run may load a checkpoint: a resume, any world size, sp size and dp size that keeps the global batch
(dp x micro_batch x grad_accum; another one only with allow_batch_change) and that the planner says fits the
machine: ZeRO-3's partitions are per rank, so another layout cuts its own from the checkpoint's universal form
(checkpoint/layout_change.py says what carries over, checkpoint/reshard.py loads it). `ds-longctx eval` reads the
partitions as saved: the same world size and sp_size (`loadable`). A resume also needs the same model, numerics,
data and optimizer layout; which keys may change instead (lr, steps, the memory levers, ...) is config/resume_keys.py's
rule, and run/resume_changes.py applies them.
"""

from __future__ import annotations

import re
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint or output directory that cannot be used: the message names the value and the fix."""


CKPT_SUBDIR = "checkpoints"
LATEST = "latest"
TAG = re.compile(r"^step(\d+)$")  # the tags a save writes
PARTIAL_PREFIX = (
    ".tmp-"  # a save in progress: checkpoints/.tmp-<tag>, renamed to <tag> when complete
)
# a tag's universal form (checkpoint/universal.py) and its conversion in progress: checked by their own manifest
UNIVERSAL_DIRS = ("universal", ".tmp-universal")
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
    """Whether a run of `world_size` processes at `sp_size` may load the checkpoint whose meta.json "run" is `run`
    as saved, without resharding (`ds-longctx eval`; module doc)."""
    return (run["world_size"], run["sp_size"]) == (world_size, sp_size)
