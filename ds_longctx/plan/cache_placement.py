"""The per-layer placement that skips the most attention recomputes and still fits:
`fastest_placement`, what
`ds-longctx plan` writes after `search.choose` picked the levers (unless --no_attention_cache).

    plan = choose("qwen3-8b", 1 << 20, gpus=8, gpu_mem_gb=80, host_mem_gb=560)
    choice = fastest_placement(plan, 80, 560)
"""

from __future__ import annotations

from dataclasses import replace

from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.parallel import kernel_rules
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.moe_terms import tiled_moe_seconds
from ds_longctx.plan.planner import GB, MemoryPlan, plan_memory
from ds_longctx.plan.search import (
    Choice,
    chunk_rows,
    last_fit,
    tile_tokens_for,
    tiled_layer_allowed,
)
from ds_longctx.plan.search_notes import POOL_HOW

# FlashAttention 4's causal forward at Ulysses shapes on H200, FLOP/s.
# calibrated: see docs/calibration.md#attention-fwd-flops
ATTENTION_FWD_FLOPS = 660e12
# What the tiled layer costs a step beyond the tiled MLP, per token of one rank's slice.
# calibrated: see docs/calibration.md#tiled-layer-seconds
TILED_LAYER_SECONDS_PER_TOKEN = 2.36 / 131_072


