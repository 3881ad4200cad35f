"""Which levers a run needs: the search over the memory model (`planner.plan_memory`).

`choose` picks sp_size, the fewest offloaded checkpoints, tiled MLP only when needed, the loss chunk and
optimizer offload for one length; `find_max_len` the longest length anything fits; `fewest_offload_layers`
the engine's `offload_layers: auto`. Pure arithmetic like the planner (no torch), so the CLI answers in
milliseconds and before any process starts.

Usage:
    from ds_longctx.plan.search import choose
    print(choose("qwen3-8b", seq_len=1 << 20, gpus=8, gpu_mem_gb=80, host_mem_gb=560).plan.table())
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from ds_longctx.config.run import lever_conflict
from ds_longctx.levers.rope import yarn_factor
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import local_kv_heads
from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.planner import (
    GB,
    LAYER,
    LIN,
    MAX_HEADROOM,
    Levers,
    MemoryPlan,
    check_headroom,
    plan_memory,
    sp_sizes_for,
)


@dataclass(frozen=True)
class Choice:
    """What `choose` picked: the plan (sp_size and levers inside) and one line of reasoning per choice."""

    plan: MemoryPlan
    notes: tuple = field(default=())

    @property
    def sp_size(self) -> int:
        return self.plan.sp_size

    @property
    def levers(self) -> Levers:
        return self.plan.levers


class NoFit(ValueError):
    """Raised by `choose`: nothing fits. Carries the longest length that does and what to change."""

    def __init__(self, message: str, seq_len: int, max_len: int, best: Optional[MemoryPlan]):
        super().__init__(message)
        self.seq_len, self.max_len, self.best = seq_len, max_len, best


def chunk_rows(geom, seq_len, gpus, sp, levers, knobs, max_rows=4096, min_rows=256) -> int:
    """Largest power of two in [min_rows, max_rows] whose loss phase stays at or under the layer-backward
    phase (so the loss never sets the peak); min_rows (TRL's 256, still a full-width matmul) if none does."""
    rows = max_rows
    while rows > min_rows:
        pb = dict(plan_memory(geom, seq_len, gpus, sp, replace(levers, loss_chunk_rows=rows), **knobs).phase_bytes)
        if pb["loss"] <= max(b for p, b in pb.items() if p in LAYER + LIN):
            return rows
        rows //= 2
    return min_rows


def tiled_layer_allowed(geom, base: Levers) -> bool:
    """Whether the search may tile whole layers (levers/tiled_layer.py): not LoRA's adapted Linears, not a hybrid
    model's layers (its gated DeltaNet and gated attention are not the tiles' pre-norm Qwen3 layout), not a mixture
    of experts' sparse blocks (the tiled MLP tiles those)."""
    return not base.lora_rank and geom.hybrid is None and geom.moe is None


def tile_tokens_for(geom, seq_len: int, sp: int) -> int:
    """Tokens per tile of the tiled MLP / tiled layer: the hidden size, or the whole slice if that is shorter."""
    return min(geom.hidden, -(-seq_len // sp))


def _search(geom, seq_len, gpus, gpu_budget, host_budget, knobs, sp_size=None, base: Levers = Levers(),
            nodes=1) -> Optional[Choice]:
    """The first fit on `nodes` nodes of `gpus` GPUs (host_budget: one node's) in this order, the cheaper lever
    first (step costs: docs/calibration.md#lever-step-costs): optimizer on GPU before offloaded (host RAM and a CPU
    Adam step), then the bf16 parameters offloaded too (not with LoRA or a partial optimizer offload), then a partial
    optimizer offload (PARTIAL_OFFLOAD_RATIOS, the host's share falling: where the full offload fits the GPUs but
    not the host; not with LoRA, or where the user gave a ratio or the parameter offload); sp descending (sp = gpus
    first); the token-wise work untiled, then the tiled MLP, then the tiled layer (not with LoRA), then the
    attention backward over groups of KV heads (as many as each rank attends: the fp32 accumulators of one head at
    a time); offloaded checkpoints in DeepSpeed's pinned buffers, then in our exact-size pool (the same bytes in up
    to half the host memory); then the fewest offloaded checkpoints.

    Host bytes only grow with k, so if the fewest k that fits the GPU breaks the host budget, no k fits with
    these levers. `base` carries what the user fixed (the pinned pool or the tiled layer forced on, LoRA); the
    search sets the rest.
    """
    L, sps = geom.layers, [sp_size] if sp_size else sp_sizes_for(geom, gpus, nodes)[::-1]
    knobs = dict(knobs, nodes=nodes)
    # (tiled MLP, tiled layer): a tiled layer tiles its MLP too
    shapes = [(True, True)] if base.tiled_layer else \
        [(False, False), (True, False)] + ([(True, True)] if tiled_layer_allowed(geom, base) else [])
    pools = (True,) if base.pinned_pool else (False, True)
    asked = base.optimizer_offload_ratio  # < 1: the user's partial offload, the only offload tried
    whole = not (base.lora_rank or asked < 1 or base.offload_params)  # the full model's optimizer, nothing fixed
    placements = ([(False, False, asked), (True, False, asked)] + ([(True, True, 1.0)] if whole else [])
                  + ([(True, False, r) for r in PARTIAL_OFFLOAD_RATIOS if whole and base.partial_offload]))
    host_bound = False  # the full offload fit the GPUs somewhere but not the host: only then can a partial one fit
    for opt, params, ratio in placements:
        if ratio < asked and not host_bound:
            continue  # a partial offload takes more GPU memory than the full one, which already did not fit it
        for sp in sps:
            if not kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, sp):
                continue  # the groups asked for do not split this sp's KV heads per rank
            most = local_kv_heads(geom.kv_heads, sp)
            # then the grouped attention backward, with the last shape: one group per KV head this rank attends
            grouped = [(*shapes[-1], most)] if base.attn_bwd_head_groups == 1 and most > 1 else []
            for tiled, layer, groups in [(t, ly, base.attn_bwd_head_groups) for t, ly in shapes] + grouped:
                for pool in pools:
                    lv = replace(base, tiled_mlp=tiled, tiled_layer=layer, pinned_pool=pool,
                                 optimizer_offload=opt, optimizer_offload_ratio=ratio, attn_bwd_head_groups=groups,
                                 offload_params=params or base.offload_params,
                                 tile_tokens=tile_tokens_for(geom, seq_len, sp) if tiled else None)
                    if ratio < asked and \
                            plan_memory(geom, seq_len, gpus, sp, lv, **knobs).host_peak_bytes > host_budget:
                        continue  # a partial offload whose least host (no checkpoint offloaded) breaks it: no k fits
                    lv = replace(lv, loss_chunk_rows=chunk_rows(geom, seq_len, gpus, sp, lv, knobs))

                    def gpu_at(k, lv=lv):
                        return plan_memory(geom, seq_len, gpus, sp, replace(lv, offload_layers=k), **knobs)
                    k = _fewest_k(lambda k: gpu_at(k).gpu_peak_bytes <= gpu_budget, L)
                    if k is not None and (plan := gpu_at(k)).host_peak_bytes <= host_budget:
                        return Choice(plan=plan, notes=_notes(plan, sp_size, gpu_at, base))
                    host_bound |= k is not None and opt and not params and ratio == asked
    return None


# The host's shares of the optimizer a partial offload tries (DeepSpeed ZeRO-3 `offload_optimizer.ratio`; the split
# falls at its sub-groups, plan/zero_buffers.optimizer_split), most on the host first: taken only where the full
# offload breaks the host budget, each step back moves a tenth of the optimizer's fp32 state (12 bytes per
# parameter) from the host to the GPUs. calibrated: see docs/calibration.md#partial-offload
PARTIAL_OFFLOAD_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)


def _fewest_k(fits, layers: int) -> Optional[int]:
    """The fewest offloaded layers k in 0..layers with fits(k); None if none. fits is monotone over 1..layers
    only (k=1 costs more than k=0: the staging buffers), so k=0 is tried first, then bisection over 1..L."""
    if fits(0):
        return 0
    if not fits(layers):
        return None
    lo, hi = 0, layers  # fits(lo) fails, fits(hi) holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


# what the pinned pool changes, for the notes of both places that add it
POOL_HOW = ("offloaded checkpoints in one exact-size pinned slot each (DeepSpeed's buffers are powers of two) and one "
            "restored at a time on the GPU (DeepSpeed's offload holds two; measured: docs/calibration.md#pinned-pool)")


def _notes(plan: MemoryPlan, pinned_sp: Optional[int], gpu_at, base: Levers = Levers()) -> tuple:
    """One line of reasoning per choice `_search` made."""
    geom, lv, sp, k = plan.geom, plan.levers, plan.sp_size, plan.levers.offload_layers
    within = "" if plan.nodes == 1 else f" inside one node, dp={plan.dp_size} across {plan.nodes} nodes"
    valid = sp_sizes_for(geom, plan.gpus, plan.nodes)
    split = [v for v in valid if kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, v)]
    if sp == valid[-1]:
        why_sp = f"the largest of {valid} (one sequence over {sp} GPUs{within}: the least memory per GPU)"
    elif base.attn_bwd_head_groups > 1 and sp == split[-1]:  # the groups asked for held sp down
        why_sp = (f"the largest of {valid} whose ranks' KV heads split into --attn_bwd_head_groups "
                  f"{base.attn_bwd_head_groups} groups ({split}; at sp_size={valid[-1]} each rank attends "
                  f"{local_kv_heads(geom.kv_heads, valid[-1])}); without that flag sp_size={valid[-1]} and the "
                  f"search's own groups would be tried first")
    else:
        why_sp = f"one of {valid}: the larger ones did not fit"
    notes = [f"sp_size={sp}: " + ("pinned" if pinned_sp else why_sp),
             (f"tiled_layer=True: {'as asked (--tiled_layer)' if base.tiled_layer else 'needed to fit'}; the MLP "
              f"tiled with it, tile_tokens={lv.tile_tokens} = min(T, hidden) (measured: "
              f"docs/calibration.md#tiled-layer)" if lv.tiled_layer else
              f"tiled_mlp={lv.tiled_mlp}: " + (f"needed to fit; tile_tokens={lv.tile_tokens} = min(T, hidden)"
                                               if lv.tiled_mlp else "not needed (it costs step time: "
                                               "docs/calibration.md#lever-step-costs)")),
             f"offload_layers={k}: the fewest whose checkpoints must leave the GPU"
             + (f" (k={k - 1} needs {gpu_at(k - 1).gpu_peak_bytes / GB:.1f} GB/GPU)" if k else ""),
             f"loss_chunk_rows={lv.loss_chunk_rows}: largest power of two <= 4096 whose loss phase stays under the "
             f"layer-backward phase (floor 256)",
             f"optimizer_offload={lv.optimizer_offload}: "
             + ("nothing fits with it on GPU" if lv.optimizer_offload else "not needed")
             + (f" (partial: {lv.optimizer_offload_ratio:g} of it on the host, "
                + ("as asked)" if base.optimizer_offload_ratio < 1 else "the most the host holds beside the "
                   "checkpoints; the whole optimizer there breaks the host budget; measured: "
                   "docs/calibration.md#partial-offload)")
                if lv.optimizer_offload and lv.optimizer_offload_ratio < 1 else "")]
    if lv.offload_params:
        notes.append("offload_params=True: " + ("as asked" if base.offload_params else "nothing fits with the "
                     "optimizer alone offloaded") + "; the bf16 parameters in one pinned host buffer per rank, each "
                     "layer's fetched when it runs (DeepSpeed offload_param; measured: "
                     "docs/calibration.md#offload-params)")
    if lv.attn_bwd_head_groups > 1:
        notes.append(f"attn_bwd_head_groups={lv.attn_bwd_head_groups}: "
                     + ("as asked" if base.attn_bwd_head_groups > 1 else "needed to fit")
                     + "; the attention backward over that many groups of KV heads, one at a time (the kernel's fp32 "
                       "accumulators of one group; measured: docs/calibration.md#attn-bwd-head-groups)")
    if lv.pinned_pool and k:
        notes.append("pinned_pool=True: " + ("as asked (--pinned_pool)" if base.pinned_pool else "needed to fit")
                     + "; " + POOL_HOW)
    notes.extend(rope_notes(geom, plan.seq_len))
    return tuple(notes)


