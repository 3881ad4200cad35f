"""One run's shape, read once (`run/preflight.validate` builds it): the model's geometry and HF
config, seq_len, the SP, DP and world sizes, the nodes and the per-layer placement.

    shape = RunShape.of(geometry, hf_config, seq_len, sp=2, world=4, per_node=4, placement=plan)

Rules: frozen; built after every check of its values passed, so whoever holds one (the engine, the
MoE checks, a resume on another layout, a rehearsal) reads the model and plans nothing again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.plan.geometry import ModelGeometry


@dataclass(frozen=True)
class RunShape:
    """A checked run's model and world (`of` builds one)."""

    geometry: ModelGeometry  # the shapes the planner reads (plan/geometry.py)
    hf_config: Any  # the model's transformers config, as the model is built from it
    text: Any  # its text config (a multimodal config's language model; else hf_config)
    seq_len: int
    sp: int
    dp: int  # world // sp
    world: int  # processes, one per GPU
    per_node: int  # processes per node
    nodes: int
    placement: PlacementPlan  # one place per decoder layer, planned for gpu_budget_gb

    @classmethod
    def of(
        cls,
        geometry: ModelGeometry,
        hf_config: Any,
        seq_len: int,
        sp: int,
        world: int,
        per_node: int,
        placement: PlacementPlan,
    ) -> RunShape:
        return cls(
            geometry,
            hf_config,
            hf_config.get_text_config(),
            seq_len,
            sp,
            world // sp,
            world,
            per_node,
            -(-world // per_node),
            placement,
        )
