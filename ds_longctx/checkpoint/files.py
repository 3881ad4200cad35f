"""The files of a checkpoint: each one's owning rank (`owner`), the manifest's size and sha256 per
file, checking them before a load (`verify`), and loading without running code (`load`,
`weights_only_loads`, ALLOWED globals).

A damaged or altered file is refused naming the rank, the file and both digests, before DeepSpeed's
collective load. Manifest formats, hashing cost and the allowed globals: docs/design/checkpoint.md.
"""

from __future__ import annotations

# torch, numpy and deepspeed are imported inside the functions that use them: the HF Trainer
# integration imports this module, and importing it loads none of them.
import contextlib
import hashlib
import json
import os
import pickle
import re
from pathlib import Path
from typing import Iterable, Optional

from tqdm import tqdm

from ds_longctx.checkpoint.layout import META, UNIVERSAL_DIRS, CheckpointError
from ds_longctx.checkpoint.paths import is_ours, manifest_path, walk_files

PROGRESS_BYTES = 1 << 30  # rank 0 shows a progress bar while hashing a file larger than this
_CHUNK = 8 << 20
_RANK_FILE = re.compile(r"(?:^|_)zero_pp_rank_(\d+)_|^rng_rank(\d+)\.pt$")
# DeepSpeed 0.19.8's ZeRO-3 optimizer state (stage3._rigid_state_dict): the stage and the (bf16 /
# fp32) loss scaler
ALLOWED = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
)
# what numpy's RNG state pickles to (np.random.get_state()): only format-1 RNG files, written before
# RNG was tensors
LEGACY_RNG = (
    "numpy.dtype",
    "numpy.ndarray",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.dtypes.UInt32DType",
)
_FORCE, _FORCE_NO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_TORCH_PROSE = ("Weights only load failed", "Check the documentation", "Please file", "\t", " ")
# torch names the global it refused: "GLOBAL x.y was not an allowed global" or "GLOBAL posix.system
# whose module ..."
_ASKED = re.compile(r"GLOBAL (\S+)")


def owner(name: str) -> int:
    """The rank that writes, hashes and checks file `name` of a tag directory (module doc)."""
    m = _RANK_FILE.search(name)
    return int(m.group(1) or m.group(2)) if m else 0


def digest(path: Path, show: bool = False) -> str:
    """sha256 of `path`, read in 8 MiB chunks (memory stays flat); with `show`, a progress bar for a
    large file."""
    h = hashlib.sha256()
    size = path.stat().st_size
    bar = None
    if show and size > PROGRESS_BYTES:
        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}", leave=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return h.hexdigest()


def entries(tag_dir: Path, names: Iterable[str], show: bool = False) -> dict:
    """Manifest entries {name: {"bytes", "sha256"}} of `names` under `tag_dir`."""
    return {
        n: {"bytes": (tag_dir / n).stat().st_size, "sha256": digest(tag_dir / n, show)}
        for n in sorted(names)
    }


def owned(names: Iterable[str], rank: Optional[int]) -> list:
    """The names of `names` that `rank` owns (None: all)."""
    return sorted(n for n in names if rank is None or owner(n) == rank)


def expected_size(entry) -> int:
    """The size a manifest entry records (format 1: the entry is the size)."""
    return entry if isinstance(entry, int) else int(entry["bytes"])


def check_sizes(tag_dir: Path, meta: dict, what: str, fix: str) -> None:
    """Every manifest file present at its recorded size and no other file beside them (cheap: no
    data read: a file the save did not write would be read by DeepSpeed's globs), else
    CheckpointError."""
    listed = meta.get("files", {})
    for name in listed:
        manifest_path(tag_dir, name, what)
    extra = sorted(
        rel
        for rel in walk_files(tag_dir, what)
        if rel not in listed and rel != META and Path(rel).parts[0] not in UNIVERSAL_DIRS
    )
    if extra:
        raise CheckpointError(
            f"{what}: checkpoint {str(tag_dir)!r} holds {', '.join(extra[:5])}, which its save did "
            f"not write (not in {META}); remove it, or {fix}"
        )
    for name, entry in listed.items():
        f = tag_dir / name
        if not f.is_file():
            raise CheckpointError(
                f"{what}: checkpoint {str(tag_dir)!r} is corrupt: {name} is missing; {fix}"
            )
        if f.stat().st_size != expected_size(entry):
            raise CheckpointError(
                f"{what}: checkpoint {str(tag_dir)!r} is corrupt: {name} has {f.stat().st_size} "
                f"bytes, {expected_size(entry)} were written; {fix}"
            )


def problem(tag_dir: Path, meta: dict, rank: Optional[int], show: bool = False) -> Optional[str]:
    """What is wrong with `rank`'s files (None: every file) of `tag_dir`, or None: each is a torch
    archive whose pickle names no global outside ALLOWED (LEGACY_RNG too for a format-1 RNG file),
    and, where the manifest has a digest, hashes to it. Reads every byte of the files it hashes (the
    module doc's cost)."""
    files = meta.get("files", {})
    for name in owned(files, rank):
        path = manifest_path(tag_dir, name, "load")
        if name.endswith(".pt"):
            asked = unsafe_globals(
                path, legacy_rng=meta.get("format") == 1 and name.startswith("rng_rank")
            )
            if isinstance(asked, str):
                return f"{name}: {asked}"
            if asked:
                return (
                    f"{name} asks to run {', '.join(asked)} when loaded; a checkpoint holds "
                    "tensors and numbers "
                    f"(and DeepSpeed's {', '.join(a.rpartition('.')[2] for a in ALLOWED)}), so it "
                    f"is refused unloaded"
                )
        entry = files[name]
        if isinstance(entry, dict):
            found = digest(path, show)
            if found != entry["sha256"]:
                return (
                    f"{name}: sha256 {found}, the manifest ({META}) says {entry['sha256']}: the "
                    f"file changed after it was written"
                )
    return None


