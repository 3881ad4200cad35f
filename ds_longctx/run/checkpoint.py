"""Checkpoints of a run: atomic DeepSpeed saves, resume, SIGTERM, and the checks that come before them.

Layout (a shared filesystem: rank 0 finishes what every rank wrote; across nodes, output_dir must be one filesystem
that every node mounts at the same path, e.g. NFS or Lustre; tests/distributed/test_nodes.py runs its two "nodes" on
one machine, where it is):

    <output_dir>/checkpoints/latest          tag of the newest complete checkpoint, replaced atomically
    <output_dir>/checkpoints/step300/        DeepSpeed's files (ZeRO-3: one partition per rank), and ours:
        meta.json          step, run layout, data signature and the size of every file; written last
        config.json        the HF config the engine built (YaRN included): export's config
        run.yaml           the run config
        rng_rank00000.pt   each rank's RNG states
    <output_dir>/checkpoints/.tmp-step300/   a save in progress; renamed to step300 once complete

Save (collective): every rank writes into `.tmp-<tag>` (DeepSpeed `save_checkpoint(save_latest=False)`, then
its RNG), barrier; rank 0 writes meta.json, renames the directory to `<tag>`, writes `latest.tmp` and renames
it onto `latest`, prunes old tags; barrier. A crash at any point leaves `latest` naming the previous complete
checkpoint, and the next save removes the leftover `.tmp-*`.

Resume needs the same world size and sp_size: ZeRO-3 optimizer partitions are per rank, so another layout is
refused (export to HF safetensors, then start a new run from the exported directory). It also needs the
same model, data, seq_len, micro_batch, seed and dtype, so that the data order (a function of seed and step)
and the optimizer state continue exactly. `ds-longctx eval` (run/eval_checkpoint.py) reads the weights alone
(`load_weights`) under the same layout rule.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ds_longctx.parallel import fake_world

log = logging.getLogger("ds_longctx")

CKPT_SUBDIR = "checkpoints"
META = "meta.json"
FORMAT = 1
_TAG = re.compile(r"^step(\d+)$")
# settings a resumed run must share with its checkpoint (the layout is checked separately): the data order,
# and the optimizer settings that DeepSpeed restores from the checkpoint (a new lr would be silently ignored)
RESUME_KEYS = ("model", "seq_len", "micro_batch", "data", "data_layout", "tokenizer", "seed", "shuffle", "dtype",
               "text_field", "text_unit", "add_eos", "lr", "warmup_steps", "weight_decay", "torch_adam",
               "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_init")


class CheckpointError(ValueError):
    """A checkpoint or output directory that cannot be used: the message names the value and the fix."""


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
        raise CheckpointError(f"{what}: checkpoint tag {tag!r} does not exist in {str(root)!r}; available: "
                              f"{sorted(p.name for p in root.iterdir() if _TAG.match(p.name)) if root.is_dir() else []}")
    meta_path = tag_dir / META
    if not meta_path.is_file():
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} is incomplete (no {META}: its save was "
                              f"interrupted); delete it and use an earlier tag")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{what}: {str(meta_path)!r} is corrupt ({e.msg}); use an earlier tag") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{what}: {str(tag_dir)!r} has checkpoint format {meta.get('format')!r}, this version "
                              f"reads {FORMAT}; resume with the ds_longctx version that wrote it")
    for name, size in meta.get("files", {}).items():
        f = tag_dir / name
        if not f.is_file():
            raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} is corrupt: {name} is missing; use an earlier "
                                  f"tag (or restore the file)")
        if f.stat().st_size != size:
            raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} is corrupt: {name} has {f.stat().st_size} "
                                  f"bytes, {size} were written; use an earlier tag (or restore the file)")
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


def check_run_dir(cfg, world_size: int) -> Optional[dict]:
    """Every check of output_dir and resume, before anything is started or written. Returns the meta of the
    checkpoint to resume from (None for a fresh run)."""
    check_output_dir(cfg.train.output_dir)
    root = ckpt_root(cfg.train.output_dir)
    if not cfg.checkpoint.resume:
        latest = read_latest(root)
        if latest is not None:
            raise CheckpointError(f"output_dir={cfg.train.output_dir!r} already holds checkpoints (latest {latest}); pass "
                                  f"--resume to continue that run, or choose a new output_dir")
        return None
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
    default = type(cfg)()  # a key the checkpoint's version did not have yet held its default
    then = {k: run.get(k, default.get(k)) for k in RESUME_KEYS}
    changed = [(k, then[k], cfg.get(k)) for k in RESUME_KEYS if then[k] != cfg.get(k)]
    if changed:
        what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)
        raise CheckpointError(f"resume: this run changes {what} from checkpoint {str(tag_dir)!r}; resume with the "
                              f"checkpoint's values (see its run.yaml) or start a new output_dir")
    if meta["step"] >= cfg.train.steps:
        raise CheckpointError(f"resume: checkpoint {str(tag_dir)!r} is at step {meta['step']} and steps="
                              f"{cfg.train.steps}: nothing left to train; set steps above {meta['step']}")
    return meta


# ----------------------------------------------------------------------------- save / load (collective)
def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict:
    import numpy as np
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import numpy as np
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (temp file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    torch.save(_rng_state(), tmp / f"rng_rank{st.rank:05d}.pt")
    _barrier()
    if st.rank == 0:
        run = {k: cfg.get(k) for k in RESUME_KEYS}
        run.update(world_size=st.world_size, sp_size=st.sp_size, dp_size=st.dp_size)
        engine.model.config.to_json_file(str(tmp / "config.json"))
        cfg.dump(tmp / "run.yaml")
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        meta = {"format": FORMAT, "step": step, "tag": tag, "run": run, "data": data_signature,
                "deepspeed": deepspeed.__version__, "files": files}
        _replace_file(tmp / META, json.dumps(meta, indent=1) + "\n")
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


def _unreadable(tag_dir: Path, rank: int) -> Optional[str]:
    """This rank's files that do not open as torch archives (cheap: reads each zip's directory, not the data)."""
    import zipfile
    mine = [*tag_dir.glob(f"zero_pp_rank_{rank}_*.pt"), tag_dir / f"rng_rank{rank:05d}.pt"]
    if rank == 0:
        mine += [f for f in tag_dir.glob("*.pt") if not f.name.startswith(("zero_pp_rank_", "rng_rank"))]
    for f in mine:
        try:
            with zipfile.ZipFile(f) as z:
                z.namelist()
        except (OSError, zipfile.BadZipFile) as e:
            return f"{f.name}: {e}"
    return None


def load(engine, tag_dir: Path, meta: dict, data_signature: dict) -> int:
    """Load weights, optimizer, scheduler and this rank's RNG from `tag_dir`; returns its step. Collective.

    Every rank first opens its own files; the ranks share the verdicts before DeepSpeed's collective load, so
    a damaged partition stops all of them with the message. Damage inside a file's data that only DeepSpeed's
    load meets stops that rank; the others fail their next collective within collective_timeout_s."""
    if meta.get("data") != data_signature:
        raise CheckpointError(f"resume: the data changed since checkpoint {str(tag_dir)!r} (then {meta.get('data')}, "
                              f"now {data_signature}), so its order cannot continue; resume with the same data or "
                              f"start a new output_dir")
    _load_states(engine, tag_dir, meta, "resume", "; it is corrupt: use an earlier tag (resume_tag) or start a new "
                 "output_dir", resume=True)
    log.info("resumed from %s at step %d", tag_dir, meta["step"])
    return int(meta["step"])


def load_weights(engine, tag_dir: Path, meta: dict) -> None:
    """The weights of `tag_dir` for evaluation (`ds-longctx eval`): each rank's partition of the fp32 master
    weights, which DeepSpeed keeps with the optimizer states (read along; neither the lr scheduler nor the RNG
    is). Collective, with `load`'s shared verdicts."""
    _load_states(engine, tag_dir, meta, "eval", "; it is corrupt: evaluate an earlier tag (--tag)", resume=False)
    log.info("loaded the weights of %s (step %d)", tag_dir, meta["step"])


