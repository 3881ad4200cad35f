"""Which levers a run needs: the search over the memory model (`planner.plan_memory`).

`choose` picks the levers for one length, `find_max_len` the longest length anything fits,
`fewest_offload_layers` the engine's `offload_layers: auto`. No torch: the CLI answers in
milliseconds. Notes: `search_notes.py`; refusals: `no_fit.py`; the search order's reasons:
`docs/design/plan.md`.

Usage:
    from ds_longctx.plan.search import choose
    print(choose("qwen3-8b", seq_len=1 << 20, gpus=8, gpu_mem_gb=80, host_mem_gb=560).plan.table())
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ds_longctx.config.run import lever_conflict
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import local_kv_heads
from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.no_fit import NoFit, no_fit_error
from ds_longctx.plan.planner import (
    GB,
    LAYER,
    LIN,
    Levers,
    MemoryPlan,
    check_headroom,
    plan_memory,
    sp_sizes_for,
)
from ds_longctx.plan.search_disk import onto_disk
from ds_longctx.plan.search_notes import choice_notes


@dataclass(frozen=True)
class Choice:
    """What `choose` picked: the plan (sp_size and levers inside) and one note per choice."""

    plan: MemoryPlan
    notes: tuple = field(default=())

    @property
    def sp_size(self) -> int:
        return self.plan.sp_size

    @property
    def levers(self) -> Levers:
        return self.plan.levers


def chunk_rows(geom, seq_len, gpus, sp, levers, knobs, max_rows=4096, min_rows=256) -> int:
    """Largest power of two in [min_rows, max_rows] whose loss phase stays at or under the
    layer-backward phase (so the loss never sets the peak); min_rows (TRL's 256, still a full-width
    matmul) if none does."""
    rows = max_rows
    while rows > min_rows:
        pb = dict(
            plan_memory(
                geom, seq_len, gpus, sp, replace(levers, loss_chunk_rows=rows), **knobs
            ).phase_bytes
        )
        if pb["loss"] <= max(b for p, b in pb.items() if p in LAYER + LIN):
            return rows
        rows //= 2
    return min_rows


def tiled_layer_allowed(geom, base: Levers) -> bool:
    """Whether the search may tile whole layers (levers/tiled_layer.py): not with LoRA, a hybrid or
    a MoE model (docs/design/plan.md)."""
    return not base.lora_rank and geom.hybrid is None and geom.moe is None


def tile_tokens_for(geom, seq_len: int, sp: int) -> int:
    """Tokens per tile of the tiled MLP / layer: the hidden size, or the whole slice if shorter."""
    return min(geom.hidden, -(-seq_len // sp))


def _search(
    geom,
    seq_len,
    gpus,
    gpu_budget,
    host_budget,
    knobs,
    sp_size=None,
    base: Levers = Levers(),
    nodes=1,
    disk_budget=0.0,
) -> Optional[Choice]:
    """The first fit on `nodes` nodes of `gpus` GPUs (host_budget: one node's), the cheaper lever
    first (docs/calibration.md#lever-step-costs): `_placements`, then sp descending, then
    `_levers_at`, then the fewest offloaded checkpoints. `base` carries what the user fixed; the
    search sets the rest."""
    L, sps = geom.layers, [sp_size] if sp_size else sp_sizes_for(geom, gpus, nodes)[::-1]
    knobs = dict(knobs, nodes=nodes)
    asked = base.optimizer_offload_ratio  # < 1: the user's partial offload, the only offload tried
    # the full offload fit the GPUs somewhere but not the host: only then can a partial one fit
    host_bound = False
    for opt, params, ratio in _placements(base):
        if ratio < asked and not host_bound:
            # a partial offload takes more GPU memory than the full one, which did not fit
            continue
        for sp in sps:
            for lv in _levers_at(geom, seq_len, sp, base, opt, params, ratio):
                if (
                    ratio < asked
                    and plan_memory(geom, seq_len, gpus, sp, lv, **knobs).host_peak_bytes
                    > host_budget
                ):
                    # its least host (no checkpoint offloaded) breaks the budget: no k fits
                    continue
                lv = replace(lv, loss_chunk_rows=chunk_rows(geom, seq_len, gpus, sp, lv, knobs))

                def gpu_at(k, lv=lv):
                    return plan_memory(
                        geom, seq_len, gpus, sp, replace(lv, offload_layers=k), **knobs
                    )

                k = _fewest_k(lambda k: gpu_at(k).gpu_peak_bytes <= gpu_budget, L)
                if k is not None and (plan := gpu_at(k)).host_peak_bytes <= host_budget:
                    return Choice(plan=plan, notes=choice_notes(plan, sp_size, gpu_at, base))
                if k is not None and disk_budget and lv.pinned_pool:
                    budgets = (gpu_budget, host_budget, disk_budget)
                    if found := onto_disk(gpu_at(k), budgets, knobs):
                        notes = choice_notes(plan, sp_size, gpu_at, base) + found[1]
                        return Choice(plan=found[0], notes=notes)
                host_bound |= k is not None and opt and not params and ratio == asked
    return None


def _placements(base: Levers) -> list:
    """(optimizer offloaded, parameters offloaded, host share) in the order tried: on GPU,
    offloaded, the parameters too, then partial offloads (PARTIAL_OFFLOAD_RATIOS; the rules:
    docs/design/plan.md)."""
    asked = base.optimizer_offload_ratio
    # the full model's optimizer, nothing fixed
    whole = not (base.lora_rank or asked < 1 or base.offload_params)
    return (
        [(False, False, asked), (True, False, asked)]
        + ([(True, True, 1.0)] if whole else [])
        + ([(True, False, r) for r in PARTIAL_OFFLOAD_RATIOS if whole and base.partial_offload])
    )


def _levers_at(geom, seq_len: int, sp: int, base: Levers, opt: bool, params: bool, ratio: float):
    """The levers tried at one sp and placement, in order: untiled, tiled MLP, tiled layer, grouped
    attention backward; each with DeepSpeed's pinned buffers, then our pool. Nothing where the asked
    groups do not split."""
    if not kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, sp):
        return
    # (tiled MLP, tiled layer): a tiled layer tiles its MLP too
    shapes = (
        [(True, True)]
        if base.tiled_layer
        else [(False, False), (True, False)]
        + ([(True, True)] if tiled_layer_allowed(geom, base) else [])
    )
    pools = (True,) if base.pinned_pool else (False, True)
    most = local_kv_heads(geom.kv_heads, sp)
    # then the grouped attention backward on the last shape: one group per local KV head
    grouped = [(*shapes[-1], most)] if base.attn_bwd_head_groups == 1 and most > 1 else []
    for tiled, layer, groups in [(t, ly, base.attn_bwd_head_groups) for t, ly in shapes] + grouped:
        for pool in pools:
            yield replace(
                base,
                tiled_mlp=tiled,
                tiled_layer=layer,
                pinned_pool=pool,
                optimizer_offload=opt,
                optimizer_offload_ratio=ratio,
                attn_bwd_head_groups=groups,
                offload_params=params or base.offload_params,
                tile_tokens=tile_tokens_for(geom, seq_len, sp) if tiled else None,
            )


# The host's shares of the optimizer a partial offload tries (`offload_optimizer.ratio`), most on
# the host first. calibrated: see docs/calibration.md#partial-offload
PARTIAL_OFFLOAD_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)


def _fewest_k(fits, layers: int) -> Optional[int]:
    """The fewest offloaded layers k in 0..layers with fits(k); None if none. fits is monotone over
    1..layers only (k=1 costs more than k=0: the staging buffers), so k=0 is tried first, then
    bisection over 1..L."""
    if fits(0):
        return 0
    if not fits(layers):
        return None
    lo, hi = 0, layers  # fits(lo) fails, fits(hi) holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def choose(
    geom,
    seq_len: int,
    gpus: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float = 0.9,
    sp_size: Optional[int] = None,
    base: Levers = Levers(),
    nodes: int = 1,
    nvme_gb: float = 0.0,
    **knobs,
) -> Choice:
    """The levers for `seq_len` tokens on `nodes` nodes of `gpus` GPUs of `gpu_mem_gb` GB, each node
    with `host_mem_gb` GB of host RAM. A plan fits when its GPU peak <= headroom·gpu_mem_gb and its
    node's host peak <= headroom·host_mem_gb; `_search` gives the order (docs/design/plan.md).
    `sp_size` pins sp; `knobs` go to `plan_memory`. Raises `NoFit` with the longest length that fits
    and what to change."""
    geom = as_geometry(geom)
    check_headroom(headroom)
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    if sp_size is not None:
        plan_memory(geom, 1, gpus, sp_size, nodes=nodes)  # validates sp_size, naming the valid ones
    disk = headroom * nvme_gb * GB
    found = _search(geom, seq_len, gpus, gpu_budget, host_budget, knobs, sp_size, base, nodes, disk)
    if found is not None:
        return found
    raise _no_fit(
        geom, seq_len, gpus, gpu_mem_gb, host_mem_gb, headroom, sp_size, base, nodes, knobs, nvme_gb
    )


def _every_lever(
    geom, seq_len: int, gpus: int, sp_size: Optional[int], base: Levers, nodes: int, knobs
) -> MemoryPlan:
    """The plan with every lever the search may pull (the least GPU memory of any), at the largest
    sp whose ranks' KV heads the asked groups split."""
    sp = sp_size or next(
        (
            v
            for v in sp_sizes_for(geom, gpus, nodes)[::-1]
            if kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, v)
        ),
        1,
    )
    params = (
        base.offload_params
        or lever_conflict(
            lora_rank=base.lora_rank,
            offload_params=True,
            offload_ratio=base.optimizer_offload_ratio,
        )
        is None
    )
    groups = (
        base.attn_bwd_head_groups
        if base.attn_bwd_head_groups > 1
        else local_kv_heads(geom.kv_heads, sp)
    )
    return plan_memory(
        geom,
        seq_len,
        gpus,
        sp,
        replace(
            base,
            loss_chunk_rows=256,
            tiled_mlp=True,
            tile_tokens=tile_tokens_for(geom, seq_len, sp),
            tiled_layer=tiled_layer_allowed(geom, base),
            pinned_pool=True,
            offload_layers=geom.layers,
            optimizer_offload=True,
            offload_params=params,
            attn_bwd_head_groups=groups,
        ),
        nodes=nodes,
        **knobs,
    )


def _no_fit(
    geom,
    seq_len: int,
    gpus: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float,
    sp_size: Optional[int],
    base: Levers,
    nodes: int,
    knobs,
    nvme_gb: float = 0.0,
) -> NoFit:
    """`choose`'s refusal (`no_fit.no_fit_error`): the longest length that fits, the search its
    fixes try."""
    max_len = find_max_len(
        geom,
        gpus,
        gpu_mem_gb,
        host_mem_gb,
        headroom,
        sp_size=sp_size,
        base=base,
        nodes=nodes,
        nvme_gb=nvme_gb,
        **knobs,
    )
    disk = headroom * nvme_gb * GB

    def fits(n, gb, hb, m=nodes, b=base) -> bool:
        # a pinned sp_size must divide n (SP groups stay in a node)
        return (
            not (sp_size and n % sp_size)
            and _search(geom, seq_len, n, gb, hb, knobs, sp_size, b, m, disk) is not None
        )

    best = _every_lever(geom, seq_len, gpus, sp_size, base, nodes, knobs)
    return no_fit_error(fits, best, seq_len, max_len, gpu_mem_gb, host_mem_gb, headroom, base)


def last_fit(fits, lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with fits(n), fits true then false, fits(lo), not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


MAX_SEARCH_TOKENS = 1 << 32  # find_max_len's end: a length it reports is "at least" there


def find_max_len(
    geom,
    gpus: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float = 0.9,
    multiple: int = 1024,
    upper: int = MAX_SEARCH_TOKENS,
    sp_size: Optional[int] = None,
    base: Levers = Levers(),
    nodes: int = 1,
    nvme_gb: float = 0.0,
    **knobs,
) -> int:
    """The longest seq_len, a multiple of `multiple`, for which `choose` finds a fit; 0 if none.
    Fitting is monotone in seq_len: double until a length fails, then bisect. Stops at `upper`
    tokens."""
    geom = as_geometry(geom)
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    disk = headroom * nvme_gb * GB

    def fits(n: int) -> bool:
        found = _search(
            geom, n * multiple, gpus, gpu_budget, host_budget, knobs, sp_size, base, nodes, disk
        )
        return found is not None

    if not fits(1):
        return 0
    lo, hi, cap = 1, 2, max(upper // multiple, 1)
    while fits(hi):
        if hi >= cap:
            return cap * multiple
        lo, hi = hi, min(2 * hi, cap)
    return last_fit(fits, lo, hi) * multiple


def fewest_offload_layers(
    geom,
    seq_len: int,
    gpus: int,
    sp_size: int,
    gpu_mem_gb: float,
    levers: Levers = Levers(),
    headroom: float = 0.9,
    **knobs,
) -> int:
    """`offload_layers: auto`: the fewest layers whose checkpoints must leave the GPU for the
    per-GPU peak to stay under headroom·gpu_mem_gb (all layers if even that does not fit: the run
    then fails loudly). The `levers.attention_cache_layers` last layers stay on the GPU (their cache
    counts), so k stops at L - that."""
    geom = as_geometry(geom)
    budget, most = headroom * gpu_mem_gb * GB, geom.layers - levers.attention_cache_layers
    k = _fewest_k(
        lambda k: (
            plan_memory(
                geom, seq_len, gpus, sp_size, replace(levers, offload_layers=k), **knobs
            ).gpu_peak_bytes
            <= budget
        ),
        most,
    )
    return most if k is None else k
