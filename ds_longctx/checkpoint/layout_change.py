"""Which layout may resume a checkpoint, and what carries over when it is another one.

Any world, sp and dp size may resume if the global batch is the checkpoint's (else only with
`allow_batch_change`) and the planner says the run fits (`plan_problem`). The data position is
counted in samples (meta "samples"). Details: docs/design/checkpoint.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ds_longctx.checkpoint.layout import CheckpointError
from ds_longctx.plan.no_fit import NoFit
from ds_longctx.plan.search import choose

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def layout_of(run: dict) -> tuple:
    """(world_size, sp_size, dp_size) of a checkpoint's meta["run"]."""
    return int(run["world_size"]), int(run["sp_size"]), int(run["dp_size"])


def global_batch(run: dict) -> int:
    """Sequences per optimizer step of a checkpoint's meta["run"]."""
    return int(run["dp_size"]) * int(run["micro_batch"]) * int(run["grad_accum"])


def samples_done(meta: dict) -> int:
    """Samples a checkpoint's run consumed (older metas: step x global batch)."""
    return int(meta.get("samples", int(meta["step"]) * global_batch(meta["run"])))


def sample_offset(meta: Optional[dict], batch: int) -> int:
    """Where this run's step 0 starts in the sample stream, resuming `meta` (None: a fresh run) with
    `batch` sequences a step: samples consumed - step x batch (0 when the batch is the
    checkpoint's)."""
    return 0 if meta is None else samples_done(meta) - int(meta["step"]) * batch


def check_layout(cfg: RunConfig, world_size: int, meta: dict, where: str) -> Optional[str]:
    """None when this run has the checkpoint's layout; otherwise the log line of the change, after
    the checks (module doc) that raise a CheckpointError naming the value and the fix."""
    run = meta["run"]
    sp = cfg.parallel.sp_size
    dp = world_size // sp
    old, new = layout_of(run), (world_size, sp, dp)
    old_batch = global_batch(run)
    batch = dp * cfg.train.micro_batch * cfg.train.grad_accum
    same_batch = (run["micro_batch"], run["grad_accum"]) == (
        cfg.train.micro_batch,
        cfg.train.grad_accum,
    )
    if old == new and same_batch:
        return None
    if batch != old_batch and not cfg.checkpoint.allow_batch_change:
        keep = _keeping(old_batch, dp, cfg.train.micro_batch)
        raise CheckpointError(
            f"resume: checkpoint {where} trained {old_batch} sequences a step (dp {run['dp_size']} "
            "x micro_batch "
            f"{run['micro_batch']} x grad_accum {run['grad_accum']}); this run trains {batch} (dp "
            f"{dp} x micro_batch "
            f"{cfg.train.micro_batch} x grad_accum {cfg.train.grad_accum}), which changes the "
            f"tokens of every step; {keep}, or pass --allow_batch_change true"
        )
    line = (
        f"resume: layout world {old[0]} = sp {old[1]} x dp {old[2]} -> world {world_size} = sp "
        f"{sp} x dp {dp}"
        if old != new
        else "resume: layout kept"
    )
    if batch != old_batch:
        line += (
            f"; global batch {old_batch} -> {batch} sequences a step (allow_batch_change): the "
            f"sample stream continues at sample {samples_done(meta)}"
        )
    return line + "; the optimizer state is resharded from the checkpoint's universal form"


def _keeping(batch: int, dp: int, micro_batch: int) -> str:
    """How to keep `batch` sequences a step at dp `dp`."""
    if batch % (dp * micro_batch) == 0:
        return f"set grad_accum {batch // (dp * micro_batch)} to keep it"
    return (
        f"no grad_accum keeps it at dp {dp} x micro_batch {micro_batch}; choose a dp that divides "
        f"{batch}"
    )


def plan_problem(
    geom,
    seq_len: int,
    world_size: int,
    gpu_mem_gb: Optional[float],
    host_mem_gb: float,
    per_node: int,
) -> Optional[str]:
    """Why the planner says `seq_len` cannot train on this machine (`world_size` GPUs of
    `gpu_mem_gb` GB, `per_node` a node with `host_mem_gb` GB of host), with the longest length that
    does; None when it fits or there is no GPU to plan for."""

    if gpu_mem_gb is None:
        return None
    nodes = max(1, world_size // per_node)
    try:
        choose(geom, seq_len, min(per_node, world_size), gpu_mem_gb, host_mem_gb, nodes=nodes)
    except NoFit as e:
        return (
            f"the planner says seq_len={seq_len:,} does not fit {world_size} x {gpu_mem_gb:g} GB "
            "GPUs with "
            f"{host_mem_gb:g} GB host a node (the longest that fits is {e.max_len:,} tokens); "
            "resume on a machine "
            f"that fits it (`ds-longctx plan --find_max_len` asks for one), nothing was loaded"
        )
    return None
