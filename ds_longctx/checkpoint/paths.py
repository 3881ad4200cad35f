"""Paths read out of a run's own files, kept inside the run.

Every tag or file name taken from a run's files or from the user is resolved here only: a tag is one
plain path component, and every path, after symlinks, lies inside its checkpoint directory; anything
else is a CheckpointError raised before the target is opened. Details: docs/design/checkpoint.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Optional

from ds_longctx.checkpoint.layout import LATEST, META, PARTIAL_PREFIX, TAG, CheckpointError
from ds_longctx.parallel.disk import PARTIAL_MARKER

MAX_SMALL_FILE = 64 << 20  # meta.json and latest are read whole; larger is not ours
_SHOWN = 240  # characters of an offending value shown


def shown(value: str) -> str:
    """`value` for a message: repr, cut to _SHOWN characters."""
    r = repr(value)
    return r if len(r) <= _SHOWN else r[:_SHOWN] + "...'"


def inside(base: Path, path: Path) -> bool:
    """`path` resolves (symlinks followed) to `base` or below it."""
    try:
        return path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def check_tag(tag: str, source: str, what: str, root: Path) -> str:
    """`tag` when it is one plain path component naming a directory inside `root`, else
    CheckpointError naming `source` (the file or option it came from) and the value."""
    plain = (
        0 < len(tag) <= 255
        and tag not in (".", "..")
        and "/" not in tag
        and "\\" not in tag
        and "\x00" not in tag
        and tag.isprintable()
    )
    if not plain or not inside(root, root / tag):
        raise CheckpointError(
            f"{what}: {source} holds {shown(tag)}, which is not a checkpoint of this run (a tag is "
            f"a directory name inside {str(root)!r}); name one of {tag_names(root)}"
        )
    return tag


def tag_names(root: Path) -> list:
    """The complete-looking tag directories of `root`, oldest first (names only; nothing read)."""
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p.name)
        for p in root.iterdir()
        if (m := TAG.match(p.name)) and inside(root, p)
    ]
    return [name for _, name in sorted(found)]


def read_small(path: Path, base: Path, what: str) -> str:
    """The text of `path`, a file of the run inside `base` (checked before it is opened), at most
    MAX_SMALL_FILE bytes."""
    if not inside(base, path):
        raise CheckpointError(
            f"{what}: {str(path)!r} is a link that leads out of {str(base)!r}, so it is not read; "
            f"replace it with the run's own file"
        )
    size = path.stat().st_size
    if size > MAX_SMALL_FILE:
        raise CheckpointError(
            f"{what}: {str(path)!r} has {size} bytes, more than a run writes there "
            f"({MAX_SMALL_FILE}); it is not read"
        )
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise CheckpointError(
            f"{what}: {str(path)!r} is not text, so it is not what a save writes there"
        ) from None


def read_latest(root: Path, what: str = "resume") -> Optional[str]:
    """The tag `root/latest` names (None: no such file), checked by `check_tag`."""
    f = root / LATEST
    if not (f.is_file() or f.is_symlink()):
        return None
    return check_tag(read_small(f, root, what).strip(), repr(str(f)), what, root)


def manifest_path(tag_dir: Path, name: str, what: str) -> Path:
    """tag_dir / name for a manifest entry `name`: a relative path without '..' that stays inside
    `tag_dir`."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts or "\x00" in name:
        raise CheckpointError(
            f"{what}: {str(tag_dir / 'meta.json')!r} lists the file {shown(name)}, which is not "
            f"inside its checkpoint directory; nothing of it is read; use an earlier tag"
        )
    if not inside(tag_dir, tag_dir / name):
        raise CheckpointError(
            f"{what}: {str(tag_dir / name)!r} is a link that leads out of checkpoint "
            f"{str(tag_dir)!r}, so nothing of it is read; remove the link or use an earlier tag"
        )
    return tag_dir / name


def walk_files(tag_dir: Path, what: str) -> Iterator[str]:
    """Every file under `tag_dir`, relative; CheckpointError for a link that leads out of it
    (symlinked directories are not followed)."""
    for d, dirs, names in os.walk(tag_dir, followlinks=False):
        for n in dirs + names:
            p = Path(d) / n
            if p.is_symlink() and not inside(tag_dir, p):
                raise CheckpointError(
                    f"{what}: {str(p)!r} is a link that leads out of checkpoint {str(tag_dir)!r}, "
                    f"so nothing of it is read; remove the link or use an earlier tag"
                )
        for n in names:
            yield str((Path(d) / n).relative_to(tag_dir))


# ----------------------------------------------------------------------------- saves in progress
def unmark_partial(d: Path) -> None:
    """A save about to be renamed into place: no longer partial."""
    (d / PARTIAL_MARKER).unlink(missing_ok=True)


def is_ours(d: Path) -> bool:
    """`d` is a directory this project wrote: a marked partial output, or a checkpoint with its
    meta.json."""
    return (
        d.is_dir()
        and not d.is_symlink()
        and ((d / PARTIAL_MARKER).is_file() or (d / META).is_file())
    )


def partial_saves(root: Path) -> list:
    """The saves of ours under `root` that never completed (a crash, a full disk, an abandoned
    save)."""
    return sorted(p for p in root.glob(PARTIAL_PREFIX + "*") if is_ours(p)) if root.is_dir() else []


def foreign_partials(root: Path) -> list:
    """Paths under `root` named like a save in progress that this project did not make (never
    removed)."""
    return (
        sorted(p for p in root.glob(PARTIAL_PREFIX + "*") if not is_ours(p))
        if root.is_dir()
        else []
    )
