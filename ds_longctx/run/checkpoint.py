"""Checkpoints of a run: atomic DeepSpeed saves, resume, SIGTERM, and the checks that come before them.

Layout (a shared filesystem: rank 0 finishes what every rank wrote; across nodes, output_dir must be one filesystem
that every node mounts at the same path, e.g. NFS or Lustre; tests/distributed/test_nodes.py runs its two "nodes" on
one machine, where it is):

    <output_dir>/checkpoints/latest          tag of the newest complete checkpoint, replaced atomically
    <output_dir>/checkpoints/step300/        DeepSpeed's files (ZeRO-3: one partition per rank), and ours:
        meta.json          step, run layout, data signature and every file's size and sha256; written last
        config.json        the HF config the engine built (YaRN included): export's config
        run.yaml           the run config
        rng_rank00000.pt   each rank's RNG states, as tensors and numbers (a weights-only load reads them)
    <output_dir>/checkpoints/.tmp-step300/   a save in progress; renamed to step300 once complete

Save (collective): every rank writes into `.tmp-<tag>` (DeepSpeed `save_checkpoint(save_latest=False)`, then
its RNG) and hashes its own files (run/checkpoint_files.py); rank 0 gathers the digests, writes meta.json, renames
the directory to `<tag>`, writes `latest.tmp` and renames it onto `latest`, prunes old tags; barrier. A crash at
any point leaves `latest` naming the previous complete checkpoint, and the next save removes the leftover `.tmp-*`.

Load: every file is checked before anything is loaded (sizes and the globals each pickle names when the checkpoint
is found, each rank's own digests before DeepSpeed's load), and every load is weights-only: a checkpoint runs no
code (checkpoint_files.py). Format-1 checkpoints (written before digests, RNG pickled with numpy) still load, their
RNG with numpy's array globals allowed for that one file; `ds-longctx checkpoint convert DIR` rewrites them as
format 2 (run/checkpoint_convert.py).

Resume needs the same world size and sp_size: ZeRO-3 optimizer partitions are per rank, so another layout is
refused (export to HF safetensors, then start a new run from the exported directory). It also needs the
same model, numerics, data order (a function of seed and step) and optimizer layout; which keys may change instead
(lr, steps, the memory levers, ...) is config/resume_keys.py's rule, and run/resume_changes.py applies them.
`ds-longctx eval` (run/eval_checkpoint.py) reads the weights alone (`load_weights`) under the same layout rule.
"""

from __future__ import annotations

# deepspeed is imported where a checkpoint is saved, not at import.
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ds_longctx.config import resume_keys
from ds_longctx.parallel import fake_world
from ds_longctx.run import checkpoint_files as files
from ds_longctx.run.checkpoint_files import META, CheckpointError
from ds_longctx.run.evaluate import CURVE_FILE, METRICS_FILE

log = logging.getLogger("ds_longctx")

CKPT_SUBDIR = "checkpoints"
FORMAT = 2  # 2: every file's sha256 in meta.json, RNG as tensors; 1: sizes only, RNG pickled with numpy
READS = (1, 2)
# a fresh run refuses an output_dir holding any of these (another run's), unless overwrite
RUN_FILES = (CKPT_SUBDIR, "run.yaml", "ds_config.json", METRICS_FILE, CURVE_FILE, "tensorboard")
_TAG = re.compile(r"^step(\d+)$")


def ckpt_root(output_dir) -> Path:
    return Path(output_dir) / CKPT_SUBDIR


def tag_for(step: int) -> str:
    return f"step{step}"


def read_latest(root: Path) -> Optional[str]:
    f = root / "latest"
    return f.read_text().strip() if f.is_file() else None


