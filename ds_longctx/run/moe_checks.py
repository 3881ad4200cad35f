"""A mixture of experts in a run: its load-balancing coefficient, the checks before any work, and
the one warning of a sparse block that runs untiled (levers/moe.py), with what it costs by the
planner.

    coef = router_aux_coef(cfg, hf_text_config)       # the run's key, else the model config's own
    check_moe(cfg, shape)                             # preflight: ValueError naming value and fix
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ds_longctx.levers.gpu_budget import GB
from ds_longctx.levers.moe import moe_family, sparse_blocks, tile_problem
from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.moe_geometry import lora_problem
from ds_longctx.plan.planner import plan_memory
from ds_longctx.run.model import model_class
from ds_longctx.run.placement_plan import run_placement

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig
    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.shape import RunShape


def router_aux_coef(cfg: RunConfig, text_config) -> float:
    """`model.router_aux_loss_coef`, else the model config's `router_aux_loss_coef` (0 for a model
    without one)."""
    if cfg.model.router_aux_loss_coef is not None:
        return cfg.model.router_aux_loss_coef
    return float(getattr(text_config, "router_aux_loss_coef", 0.0) or 0.0)


def untiled_cost_gb(
    cfg: RunConfig,
    world_size: int,
    geom: ModelGeometry | None = None,
    placement: PlacementPlan | None = None,
) -> float:
    """GB per GPU the planner adds when the sparse blocks run untiled under this run's levers
    (tiled_mlp off). `geom`, `placement`: the run's (`RunShape`), else read and planned here."""
    geom = as_geometry(cfg.model.name if geom is None else geom)
    if placement is None:
        placement = run_placement(cfg, geom.layers, world_size, None, geom)
    tiled = Levers.from_run_config(cfg, placement)
    args = (geom, cfg.train.seq_len, world_size, cfg.parallel.sp_size)
    return (
        plan_memory(*args, replace(tiled, tiled_mlp=False)).gpu_peak_bytes
        - plan_memory(*args, tiled).gpu_peak_bytes
    ) / GB


def untiled_warning(
    cfg: RunConfig, untiled: dict, world_size: int, shape: RunShape | None = None
) -> str:
    """The one warning of sparse blocks `tiled_mlp` asked to tile that run whole ({block index:
    why}). `shape`: the run's (its geometry and placement), else read and planned here."""
    where = (None, None) if shape is None else (shape.geometry, shape.placement)
    first, extra = next(iter(untiled.values())), untiled_cost_gb(cfg, world_size, *where)
    cost = (
        f"about {extra:.1f} GB more per GPU at seq_len={cfg.train.seq_len:,}"
        if extra >= 0.05
        else f"no more GPU memory at seq_len={cfg.train.seq_len:,} (another phase sets the peak)"
    )
    return (
        f"tiled_mlp: {len(untiled)} sparse MoE block(s) run untiled ({first}): {cost} by the "
        f"planner's untiled sparse block against its tiles"
    )


def check_moe(cfg: RunConfig, shape: RunShape) -> None:
    """Refuse, before any work: `router_aux_loss_coef` for a model without experts; LoRA on the
    experts (plan/moe_geometry.lora_problem); tiled_mlp asked of sparse blocks
    the tiles cannot compute (a meta-device model: nothing allocated) when, run untiled, the plan no
    longer fits `memory.gpu_budget_gb` (without a budget they run untiled with one warning:
    run/lever_order.py)."""
    if not getattr(shape.text, "num_experts", 0):
        if cfg.model.router_aux_loss_coef is not None:
            raise ValueError(
                f"router_aux_loss_coef={cfg.model.router_aux_loss_coef:g} is set, but model="
                f"{cfg.model.name!r} has no experts (no load-balancing loss); remove the key"
            )
        return
    geom, world_size = shape.geometry, shape.world
    if cfg.lora.rank and (problem := lora_problem(geom.moe, geom.layers, cfg.lora.target_modules)):
        raise ValueError(problem)
    if not cfg.memory.tiled_mlp or not cfg.memory.gpu_budget_gb:
        return
    with torch.device("meta"):
        model = model_class(shape.hf_config)(copy.deepcopy(shape.hf_config))
    fam = moe_family(model)
    problems = [p for b in sparse_blocks(model) if (p := tile_problem(b, fam)) is not None]
    if not problems:
        return
    extra = untiled_cost_gb(cfg, world_size, geom, shape.placement)
    untiled = replace(Levers.from_run_config(cfg, shape.placement), tiled_mlp=False)
    peak = (
        plan_memory(
            geom, cfg.train.seq_len, world_size, cfg.parallel.sp_size, untiled
        ).gpu_peak_bytes
        / GB
    )
    if peak > cfg.memory.gpu_budget_gb:
        raise ValueError(
            f"tiled_mlp: the sparse MoE blocks of model={cfg.model.name!r} cannot run in tiles "
            f"({problems[0]}); untiled they need {extra:.1f} GB more per GPU, {peak:.1f} GB in "
            f"all, over gpu_budget_gb={cfg.memory.gpu_budget_gb:g}; shorten seq_len or plan again "
            f"(ds-longctx plan) with more GPUs"
        )
