"""The reasoning a plan prints: one line per choice the lever search (`search.choose`) made.

`choice_notes` explains sp_size, the tiling, offloaded checkpoints, the loss chunk, the offloads,
the grouped attention backward and the pinned pool; `rope_notes` what train's rope_scaling auto does
past the trained context. Pure text from a plan (no search, no torch): plan.txt and `ds-longctx
plan` print these lines as they are.
"""

from __future__ import annotations

from typing import Optional

from ds_longctx.levers.rope import yarn_factor
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import local_kv_heads
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.planner import GB, MemoryPlan, sp_sizes_for

# what the pinned pool changes, for the notes of both places that add it
POOL_HOW = (
    "offloaded checkpoints in one exact-size pinned slot each (DeepSpeed's buffers are powers of "
    "two) and one restored at a time on the GPU (DeepSpeed's offload holds two; measured: "
    "docs/calibration.md#pinned-pool)"
)


def _why_sp(plan: MemoryPlan, base: Levers) -> str:
    """Why the search's sp_size (not pinned): the largest valid, or the largest the asked head
    groups split."""
    geom, sp = plan.geom, plan.sp_size
    within = (
        "" if plan.nodes == 1 else f" inside one node, dp={plan.dp_size} across {plan.nodes} nodes"
    )
    valid = sp_sizes_for(geom, plan.gpus, plan.nodes)
    split = [
        v
        for v in valid
        if kernel_rules.head_groups_split(base.attn_bwd_head_groups, geom.kv_heads, v)
    ]
    if sp == valid[-1]:
        return (
            f"the largest of {valid} (one sequence over {sp} GPUs{within}: the least memory per "
            "GPU)"
        )
    if base.attn_bwd_head_groups > 1 and sp == split[-1]:  # the groups asked for held sp down
        return (
            f"the largest of {valid} whose ranks' KV heads split into --attn_bwd_head_groups "
            f"{base.attn_bwd_head_groups} groups ({split}; at sp_size={valid[-1]} each rank "
            "attends "
            f"{local_kv_heads(geom.kv_heads, valid[-1])}); without that flag sp_size={valid[-1]} "
            f"and the search's own groups would be tried first"
        )
    return f"one of {valid}: the larger ones did not fit"


def _tiling_note(lv: Levers, base: Levers) -> str:
    if lv.tiled_layer:
        return (
            "tiled_layer=True: "
            f"{'as asked (--tiled_layer)' if base.tiled_layer else 'needed to fit'}; the MLP "
            f"tiled with it, tile_tokens={lv.tile_tokens} = min(T, hidden) (measured: "
            f"docs/calibration.md#tiled-layer)"
        )
    return f"tiled_mlp={lv.tiled_mlp}: " + (
        f"needed to fit; tile_tokens={lv.tile_tokens} = min(T, hidden)"
        if lv.tiled_mlp
        else "not needed (it costs step time: docs/calibration.md#lever-step-costs)"
    )


def _optimizer_note(lv: Levers, base: Levers) -> str:
    partial = (
        f" (partial: {lv.optimizer_offload_ratio:g} of it on the host, "
        + (
            "as asked)"
            if base.optimizer_offload_ratio < 1
            else "the most the host holds beside the "
            "checkpoints; the whole optimizer there breaks the host budget; measured: "
            "docs/calibration.md#partial-offload)"
        )
        if lv.optimizer_offload and lv.optimizer_offload_ratio < 1
        else ""
    )
    on = "nothing fits with it on GPU" if lv.optimizer_offload else "not needed"
    return f"optimizer_offload={lv.optimizer_offload}: {on}{partial}"


def choice_notes(
    plan: MemoryPlan, pinned_sp: Optional[int], gpu_at, base: Levers = Levers()
) -> tuple:
    """One line of reasoning per choice the search made; gpu_at(k) is the plan with k checkpoints
    offloaded."""
    lv, k = plan.levers, plan.levers.offload_layers
    notes = [
        f"sp_size={plan.sp_size}: " + ("pinned" if pinned_sp else _why_sp(plan, base)),
        _tiling_note(lv, base),
        f"offload_layers={k}: the fewest whose checkpoints must leave the GPU"
        + (f" (k={k - 1} needs {gpu_at(k - 1).gpu_peak_bytes / GB:.1f} GB/GPU)" if k else ""),
        f"loss_chunk_rows={lv.loss_chunk_rows}: largest power of two <= 4096 whose loss phase "
        f"stays under the layer-backward phase (floor 256)",
        _optimizer_note(lv, base),
    ]
    if lv.offload_params:
        notes.append(
            "offload_params=True: "
            + (
                "as asked"
                if base.offload_params
                else "nothing fits with the optimizer alone offloaded"
            )
            + "; the bf16 parameters in one pinned host buffer per rank, each "
            "layer's fetched when it runs (DeepSpeed offload_param; measured: "
            "docs/calibration.md#offload-params)"
        )
    if lv.attn_bwd_head_groups > 1:
        notes.append(
            f"attn_bwd_head_groups={lv.attn_bwd_head_groups}: "
            + ("as asked" if base.attn_bwd_head_groups > 1 else "needed to fit")
            + "; the attention backward over that many groups of KV heads, one at a time (the "
            "kernel's fp32 "
            "accumulators of one group; measured: docs/calibration.md#attn-bwd-head-groups)"
        )
    if lv.pinned_pool and k:
        notes.append(
            "pinned_pool=True: "
            + ("as asked (--pinned_pool)" if base.pinned_pool else "needed to fit")
            + "; "
            + POOL_HOW
        )
    notes.extend(rope_notes(plan.geom, plan.seq_len))
    return tuple(notes)


def rope_notes(geom, seq_len: int) -> list:
    """What `train`'s default rope_scaling (auto) does at seq_len, by levers/rope's rules: nothing
    within the trained context; YaRN and its factor past it (where it cannot: plan_args refuses,
    levers/rope.rope_problem)."""
    trained = geom.trained_context
    if seq_len <= trained:
        return []
    return [
        f"seq_len {seq_len:,} > the trained context {trained:,}: train with YaRN (rope_scaling "
        f"auto sets factor {yarn_factor(seq_len, trained):g})"
    ]