# ----------------------------------------------------------------------------- checks (no writes)
def find_checkpoint(root: Path, tag: Optional[str] = None, what: str = "resume") -> tuple[Path, dict]:
    """The complete checkpoint `tag` (default: latest) under `root` and its meta, or a CheckpointError."""
    if tag is None:
        if not root.is_dir():
            raise CheckpointError(f"{what}: no checkpoint in {str(root.parent)!r} ({str(root)!r} does not exist); "
                                  f"run without resume first with save_every > 0, or point at the run's output_dir")
        tag = read_latest(root)
        if tag is None:
            tags = sorted(p.name for p in root.iterdir() if _TAG.match(p.name))
            raise CheckpointError(f"{what}: {str(root / 'latest')!r} is missing, so no checkpoint is complete"
                                  + (f" (tag directories present: {tags}; pick one with resume_tag / --tag)"
                                     if tags else "; train without resume to create one"))
    tag_dir = root / tag
    if not tag_dir.is_dir():
        tags = sorted(p.name for p in root.iterdir() if _TAG.match(p.name)) if root.is_dir() else []
        raise CheckpointError(f"{what}: checkpoint tag {tag!r} does not exist in {str(root)!r}; available: {tags}")
    meta_path = tag_dir / META
    if not meta_path.is_file():
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} is incomplete (no {META}: its save was "
                              f"interrupted); delete it and use an earlier tag")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{what}: {str(meta_path)!r} is corrupt ({e.msg}); use an earlier tag") from None
    if meta.get("format") not in READS:
        raise CheckpointError(f"{what}: {str(tag_dir)!r} has checkpoint format {meta.get('format')!r}, this version "
                              f"reads {list(READS)}; {what} with the ds_longctx version that wrote it")
    files.check_sizes(tag_dir, meta, what, "use an earlier tag (or restore the file)")
    for name in meta.get("files", {}):  # no data read: each pickle's globals, so a file that runs code stops here
        if name.endswith(".pt"):  # (a file that does not open is left to its rank's check, which names the rank)
            asked = files.unsafe_globals(tag_dir / name, legacy_rng=meta["format"] == 1 and name.startswith("rng_"))
            if asked and not isinstance(asked, str):
                raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} is refused: {name} asks to run "
                                      f"{', '.join(asked)} when loaded (a checkpoint holds tensors and numbers), so "
                                      f"nothing of it is loaded; use an earlier tag")
    return tag_dir, meta