def rope_notes(geom, seq_len: int) -> list:
    """What `train`'s default rope_scaling (auto) does at seq_len, by levers/rope's rules: nothing within the
    trained context; YaRN and its factor past it (where it cannot: plan_args refuses, levers/rope.rope_problem)."""
    trained = geom.trained_context
    if seq_len <= trained:
        return []
    return [f"seq_len {seq_len:,} > the trained context {trained:,}: train with YaRN (rope_scaling auto sets factor "
            f"{yarn_factor(seq_len, trained):g})"]


def choose(geom, seq_len: int, gpus: int, gpu_mem_gb: float, host_mem_gb: float, headroom: float = 0.9,
           sp_size: Optional[int] = None, base: Levers = Levers(), nodes: int = 1, **knobs) -> Choice:
    """The levers for `seq_len` tokens on `nodes` nodes of `gpus` GPUs of `gpu_mem_gb` GB, each node with
    `host_mem_gb` GB of host RAM.

    A plan fits when its per-GPU peak <= headroom·gpu_mem_gb and its node host peak <= headroom·host_mem_gb.
    Rules (`_search`): the optimizer stays on GPU unless nothing fits that way; sp_size is the largest valid one
    within a node (sp = gpus when valid: one sequence per step over the node, the least memory and the fewest
    offloaded layers; across nodes data parallelism); tiled MLP only when it is needed to fit; offload_layers the
    fewest that fit (only the layers that must leave the GPU go); chunk_rows as in `chunk_rows`. `sp_size` pins sp.
    `knobs` go to `plan_memory` (live_layers, fragmentation, cuda_context_gib, process_host_gib). Raises `NoFit`
    with the longest length that fits and what to change.
    """
    geom = as_geometry(geom)
    check_headroom(headroom)
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    if sp_size is not None:
        plan_memory(geom, 1, gpus, sp_size, nodes=nodes)  # validates sp_size, naming the valid ones
    found = _search(geom, seq_len, gpus, gpu_budget, host_budget, knobs, sp_size, base, nodes)
    if found is not None:
        return found
    raise _no_fit(geom, seq_len, gpus, gpu_mem_gb, host_mem_gb, headroom, sp_size, base, nodes, knobs)


