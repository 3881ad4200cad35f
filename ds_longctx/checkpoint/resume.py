"""Finding a checkpoint, the checks of output_dir and resume before anything starts, and the
collective load.

The layout of a run's directory and which run may load a checkpoint: checkpoint/layout.py. Every
path read from the run's files stays inside the run (checkpoint/paths.py). A partial save left by a
crash or a SIGKILL never blocks a resume: it is named in one line and removed by the next save
(checkpoint/save.py).

Load: every file is checked before anything is loaded (sizes and the globals each pickle names when
the checkpoint is found, each rank's own digests before DeepSpeed's load), and every load is
weights-only: a checkpoint runs no code (checkpoint/files.py). Format-1 checkpoints (before digests)
still load; `ds-longctx checkpoint convert DIR` rewrites them as format 2 (checkpoint/convert.py).
`ds-longctx eval` (run/eval_checkpoint.py) reads the weights alone (`load_weights`).
"""

from __future__ import annotations

# deepspeed is imported where a checkpoint is saved, not at import.
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch.distributed as dist

from ds_longctx.checkpoint import files, layout_change, nvme_state, paths
from ds_longctx.checkpoint.layout import (
    CKPT_SUBDIR,
    META,
    READS,
    RUN_CONFIGS,
    RUN_FILES,
    RUN_MARKER,
    TAG,
    CheckpointError,
    ckpt_root,
)
from ds_longctx.checkpoint.paths import read_latest, shown
from ds_longctx.checkpoint.reshard import resume_resharded
from ds_longctx.checkpoint.rng import rng_file, set_rng_state
from ds_longctx.config import resume_keys
from ds_longctx.parallel.disk import PARTIAL_MARKER, not_ours

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")


# ----------------------------------------------------------------------------- checks (no writes)
def find_checkpoint(
    root: Path, tag: Optional[str] = None, what: str = "resume"
) -> tuple[Path, dict]:
    """The complete checkpoint `tag` (default: latest) under `root` and its meta, or a
    CheckpointError. Every path taken from the run's files stays inside `root`
    (checkpoint/paths.py)."""
    if not root.is_dir():
        raise CheckpointError(
            f"{what}: no checkpoint in {str(root.parent)!r} ({str(root)!r} does not exist); "
            f"run without resume first with save_every > 0, or point at the run's output_dir"
        )
    if tag is None:
        tag = read_latest(root, what)
        if tag is None:
            found = paths.tag_names(root)
            raise CheckpointError(
                f"{what}: {str(root / 'latest')!r} is missing, so no checkpoint is complete"
                + (
                    f" (tag directories present: {found}; pick one with resume_tag / --tag)"
                    if found
                    else "; train without resume to create one"
                )
            )
    else:
        paths.check_tag(tag, f"the tag asked for ({shown(tag)})", what, root)
    tag_dir = root / tag
    if not tag_dir.is_dir():
        raise CheckpointError(
            f"{what}: checkpoint tag {tag!r} does not exist in {str(root)!r}; available: "
            f"{paths.tag_names(root)}"
        )
    meta_path = tag_dir / META
    if not meta_path.is_file():
        raise CheckpointError(
            f"{what}: checkpoint {str(tag_dir)!r} is incomplete (no {META}: its save was "
            f"interrupted); use an earlier tag of {paths.tag_names(root)}"
        )
    try:
        meta = json.loads(paths.read_small(meta_path, tag_dir, what))
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{what}: {str(meta_path)!r} is corrupt ({e.msg}); use an earlier tag"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") not in READS:
        raise CheckpointError(
            f"{what}: {str(tag_dir)!r} has checkpoint format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, this version reads "
            f"{list(READS)}; {what} with the ds_longctx version that wrote it"
        )
    if meta.get("tag") != tag and not (
        isinstance(meta.get("tag"), str) and TAG.fullmatch(meta["tag"])
    ):
        raise CheckpointError(
            f"{what}: {str(meta_path)!r} names tag {shown(str(meta.get('tag')))}, which no save "
            f"writes (step<N>): the file was changed after its save; use another of "
            f"{paths.tag_names(root)}"
        )
    if meta.get("tag") != tag:
        raise CheckpointError(
            f"{what}: directory {str(tag_dir)!r} holds the checkpoint saved as tag "
            f"{shown(str(meta.get('tag')))} (its {META}); a tag directory keeps its name: rename "
            f"it back to {shown(str(meta.get('tag')))}, or pick another of {paths.tag_names(root)}"
        )
    files.check_sizes(tag_dir, meta, what, "use an earlier tag (or restore the file)")
    for name in meta.get(
        "files", {}
    ):  # no data read: each pickle's globals, so a file that runs code stops here
        if name.endswith(
            ".pt"
        ):  # (a file that does not open is left to its rank's check, which names the rank)
            asked = files.unsafe_globals(
                tag_dir / name, legacy_rng=meta["format"] == 1 and name.startswith("rng_")
            )
            if asked and not isinstance(asked, str):
                raise CheckpointError(
                    f"{what}: checkpoint {str(tag_dir)!r} is refused: {name} asks to run "
                    f"{', '.join(asked)} when loaded (a checkpoint holds tensors and numbers), so "
                    f"nothing of it is loaded; use an earlier tag"
                )
    return tag_dir, meta


