"""Memory model: how much GPU and host memory a run takes, before anything is allocated.

Pure arithmetic on an HF config's geometry.
gpu_peak = fragmentation · (Σ all + Σ peak phase) + cuda_context; host_peak is one node's.
Dimensions, phases and the modelled design: docs/design/plan.md.

Usage (which levers to pull for a length is `plan.search.choose`):
    from ds_longctx.plan.planner import Levers, ModelGeometry, plan_memory
    geometry = ModelGeometry.from_name_or_path("qwen3-8b")
    print(plan_memory(geometry, 1 << 20, 8, 8, Levers(offload_layers=32)).table())
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ds_longctx.config.run import lever_conflict
from ds_longctx.levers.gpu_budget import CUDA_CONTEXT_GIB, GB
from ds_longctx.levers.lora import DEFAULT_TARGETS
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.parallel import kernel_rules, parallel_state
from ds_longctx.plan.geometry import ModelGeometry, as_geometry
from ds_longctx.plan.layer_terms import attention_terms, mlp_terms
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.linear_terms import linear_terms
from ds_longctx.plan.memory_terms import (  # noqa: F401
    ALL,
    BUILD,
    LAYER,
    LIN,
    PHASES,
    Term,
    Terms,
    adapters,
    checkpoint_terms,
    embed_loss_terms,
    host_terms,
    sizes,
    zero3_terms,
)
from ds_longctx.plan.moe_terms import moe_lever_problem
from ds_longctx.plan.preference_terms import objective_memory_terms

GIB = 2**30
# reserved / allocated. calibrated: see docs/calibration.md#fragmentation
FRAGMENTATION = 1.06
OFFLOAD_FRAGMENTATION = 1.12
DS_OFFLOAD_FRAGMENTATION = 1.28
# A rank's steady host RSS. calibrated: see docs/calibration.md#process-host
PROCESS_HOST_GIB = 2.25
# A plan fills at most this share of the user's budget (check_headroom).
# calibrated: see docs/calibration.md#max-headroom
MAX_HEADROOM = 0.90
# A rank's RSS at ZeRO-3 init. calibrated: see docs/calibration.md#build-host
BUILD_HOST_GIB = 1.5


@dataclass(frozen=True)
class MemoryPlan:
    """The result of `plan_memory`: every term, the peak phase, per-GPU and node-host peaks
    (bytes)."""

    geom: ModelGeometry
    seq_len: int  # padded to a multiple of sp_size
    gpus: int  # per node
    sp_size: int
    levers: Levers
    terms: tuple
    phase_bytes: tuple  # ((phase, Σ gpu bytes of that phase's transient terms), ...)
    peak_phase: str
    reserved_bytes: int  # what torch.cuda.max_memory_reserved will report: f·(all + peak phase)
    gpu_peak_bytes: int  # reserved + cuda_context: what must fit on the card
    host_peak_bytes: int
    placement: PlacementPlan  # the per-layer plan the terms read (levers.placement_for)
    nodes: int = 1
    disk_bytes: int = 0  # one node's bytes on nvme_path (the disk tier; plan/disk_terms.py)

    @property
    def world(self) -> int:
        """Ranks in all: nodes · GPUs per node (ZeRO-3 partitions over all of them)."""
        return self.nodes * self.gpus

    @property
    def dp_size(self) -> int:
        return self.world // self.sp_size

    @property
    def local_tokens(self) -> int:
        return self.seq_len // self.sp_size

    @property
    def host_step_bytes(self) -> int:
        """Host bytes during training steps (the build's transient host terms excluded)."""
        return _host_bytes(self.terms, ALL)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def fits(self, gpu_budget_bytes: float, host_budget_bytes: float) -> bool:
        return self.gpu_peak_bytes <= gpu_budget_bytes and self.host_peak_bytes <= host_budget_bytes

    def over_budget(self, gpu_budget_bytes: float, host_budget_bytes: float) -> str:
        """What a refusal says bounds it: `, over the budget (host 174.0 > 115.2 GB)`, or "" within
        both."""
        over = [
            f"{what} {need / GB:.1f} > {budget / GB:.1f} GB"
            for what, need, budget in (
                ("GPU", self.gpu_peak_bytes, gpu_budget_bytes),
                ("host", self.host_peak_bytes, host_budget_bytes),
            )
            if need > budget
        ]
        return f", over the budget ({', '.join(over)})" if over else ""

    def table(self) -> str:
        """A fixed-width table: term, phase, GB per GPU, GB host (node), formula; then the peaks."""
        lv = self.levers
        pw = (
            17 if self.geom.hybrid is None else 2 + max(len(",".join(t.phases)) for t in self.terms)
        )
        where = (
            f"gpus={self.gpus}"
            if self.nodes == 1
            else f"nodes={self.nodes} gpus/node={self.gpus} world={self.world}"
        )
        rows = [
            f"{self.geom.name}: seq_len={self.seq_len:,} {where} sp={self.sp_size} "
            f"dp={self.dp_size} T={self.local_tokens:,} | chunked_loss={lv.chunked_loss} "
            f"loss_chunk_rows={lv.loss_chunk_rows} "
            f"tiled_mlp={lv.tiled_mlp}{' tiled_layer=True' if lv.tiled_layer else ''} "
            f"tile_tokens={lv.tile_tokens} optimizer_offload={lv.optimizer_offload}"
            + (
                f" (ratio {lv.optimizer_offload_ratio})"
                if lv.optimizer_offload and lv.optimizer_offload_ratio < 1
                else ""
            )
            + (" offload_params=True" if lv.offload_params else "")
            + (
                f" attn_bwd_head_groups={lv.attn_bwd_head_groups}"
                if lv.attn_bwd_head_groups > 1
                else ""
            )
            + (f" fused_ops={lv.fused_ops}" if lv.fused_ops != "auto" else "")
            + (f" lora_rank={lv.lora_rank}" if lv.lora_rank else ""),
            f"placement: {self.placement.describe()}",
            f"{'term':<26}{'phase':<{pw}}{'GB/GPU':>9}{'GB host':>10}  formula"
            + ("" if self.nodes == 1 else "  (GB host: per node)"),
        ]
        for t in self.terms:
            rows.append(
                f"{t.name:<26}{','.join(t.phases):<{pw}}"
                f"{t.gpu_bytes / GB:>9.2f} {t.host_bytes / GB:>9.2f}  {t.formula}"
            )
        phases = "  ".join(f"{p}={b / GB:.2f}" for p, b in self.phase_bytes)
        rows.append(f"phases (GB/GPU beyond 'all'): {phases}")
        rows.append(
            f"{'peak (' + self.peak_phase + ')':<{26 + pw}}{self.gpu_peak_bytes / GB:>9.2f} "
            f"{self.host_peak_bytes / GB:>9.2f}  = fragmentation·(all + {self.peak_phase}) + "
            "cuda_context"
        )
        if self.disk_bytes:
            rows.append(
                f"disk (nvme_path, per node): {self.disk_bytes / GB:.2f} GB = Σ the terms' disk"
            )
        return "\n".join(rows)


def check_headroom(headroom: float) -> None:
    """Refuse a headroom outside (0, MAX_HEADROOM]."""
    if not 0 < headroom <= MAX_HEADROOM:
        raise ValueError(
            f"--headroom {headroom:g} must be in (0, {MAX_HEADROOM:g}]: a plan above "
            f"{MAX_HEADROOM:g} of "
            "the budget could run past it (the planner's worst under-prediction of a measured "
            f"peak: docs/calibration.md#max-headroom); use {MAX_HEADROOM:g} or less"
        )


def sp_sizes_for(geom: ModelGeometry, gpus: int, nodes: int = 1) -> list:
    """The sp sizes `geom` can run on `nodes` nodes of `gpus` GPUs, each SP group inside a node."""
    return parallel_state.valid_sp_sizes(
        nodes * gpus, geom.heads, geom.kv_heads, per_node=gpus, linear_heads=geom.linear_heads
    )


def _host_bytes(terms, phases: tuple) -> int:
    """Σ host bytes of the terms live in exactly `phases` (ALL: the steps; BUILD: the engine
    build)."""
    return sum(t.host_bytes for t in terms if t.phases == phases)


def checkpoint_bytes_per_token(geom: ModelGeometry) -> int:
    """L·H·2: the checkpointed layer inputs per token of the full sequence (Qwen3-8B: 288 KiB)."""
    return geom.layers * geom.hidden * 2


# fp32 master weight + Adam's two moments per trained parameter.
SAVED_BYTES_PER_TRAINED_PARAM = 12


def disk_checkpoint_bytes(
    geom: ModelGeometry, lora_rank: int = 0, lora_targets=DEFAULT_TARGETS, dtype_bytes: int = 2
) -> int:
    """Bytes on disk of one saved checkpoint: 12·P, or 12·A + dtype_bytes·P under LoRA."""
    A = adapters(geom, lora_rank, lora_targets)[0]
    if not A:
        return SAVED_BYTES_PER_TRAINED_PARAM * geom.num_params
    return SAVED_BYTES_PER_TRAINED_PARAM * A + dtype_bytes * geom.num_params


def plan_memory(
    geom: ModelGeometry,
    seq_len: int,
    gpus: int,
    sp_size: int,
    levers: Levers = Levers(),
    *,
    nodes: int = 1,
    live_layers: int = 2,
    fragmentation: float = FRAGMENTATION,
    offload_fragmentation: float = OFFLOAD_FRAGMENTATION,
    ds_offload_fragmentation: float = DS_OFFLOAD_FRAGMENTATION,
    cuda_context_gib: float = CUDA_CONTEXT_GIB,
    process_host_gib: float = PROCESS_HOST_GIB,
) -> MemoryPlan:
    """Every allocation of one training step, per GPU and on one node's host. `gpus` is per node.
    Raises ValueError, naming the fix, for a request the run would refuse. `live_layers`: layers
    ZeRO-3 holds gathered."""
    return _plan_memory(
        as_geometry(geom),
        seq_len,
        gpus,
        sp_size,
        levers,
        nodes,
        live_layers,
        fragmentation,
        offload_fragmentation,
        ds_offload_fragmentation,
        cuda_context_gib,
        process_host_gib,
    )


@functools.lru_cache(maxsize=16384)
def _plan_memory(
    g: ModelGeometry,
    seq_len: int,
    G: int,
    sp: int,
    levers: Levers,
    nodes: int,
    live_layers: int,
    fragmentation: float,
    offload_fragmentation: float,
    ds_offload_fragmentation: float,
    cuda_context_gib: float,
    process_host_gib: float,
) -> MemoryPlan:
    """`plan_memory`'s work, cached: arguments and result are immutable."""
    if nodes < 1:
        raise ValueError(f"nodes={nodes}: need at least 1 node")
    parallel_state.check_sp_size(
        sp, nodes * G, g.heads, g.kv_heads, per_node=G, linear_heads=g.linear_heads
    )
    kernel_rules.check_head_groups(levers.attn_bwd_head_groups, g.kv_heads, sp)
    placement = levers.placement_for(g.layers, g.attention_layers)
    if (
        min(
            seq_len, levers.loss_chunk_rows, 1 if levers.tile_tokens is None else levers.tile_tokens
        )
        < 1
    ):
        raise ValueError(
            f"seq_len={seq_len}, loss_chunk_rows={levers.loss_chunk_rows}, tile_tokens="
            f"{levers.tile_tokens} must be >= 1"
        )
    z = sizes(g, seq_len, G, sp, levers, nodes, placement)
    off = levers.optimizer_offload
    if msg := lever_conflict(
        lora_rank=levers.lora_rank,
        tiled_layer=levers.tiled_layer,
        offload_ratio=levers.optimizer_offload_ratio if off else 1.0,
        offload_params=levers.offload_params,
    ) or moe_lever_problem(g, levers):
        raise ValueError(msg)
    terms = Terms()
    zero3_terms(terms, z, levers, live_layers)
    checkpoint_terms(terms, z, levers)
    embed_loss_terms(terms, z, levers)
    attention_terms(terms, z, levers)
    mlp_terms(terms, z, levers)
    if g.hybrid is not None:
        linear_terms(terms, z)
    objective_memory_terms(terms, z, levers)

    base = sum(t.gpu_bytes for t in terms if t.phases == ALL)
    phase_bytes = tuple((p, sum(t.gpu_bytes for t in terms if p in t.phases)) for p in z.phases)
    peak_phase, peak_extra = max(phase_bytes, key=lambda pb: pb[1])
    sub, ctx = base + peak_extra, round(cuda_context_gib * GIB)
    ds_opt = z.k and off and not levers.pinned_pool
    f = ds_offload_fragmentation if ds_opt else offload_fragmentation if z.k else fragmentation
    slack = round((f - 1) * sub)
    terms.add("allocator_slack", slack, 0, f"({f:g}-1)·(all + {peak_phase})")
    terms.add("cuda_context", ctx, 0, f"{cuda_context_gib:g} GiB")
    host_terms(terms, z, levers, process_host_gib, BUILD_HOST_GIB)
    return MemoryPlan(
        geom=g,
        seq_len=z.S,
        gpus=G,
        nodes=nodes,
        sp_size=sp,
        levers=levers,
        terms=tuple(terms),
        phase_bytes=phase_bytes,
        peak_phase=peak_phase,
        reserved_bytes=sub + slack,
        gpu_peak_bytes=sub + slack + ctx,
        host_peak_bytes=max(_host_bytes(terms, ALL), _host_bytes(terms, BUILD)),
        placement=placement,
        disk_bytes=sum(t.disk_bytes for t in terms),
    )
