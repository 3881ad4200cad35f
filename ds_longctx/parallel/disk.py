"""Files on disk, for every layer that writes them: an OS error said in one line, free space, and
the marker that makes a partial output this project's own. Torch-free, at the bottom (data, run and
the commands import it).

    # "no space left on /x writing /x/r/f (needs ~3.2 GB, 1.1 GB free)":
    describe_os_error(e, path, needed=None)
    make_partial(dir)          # a new directory carrying PARTIAL_MARKER (who made it, when)
    clear_partial(dir, fix)    # remove it only if it carries the marker and its maker is gone
    finish_partial(dir, dest)  # the marker removed, the directory renamed into place

Design notes: docs/design/parallel.md, section `disk.py`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from ds_longctx.parallel.units import GB

PARTIAL_MARKER = ".ds_longctx-partial"
# errors that say the disk or its permissions stop a write (what describe_os_error words itself)
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG)


class NotOurs(ValueError):
    """A path this project would remove or replace holds something it did not make: the message
    names it."""


def size_text(n: float) -> str:
    """Bytes for a person: '3.2 GB', '540 MB', '12 kB', '80 bytes' (GB = 10**9)."""
    for unit, scale in (("GB", GB), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 100 * scale else f"{n / scale:,.0f} {unit}"
    return f"{int(n)} bytes"


def user_path(path: str) -> str:
    """The one resolution of a path a user gives (config key or command option). More:
    docs/design/parallel.md."""
    return os.path.expanduser(path) if path.startswith("~") else path


def existing_ancestor(path) -> Path:
    """`path` itself if it exists, else its nearest existing parent (where a new file would
    land)."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def mount_point(path) -> Path:
    """The mount point of the filesystem that holds (or would hold) `path`, links followed (a link
    into another filesystem names that one): what a full disk is."""
    p = Path(os.path.realpath(existing_ancestor(path)))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def free_bytes(path) -> Optional[int]:
    """Free bytes on the filesystem that holds (or would hold) `path`, for this user; None if it
    cannot be read."""
    try:
        return shutil.disk_usage(existing_ancestor(path)).free
    except OSError:
        return None


def read_only(path) -> bool:
    """Whether `path` lies on a filesystem mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable(path) -> Optional[str]:
    """Why no file can be made at `path`, naming its nearest existing parent (a file, on a read-only
    filesystem or not writable by this user); None where one can. Asked before free space."""
    anc = existing_ancestor(path)
    if not anc.is_dir():
        return f"{anc} is a file, not a directory"
    if os.access(anc, os.W_OK | os.X_OK):  # EROFS too: access(2) checks the mount
        return None
    why = "on a read-only filesystem" if read_only(anc) else "not writable by this user"
    return f"{anc} is {why}"


def is_disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_ERRNOS


def describe_os_error(e: OSError, path, needed: Optional[int] = None) -> str:
    """`e` (raised while writing `path`) in one line: what stopped the write, the file, and for a
    full disk or quota the bytes needed (where known) against the free space. The caller adds the
    fix."""
    where = str(e.filename or path)
    free = free_bytes(where)
    room = ", ".join(
        x
        for x in (
            f"needs ~{size_text(needed)}" if needed else "",
            f"{size_text(free)} free" if free is not None else "",
        )
        if x
    )
    room = f" ({room})" if room else ""
    if e.errno == errno.ENOSPC:
        return f"no space left on {mount_point(where)} writing {where}{room}"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded writing {where}{room}"
    if e.errno == errno.EROFS:
        return f"{where} is on a read-only filesystem"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write {where} ({e.strerror})"
    if e.errno == errno.EFBIG:
        return (
            f"{where}: {e.strerror} (over the filesystem's or this process's file-size limit, "
            "ulimit -f)"
        )
    return f"{where}: {e.strerror or e}"


def maker() -> dict:
    """Who this process is, as the marker and the run lock record it: pid, host, since (local time),
    command."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv else "",
    }


