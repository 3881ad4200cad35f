"""The per-layer placement a run uses, computed once for its model: the run config's, or for
`offload_layers: auto` the planner's fewest offloaded layers that fit the GPU (levers/placement.py holds the rules).

    plan = run_placement(cfg, num_layers=36, world_size=8, gpu_mem_gb=80)   # engine; preflight validates with it
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ds_longctx.levers.placement import PlacementPlan, resolve_placement
from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.search import fewest_offload_layers


def run_placement(
    cfg, num_layers: int, world_size: int, gpu_mem_gb: Optional[float]
) -> PlacementPlan:
    """The per-layer placement plan of run config `cfg` for a model of `num_layers` layers. From the config, or for
    offload_layers='auto' the fewest offloaded layers that fit `gpu_mem_gb` GB by the planner (0 with no GPU: there
    is nowhere to offload from)."""
    mem = cfg.memory

    def auto() -> int:
        if not gpu_mem_gb:
            return 0
        cache = (
            mem.attention_cache_layers
        )  # an int here: 'all' with 'auto' is refused by check_request
        levers = replace(Levers.from_run_config(cfg), attention_cache_layers=int(cache))
        return fewest_offload_layers(
            as_geometry(cfg.model.name),
            cfg.train.seq_len,
            world_size,
            cfg.parallel.sp_size,
            gpu_mem_gb,
            levers,
        )

    return resolve_placement(
        mem.offload_layers,
        mem.attention_cache_layers,
        mem.activation_checkpointing,
        mem.placement,
        num_layers,
        auto,
        cacheable=as_geometry(cfg.model.name).attention_layers,
    )