def _every_lever(geom, seq_len: int, gpus: int, sp_size: Optional[int], base: Levers, nodes: int, knobs) -> tuple:
    """(plan, sp, groups, params offloaded): every lever the search may pull, at the largest sp whose ranks' KV heads
    the asked groups split: the least GPU memory of any plan (the parameter offload unless LoRA or a partial offload
    rules it out; the attention backward one KV head at a time unless the user fixed the groups)."""
    sp = sp_size or next((v for v in sp_sizes_for(geom, gpus, nodes)[::-1]
                          if kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, v)), 1)
    params = base.offload_params or lever_conflict(lora_rank=base.lora_rank, offload_params=True,
                                                   offload_ratio=base.optimizer_offload_ratio) is None
    groups = base.attn_bwd_head_groups if base.attn_bwd_head_groups > 1 else local_kv_heads(geom.kv_heads, sp)
    best = plan_memory(geom, seq_len, gpus, sp, replace(base, loss_chunk_rows=256, tiled_mlp=True,
                                                        tile_tokens=tile_tokens_for(geom, seq_len, sp),
                                                        tiled_layer=tiled_layer_allowed(geom, base), pinned_pool=True,
                                                        offload_layers=geom.layers, optimizer_offload=True,
                                                        offload_params=params, attn_bwd_head_groups=groups),
                       nodes=nodes, **knobs)
    return best, sp, groups, params


