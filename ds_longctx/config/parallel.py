"""`parallel` section: how ranks share a sequence and how long they wait for each other (owner:
parallel/)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from ds_longctx.config.base import Section


class ParallelConfig(Section):
    """How ranks share a sequence and how long they wait for each other."""

    sp_size: int = Field(1, ge=1)
    """Ulysses sequence-parallel degree: ranks that share one sequence. Must divide the world size
    and the query heads (parallel/parallel_state.py has the rule); data parallelism is world_size /
    sp_size. Across nodes it must also divide the processes per node (the launcher's
    LOCAL_WORLD_SIZE), so that every SP group stays inside one node and data parallelism runs across
    nodes."""
    collective_timeout_s: float = Field(600.0, ge=1)
    """Process-group timeout in seconds: a collective waiting longer for a dead or hung rank fails
    and ends the job."""
    sp_across_nodes: bool = False
    """Allow an SP group to span nodes (sp_size not dividing the processes per node): every
    attention layer's all-to-all then crosses the inter-node network, several times slower than
    NVLink. Off: such a layout is refused before start."""
    nodes: Optional[int] = Field(None, ge=1)
    """The nodes this config was planned for (`ds-longctx plan` writes it, with gpus_per_node). A
    launch of another world (nodes x gpus_per_node processes) is refused before start: the memory
    plan holds for its world only; `ds-longctx rehearse` plays a rank of it. null: any world."""
    gpus_per_node: Optional[int] = Field(None, ge=1)
    """Processes (one per GPU) per node this config was planned for; see `nodes`."""
