"""Refusals: bad config, bad input, an unusable checkpoint. Every one exits with `REFUSED` (2), says
why in one line, and changes nothing. Inside workers launched by `ds-longctx train`, the line goes
to $DS_LONGCTX_REFUSAL_FILE so the launcher prints it last (`last_line`; also used by
run/stops.py)."""

from __future__ import annotations

# torch is imported where a process group may need tearing down: the CLI imports this module without it.
import os
import sys
from pathlib import Path
from typing import Optional

REFUSED = 2
REFUSAL_FILE_ENV = "DS_LONGCTX_REFUSAL_FILE"


def last_line(message: str, code: int, rank: int = 0) -> None:
    """Rank 0's last word: for the launcher to print last with exit `code` (the file of $DS_LONGCTX_REFUSAL_FILE:
    the code on its first line, the message after), else on stderr now. Other ranks say nothing."""
    if rank != 0:
        return
    path = os.environ.get(REFUSAL_FILE_ENV)
    if path:  # `ds-longctx train` prints it last, after torchrun's own lines
        Path(path).write_text(f"{code}\n{message}\n")
    else:
        print(message, file=sys.stderr, flush=True)


def refuse(message: str, rank: int = 0):
    """Leave this process with exit 2; rank 0 prints `message` (and records it for the launcher). Tears the
    process group down first when there is one, and lets go of an output_dir lock this process took (run_lock)."""
    from ds_longctx.checkpoint.run_lock import release_all

    release_all()  # a refused run leaves no lock file, nor the directory its lock made
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    last_line(message, REFUSED, rank)
    sys.exit(REFUSED)


def recorded_line(path: str) -> Optional[tuple]:
    """(exit code, message) a worker recorded in `path` with `last_line`, or None."""
    p = Path(path)
    if not p.is_file():
        return None
    code, _, message = p.read_text().partition("\n")
    return (
        (int(code), message.strip())
        if code.strip().lstrip("-").isdigit() and message.strip()
        else None
    )
