"""A checkpoint's save, collective (the layout it writes: checkpoint/layout.py).

    with stops.saving(step):                          # the caller's: signals wait for the save
        tag_dir = save(engine, cfg, step, data.signature())

Rank 0 makes and marks `.tmp-<tag>`; every rank writes its files there and hashes them; rank 0
writes meta.json, renames the directory to `<tag>`, replaces `latest`, prunes. Until the rename
`latest` names the previous complete checkpoint; a failed write on any rank fails the save on all
(one line: the path, the free space), and its partial directory is removed.
"""

from __future__ import annotations

# deepspeed is imported where a checkpoint is saved, not at import.
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from ds_longctx.checkpoint import files, paths
from ds_longctx.checkpoint.layout import (
    FORMAT,
    LATEST,
    META,
    TAG,
    CheckpointError,
    ckpt_root,
    tag_for,
)
from ds_longctx.checkpoint.paths import read_latest
from ds_longctx.checkpoint.rng import rng_file, rng_state
from ds_longctx.config import resume_keys
from ds_longctx.parallel import fake_world
from ds_longctx.parallel.disk import PARTIAL_MARKER, describe_os_error, make_partial

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")
# debug: seconds a save waits with every file written, unrenamed
SAVE_PAUSE_ENV = "DS_LONGCTX_DEBUG_SAVE_PAUSE_S"


def _debug_pause(step: int) -> None:
    """Tests interrupt a save here: SAVE_PAUSE_ENV is `S` (every save waits S seconds) or `S@N` (the
    save of step N only)."""
    seconds, _, at = os.environ.get(SAVE_PAUSE_ENV, "0").partition("@")
    if not at or int(at) == step:
        time.sleep(float(seconds))


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (temp file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_meta(tag_dir: Path, meta: dict) -> None:
    _replace_file(tag_dir / META, json.dumps(meta, indent=1) + "\n")


def _own_files(tmp: Path, rank: int) -> list:
    return [
        str(f.relative_to(tmp))
        for f in sorted(tmp.rglob("*"))
        if f.is_file() and files.owner(f.name) == rank and f.name != PARTIAL_MARKER
    ]


def save(engine, cfg: RunConfig, step: int, data_signature: dict) -> Path:
    """Save the run at `step` (completed optimizer steps) as tag `step<step>`; atomic (module doc).
    Collective. A write that fails on any rank (a full disk, no permission) fails the save on every
    rank with one CheckpointError naming the path and the free space; the partial save is removed,
    the previous checkpoint stays."""
    fake_world.refuse_in_rehearsal("a checkpoint save")
    root = ckpt_root(cfg.train.output_dir)
    tag = tag_for(step)
    if read_latest(root, "save") == tag:
        return root / tag  # already saved at this step (SIGTERM right after a periodic save)
    tmp = root / f"{paths.PARTIAL_PREFIX}{tag}"
    if engine.state.rank == 0:
        log.info("checkpoint: saving step %d to %s", step, root / tag)
    err = _agree(_attempt(lambda: _begin(root, tmp, step) if engine.state.rank == 0 else None))
    if err is None:
        digests = _write_own(engine, cfg, tmp, step)
        err = next((d for d in digests if isinstance(d, str)), None)
        _debug_pause(step)
    if err is None and engine.state.rank == 0:
        err = _attempt(lambda: _finish(engine, cfg, root, tmp, step, digests, data_signature))
    err = _agree(err)
    if err is not None:
        if engine.state.rank == 0:
            shutil.rmtree(
                tmp, ignore_errors=True
            )  # ours (marked), and holding the space a full disk lacks
        raise CheckpointError(
            f"the save of step {step} failed: {err}; the partial save is removed, the last "
            f"complete checkpoint ({read_latest(root, 'save') or 'none'}) is unchanged"
        )
    return root / tag


def _attempt(write) -> Optional[str]:
    """None when `write()` succeeds; the one-line reason of its OSError (path, free space) when it
    fails."""
    try:
        write()
        return None
    except OSError as e:
        return describe_os_error(e, e.filename or "?")


def _agree(err: Optional[str]) -> Optional[str]:
    """The first rank's error of `err` on every rank (None: none failed). Collective; also a
    barrier."""
    if not dist.is_initialized():
        return err
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, err)
    return next((e for e in gathered if e is not None), None)


def _begin(root: Path, tmp: Path, step: int) -> None:
    """Rank 0: the partial save's directory, marked as ours, after earlier partial saves of ours."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in paths.partial_saves(root):
        shutil.rmtree(stale, ignore_errors=True)
    make_partial(tmp)


def _write_own(engine, cfg: RunConfig, tmp: Path, step: int) -> list:
    """Every rank writes its files into `tmp` (DeepSpeed's, its RNG) and hashes them: the ranks'
    manifest entries, or a rank's error line in its place. Collective."""
    st, wrote = engine.state, False
    try:
        engine.ds.save_checkpoint(
            str(tmp.parent), tag=tmp.name, client_state={"ds_longctx_step": step}, save_latest=False
        )
        wrote = True
        torch.save(rng_state(), tmp / rng_file(st.rank))
        mine = files.entries(
            tmp, _own_files(tmp, st.rank), show=st.rank == 0
        )  # this rank's own files
    except OSError as e:
        mine = describe_os_error(e, e.filename or "?")
        if not wrote:  # DeepSpeed's save ends with a barrier this rank skipped
            _barrier()
    if not dist.is_initialized():
        return [mine]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)  # also the barrier: every rank's files are written
    return gathered


def _finish(
    engine, cfg: RunConfig, root: Path, tmp: Path, step: int, digests: list, data_signature: dict
) -> None:
    """Rank 0: config.json, run.yaml and meta.json (written last), then the rename to the tag,
    `latest`, pruning."""
    import deepspeed

    st, tag = engine.state, tag_for(step)
    run = resume_keys.stored_values(cfg)
    run.update(world_size=st.world_size, sp_size=st.sp_size, dp_size=st.dp_size)
    engine.model.config.to_json_file(str(tmp / "config.json"))
    cfg.dump(tmp / "run.yaml")
    manifest = {k: v for d in digests for k, v in d.items()}
    manifest.update(files.entries(tmp, ["config.json", "run.yaml"]))
    samples = (
        engine.sample_offset + step * st.dp_size * cfg.train.micro_batch * cfg.train.grad_accum
    )
    meta = {
        "format": FORMAT,
        "step": step,
        "tag": tag,
        "run": run,
        "data": data_signature,
        "samples": samples,
        "deepspeed": deepspeed.__version__,
        "files": dict(sorted(manifest.items())),
    }
    paths.unmark_partial(tmp)
    write_meta(tmp, meta)
    final = root / tag
    if (
        final.exists()
    ):  # a tag of an abandoned later timeline (resumed from an earlier tag): replace it
        old = root / f"{paths.PARTIAL_PREFIX}old-{tag}"
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)
    _replace_file(root / LATEST, tag)
    _prune(root, step, cfg.checkpoint.keep)
    log.info("checkpoint: %s (step %d)", final, step)


def _prune(root: Path, step: int, keep: int) -> None:
    """Delete all but the newest `keep` tags at or before `step` (later tags, if any, are left
    alone)."""
    if keep <= 0:
        return
    tags = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := TAG.match(p.name)) and (p / META).is_file()
    )
    older = [p for s, p in tags if s <= step]
    for p in older[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
