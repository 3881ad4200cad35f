"""What a resume changes (config/resume_keys.py decides what may change), applied after the
checkpoint's load and listed in one log line on rank 0:

    resume: changed since step 3: lr 0.001 -> 0.0005, steps 6 -> 8

After the load every param group gets this run's weight_decay and the scheduler this run's peak lr,
so the next step runs with the lr this run's schedule gives it. Why: docs/design/run.md."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ds_longctx.config.resume_keys import OPTIMIZER_KEYS, changed_line, compare, saved_values
from ds_longctx.run.optimizer_state import optimizers

log = logging.getLogger("ds_longctx")


def set_schedule(ds_engine, lr: float, weight_decay: float, step: int) -> None:
    """Every param group's weight_decay set to this run's, and the lr schedule (a LambdaLR of this run's
    plan/lr_schedule.py, stepped once per optimizer step) put at `step` with this run's peak lr: the next step runs
    at lr x factor(step), as a run with this config from the start would."""
    sched = ds_engine.lr_scheduler
    for opt in optimizers(ds_engine.optimizer):
        for group in opt.param_groups:
            group["weight_decay"] = weight_decay
            if sched is None:
                group["lr"] = lr
    if sched is not None:
        sched.base_lrs = [lr] * len(sched.base_lrs)
        sched.last_epoch = step
        for group, factor in zip(sched.optimizer.param_groups, sched.lr_lambdas):
            group["lr"] = lr * factor(step)
        sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]


def adopt_saved_state(zo) -> None:
    """After a load of another Adam's state (optimizer_offload changed: torch AdamW <-> DeepSpeed
    CPU Adam): each param group gets the settings the saved groups lack (CPU Adam's
    `bias_correction`) and CPU Adam's step counters become ints. A no-op where the checkpoint's Adam
    is this run's."""
    for opt in optimizers(zo):
        for group in opt.param_groups:
            for key, value in opt.defaults.items():
                group.setdefault(key, value)
        if type(opt).__name__ == "DeepSpeedCPUAdam":
            for state in opt.state.values():
                if torch.is_tensor(state.get("step")):
                    state["step"] = int(state["step"].item())


def apply_changes(engine, cfg, tag_dir: Path, meta: dict) -> list:
    """Apply what this run changes against the checkpoint `tag_dir` with `meta` (just loaded into `engine`); log it
    in one line on rank 0. Returns [(flat key, old, new)]."""
    changed = compare(saved_values(meta["run"], tag_dir / "run.yaml"), cfg)[1]
    if (
        any(k in OPTIMIZER_KEYS for k, _, _ in changed)
        or "lr_schedule" not in meta["run"]
        or meta.get("layout_change")
    ):  # or no LambdaLR saved, or none loaded (a resharded load)
        set_schedule(engine.ds, cfg.optimizer.lr, cfg.optimizer.weight_decay, int(meta["step"]))
    adopt_saved_state(
        engine.ds.optimizer
    )  # always: checkpoints older than this rule do not store optimizer_offload
    if changed and engine.state.rank == 0:
        log.info(changed_line(changed, int(meta["step"])))
    return changed
