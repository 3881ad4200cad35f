"""`train` section: the length, the step count, the seed and where the run writes (owner: run/train.py)."""

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
    seed: int = 0
    """Seed for random init and synthetic data; identical for any world size / sp_size."""
    output_dir: str = "runs/latest"
    """Where metrics.jsonl (one JSON line per step), run.yaml and checkpoints are written."""
