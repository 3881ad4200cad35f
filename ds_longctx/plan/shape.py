"""One run's shape, read once (`run/preflight.validate` builds it): the model's geometry and HF
config, seq_len, the SP, DP and world sizes, the nodes and the per-layer placement.

    shape = RunShape(geometry, hf_config, seq_len, sp=2, world=4, per_node=4, placement=plan)

Rules: frozen; built after every check of its values passed, so whoever holds one (the engine, the
MoE checks, a resume on another layout, a rehearsal) reads the model and plans nothing again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.plan.geometry import ModelGeometry


@dataclass(frozen=True)
class RunShape:
    """A checked run's model and world."""

    geometry: ModelGeometry  # the shapes the planner reads (plan/geometry.py)
    hf_config: Any  # the model's transformers config, as the model is built from it
    seq_len: int
    sp: int
    world: int  # processes, one per GPU
    per_node: int  # processes per node
    placement: PlacementPlan  # one place per decoder layer, planned for gpu_budget_gb

    @property
    def text(self) -> Any:
        """The text config (a multimodal config's language model; else hf_config)."""
        return self.hf_config.get_text_config()

    @property
    def dp(self) -> int:
        return self.world // self.sp

    @property
    def nodes(self) -> int:
        return -(-self.world // self.per_node)