def alive_here(info: dict) -> bool:
    """Whether the process `info` names runs on this host (its pid exists here; another host:
    assumed alive)."""
    if info.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return True


def who(info: dict) -> str:
    """'pid 123 on host h since <its local start time> (its command)' from a marker's or lock's
    record."""
    if not info:
        return "an unknown process (its record is empty)"
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('since')}" + (
        f" ({info['command']})" if info.get("command") else ""
    )


def make_partial(path: Path) -> None:
    """Create directory `path` (it must not exist) with PARTIAL_MARKER in it: this process made
    it."""
    Path(path).mkdir(parents=True)
    (Path(path) / PARTIAL_MARKER).write_text(json.dumps(maker()) + "\n")


def partial_maker(path: Path) -> Optional[dict]:
    """The record in `path`'s PARTIAL_MARKER ({} if unreadable), or None where `path` has no
    marker."""
    marker = Path(path) / PARTIAL_MARKER
    if not marker.is_file():
        return None
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def check_partial(path: Path, fix: str) -> Optional[dict]:
    """The maker of the partial directory `path` that this project left (its marker's maker is
    gone), None if `path` does not exist. NotOurs, naming it and `fix`, where it lacks the marker or
    its maker still runs."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    info = partial_maker(p) if p.is_dir() and not p.is_symlink() else None
    if info is None:
        raise NotOurs(
            f"{str(p)!r} exists and was not made by ds_longctx (no {PARTIAL_MARKER} marker in it), "
            f"so it is left alone; {fix}"
        )
    if info.get("pid") != os.getpid() and alive_here(info):
        raise NotOurs(f"{str(p)!r} is being written by {who(info)}; wait for it to end, or {fix}")
    return info


def clear_partial(path: Path, fix: str) -> Optional[str]:
    """Remove the partial directory `path` where `check_partial` finds it ours; returns the line to
    say (None: there was none)."""
    info = check_partial(path, fix)
    if info is None:
        return None
    shutil.rmtree(path)
    return f"removed {str(path)!r}, left unfinished by {who(info)}"


def finish_partial(path: Path, dest: Path) -> None:
    """Rename the partial directory `path` (its marker removed) to `dest` (absent, or an empty
    directory)."""
    (Path(path) / PARTIAL_MARKER).unlink()
    if Path(dest).is_dir():
        Path(dest).rmdir()  # empty: rmdir refuses otherwise
    os.replace(path, dest)


def _digest(path: Path) -> Optional[str]:
    if path.is_symlink() or not path.is_file():
        return None
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def mark_written(d: Path, marker: str, names) -> None:
    """`d/marker` records who wrote the files `names` of `d` and each one's sha256 (what `not_ours`
    asks)."""
    record = {"maker": maker(), "files": {n: _digest(Path(d) / n) for n in names}}
    fd = os.open(
        Path(d) / marker,
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK,
        0o644,
    )
    with os.fdopen(fd, "w") as f:  # a link in its place is never written through (ELOOP)
        f.write(json.dumps(record, indent=1) + "\n")


def not_ours(d: Path, marker: str, names=None) -> list:
    """The entries of `d` (of `names` only, where given) that `d/marker` does not record as written
    by this project with their present content: a user's own files, never overwritten nor removed.
    The marker itself is ours."""
    d = Path(d)
    mine = (d / marker).is_file() and not (d / marker).is_symlink()
    try:
        text = (d / marker).read_text()[: 1 << 20] if mine else "{}"
        recorded = json.loads(text).get("files", {})
    except (OSError, ValueError, AttributeError):
        recorded = {}
    recorded = recorded if isinstance(recorded, dict) else {}
    present = (
        sorted(p.name for p in d.iterdir())
        if names is None
        else [n for n in names if os.path.lexists(d / n)]
    )
    return [
        n
        for n in present
        if not (n == marker and mine) and (n not in recorded or _digest(d / n) != recorded[n])
    ]
