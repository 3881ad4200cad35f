"""`logging` section: how often the progress bar refreshes and where metrics also go (owner:
run/train_loop.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ds_longctx.config.base import Section


class LoggingConfig(Section):
    """How often the progress bar refreshes and where metrics also go."""

    log_every: int = Field(1, ge=1)
    """Progress-bar refresh interval in steps."""
    report_to: Literal["auto", "none", "tensorboard", "wandb"] = "auto"
    """Where metrics go besides metrics.jsonl: tensorboard (output_dir/tensorboard; needs the
    tensorboard package), wandb (Weights & Biases, offline under output_dir/wandb unless WANDB_MODE
    says otherwise; needs wandb), none; auto: tensorboard when it imports, else none. An older
    file's `tensorboard: true|false` reads as auto|none."""
    memory_snapshot_steps: int = Field(0, ge=0)
    """Record the CUDA allocator's history for the first N steps, then write per rank
    output_dir/memory/rank<r>_snapshot.pickle (https://pytorch.org/memory_viz) and rank<r>_peak.txt
    (what is alive at the peak, by the code line that allocated it); run/memory_snapshot.py. 0: off.
    Needs CUDA."""
