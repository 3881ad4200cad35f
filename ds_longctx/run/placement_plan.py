"""The per-layer placement a run uses, computed once: the run config's, or for
`offload_layers: auto` the planner's fewest offloaded layers that fit (rules: levers/placement.py).

    plan = run_placement(cfg, num_layers=36, world_size=8, gpu_mem_gb=80)
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from ds_longctx.levers.placement import PlacementPlan, resolve_placement
from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.search import fewest_offload_layers

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def run_placement(
    cfg: RunConfig, num_layers: int, world_size: int, gpu_mem_gb: Optional[float]
) -> PlacementPlan:
    """The placement plan of `cfg` for `num_layers` layers; `auto`: the fewest offloaded layers that
    fit `gpu_mem_gb` (0 without a GPU)."""
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
