"""A run's output survives its terminal: stdout and stderr go to the terminal and, past the
refusals, to `<output_dir>/train.log`; a terminal that goes away stops only the writes to it.

    with guarded_output():          # a process's whole life
        keep_log(output_dir)        # past every refusal: both streams append there
        say_now(text)               # from a signal handler: os.write to stderr and the log
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Optional

LOG_NAME = "train.log"
_log_fd: Optional[int] = (
    None  # the open train.log of this process (O_APPEND: every rank and the launcher share it)
)


class _Tee(io.TextIOBase):
    """A text stream writing to `stream` (dropped at its first OSError) and to the run's log."""

    def __init__(self, stream):
        self.stream = self.original = stream

    def write(self, s: str) -> int:
        if _log_fd is not None and s:
            with contextlib.suppress(OSError):
                os.write(_log_fd, s.encode("utf-8", "replace"))
        if self.stream is not None:
            try:
                self.stream.write(s)
                self.stream.flush()
            except OSError:
                self._drop()
        return len(s)

    def _drop(self) -> None:
        """Point the dead descriptor at /dev/null, keep the text in the log."""
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
            self.stream.flush()  # what the buffer held goes to /dev/null now
        self.stream = None

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError:
                self._drop()

    def fileno(self) -> int:
        return self.original.fileno()

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    @property
    def encoding(self) -> str:
        return "utf-8"


@contextlib.contextmanager
def guarded_output():
    """sys.stdout and sys.stderr as _Tee for the block (idempotent), the previous streams back after
    it."""
    global _log_fd
    previous, outer = (sys.stdout, sys.stderr), not isinstance(sys.stdout, _Tee)
    if outer:
        sys.stdout, sys.stderr = _Tee(sys.stdout), _Tee(sys.stderr)
    try:
        yield
    finally:
        if outer:
            for tee in (sys.stdout, sys.stderr):
                tee.flush()
            sys.stdout, sys.stderr = previous
            if _log_fd is not None:
                os.close(_log_fd)
                _log_fd = None


def keep_log(output_dir) -> Path:
    """From now on this process's output also goes to `<output_dir>/train.log`; its path."""
    global _log_fd
    path = Path(output_dir) / LOG_NAME
    if _log_fd is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return path


def say_now(text: str) -> None:
    """`text` to stderr and the run's log with bare os.write (safe in a signal handler)."""
    for fd in (2, _log_fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, text.encode())
