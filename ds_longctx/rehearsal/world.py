"""What `ds-longctx rehearse` (rehearse.py) and each rank it plays (rank.py) both read: a rank's
role in the world, the plan it is held against and how a figure compares with it, the checks before
a rank is built, the links its step time is predicted for, and the row's provenance (commit,
date)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Optional

# the data and torch are imported inside the functions that use them (module doc of rehearse.py).
from ds_longctx.plan import interconnect as ic
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.planner import plan_memory
from ds_longctx.run.provenance import commit, now  # noqa: F401 (rank.py reads them here)

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig
    from ds_longctx.plan.shape import RunShape


class Refused(ValueError):
    """Bad arguments or config: exit 2 before any rank starts."""


def role_of(rank: int, per_node: int, sp: int) -> str:
    node, first = rank // per_node, rank - rank % sp
    where = "first" if rank == first else "last" if rank == first + sp - 1 else f"#{rank - first}"
    return (
        f"{where} of SP group {rank // sp} (ranks {first}-{first + sp - 1}), node {node}, local "
        f"rank {rank % per_node}"
    )


def planned(cfg: RunConfig, shape: RunShape, completion_len: Optional[int] = None):
    """The planner's memory plan of this run config on its shape (`check`'s: its geometry, world
    and placement; `plan/planner.plan_memory`); objective dpo: for completions of `completion_len`
    (None: the planner's default)."""
    levers = Levers.from_run_config(cfg, shape.placement)
    if levers.objective == "dpo" and completion_len is not None:
        levers = replace(levers, completion_len=completion_len)
    return plan_memory(
        shape.geometry, shape.seq_len, shape.per_node, shape.sp, levers, nodes=shape.nodes
    )


# bytes: a plan smaller than this is compared in GB, not in percent (a tiny model's plan is mostly
# the fixed CUDA context: "-100%" of it says nothing)
PERCENT_FROM = 4e9


def vs_plan(measured: float, planned: float) -> str:
    """The measured against the planned: a percentage, or the difference in GB where the plan is
    under PERCENT_FROM bytes."""
    if planned >= PERCENT_FROM:
        return f"{measured / planned - 1:+.1%}"
    return f"{(measured - planned) / 1e9:+.2f} GB"


def check(cfg: RunConfig, world: int, per_node: int) -> RunShape:
    """Every check of a rank's preflight that a rehearsal needs (not output_dir's or resume's: it
    writes no run); returns the run's shape. Raises ValueError."""
    from ds_longctx.run.preflight import check_sources, rope_coverage, validate

    shape = validate(cfg, world, per_node)
    rope_coverage(cfg, shape.hf_config)
    check_sources(cfg, shape.text.vocab_size)
    return shape


def links(a, cfg: RunConfig):
    name = a.link or ic.intra_link_for(cfg.memory.gpu_budget_gb)
    if name not in ic.LINKS:
        raise Refused(f"--link {name}: one of {', '.join(ic.LINKS)}")
    intra = (
        ic.link_from_gbps("--link_gbps", a.link_gbps) if a.link_gbps is not None else ic.LINKS[name]
    )
    inter = (
        ic.link_from_gbps("--internode_gbps", a.internode_gbps)
        if a.internode_gbps is not None
        else ic.LINKS[ic.DEFAULT_INTERNODE]
    )
    return intra, inter


def fastest_steady(seconds: list) -> float:
    """The fastest timed step (step 2 on): a later step of a cold process (the first a job
    rehearses) can still hold one-time compile or autotune work, which is no step cost."""
    return min(seconds[1:])
