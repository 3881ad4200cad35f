"""A ZeRO-3 checkpoint in a layout-free form: each trainable parameter's whole fp32 master and Adam
moments, what a resume at another world size, sp size or dp size cuts its own partitions from
(checkpoint/reshard.py).

    <tag>/universal/manifest.json             source layout, optimizer step, every parameter,
                                              every file's sha256
    <tag>/universal/<param name>.safetensors  "fp32", "exp_avg", "exp_avg_sq": [numel] float32 each

Writing streams one old rank and one fragment at a time, never a whole model in host memory; a rank
reads only its slice; every file is checked against the manifest's digest first. Where each piece
comes from: docs/design/checkpoint.md."""

from __future__ import annotations

# torch and safetensors are imported where tensors are read or written: importing this module
# loads neither.
import ctypes
import ctypes.util
import functools
import json
import math
import mmap
import os
import shutil
import struct
import time
from pathlib import Path

from tqdm import tqdm

from ds_longctx.checkpoint import files
from ds_longctx.checkpoint.layout import UNIVERSAL_DIRS, CheckpointError

UNIVERSAL, PARTIAL, REPLACED = UNIVERSAL_DIRS
MANIFEST = "manifest.json"
KEYS = ("fp32", "exp_avg", "exp_avg_sq")
FORMAT = 1
_F32 = 4  # bytes per element


def universal_dir(tag_dir: Path) -> Path:
    return Path(tag_dir) / UNIVERSAL


def param_file(name: str) -> str:
    return f"{name}.safetensors"


def partition(numel: int, world: int) -> int:
    """Elements of one rank's partition of a `numel` parameter over `world` ranks (ZeRO-3: padded to
    equal)."""
    return math.ceil(numel / world)


