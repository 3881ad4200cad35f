"""LoRA adapter counts of a model geometry, memoized: a plan's search asks for the same geometry,
rank and targets at every length and layout it tries. plan/memory_terms.adapters checks the request
first, then reads the counts here."""

from __future__ import annotations

import functools

from ds_longctx.levers.lora import target_names
from ds_longctx.plan.geometry import ModelGeometry


@functools.lru_cache(maxsize=256)
def adapter_counts(g: ModelGeometry, rank: int, targets) -> tuple:
    """(A, A_layer, A_mlp, n) for a checked request; `targets` a name or a tuple (hashable)."""
    lin, top = g.linears(), f"model.layers.{g.layers - 1}."
    names = target_names(lin, targets, "lm_head")

    def count(prefix: str = "") -> int:
        return sum(rank * sum(lin[n]) for n in names if n.startswith(prefix))

    return count(), count(top), count(top + "mlp."), sum(n.startswith(top) for n in names)
