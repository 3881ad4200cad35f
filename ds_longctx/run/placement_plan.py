"""The per-layer placement a run uses, computed once: the run config's, or for
`offload_layers: auto` the planner's fewest offloaded layers that fit (rules: levers/placement.py).

    plan = run_placement(cfg, num_layers=36, world_size=8, gpu_mem_gb=80)
    if planned_for_gpu(cfg): ...   # offload_layers auto: the plan depends on the GPU's memory
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from ds_longctx.levers.placement import PlacementPlan, resolve_placement
from ds_longctx.plan.geometry import ModelGeometry, as_geometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.search import fewest_offload_layers

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def planned_for_gpu(cfg: RunConfig) -> bool:
    """Whether `run_placement` asks the planner (`offload_layers: auto`): its plan depends on
    `gpu_mem_gb`."""
    mem = cfg.memory
    return mem.offload_layers == "auto" and mem.placement is None and mem.activation_checkpointing


def run_placement(
    cfg: RunConfig,
    num_layers: int,
    world_size: int,
    gpu_mem_gb: Optional[float],
    geom: Optional[ModelGeometry] = None,
) -> PlacementPlan:
    """The placement plan of `cfg` for `num_layers` layers; `auto`: the fewest offloaded layers that
    fit `gpu_mem_gb` (0 without a GPU). `geom`: the model's, where the caller has read it."""
    mem = cfg.memory
    geom = as_geometry(cfg.model.name if geom is None else geom)

    def auto() -> int:
        if not gpu_mem_gb:
            return 0
        cache = (
            mem.attention_cache_layers
        )  # an int here: 'all' with 'auto' is refused by check_request
        levers = replace(Levers.from_run_config(cfg), attention_cache_layers=int(cache))
        return fewest_offload_layers(
            geom, cfg.train.seq_len, world_size, cfg.parallel.sp_size, gpu_mem_gb, levers
        )

    return resolve_placement(
        mem.offload_layers,
        mem.attention_cache_layers,
        mem.activation_checkpointing,
        mem.placement,
        num_layers,
        auto,
        cacheable=geom.attention_layers,
    )
