"""Refusals: bad config, bad input, an unusable checkpoint. Every one exits with `REFUSED` (2), says why in one
line, and changes nothing.

Inside workers (after `ds-longctx train` started them, e.g. data whose token ids are outside the vocabulary):
every rank exits 2 and rank 0 prints the line, or, when `ds-longctx train` launched it, writes it to the file
named by $DS_LONGCTX_REFUSAL_FILE instead, so the launcher prints it as the last line rather than under
torchrun's failure report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

REFUSED = 2
REFUSAL_FILE_ENV = "DS_LONGCTX_REFUSAL_FILE"


def refuse(message: str, rank: int = 0):
    """Leave this process with exit 2; rank 0 prints `message` (and records it for the launcher). Tears the
    process group down first when there is one."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        path = os.environ.get(REFUSAL_FILE_ENV)
        if path:  # `ds-longctx train` prints it last, after torchrun's own lines
            Path(path).write_text(message + "\n")
        else:
            print(message, file=sys.stderr, flush=True)
    sys.exit(REFUSED)


def recorded_refusal(path: str) -> Optional[str]:
    """The refusal a worker wrote to `path` (None if none)."""
    p = Path(path)
    return p.read_text().strip() or None if p.is_file() else None