def unsafe_globals(path: Path, legacy_rng: bool = False):
    """The globals the pickle in torch archive `path` names beyond torch's defaults and ALLOWED
    (LEGACY_RNG too with `legacy_rng`), read without running it (torch's
    `get_unsafe_globals_in_checkpoint`); a string when `path` is not a torch archive."""
    import torch

    try:
        asked = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError, pickle.UnpicklingError, KeyError) as e:
        return (
            f"not a readable torch archive ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:200]})"
        )
    return sorted(set(asked) - set(ALLOWED) - (set(LEGACY_RNG) if legacy_rng else set()))


# ----------------------------------------------------------------------------- loading
def allowed_globals(legacy_rng: bool = False) -> list:
    """The objects of ALLOWED (and of LEGACY_RNG) that a weights-only load may build."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    out = [ZeroStageEnum, LossScaler]
    if legacy_rng:
        import numpy as np

        try:
            from numpy._core.multiarray import _reconstruct
        except ImportError:  # numpy < 2
            from numpy.core.multiarray import _reconstruct
        out += [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    return out


@contextlib.contextmanager
def weights_only_loads(legacy_rng: bool = False):
    """Within the block every torch.load of this process is weights-only and may build only
    `allowed_globals`; the environment and torch's safe-globals list are restored after."""
    import torch

    saved_env = {k: os.environ.get(k) for k in (_FORCE, _FORCE_NO)}
    saved_globals = torch.serialization.get_safe_globals()
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NO, None)  # torch refuses both set at once
    torch.serialization.add_safe_globals(allowed_globals(legacy_rng))
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved_globals)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def refusal(exc: BaseException, where: str) -> Optional[str]:
    """The one-line reason when `exc` is torch's weights-only refusal ("asks to run GLOBAL"), else
    None."""
    text = str(exc)
    if not isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" not in text:
        return None
    m = _ASKED.search(text)
    if m:
        asked = m.group(1)
    else:  # no global named: torch's own line about what it met
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(_TORCH_PROSE)
        ]
        asked = f"more than tensors ({(lines or ['?'])[-1][:200]})"
    return (
        f"{where} asks to run {asked} when loaded; a checkpoint holds tensors and numbers (and "
        f"DeepSpeed's {', '.join(a.rpartition('.')[2] for a in ALLOWED)}), so it is refused"
    )


def load(path: Path, legacy_rng: bool = False, map_location="cpu"):
    """torch.load of one checkpoint file, weights-only (module doc); CheckpointError naming the file
    and the global it asked for."""
    import torch

    try:
        with weights_only_loads(legacy_rng):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        reason = refusal(e, str(path))
        if reason is None:
            raise
        raise CheckpointError(reason) from None


# ----------------------------------------------------------------------------- what of checkpoints/
# a save wrote beside its tag directories a save leaves `latest` (and its temporary) and DeepSpeed's
# two scripts
SAVED_FILES = ("latest", "latest.tmp", "zero_to_fp32.py", "zero_to_torch.py")
_SAVING = re.compile(
    r"^\.tmp-(old-)?step\d+$"
)  # a save in progress, or the tag directory it replaces


def foreign_files(root: Path, tag: re.Pattern) -> list:
    """What under checkpoints/ `root` no save of this project wrote, as paths from its parent:
    anything but SAVED_FILES, `.tmp-*` saves marked as ours, and directories named like `tag` whose
    every file is meta.json or in its manifest."""
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        return [f"{root.name} (a {'symbolic link' if root.is_symlink() else 'file'})"]
    foreign = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        rel = f"{root.name}/{p.name}"
        if p.is_symlink():
            foreign.append(f"{rel} (a symbolic link)")
        elif (p.is_file() and p.name in SAVED_FILES) or (_SAVING.match(p.name) and is_ours(p)):
            continue
        elif not p.is_dir() or not tag.match(p.name):
            foreign.append(rel)
        elif not (p / META).is_file():
            foreign.append(f"{rel}/ (no {META}: not a checkpoint this project finished)")
        else:
            try:
                listed = json.loads((p / META).read_text()).get("files", {})
            except (OSError, ValueError, AttributeError):
                foreign.append(f"{rel}/{META} (not a checkpoint's)")
                continue
            foreign += [
                f"{rel}/{f.relative_to(p)}"
                for f in sorted(p.rglob("*"))
                if f.is_symlink()
                or (
                    f.is_file()
                    and str(f.relative_to(p)) not in (*listed, META)
                    and f.relative_to(p).parts[0] not in UNIVERSAL_DIRS
                )
            ]
    return foreign


def overwrite_problem(root: Path, tag: re.Pattern) -> Optional[str]:
    """Why --overwrite may not delete checkpoints/ `root` (it holds what no save wrote:
    `foreign_files`), or None."""
    foreign = foreign_files(root, tag)
    if not foreign:
        return None
    more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    return (
        f"overwrite deletes {str(root)!r} only where every file in it is a checkpoint's, and it "
        "holds "
        f"{', '.join(foreign[:5])}{more}, which no save wrote; move those out of it, or choose a "
        "new output_dir"
    )