def hardware(gpus: int, gpu_mem_gb: float, host_mem_gb: float, nodes: int = 1) -> str:
    """The machine in words, as plans and refusals name it."""
    each = f"{gpus} x {gpu_mem_gb:g} GB GPUs + {host_mem_gb:g} GB host"
    return each if nodes == 1 else f"{nodes} nodes of {each} each"


def _no_fit(geom, seq_len: int, gpus: int, gpu_mem_gb: float, host_mem_gb: float, headroom: float,
            sp_size: Optional[int], base: Levers, nodes: int, knobs) -> NoFit:
    """`choose`'s refusal: what every lever needs, the longest length that fits, and each change that would fit."""
    max_len = find_max_len(geom, gpus, gpu_mem_gb, host_mem_gb, headroom, sp_size=sp_size, base=base,
                           nodes=nodes, **knobs)
    best, sp, groups, params = _every_lever(geom, seq_len, gpus, sp_size, base, nodes, knobs)
    ratio = base.optimizer_offload_ratio
    offloaded = ("the optimizer" if ratio >= 1 else f"{ratio:g} of the optimizer") + \
        (" and the parameters" if params else "")

    def fits(n, gb, hb, m=nodes, b=base) -> bool:  # a pinned sp_size must divide n (SP groups stay in a node)
        return not (sp_size and n % sp_size) and _search(geom, seq_len, n, gb, hb, knobs, sp_size, b, m) is not None
    machine = hardware(gpus, gpu_mem_gb, host_mem_gb, nodes)
    lines = [f"{geom.name} at seq_len={seq_len:,} does not fit {machine} (x headroom {headroom:g}). Every lever on "
             f"(sp_size={sp}, tiled {'layer' if tiled_layer_allowed(geom, base) else 'MLP'}, the attention backward "
             f"over {groups} KV-head group(s), all {geom.layers} checkpoints and {offloaded} offloaded) needs "
             f"{best.gpu_peak_bytes / GB:.1f} GB/GPU and {best.host_peak_bytes / GB:.1f} GB host"
             f"{best.over_budget(headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB)}. Longest length that fits: "
             f"{max_len:,} tokens."]
    lines += _fixes(fits, geom, gpus, nodes, gpu_mem_gb, host_mem_gb, headroom, base, sp)
    lines.append(f"Fix: shorten to <= {max_len:,} tokens." if max_len else "No length fits this hardware.")
    return NoFit("\n".join(lines), seq_len=seq_len, max_len=max_len, best=best)