def _load_states(engine, tag_dir: Path, meta: dict, what: str, fix: str, resume: bool) -> None:
    """DeepSpeed's load of `tag_dir` after every rank's verdict on its own files (`load`'s doc); with `resume`
    also the lr scheduler and this rank's RNG."""
    errors = [_unreadable(tag_dir, engine.state.rank)]
    if dist.is_initialized():  # every rank learns every rank's verdict (small strings, once per load)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, errors[0])
        errors = gathered
    bad = [(r, e) for r, e in enumerate(errors) if e is not None]
    if bad:
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} could not be loaded (rank {bad[0][0]}: "
                              f"{bad[0][1]})" + fix)
    try:
        path, client = engine.ds.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=True,
                                                 load_lr_scheduler_states=resume)
        if path is None or client.get("ds_longctx_step") != meta["step"]:
            raise RuntimeError(f"DeepSpeed found no loadable state (client state {client!r})")
        if resume:
            _set_rng_state(torch.load(tag_dir / f"rng_rank{engine.state.rank:05d}.pt", weights_only=False))
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"{what}: checkpoint {str(tag_dir)!r} could not be loaded ({type(e).__name__}: "
                              f"{first})" + fix) from None


# ----------------------------------------------------------------------------- SIGTERM
class StopRequest:
    """SIGTERM sets a flag; `agreed()` (collective, once per step) all-reduces it so that every rank stops at
    the same step boundary, saves and exits 0. install()/uninstall() restore the previous handler."""

    def __init__(self):
        self.flag = False
        self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self.flag = True

    def install(self) -> "StopRequest":
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def agreed(self, device) -> bool:
        if not dist.is_initialized():
            return self.flag
        t = torch.tensor([float(self.flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
