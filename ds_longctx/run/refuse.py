"""Refusals: exit `REFUSED` (2) with one line, nothing changed; under `ds-longctx train` the line
goes to $DS_LONGCTX_REFUSAL_FILE for the launcher to print last."""

from __future__ import annotations

# torch is imported where a process group may need tearing down: the CLI imports this module without
# it.
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

from ds_longctx.checkpoint.run_lock import release_all

REFUSED = 2
REFUSAL_FILE_ENV = "DS_LONGCTX_REFUSAL_FILE"
GAVE_UP_AT = "gave_up_at"  # record_failure's exact time.time() in the error file's extraInfo


def last_line(message: str, code: int, rank: int = 0) -> None:
    """Rank 0's last line with exit `code`: to $DS_LONGCTX_REFUSAL_FILE for the launcher, else
    stderr."""
    if rank != 0:
        return
    path = os.environ.get(REFUSAL_FILE_ENV)
    if path:  # `ds-longctx train` prints it last, after torchrun's own lines
        Path(path).write_text(f"{code}\n{message}\n")
    else:
        print(message, file=sys.stderr, flush=True)


def record_failure(e: BaseException) -> None:
    """This worker's exception (call it in `except`) where its torchrun agent reads it,
    $TORCHELASTIC_ERROR_FILE, in torch's error-file format plus GAVE_UP_AT, the exact time it was
    caught (torch's `timestamp` is whole seconds): the launcher's last line names the rank others
    timed out waiting for."""
    at = time.time()  # first: the moment the collective gave up, to the millisecond
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        info = {"py_callstack": traceback.format_exc(), "timestamp": str(int(at)), GAVE_UP_AT: at}
        record = {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": info}}
        Path(path).write_text(json.dumps(record))


def refuse(message: str, rank: int = 0):
    """Exit 2 with rank 0 saying `message`, after the process group and any output_dir lock are let
    go."""

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