def _fixes(fits, geom, gpus: int, nodes: int, gpu_mem_gb: float, host_mem_gb: float, headroom: float, base: Levers,
           sp: int) -> list:
    """The "Fix:" lines of a refusal: each change of hardware or flags with which `fits(gpus, gpu_budget,
    host_budget, nodes, base)` finds a plan."""
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    lines = []
    if (need_gpu := _least(lambda b: fits(gpus, b, host_budget))) is not None:
        lines.append(f"Fix: GPUs of >= {math.ceil(need_gpu / headroom / GB)} GB (same count and host).")  # up: fits
    if (need_host := _least(lambda b: fits(gpus, gpu_budget, b))) is not None:
        lines.append(f"Fix: >= {math.ceil(need_host / headroom / GB)} GB host RAM (same GPUs).")
    more = next((n for n in (2 * gpus, 4 * gpus, 8 * gpus) if fits(n, gpu_budget, host_budget * n / gpus)), None)
    if more and nodes == 1:  # host RAM is assumed to grow with the GPU count
        lines.append(f"Fix: {more} GPUs of this size, host RAM scaled with them.")
    if (m := next((m for m in (2 * nodes, 4 * nodes, 8 * nodes) if fits(gpus, gpu_budget, host_budget, m)), None)):
        lines.append(f"Fix: {m} nodes like these (--nodes {m}: ZeRO-3 partitions over {m * gpus} GPUs).")
    # the same GPUs spread over more nodes, each node's host holding fewer processes (the most per node that fits)
    spread = next((n for n in sorted((d for d in range(1, gpus) if gpus % d == 0), reverse=True)
                   if fits(n, gpu_budget, host_budget, nodes * gpus // n)), None)
    if spread:
        lines.append(f"Fix: the same {nodes * gpus} GPUs, {spread} per node (--gpus {spread} --nodes "
                     f"{nodes * gpus // spread}: each node's host holds its own processes).")
    if base.attn_bwd_head_groups > 1 and fits(gpus, gpu_budget, host_budget, b=replace(base, attn_bwd_head_groups=1)):
        # the asked groups held sp down (or ruled the search's own groups out)
        lines.append(f"Fix: drop --attn_bwd_head_groups {base.attn_bwd_head_groups} (the search picks the groups and "
                     f"sp_size itself; at sp_size={sp} every rank attends {local_kv_heads(geom.kv_heads, sp)} KV "
                     f"heads).")
    if headroom < MAX_HEADROOM and fits(gpus, MAX_HEADROOM * gpu_mem_gb * GB, MAX_HEADROOM * host_mem_gb * GB):
        lines.append(f"Fix: --headroom {MAX_HEADROOM:g} (now {headroom:g}; the most of the budget a plan may fill).")
    if not base.partial_offload and base.optimizer_offload_ratio >= 1 and \
            fits(gpus, gpu_budget, host_budget, b=replace(base, partial_offload=True)):
        # the whole optimizer on the host, as asked, is what breaks it
        lines.append("Fix: drop --optimizer_offload_ratio 1 (the search then keeps a share of the optimizer on the "
                     "GPU where the whole of it breaks the host budget).")
    return lines


def last_fit(fits, lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with fits(n), for fits monotone (true then false), fits(lo) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _least(ok, hi: float = 1e14, tol: float = 0.5 * GB) -> Optional[float]:
    """The smallest budget b in (0, hi] (to within tol) with ok(b), for ok monotone in b; None if ok(hi) fails."""
    if not ok(hi):
        return None
    lo = 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


MAX_SEARCH_TOKENS = 1 << 32  # find_max_len's end: a length it reports is "at least" there


def find_max_len(geom, gpus: int, gpu_mem_gb: float, host_mem_gb: float, headroom: float = 0.9,
                 multiple: int = 1024, upper: int = MAX_SEARCH_TOKENS, sp_size: Optional[int] = None,
                 base: Levers = Levers(), nodes: int = 1, **knobs) -> int:
    """The longest seq_len, a multiple of `multiple` (1024: a multiple of every power-of-two sp_size; others are
    padded inside `plan_memory`), for which `choose` finds a fit; 0 if not even `multiple` fits.

    Fitting is monotone in seq_len (every term grows with it for fixed levers), so: double until a length
    fails, then bisect between the last fit and the first failure. Stops at `upper` tokens.
    """
    geom = as_geometry(geom)
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB

    def fits(n: int) -> bool:
        found = _search(geom, n * multiple, gpus, gpu_budget, host_budget, knobs, sp_size, base, nodes)
        return found is not None

    if not fits(1):
        return 0
    lo, hi, cap = 1, 2, max(upper // multiple, 1)
    while fits(hi):
        if hi >= cap:
            return cap * multiple
        lo, hi = hi, min(2 * hi, cap)
    return last_fit(fits, lo, hi) * multiple


def fewest_offload_layers(geom, seq_len: int, gpus: int, sp_size: int, gpu_mem_gb: float, levers: Levers = Levers(),
                          headroom: float = 0.9, **knobs) -> int:
    """`offload_layers: auto`: the fewest layers whose checkpoints must leave the GPU for the per-GPU peak to
    stay under headroom·gpu_mem_gb (all layers if even that does not fit: the run then fails loudly). The
    `levers.attention_cache_layers` last layers stay on the GPU (their cache counts), so k stops at L - that."""
    geom = as_geometry(geom)
    budget, most = headroom * gpu_mem_gb * GB, geom.layers - levers.attention_cache_layers
    k = _fewest_k(lambda k: plan_memory(geom, seq_len, gpus, sp_size, replace(levers, offload_layers=k),
                                        **knobs).gpu_peak_bytes <= budget, most)
    return most if k is None else k