def check_output_dir(output_dir: str) -> None:
    """output_dir is (or can be made) a writable directory. Writes nothing (a probe is made and
    removed)."""
    p = Path(output_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise CheckpointError(
            f"output_dir={output_dir!r} is a file; choose a directory path for the run"
        )
    here = p.resolve()
    if tag := next(
        (d for d in (here, *here.parents) if d.parent.name == CKPT_SUBDIR and (d / META).is_file()),
        None,
    ):
        raise CheckpointError(
            f"output_dir={output_dir!r} is inside {str(tag)!r}, a checkpoint, whose files its "
            f"{META} records; choose an output_dir outside every run's checkpoints/"
        )
    if here in (Path(here.anchor), Path.home().resolve()):  # the run's files would litter it
        what = "your home directory" if here == Path.home().resolve() else "the filesystem root"
        raise CheckpointError(
            f"output_dir={output_dir!r} is {what}; give the run a directory of its own, e.g. "
            f"runs/NAME"
        )
    anc = p
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise CheckpointError(
            f"output_dir={output_dir!r} cannot be created: {str(anc)!r} is a file; choose "
            f"another output_dir"
        )
    try:
        if not os.access(anc, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {anc}")
        os.rmdir(tempfile.mkdtemp(prefix=".ds_longctx-probe-", dir=anc))
    except OSError as e:
        raise CheckpointError(
            f"output_dir={output_dir!r} is not writable ({str(anc)!r}: {e.strerror or e}); "
            f"choose a writable output_dir or fix its permissions"
        ) from None


def previous_run(output_dir) -> list:
    """What of another run `output_dir` holds (RUN_FILES present), each with its gist, e.g.
    'checkpoints (latest step6)', 'metrics.jsonl (6 lines)'."""
    out = Path(output_dir)
    held = []
    for name in RUN_FILES:
        p = out / name
        if not p.exists():
            continue
        if name == CKPT_SUBDIR:
            try:
                latest = read_latest(p)
            except (CheckpointError, OSError):
                latest = "not a tag of this run"
            held.append(
                f"checkpoints (latest {latest})" if latest else "checkpoints/ (none complete)"
            )
        elif name.endswith(".jsonl") and p.is_file():
            with open(p, "rb") as f:
                held.append(f"{name} ({sum(1 for _ in f)} lines)")
        else:
            held.append(name)
    return held


def check_run_dir(cfg: RunConfig, world_size: int) -> Optional[dict]:
    """Every check of output_dir and resume, before anything is started or written. Returns the meta
    of the checkpoint to resume from (None for a fresh run). A fresh run into an output_dir holding
    another run's files is refused unless `overwrite` (then `clear_previous_run` replaces them)."""
    check_output_dir(cfg.train.output_dir)
    root = ckpt_root(cfg.train.output_dir)
    if not cfg.checkpoint.resume:
        out = Path(cfg.train.output_dir)
        if out.is_dir() and (theirs := not_ours(out, RUN_MARKER, RUN_CONFIGS)):
            raise CheckpointError(
                f"output_dir={cfg.train.output_dir!r} holds {' and '.join(theirs)}, which no run "
                f"wrote there (or changed since): your own, which a run would replace; keep "
                f"them elsewhere (a run writes its own copies here) or choose another output_dir"
            )
        held = previous_run(cfg.train.output_dir)
        if held and not cfg.train.overwrite:
            raise CheckpointError(
                f"output_dir={cfg.train.output_dir!r} already holds {', '.join(held)} of another "
                f"run; pass --resume to continue that run, --overwrite to replace it (its "
                f"checkpoints deleted, its metrics kept aside), or choose a new output_dir"
            )
        if cfg.train.overwrite and (problem := files.overwrite_problem(root, TAG)):
            raise CheckpointError(problem)
        return None
    if cfg.train.overwrite:
        raise CheckpointError(
            "overwrite with resume: resume continues the run in output_dir, overwrite replaces it; "
            "drop one of them"
        )
    tag_dir, meta = find_checkpoint(root, cfg.checkpoint.resume_tag)
    set_aside(root)
    run = meta["run"]
    saved = resume_keys.saved_values(run, tag_dir / "run.yaml")
    refused, _ = resume_keys.compare(saved, cfg)  # which keys may change: config/resume_keys.py
    if refused:
        raise CheckpointError(resume_keys.resume_refusal(refused, repr(str(tag_dir))))
    if (
        cfg.train.epochs is None and meta["step"] >= cfg.train.steps
    ):  # epochs: known once the data is read
        raise CheckpointError(
            f"resume: checkpoint {str(tag_dir)!r} is at step {meta['step']} and steps="
            f"{cfg.train.steps}: nothing left to train; set steps above {meta['step']}"
        )
    change = layout_change.check_layout(
        cfg, world_size, meta, repr(str(tag_dir))
    )  # another layout: resharded at load
    if problem := nvme_state.resume_problem(cfg, tag_dir, meta, change is not None):
        raise CheckpointError(problem)
    return meta if change is None else dict(meta, layout_change=change)


def set_aside(root: Path) -> None:
    """Partial saves under `root` do not block a resume: ours are named in one line (the next save
    removes them), anything else named like one is refused (never removed)."""
    foreign = paths.foreign_partials(root)
    if foreign:
        raise CheckpointError(
            f"resume: {str(foreign[0])!r} is named like a save in progress but ds_longctx did not "
            f"make it (no {PARTIAL_MARKER} or meta.json inside); move it out of {str(root)!r}"
        )
    for p in paths.partial_saves(root):
        log.info(
            "resume: %s is a save that never completed (a crash, a full disk or an abandoned "
            "save); it is set aside and the next save removes it",
            p,
        )


def clear_previous_run(cfg: RunConfig) -> None:
    """With overwrite, on rank 0 before the run writes: delete the previous run's checkpoints/ (its
    metrics are kept aside by the metrics log, run.yaml and ds_config.json replaced), only where
    every file in it is a save's (files.foreign_files; check_run_dir refused otherwise)."""
    root = ckpt_root(cfg.train.output_dir)
    if cfg.train.overwrite and not cfg.checkpoint.resume and root.exists():
        if problem := files.overwrite_problem(root, TAG):
            raise CheckpointError(problem)
        shutil.rmtree(root)
        log.info("overwrite: deleted the previous run's %s", root)


# ----------------------------------------------------------------------------- load (collective)
def load(engine, tag_dir: Path, meta: dict, data_signature: dict) -> int:
    """Load weights, optimizer, scheduler and this rank's RNG from `tag_dir`; returns its step.
    Collective.

    Every rank first checks its own files (files.problem: the globals each pickle names, the sha256
    the manifest holds); the ranks share the verdicts before DeepSpeed's collective load, so a
    damaged or altered file stops all of them with its rank and name. Every load is weights-only."""
    if meta.get("data") != data_signature:
        raise CheckpointError(
            f"resume: the data changed since checkpoint {str(tag_dir)!r} (then {meta.get('data')}, "
            f"now {data_signature}), so its order cannot continue; resume with the same data or "
            f"start a new output_dir"
        )
    if meta.get("layout_change"):
        if engine.state.rank == 0:
            log.info(meta["layout_change"])
        resume_resharded(engine, tag_dir, meta, int(meta["run"]["seed"]))
    else:
        _load_states(
            engine,
            tag_dir,
            meta,
            "resume",
            "; use an earlier tag (resume_tag) or start a new output_dir",
            resume=True,
        )
    log.info("resumed from %s at step %d", tag_dir, meta["step"])
    return int(meta["step"])


def load_weights(engine, tag_dir: Path, meta: dict) -> None:
    """The weights of `tag_dir` for evaluation (`ds-longctx eval`): each rank's partition of the
    fp32 master weights, which DeepSpeed keeps with the optimizer states (read along; neither the lr
    scheduler nor the RNG is). Collective, with `load`'s checks."""
    _load_states(engine, tag_dir, meta, "eval", "; evaluate an earlier tag (--tag)", resume=False)
    log.info("loaded the weights of %s (step %d)", tag_dir, meta["step"])


def _verdicts(engine, tag_dir: Path, meta: dict) -> list:
    """Every rank's `files.problem` with its own files (None: fine), gathered on every rank."""
    rank = engine.state.rank
    if meta["format"] == 1 and rank == 0:
        log.warning(
            "%s was written before checkpoints held digests (format 1): its files are checked for "
            "size and "
            "content, not for changed bytes; `ds-longctx checkpoint convert %s` adds the digests",
            tag_dir,
            tag_dir.parent.parent,
        )
    errors = [files.problem(tag_dir, meta, rank, show=rank == 0)]
    if (
        dist.is_initialized()
    ):  # every rank learns every rank's verdict (small strings, once per load)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, errors[0])
        errors = gathered
    return errors


def _load_states(engine, tag_dir: Path, meta: dict, what: str, fix: str, resume: bool) -> None:
    """DeepSpeed's load of `tag_dir` after every rank's verdict on its own files (`load`'s doc);
    with `resume` also the lr scheduler and this rank's RNG."""
    bad = [(r, e) for r, e in enumerate(_verdicts(engine, tag_dir, meta)) if e is not None]
    if bad:
        raise CheckpointError(
            f"{what}: checkpoint {str(tag_dir)!r} could not be loaded (rank {bad[0][0]}: "
            f"{bad[0][1]})" + fix
        )
    rank = engine.state.rank
    try:
        # this version saves plan/lr_schedule.py's LambdaLR; an older one's WarmupLR (or none) is
        # not loaded: the resume sets the schedule at the checkpoint's step itself
        # (run/resume_changes.set_schedule)
        sched = resume and "lr_schedule" in meta["run"]
        with files.weights_only_loads():
            path, client = engine.ds.load_checkpoint(
                str(tag_dir.parent),
                tag=tag_dir.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=sched,
            )
        if path is None or client.get("ds_longctx_step") != meta["step"]:
            raise RuntimeError(f"DeepSpeed found no loadable state (client state {client!r})")
        with files.weights_only_loads():  # the NVMe optimizer's state: DeepSpeed skips it
            nvme_state.restore(engine.ds, tag_dir)
        if resume:
            set_rng_state(files.load(tag_dir / rng_file(rank), legacy_rng=meta["format"] == 1))
    except Exception as e:
        reason = files.refusal(e, "a file it loaded")
        first = reason or f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        raise CheckpointError(
            f"{what}: checkpoint {str(tag_dir)!r} could not be loaded (rank {rank}: {first})" + fix
        ) from None
