"""`train` section: the length, the step count, the seed and where the run writes (owner: run/train_loop.py)."""

from __future__ import annotations

from pydantic import Field

from ds_longctx.config.base import Section


class TrainConfig(Section):
    """The sequence length, the step count, the seed and the output directory."""

    seq_len: int = Field(256, gt=0)
    """Tokens per sequence (one sequence per rank group per step)."""
    micro_batch: int = Field(1, ge=1)
    """Sequences per SP group per step (1 for long context)."""
    steps: int = Field(3, ge=1)
    """Optimizer steps to run."""
    seed: int = Field(0, ge=0, lt=2 ** 32)
    """Seed for random init and synthetic data; identical for any world size / sp_size. A 32-bit number (torch's
    generators take seed x 1,000,003 + epoch, which must fit 64 bits)."""
    output_dir: str = "runs/latest"
    """Where metrics.jsonl (one JSON line per step), run.yaml and checkpoints are written."""
    overwrite: bool = False
    """Start a fresh run in an output_dir that holds another run's files (checkpoints, run.yaml, metrics.jsonl, ...):
    its checkpoints are deleted, its metrics.jsonl kept aside. Without it such an output_dir is refused, naming what
    it holds. Not with resume (which continues that run)."""
