"""One writer per output directory: an advisory lock on a file in it (LOCK_FILE), held for the life
of a run or eval.

    if (holder := lock_holder(out)) ...  # who holds it now (None: free); opens nothing for writing
    lock = RunLock.acquire(out)          # RunLockError naming the holder while another holds it
    lock.release()                       # also at exit; the kernel lets go when the holder dies

Exclusive flock(2), never waited for; the file records its holder. Who takes it, and takeover of a
dead holder's lock: docs/design/checkpoint.md."""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Optional

from ds_longctx.parallel.disk import describe_os_error, maker, who

log = logging.getLogger("ds_longctx")

LOCK_FILE = ".ds_longctx.lock"
LOCK_ENV = "DS_LONGCTX_RUN_LOCK"  # pid@host of the launcher that holds the lock for its workers
_TRIES = 3  # a holder seen for an instant may be `lock_holder` peeking: try again after _WAIT_S
_WAIT_S = 0.05
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
FIX = "choose another output_dir"
# the locks this process holds (release_all: before a worker's os._exit); a forked child holds none
_HELD: list = []
os.register_at_fork(after_in_child=_HELD.clear)


class RunLockError(ValueError):
    """Another process holds the directory's lock: the message names it and the fix."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def _record(fd: int) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        info = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def in_use(out, holder: dict, fix: str) -> str:
    """The refusal of a writer into `out` while `holder` writes there; `fix`: the command's other
    way out."""
    stop = ""
    if holder.get("pid"):
        here = holder.get("host") == socket.gethostname()
        stop = (
            " (or stop it: kill -TERM "
            f"{holder['pid']}{'' if here else ' on ' + str(holder.get('host'))})"
        )
    return (
        f"output_dir={str(out)!r} is in use by {who(holder)}: one writer per run; wait for it to "
        f"end{stop}, or {fix}"
    )


_OPEN = (
    os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)  # a link or a FIFO never followed nor waited on


def _open_lock(path: Path, flags: int, fix: str = FIX) -> int:
    """`path` opened with `flags`, never following a link nor blocking; RunLockError unless a
    regular file."""
    try:
        fd = os.open(path, flags | _OPEN, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        fd = None
    kind = "a symbolic link" if fd is None else None
    if fd is not None and not stat.S_ISREG(mode := os.fstat(fd).st_mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    if kind:
        raise RunLockError(
            f"output_dir={str(path.parent)!r}: its lock file {LOCK_FILE} is {kind}, which no run "
            f"of this project makes, so nothing there is opened or written; {fix}",
            {},
        )
    return fd


def lock_holder(out) -> Optional[dict]:
    """The record of the process holding `out`'s lock, None where nobody does (or there is no lock
    file); RunLockError where the lock file is not a regular file. Never blocks."""
    path = Path(os.path.abspath(Path(out).expanduser())) / LOCK_FILE
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _record(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops a shared lock taken here
    return None


class RunLock:
    """The lock of one directory held by this process (fd None: the filesystem has no flock; nothing
    held)."""

    def __init__(self, path: Path, fd: Optional[int], created: list):
        self.path, self.fd, self.created, self.pid = path, fd, created, os.getpid()
        if fd is not None:
            _HELD.append(self)

    @classmethod
    def acquire(cls, out, fix: str = FIX, launcher: Optional[str] = None) -> Optional["RunLock"]:
        """Hold `out`'s lock (creating `out` if needed). None where `launcher` (pid@host) holds it
        for this process. RunLockError where another process holds it; OSError where `out` cannot be
        written."""
        out = Path(os.path.abspath(Path(out).expanduser()))
        created = [p for p in [out, *out.parents] if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        path = out / LOCK_FILE
        for attempt in range(_TRIES):
            fd = _open_lock(path, os.O_RDWR | os.O_CREAT, fix)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _record(fd)
                os.close(fd)
                if launcher and holder and f"{holder.get('pid')}@{holder.get('host')}" == launcher:
                    return None
                if attempt == _TRIES - 1:
                    raise RunLockError(in_use(out, holder, fix), holder) from None
                time.sleep(_WAIT_S)
                continue
            except OSError as e:
                os.close(fd)
                if e.errno not in _UNSUPPORTED:
                    raise
                log.warning(
                    "%s: this filesystem has no flock, so a second writer into it is not detected",
                    path,
                )
                return cls(path, None, [])
            try:
                same = os.fstat(fd).st_ino == os.lstat(path).st_ino
            except FileNotFoundError:
                same = False
            if (
                not same
            ):  # its holder released (removed) it between our open and flock: lock the new file
                os.close(fd)
                continue
            left = _record(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(maker()) + "\n").encode(), 0)
            if left:
                log.warning(
                    "took over the lock of %s left by %s, which no longer holds it", out, who(left)
                )
            return cls(path, fd, created)
        raise RunLockError(in_use(out, {}, fix), {})

    def release(self) -> None:
        """Let go: the lock file removed (if still ours), then the directories acquire created,
        where empty. Only in the process that took it (a forked child inherits the object, not the
        lock)."""
        if self.fd is None or self.pid != os.getpid():
            return
        try:
            if os.fstat(self.fd).st_ino == os.lstat(self.path).st_ino:
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        for d in self.created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break
        _HELD.remove(self)


@atexit.register
def release_all() -> None:
    """Release every lock this process holds (at exit, and before a worker leaves through
    os._exit)."""
    for lock in list(_HELD):
        lock.release()


def lock_env_value() -> str:
    """$DS_LONGCTX_RUN_LOCK's value for the workers of this (launching) process."""
    return f"{os.getpid()}@{socket.gethostname()}"


def take(out, fix: str = FIX, rank: int = 0, launcher: Optional[str] = None) -> Optional[RunLock]:
    """The lock of `out` as a command takes it: on rank 0 only; None where `launcher` (pid@host, a
    worker's $DS_LONGCTX_RUN_LOCK) holds it. RunLockError (a ValueError: a refusal) naming the
    holder, or the write error."""
    if rank != 0:
        return None
    try:
        return RunLock.acquire(out, fix, launcher)
    except OSError as e:
        raise RunLockError(
            f"output_dir={str(out)!r}: its lock cannot be made ({describe_os_error(e, out)}); "
            f"choose a writable output directory",
            {},
        ) from None
