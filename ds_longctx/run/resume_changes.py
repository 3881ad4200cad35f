"""What a resume changes (config/resume_keys.py decides what may), applied after the checkpoint's
load and logged in one line on rank 0 (`resume: changed since step 3: lr 0.001 -> 0.0005`). Why:
docs/design/run.md."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ds_longctx.config.resume_keys import OPTIMIZER_KEYS, changed_line, compare, saved_values
from ds_longctx.run.optimizer_state import optimizers

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")


def set_schedule(ds_engine, lr: float, weight_decay: float, step: int) -> None:
    """Set every param group's weight_decay and put the lr schedule at `step` with peak `lr`, as a
    run with this config from the start would have it."""
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
    """After loading another Adam's state: the settings the saved groups lack, CPU Adam's int step
    counters. A no-op for the same Adam."""
    for opt in optimizers(zo):
        for group in opt.param_groups:
            for key, value in opt.defaults.items():
                group.setdefault(key, value)
        if type(opt).__name__ == "DeepSpeedCPUAdam":
            for state in opt.state.values():
                if torch.is_tensor(state.get("step")):
                    state["step"] = int(state["step"].item())


def apply_changes(engine, cfg: RunConfig, tag_dir: Path, meta: dict) -> list:
    """Apply and log what this run changes against checkpoint `tag_dir`; returns [(key, old,
    new)]."""
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