def check_output_dir(output_dir: str) -> None:
    """output_dir is (or can be made) a writable directory. Writes nothing (a probe is made and removed)."""
    p = Path(output_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise CheckpointError(f"output_dir={output_dir!r} is a file; choose a directory path for the run")
    anc = p
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise CheckpointError(f"output_dir={output_dir!r} cannot be created: {str(anc)!r} is a file; choose "
                              f"another output_dir")
    try:
        if not os.access(anc, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {anc}")
        os.rmdir(tempfile.mkdtemp(prefix=".ds_longctx-probe-", dir=anc))
    except OSError as e:
        raise CheckpointError(f"output_dir={output_dir!r} is not writable ({str(anc)!r}: {e.strerror or e}); "
                              f"choose a writable output_dir or fix its permissions") from None


def previous_run(output_dir) -> list:
    """What of another run `output_dir` holds (RUN_FILES present), each with its gist, e.g. 'checkpoints (latest
    step6)', 'metrics.jsonl (6 lines)'."""
    out = Path(output_dir)
    held = []
    for name in RUN_FILES:
        p = out / name
        if not p.exists():
            continue
        if name == CKPT_SUBDIR:
            latest = read_latest(p)
            held.append(f"checkpoints (latest {latest})" if latest else "checkpoints/ (none complete)")
        elif name.endswith(".jsonl") and p.is_file():
            with open(p, "rb") as f:
                held.append(f"{name} ({sum(1 for _ in f)} lines)")
        else:
            held.append(name)
    return held


def check_run_dir(cfg, world_size: int) -> Optional[dict]:
    """Every check of output_dir and resume, before anything is started or written. Returns the meta of the
    checkpoint to resume from (None for a fresh run). A fresh run into an output_dir holding another run's files is
    refused unless `overwrite` (then `clear_previous_run` replaces them)."""
    check_output_dir(cfg.train.output_dir)
    root = ckpt_root(cfg.train.output_dir)
    if not cfg.checkpoint.resume:
        held = previous_run(cfg.train.output_dir)
        if held and not cfg.train.overwrite:
            raise CheckpointError(f"output_dir={cfg.train.output_dir!r} already holds {', '.join(held)} of another "
                                  f"run; pass --resume to continue that run, --overwrite to replace it (its "
                                  f"checkpoints deleted, its metrics kept aside), or choose a new output_dir")
        return None
    if cfg.train.overwrite:
        raise CheckpointError("overwrite with resume: resume continues the run in output_dir, overwrite replaces it; "
                              "drop one of them")
    tag_dir, meta = find_checkpoint(root, cfg.checkpoint.resume_tag)
    run = meta["run"]
    dp = world_size // cfg.parallel.sp_size
    if (run["world_size"], run["sp_size"]) != (world_size, cfg.parallel.sp_size):
        raise CheckpointError(
            f"resume: checkpoint {str(tag_dir)!r} was written by world_size={run['world_size']} with "
            f"sp_size={run['sp_size']} (dp={run['dp_size']}), this run has world_size={world_size} with "
            f"sp_size={cfg.parallel.sp_size} (dp={dp}); ZeRO-3 partitions are per rank: resume with "
            f"{run['world_size']} processes and sp_size={run['sp_size']}, or `ds-longctx export` it and start a "
            f"new run from the exported model")
    saved = resume_keys.saved_values(run, tag_dir / "run.yaml")
    refused, _ = resume_keys.compare(saved, cfg)  # which keys may change: config/resume_keys.py
    if refused:
        raise CheckpointError(resume_keys.resume_refusal(refused, repr(str(tag_dir))))
    if meta["step"] >= cfg.train.steps:
        raise CheckpointError(f"resume: checkpoint {str(tag_dir)!r} is at step {meta['step']} and steps="
                              f"{cfg.train.steps}: nothing left to train; set steps above {meta['step']}")
    return meta


def clear_previous_run(cfg) -> None:
    """With overwrite, on rank 0 before the run writes: delete the previous run's checkpoints/ (its metrics are kept
    aside by the metrics log, run.yaml and ds_config.json replaced)."""
    root = ckpt_root(cfg.train.output_dir)
    if cfg.train.overwrite and not cfg.checkpoint.resume and root.exists():
        shutil.rmtree(root)
        log.info("overwrite: deleted the previous run's %s", root)


# ----------------------------------------------------------------------------- save / load (collective)
def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def numpy_state(state) -> dict:
    """numpy's legacy RNG state tuple ('MT19937', key, pos, has_gauss, gauss) as tensors and numbers."""
    name, key, pos, has_gauss, gauss = state
    return {"bit_generator": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _rng_state() -> dict:
    """This process's RNG states (torch, python, numpy, every CUDA device) in what a weights-only load reads."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state(np.random.get_state())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    """Restore `_rng_state`'s states (format 1's numpy tuple too)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
                        if isinstance(n, dict) else n)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_file(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"


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
    return [str(f.relative_to(tmp)) for f in sorted(tmp.rglob("*")) if f.is_file() and files.owner(f.name) == rank]


def save(engine, cfg, step: int, data_signature: dict) -> Path:
    """Save the run at `step` (completed optimizer steps) as tag `step<step>`; atomic (module doc). Collective."""
    fake_world.refuse_in_rehearsal("a checkpoint save")
    import deepspeed
    st = engine.state
    root = ckpt_root(cfg.train.output_dir)
    tag = tag_for(step)
    if read_latest(root) == tag:
        return root / tag  # already saved at this step (SIGTERM right after a periodic save)
    tmp = root / f".tmp-{tag}"
    if st.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    engine.ds.save_checkpoint(str(root), tag=tmp.name, client_state={"ds_longctx_step": step}, save_latest=False)
    torch.save(_rng_state(), tmp / rng_file(st.rank))
    digests = [files.entries(tmp, _own_files(tmp, st.rank), show=st.rank == 0)]  # this rank's own files
    if dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, digests[0])  # also the barrier: every rank's files are written
        digests = gathered
    if st.rank == 0:
        run = resume_keys.stored_values(cfg)
        run.update(world_size=st.world_size, sp_size=st.sp_size, dp_size=st.dp_size)
        engine.model.config.to_json_file(str(tmp / "config.json"))
        cfg.dump(tmp / "run.yaml")
        manifest = {k: v for d in digests for k, v in d.items()}
        manifest.update(files.entries(tmp, ["config.json", "run.yaml"]))
        meta = {"format": FORMAT, "step": step, "tag": tag, "run": run, "data": data_signature,
                "deepspeed": deepspeed.__version__, "files": dict(sorted(manifest.items()))}
        write_meta(tmp, meta)
        final = root / tag
        if final.exists():  # a tag of an abandoned later timeline (resumed from an earlier tag): replace it
            old = root / f".tmp-old-{tag}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        _replace_file(root / "latest", tag)
        _prune(root, step, cfg.checkpoint.keep)
        log.info("checkpoint: %s (step %d)", final, step)
    _barrier()
    return root / tag


def _prune(root: Path, step: int, keep: int) -> None:
    """Delete all but the newest `keep` tags at or before `step` (later tags, if any, are left alone)."""
    if keep <= 0:
        return
    tags = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _TAG.match(p.name)) and p.is_dir())
    older = [p for s, p in tags if s <= step]
    for p in older[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def load(engine, tag_dir: Path, meta: dict, data_signature: dict) -> int:
    """Load weights, optimizer, scheduler and this rank's RNG from `tag_dir`; returns its step. Collective.

    Every rank first checks its own files (checkpoint_files.problem: the globals each pickle names, the sha256 the
    manifest holds); the ranks share the verdicts before DeepSpeed's collective load, so a damaged or altered file
    stops all of them with its rank and name. Every load is weights-only."""
    if meta.get("data") != data_signature:
        raise CheckpointError(f"resume: the data changed since checkpoint {str(tag_dir)!r} (then {meta.get('data')}, "
                              f"now {data_signature}), so its order cannot continue; resume with the same data or "
                              f"start a new output_dir")
    _load_states(engine, tag_dir, meta, "resume", "; use an earlier tag (resume_tag) or start a new output_dir",
                 resume=True)
    log.info("resumed from %s at step %d", tag_dir, meta["step"])
    return int(meta["step"])


def load_weights(engine, tag_dir: Path, meta: dict) -> None:
    """The weights of `tag_dir` for evaluation (`ds-longctx eval`): each rank's partition of the fp32 master
    weights, which DeepSpeed keeps with the optimizer states (read along; neither the lr scheduler nor the RNG
    is). Collective, with `load`'s checks."""
    _load_states(engine, tag_dir, meta, "eval", "; evaluate an earlier tag (--tag)", resume=False)
    log.info("loaded the weights of %s (step %d)", tag_dir, meta["step"])


def _verdicts(engine, tag_dir: Path, meta: dict) -> list:
    """Every rank's `checkpoint_files.problem` with its own files (None: fine), gathered on every rank."""
    rank = engine.state.rank
    if meta["format"] == 1 and rank == 0:
        log.warning("%s was written before checkpoints held digests (format 1): its files are checked for size and "
                    "content, not for changed bytes; `ds-longctx checkpoint convert %s` adds the digests",
                    tag_dir, tag_dir.parent.parent)
    errors = [files.problem(tag_dir, meta, rank, show=rank == 0)]
    if dist.is_initialized():  # every rank learns every rank's verdict (small strings, once per load)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, errors[0])
        errors = gathered
    return errors


def _load_states(engine, tag_dir: Path, meta: dict, what: str, fix: str, resume: bool) -> None:
    """DeepSpeed's load of `tag_dir` after every rank's verdict on its own files (`load`'s doc); with `resume`
    also the lr scheduler and this rank's RNG."""
    bad = [(r, e) for r, e in enumerate(_verdicts(engine, tag_dir, meta)) if e is not None]
    if bad:
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} could not be loaded (rank {bad[0][0]}: "
                              f"{bad[0][1]})" + fix)
    rank = engine.state.rank
    try:
        sched = resume and bool(meta["run"].get("warmup_steps"))  # a run without warm-up saved no scheduler state
        with files.weights_only_loads():
            path, client = engine.ds.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name,
                                                     load_optimizer_states=True, load_lr_scheduler_states=sched)
        if path is None or client.get("ds_longctx_step") != meta["step"]:
            raise RuntimeError(f"DeepSpeed found no loadable state (client state {client!r})")
        if resume:
            _set_rng_state(files.load(tag_dir / rng_file(rank), legacy_rng=meta["format"] == 1))
    except Exception as e:
        reason = files.refusal(e, "a file it loaded")
        first = reason or f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} could not be loaded (rank {rank}: {first})"
                              + fix) from None
