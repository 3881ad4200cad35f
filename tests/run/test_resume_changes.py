"""A resume's changed lr and schedule (run/resume_changes.py) against the reference: a run built
with the new config from the start, stepped to the checkpoint's step. The scheduler is the engine's
(a LambdaLR of plan/lr_schedule.py); the checkpoint's load is what DeepSpeed restores (the groups'
lr, the scheduler's state). The run through `ds-longctx train` is in
tests/distributed/test_resume.py."""

from types import SimpleNamespace

import pytest
import torch

from ds_longctx.config import RunConfig
from ds_longctx.plan.lr_schedule import lr_factor
from ds_longctx.run.resume_changes import set_schedule


def built(lr: float, warmup: int, weight_decay: float = 0.0, schedule: str = "cosine"):
    """What the engine builds for the run config (lr, warmup_steps, a cosine to 1e-5 over 12 steps):
    the optimizer
    and its scheduler, as engine.ds."""
    from torch.optim.lr_scheduler import LambdaLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=lr, weight_decay=weight_decay)
    cfg = RunConfig(lr=lr, warmup_steps=warmup, lr_schedule=schedule, min_lr=1e-5)
    sched = LambdaLR(opt, lr_factor(cfg.optimizer, 12))
    return SimpleNamespace(optimizer=SimpleNamespace(optimizer=opt), lr_scheduler=sched)


def stepped(engine, steps: int):
    """`steps` optimizer steps' worth of scheduler steps, as DeepSpeed's engine takes one after
    each."""
    for _ in range(steps):
        if engine.lr_scheduler is not None:
            engine.lr_scheduler.step()
    return engine


@pytest.mark.parametrize(
    "then, now",
    [
        ((1e-3, 0), (5e-4, 0)),
        ((1e-3, 4), (5e-4, 8)),
        ((1e-3, 0), (5e-4, 8)),
        ((1e-3, 8), (1e-3, 0)),
        ((1e-3, 8), (1e-3, 2)),
    ],
)
def test_the_resumed_lr_is_the_new_runs_at_that_step(then, now):
    step = 3
    saved = stepped(built(*then), step)
    resumed = built(*now, weight_decay=0.1)
    for g, s in zip(
        resumed.optimizer.optimizer.param_groups, saved.optimizer.optimizer.param_groups
    ):
        g["lr"], g["weight_decay"] = s["lr"], s["weight_decay"]  # what the load restores
    if saved.lr_scheduler is not None and resumed.lr_scheduler is not None:
        resumed.lr_scheduler.load_state_dict(saved.lr_scheduler.state_dict())
    set_schedule(resumed, now[0], 0.1, step)
    reference = stepped(built(*now), step)
    for _ in range(3):  # this step's lr and the next ones'
        lr = [g["lr"] for g in resumed.optimizer.optimizer.param_groups]
        assert lr == [g["lr"] for g in reference.optimizer.optimizer.param_groups]
        assert [g["weight_decay"] for g in resumed.optimizer.optimizer.param_groups] == [0.1]
        stepped(resumed, 1), stepped(reference, 1)