# ----------------------------------------------------------------------------- safetensors laid
# out, then filled
def _layout(numel: int) -> tuple[bytes, int]:
    """(the safetensors header for KEYS of [numel] float32, the byte where the data starts)."""
    n = numel * _F32
    header = {
        k: {"dtype": "F32", "shape": [numel], "data_offsets": [i * n, (i + 1) * n]}
        for i, k in enumerate(KEYS)
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data aligned to 8 bytes
    return struct.pack("<Q", len(text)) + text, 8 + len(text)


def _create(path: Path, numel: int) -> int:
    """A zero-filled safetensors file for KEYS of [numel]; returns its data start."""
    head, start = _layout(numel)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(start + len(KEYS) * numel * _F32)
    return start


def _source_groups(tag_dir: Path, meta: dict) -> tuple[list, int]:
    """([[(name, shape), ...] per sub-group], old world size) from rank 0's model file and the
    meta."""
    world = int(meta["run"]["world_size"])
    model = files.load(tag_dir / model_file(0))
    groups = [[(n, tuple(int(x) for x in s)) for n, s in g.items()] for g in model["param_shapes"]]
    return groups, world


def model_file(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"


def optim_file(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def _rank_pieces(path: Path) -> tuple[list, list, float]:
    """(fp32 flat groups, [{exp_avg, exp_avg_sq}] per sub-group, optimizer step) of one optim file,
    memory-mapped."""
    import torch

    with files.weights_only_loads():
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)[
            "optimizer_state_dict"
        ]
    state = sd["optimizer_state_dict"]["state"]
    flat = sd["fp32_flat_groups"]
    if sorted(state) != list(range(len(flat))):
        raise CheckpointError(
            f"reshard: {path} holds optimizer state for sub-groups {sorted(state)} and fp32 "
            f"groups 0..{len(flat) - 1}: not a ZeRO-3 save with Adam moments; resume it at its own "
            f"layout"
        )
    step = state[0].get("step", 0)
    return (
        flat,
        [state[i] for i in range(len(flat))],
        float(step.item() if hasattr(step, "item") else step),
    )


def write_universal(tag_dir: Path, meta: dict, show: bool = False) -> dict:
    """Write `<tag_dir>/universal/` from the ZeRO-3 checkpoint `tag_dir` (its files checked against
    `meta` first); returns the manifest. Written under a temporary name and renamed when whole
    (`_replace`); on any error or signal (KeyboardInterrupt) the temporary directory is removed:
    what was there before stays."""
    tag_dir = Path(tag_dir)
    if (problem := files.problem(tag_dir, meta, None, show=show)) is not None:
        raise CheckpointError(f"reshard: checkpoint {str(tag_dir)!r} could not be read ({problem})")
    groups, world = _source_groups(tag_dir, meta)
    recover_universal(tag_dir)
    out, tmp = universal_dir(tag_dir), tag_dir / PARTIAL
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        manifest = _fill(tag_dir, meta, groups, world, tmp, show)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace(tmp, out, tag_dir / REPLACED)
    return manifest


def _replace(tmp: Path, out: Path, old: Path) -> None:
    """`out` replaced by the complete `tmp`, never half-deleted: `out` renamed aside to `old`, `tmp`
    renamed to `out`, then `old` removed. A stop between the renames puts `out` back; a kill there
    leaves what `recover_universal` completes."""
    try:
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        recover_universal(out.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)  # cut short: the next `recover_universal` ends it


def recover_universal(tag_dir: Path) -> bool:
    """Whether `tag_dir` holds a complete universal form (its manifest, written last, present), once
    a replacement a kill cut short (`_replace`) is settled: the form renamed aside is put back where
    no complete one took its place, else removed. The one writer calls it (rank 0, the CLI)."""
    out, old = universal_dir(tag_dir), Path(tag_dir) / REPLACED
    if old.exists():
        if not (out / MANIFEST).is_file() and (old / MANIFEST).is_file():
            shutil.rmtree(out, ignore_errors=True)
            os.replace(old, out)
        else:
            shutil.rmtree(old)
    return (out / MANIFEST).is_file()


def _fill(tag_dir: Path, meta: dict, groups: list, world: int, tmp: Path, show: bool) -> dict:
    """The parameter files and the manifest of `tag_dir`'s universal form, written into `tmp`."""
    import torch

    t0 = time.perf_counter()
    params, starts = [], {}
    for gi, group in enumerate(groups):
        for name, shape in group:
            numel = math.prod(shape)
            starts[name] = _create(tmp / param_file(name), numel)
            params.append({"name": name, "shape": list(shape), "numel": numel, "group": gi})
    step = None
    bar = tqdm(total=world, desc="reshard: ranks read", unit="rank", disable=not show)
    for r in range(world):
        flat, state, r_step = _rank_pieces(tag_dir / optim_file(r))
        step = r_step if step is None else step
        for gi, group in enumerate(groups):
            sources = (flat[gi], state[gi]["exp_avg"], state[gi]["exp_avg_sq"])
            offset = 0
            for name, shape in group:
                numel = math.prod(shape)
                part = partition(numel, world)
                valid = max(
                    0, min(part, numel - r * part)
                )  # the rest of the last partitions is padding
                if valid:
                    fd = os.open(tmp / param_file(name), os.O_WRONLY)
                    try:
                        for k, src in enumerate(sources):
                            piece = src.detach().narrow(0, offset, valid)
                            at = starts[name] + k * numel * _F32 + r * part * _F32
                            os.pwrite(
                                fd, piece.to(torch.float32).contiguous().numpy().tobytes(), at
                            )
                            _drop_pages(piece)
                    finally:
                        os.close(fd)
                offset += part
            if offset != flat[gi].numel():
                raise CheckpointError(
                    f"reshard: {optim_file(r)} sub-group {gi} holds {flat[gi].numel()} elements, "
                    f"its parameters' partitions {offset}: not this layout's save; resume it at "
                    f"its own layout"
                )
        del flat, state  # the memory map of this rank's file goes with them
        bar.update(1)
    bar.close()
    entries = files.entries(tmp, [param_file(p["name"]) for p in params], show=show)
    run = meta["run"]
    manifest = {
        "format": FORMAT,
        "tag": tag_dir.name,
        "step": int(meta["step"]),
        "optimizer_step": step,
        "source": {k: run[k] for k in ("world_size", "sp_size", "dp_size")},
        "params": params,
        "files": entries,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _drop_pages(t) -> None:
    """The pages of memory-mapped tensor `t` given back (madvise DONTNEED: read-only file pages,
    re-read on a later touch), so host memory stays a fragment however large the rank file is. A
    no-op where libc has no madvise."""

    libc = _libc()
    if libc is None or t.numel() == 0:
        return
    start = t.data_ptr()
    lo = start - start % mmap.PAGESIZE
    hi = start + t.numel() * t.element_size()
    hi -= hi % mmap.PAGESIZE  # whole pages only: a neighbour's partial page stays
    if hi > lo:
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # MADV_DONTNEED


@functools.lru_cache(maxsize=1)
def _libc():

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return libc if hasattr(libc, "madvise") else None
    except OSError:
        return None


# ----------------------------------------------------------------------------- reading
def read_manifest(tag_dir: Path, step: int | None = None) -> dict:
    """The universal manifest of `tag_dir`, or a CheckpointError naming the file (and the key) and
    how to make it again; `step`: the tag's own (its meta.json's), which the manifest's must be."""
    path = universal_dir(tag_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"reshard: {str(path)!r} does not exist; {rewrite(tag_dir)}"
        ) from None
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"reshard: {str(path)!r} is not a manifest ({e}); {rewrite(tag_dir)}"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"reshard: {str(path)!r} is not a universal manifest of format {FORMAT}; "
            f"{rewrite(tag_dir)}"
        )
    if bad := _step_problem(manifest, step):
        raise CheckpointError(f"reshard: {str(path)!r}: {bad}; {rewrite(tag_dir)}")
    return manifest


def _step_problem(manifest: dict, step: int | None):
    """What is wrong with the manifest's `step` (the tag's) or `optimizer_step` (Adam's count, a
    whole number no greater than the steps trained); None: nothing."""
    s, o = manifest.get("step"), manifest.get("optimizer_step")
    if type(s) is not int or s < 0 or (step is not None and s != step):
        want = step if step is not None else "a whole number >= 0"
        return f"step={s!r} is not the tag's step ({want})"
    if type(o) not in (int, float) or not 0 <= o <= s or o != int(o):
        return f"optimizer_step={o!r} is not a whole number from 0 to the tag's step {s}"
    return None


def rewrite(tag_dir: Path) -> str:
    """The fix for a universal form that is missing or damaged: the command that writes it (again,
    replacing it)."""
    return (
        f"`ds-longctx checkpoint reshard {tag_dir.parent.parent} --tag {tag_dir.name}` writes it "
        f"from the checkpoint (replacing what is there)"
    )


def universal_problem(tag_dir: Path, manifest: dict, share: tuple = (0, 1), show: bool = False):
    """What is wrong with the universal form of `tag_dir` (None: nothing), checking every file of
    the manifest whose index is `share`[0] modulo `share`[1] (the ranks split the reading): inside
    universal/, the size and sha256 recorded, a safetensors file of KEYS only (no pickle is ever
    opened); and no file beside them."""
    from safetensors import safe_open

    base = universal_dir(tag_dir)
    listed = manifest["files"]
    extra = sorted(p.name for p in base.iterdir() if p.name not in listed and p.name != MANIFEST)
    if extra:
        return (
            f"{str(base)!r} holds {', '.join(extra[:5])}, which the conversion did not write (not "
            f"in {MANIFEST})"
        )
    numels = {param_file(p["name"]): p["numel"] for p in manifest["params"]}
    for name in sorted(listed)[share[0] :: share[1]]:
        path = files.manifest_path(base, name, "reshard")
        entry = listed[name]
        if not path.is_file():
            return f"{str(path)!r} is missing"
        if name not in numels:
            return f"{str(path)!r} is listed in {MANIFEST} but is no parameter's file there"
        if (size := path.stat().st_size) != entry["bytes"]:
            return (
                f"{str(path)!r} is {size:,} bytes, {MANIFEST} says {entry['bytes']:,}: "
                f"not what its conversion wrote"
            )
        if (found := files.digest(path, show)) != entry["sha256"]:
            return (
                f"{str(path)!r}: sha256 {found}, {MANIFEST} says {entry['sha256']}: the file "
                f"changed after it was written"
            )
        try:
            with safe_open(str(path), framework="pt") as f:
                keys = sorted(f.keys())
                shapes = {k: f.get_slice(k).get_shape() for k in keys}
        except (
            Exception
        ) as e:  # not a safetensors file (a pickle, anything else): never loaded otherwise
            return (
                f"{str(path)!r} is not a safetensors file ({type(e).__name__}); a universal "
                f"checkpoint holds tensors only, so it is refused unloaded"
            )
        if keys != sorted(KEYS):
            return f"{str(path)!r} holds {keys}, not {list(KEYS)}"
        if wrong := [(k, v) for k, v in shapes.items() if v != [numels[name]]]:
            key, shape = wrong[0]
            return (
                f"{str(path)!r}: {key} has shape {shape}, {MANIFEST} says "
                f"[{numels[name]}] (the parameter's elements)"
            )
    return None


def read_slices(tag_dir: Path, name: str, start: int, stop: int, keys: tuple = KEYS) -> dict:
    """{key: elements [start, stop) of parameter `name`'s flat `key`} (float32 tensors), from one
    opening of its file; only those bytes are read."""
    from safetensors import safe_open

    with safe_open(str(universal_dir(tag_dir) / param_file(name)), framework="pt") as f:
        return {k: f.get_slice(k)[start:stop] for k in keys}