def attention_fwd_seconds(plan: MemoryPlan) -> float:
    """One layer's causal attention forward on one rank (what caching that layer saves per step)."""
    return (
        2
        * plan.seq_len**2
        * (plan.geom.heads // plan.sp_size)
        * plan.geom.head_dim
        / ATTENTION_FWD_FLOPS
    )


def fastest_placement(
    choice: Choice, gpu_mem_gb: float, host_mem_gb: float, headroom: float = 0.9, **knobs
) -> Choice:
    """`choice`'s levers with the per-layer placement that skips the most attention recomputes and
    still fits.

    The rule, its orders and costs: docs/design/plan.md (attention cache placement).
    """
    plan = choice.plan
    geom = plan.geom
    # `auto` runs cuDNN SDPA there: cached layers would recompute
    if not kernel_rules.fa4_verified(geom.head_dim):
        return replace(
            choice,
            notes=choice.notes
            + (
                "no attention cache: it needs FlashAttention 4's kernel pair, which `auto` picks "
                "only at head_dim "
                f"{'/'.join(map(str, kernel_rules.FA4_VERIFIED_HEAD_DIMS))} (this model: "
                f"{geom.head_dim}; parallel/kernel_rules.py)",
            ),
        )
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    # its caches go on the full-attention layers only, between linear ones
    if geom.hybrid is not None:
        return _hybrid_cached(choice, gpu_budget, host_budget, knobs)
    per_layer = attention_fwd_seconds(plan)
    scored = []
    for lv, cost, tag in _candidates(plan, knobs):
        got = _most_cached(plan, lv, gpu_budget, host_budget, knobs)
        if got is not None:
            scored.append((got[1] * per_layer - cost, -len(tag), got, tag, cost))
    if not scored:
        return choice
    plain = next((n for _, _, (_, n, _), tag, _ in scored if tag == ""), 0)
    _, _, (new, n, note), tag, cost = max(scored, key=lambda t: t[:2])
    notes = (note,) + _lever_notes(tag, n, plain, (n - plain) * per_layer, cost)
    return Choice(plan=new, notes=choice.notes + notes)


def _candidates(plan: MemoryPlan, knobs: dict) -> list:
    """(levers, estimated seconds they cost a step, tag) to try: the chosen levers without a
    placement, then with the pinned pool, the tiled sparse blocks (MoE) and the tiled layer added
    where they are not already on."""
    geom, base = (
        plan.geom,
        replace(plan.levers, offload_layers=0, attention_cache_layers=0, placement=None),
    )
    local = plan.seq_len // plan.sp_size
    candidates = [(base, 0.0, "")]
    if not base.pinned_pool:
        candidates.append((replace(base, pinned_pool=True), 0.0, "pool"))
    added = []
    # tiled sparse blocks free their backward's dispatch buffers
    if geom.moe is not None and not base.tiled_mlp:
        added.append((_tiled(plan, base, knobs), tiled_moe_seconds(geom, local), "moe"))
    if not base.tiled_layer and tiled_layer_allowed(geom, base):
        tiled = _tiled(plan, base, knobs, tiled_layer=True)
        added.append((tiled, TILED_LAYER_SECONDS_PER_TOKEN * local, "tiled"))
    for lv, cost, tag in added:
        candidates += [(lv, cost, tag)] + (
            [] if base.pinned_pool else [(replace(lv, pinned_pool=True), cost, f"{tag}+pool")]
        )
    return candidates


def _tiled(plan: MemoryPlan, base: Levers, knobs: dict, **levers) -> Levers:
    """`base` with the tiled MLP (and `levers`), its tile and the loss chunk rows that go with
    it."""
    lv = replace(
        base,
        tiled_mlp=True,
        tile_tokens=tile_tokens_for(plan.geom, plan.seq_len, plan.sp_size),
        **levers,
    )
    rows = chunk_rows(
        plan.geom, plan.seq_len, plan.gpus, plan.sp_size, lv, dict(knobs, nodes=plan.nodes)
    )
    return replace(lv, loss_chunk_rows=rows)


def _lever_notes(tag: str, n: int, plain: int, skipped: float, cost: float) -> tuple:
    """The notes of the levers a candidate added: `n` cached layers against `plain` without them."""
    notes = []
    if "pool" in tag:
        notes.append(
            f"pinned_pool=True: it lets {n} layers cache (without the added levers {plain}): "
            f"{POOL_HOW}"
        )
    if "moe" in tag:
        notes.append(
            f"tiled_mlp=True: for speed, {n} cached layers instead of {plain} skip "
            f"~{skipped:.1f} s more of attention against the tiled sparse blocks' estimated "
            f"~{cost:.1f} s (one more forward of each: plan/moe_terms.tiled_moe_seconds)"
        )
    if "tiled" in tag:
        notes.append(
            f"tiled_layer=True: for speed, {n} cached layers instead of {plain} skip "
            f"~{skipped:.1f} s more of attention against its estimated ~{cost:.1f} s "
            f"(TILED_LAYER_SECONDS_PER_TOKEN: docs/calibration.md#tiled-layer-seconds)"
        )
    return tuple(notes)


def _hybrid_cached(choice: Choice, gpu_budget: float, host_budget: float, knobs: dict) -> Choice:
    """A hybrid model's placement: the most full-attention layers keeping their output on the GPU
    (the last n of them, `PlacementPlan.from_counts`' cacheable layers; linear layers have no
    softmax to skip), with the fewest layers offloaded from the chosen plan's count on; the chosen
    plan where none fits."""
    plan = choice.plan
    geom, L, cacheable = plan.geom, plan.geom.layers, plan.geom.attention_layers
    base = replace(plan.levers, offload_layers=0, attention_cache_layers=0, placement=None)
    for n in range(sum(cacheable), 0, -1):
        for off in range(plan.placement.offloaded, L):
            if sum(cacheable[off:]) < n:
                break
            layout = PlacementPlan.from_counts(L, off, n, cacheable=cacheable)
            new = plan_memory(
                geom,
                plan.seq_len,
                plan.gpus,
                plan.sp_size,
                replace(base, placement=layout),
                nodes=plan.nodes,
                **knobs,
            )
            if new.gpu_peak_bytes <= gpu_budget and new.host_peak_bytes <= host_budget:
                saved = n * attention_fwd_seconds(new)
                return Choice(
                    plan=new,
                    notes=choice.notes
                    + (
                        f"placement {layout.spec()}: the last {n} of {sum(cacheable)} "
                        "full-attention layers keep their "
                        f"attention output on the GPU, so the recompute skips {n} attention "
                        f"forwards (~{saved:.1f} s per "
                        f"step at {ATTENTION_FWD_FLOPS / 1e12:.0f} TFLOP/s); {off} layers "
                        "offloaded: the most cached that "
                        f"fit {new.gpu_peak_bytes / GB:.1f} GB/GPU and "
                        f"{new.host_peak_bytes / GB:.1f} GB host",
                    ),
                )
    return replace(
        choice,
        notes=choice.notes
        + ("no full-attention layer's attention output fits beside the plan: no attention cache",),
    )


def _most_cached(
    plan: MemoryPlan, base: Levers, gpu_budget: float, host_budget: float, knobs: dict
):
    """(plan, cached layers, note) of `fastest_placement`'s rule for levers `base`, or None if no
    layout fits."""
    geom, L = plan.geom, plan.geom.layers

    def at(x: int, y: int, w: int):
        z = L - x - y - w
        layout = PlacementPlan.parse(
            ",".join(
                f"{p}:{n}"
                for p, n in (("offload", z), ("cache+offload", y), ("keep", w), ("cache", x))
                if n
            )
        )
        return plan_memory(
            geom,
            plan.seq_len,
            plan.gpus,
            plan.sp_size,
            replace(base, placement=layout),
            nodes=plan.nodes,
            **knobs,
        )

    def fits_gpu(x, y, w):
        return at(x, y, w).gpu_peak_bytes <= gpu_budget

    for n in range(L, -1, -1):
        for x in range(n, -1, -1):
            y, rest = n - x, L - n
            if not fits_gpu(x, y, 0):
                continue  # even with every other layer offloaded this many GPU caches do not fit
            w = rest if fits_gpu(x, y, rest) else last_fit(lambda w: fits_gpu(x, y, w), 0, rest)
            new = at(x, y, w)
            if new.host_peak_bytes <= host_budget:
                return new, n, _placement_note(new, x, y, w)
    return None


def _placement_note(plan: MemoryPlan, x: int, y: int, w: int) -> str:
    L, n = plan.geom.layers, x + y
    saved = n * attention_fwd_seconds(plan)
    return (
        f"placement {plan.placement.spec()}: {n} of {L} layers keep their attention output ({x} on "
        "the GPU, "
        f"{y} in host memory), so the recompute skips {n} attention forwards (~{saved:.1f} s per "
        "step at "
        f"{ATTENTION_FWD_FLOPS / 1e12:.0f} TFLOP/s, FlashAttention 4 on H200); {w} checkpoints "
        "kept on the GPU, "
        f"{L - n - w} offloaded: the most cached layers that fit {plan.gpu_peak_bytes / GB:.1f} "
        "GB/GPU and "
        f"{plan.host_peak_bytes / GB:.1f} GB host (the cache needs FlashAttention 4; with cuDNN "
        f"SDPA cached layers recompute)"
    )
