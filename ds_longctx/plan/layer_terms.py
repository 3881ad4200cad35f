"""The memory terms of the top decoder layer's backward, the step's worst layer (every on-GPU
checkpoint is still live then): its grads and hidden-size tensors, the attention's all-to-all
buffers and kernel state (`attention_terms`), and its MLP's saved tensors, whole or tiled
(`mlp_terms`). `planner.plan_memory` calls them after plan/memory_terms.py's other builders, in this
order; a mixture of experts' sparse block is plan/moe_terms.py's.
"""

from __future__ import annotations

from ds_longctx.parallel.kernel_rules import LINEAR_ATTENTION
from ds_longctx.plan.layer_units import (
    COMPILED_MLP_SAVED,
    COMPILED_QK_NORM_SAVED_COPIES,
    COMPILED_UNITS_ATTN_BWD,
    COMPILED_UNITS_MLP_BWD,
    HIDDEN_UNITS_ATTN_BWD,
    HIDDEN_UNITS_MLP_BWD,
    QK_NORM_SAVED_COPIES,
    TILED_LAYER_UNITS_ATTN_BWD,
    TILED_LAYER_UNITS_MLP_BWD,
)
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.memory_terms import LAYER, LIN_MIX, Sizes, Terms
from ds_longctx.plan.moe_terms import moe_terms, top_layer_sparse


def attention_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The top layer's backward (mlp_bwd and attn_bwd; the top layer is the worst: every on-GPU
    checkpoint is still live then): its grads, the hidden-size tensors (layer_units), the all-to-all
    buffers, the kernel's saved output, LSE and fp32 accumulators (per KV-head group with
    attn_bwd_head_groups)."""
    _grad_terms(t, z, lv)
    _hidden_terms(t, z, lv)
    _kernel_terms(t, z, lv)


def _grad_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The top layer's weight grads (or LoRA's), the tied lm_head grad held, LoRA's saved low-rank
    inputs."""
    g = z.g
    if g.tied_embeddings and not z.lora:
        # the lm_head grad (made in the loss forward) waits in autograd's input buffer for the
        # embedding's grad: a tied leaf's AccumulateGrad runs once, after its last use's backward
        # (the embedding, last)
        t.add(
            "tied_lm_head_grad_held",
            g.vocab * g.hidden * 2,
            0,
            "V·H·2 (tied embeddings)",
            z.layer_phases(*LAYER) + ("embed",),
        )
    # Each part's grads live in the phase of its own backward (ZeRO-3 moves them to its bucket right
    # after)
    if z.lora:
        t.add("layer_grads_bf16", z.A_mlp * 2, 0, "A_mlp·2", z.layer_phases("mlp_bwd"))
        t.add(
            "mixer_grads_bf16",
            (z.A_layer - z.A_mlp) * 2,
            0,
            "(A_layer-A_mlp)·2",
            z.layer_phases("attn_bwd"),
        )
    else:
        t.add(
            "layer_grads_bf16",
            g.mlp_params * 2,
            0,
            "P_mlp·2 (the MLP's, the second norm's)",
            z.layer_phases("mlp_bwd"),
        )
        t.add(
            "mixer_grads_bf16",
            g.mixer_params() * 2,
            0,
            "P_mix·2 (q/k/v/o, the first norm's)",
            ("attn_bwd",),
        )
        if g.hybrid is not None:
            t.add(
                "lin_mixer_grads_bf16",
                g.mixer_params(LINEAR_ATTENTION) * 2,
                0,
                "P_lin·2 (the gated DeltaNet mixer's, the first norm's)",
                (LIN_MIX,),
            )
    if z.lora:
        r = lv.lora_rank
        t.add(
            "lora_saved",
            z.n_top * z.T * r * 2,
            0,
            f"n·T·r·2 (n={z.n_top} adapted Linears, r={r})",
            z.layer_phases(*LAYER),
        )


def _hidden_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The hidden-size tensors of the layer's backward (layer_units), the output gate's, the q/k
    norms' saved."""
    g, T, E, d, tl = z.g, z.T, z.E, z.g.head_dim, lv.tiled_layer
    hq, hkv = g.heads, g.kv_heads
    u_mlp, u_attn = (
        (TILED_LAYER_UNITS_MLP_BWD, TILED_LAYER_UNITS_ATTN_BWD)
        if tl
        else (COMPILED_UNITS_MLP_BWD, COMPILED_UNITS_ATTN_BWD)
        if z.compiled
        else (HIDDEN_UNITS_MLP_BWD, HIDDEN_UNITS_ATTN_BWD)
    )
    t.add("hidden_mlp_bwd", u_mlp * E, 0, f"{u_mlp}·T·H·2", z.layer_phases("mlp_bwd"))
    t.add("hidden_attn_bwd", u_attn * E, 0, f"{u_attn}·T·H·2", z.layer_phases("attn_bwd"))
    # sigmoid(gate) and the gated output o_proj saves; gate grad
    if g.hybrid is not None and g.hybrid.output_gate:
        t.add(
            "attn_output_gate",
            2 * T * hq * d * 2,
            0,
            "2·T·hq·d·2 (the output gate: sigmoid(gate), o_proj's input)",
            LAYER,
        )
        t.add(
            "attn_gate_grad",
            T * hq * d * 2,
            0,
            "T·hq·d·2 (the gate half of q_proj's output grad)",
            ("attn_bwd",),
        )
    if g.qk_norm and not tl:  # tiled: q/k norms run inside the q/k/v tiles
        c = COMPILED_QK_NORM_SAVED_COPIES if z.compiled else QK_NORM_SAVED_COPIES
        t.add("qk_norm_saved", c * T * (hq + hkv) * d * 2, 0, f"{c}·T·(hq+hkv)·d·2", LAYER)


def _kernel_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The attention's all-to-all buffers and grads, the kernel's saved output and LSE, its fp32
    accumulators."""
    T, S, sp, d, hq_l, kv_l = z.T, z.S, z.sp, z.g.head_dim, z.hq_l, z.kv_l
    hq, hkv = z.g.heads, z.g.kv_heads
    qkv_a2a = S * (hq_l + 2 * kv_l) * d * 2
    t.add("qkv_a2a", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", LAYER)
    t.add("qkv_a2a_grad", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", ("attn_bwd",))
    # a cached top layer's kernel output and LSE are its cached ones (counted in attention_cache)
    t.add("attn_out_a2a", 0 if z.top_cached else S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", LAYER)
    t.add("attn_out_a2a_grad", S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", ("attn_bwd",))
    t.add("softmax_lse_fp32", 0 if z.top_cached else hq_l * S * 4, 0, "(hq/sp)·S·4", LAYER)
    # the backward over hg groups of KV heads: one group's accumulators at a time
    hg = lv.attn_bwd_head_groups
    per = "" if hg == 1 else f"/{hg}"
    t.add(
        "attn_bwd_workspace",
        hq_l * S * (d + 1) * 4 // hg,
        0,
        f"(hq/sp)·S·(d+1)·4{per}",
        ("attn_bwd",),
    )
    kv_pre = max(hkv, sp)  # KV heads are repeated up to sp before the all-to-all when sp > hkv
    # After the kernel (sp > 1): q/k/v grads back through the all-to-all. Inside it, with grouped KV
    # heads, FlashAttention 4 accumulates dK / dV in fp32 per KV head
    # (flash_attn/cute/interface.py's _flash_attn_bwd). The term is the larger; at sp 1 there is no
    # exchange.
    local = T * (hq + 2 * kv_pre) * d * 2 if sp > 1 else 0
    accum = 2 * kv_l * S * d * 4 // hg if hq_l > kv_l else 0
    t.add(
        "qkv_local_grad",
        max(local, accum),
        0,
        f"max(T·(hq+2·max(hkv,sp))·d·2 if sp > 1, 2·kv'·S·d·4{per} if hq/sp > kv')",
        ("attn_bwd",),
    )
    if hg > 1:  # each group's q/k/v grads, made by the kernel, then copied into the full ones
        t.add("attn_bwd_group_grads", qkv_a2a // hg, 0, f"S·(hq/sp+2·kv')·d·2/{hg}", ("attn_bwd",))
    # o_proj's saved input: the kernel's output itself at sp 1 (no exchange), counted in
    # attn_out_a2a or the cache
    t.add(
        "attn_out_local",
        T * hq * d * 2 * (sp > 1),
        0,
        "T·hq·d·2" + ("" if sp > 1 else " (0 at sp 1)"),
        ("mlp_bwd",),
    )


def mlp_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The top layer's token-wise work in its backward: the MLP whole (its saved intermediate-width
    tensors and grads) or in tiles of t tokens (tiled_mlp; with tiled_layer the q/k/v projections
    and norms tiled too, their fp32 weight-grad sums beside the tiles); a mixture of experts' sparse
    block: plan/moe_terms.py."""
    g, T, tl = z.g, z.T, lv.tiled_layer
    if top_layer_sparse(g):  # a mixture of experts' sparse block (plan/moe_terms.py)
        moe_terms(t, z, lv)
        return
    H, inter, d, hq, hkv = g.hidden, g.intermediate, g.head_dim, g.heads, g.kv_heads
    tile = min(lv.tile_tokens or H, T)  # the tile of the tiled MLP / tiled layer
    if tl:
        # the q/k/v tiles' backward: one tile's norm / projections / rotary with their grads, and
        # the fp32 sums of the attention-side weight grads (o_proj's is an ordinary Linear's); q, k
        # and v are three outputs, so their grads (qkv_local_grad) go in as they are, never joined
        # into one buffer
        t.add(
            "qkv_tile",
            tile * (6 * H + 4 * (hq + 2 * hkv) * d) * 2,
            0,
            f"t·(6·H+4·(hq+2·hkv)·d)·2 (t={tile})",
            ("attn_bwd",),
        )
        t.add(
            "qkv_tile_wgrad_fp32",
            (hq + 2 * hkv) * d * H * 4 * (T > tile),
            0,
            "(hq+2·hkv)·d·H·4 if T > t",
            ("attn_bwd",),
        )
    if lv.tiled_mlp or tl:
        t.add("mlp_tile", 6 * tile * inter * 2, 0, f"6·t·I·2 (t={tile})", z.layer_phases("mlp_bwd"))
        t.add(
            "mlp_tile_hidden",
            (6 if tl else 2) * tile * H * 2,
            0,
            f"{6 if tl else 2}·t·H·2 (t={tile}"
            + ("; the post-attention norm in the tile" if tl else "")
            + ")",
            z.layer_phases("mlp_bwd"),
        )
        t.add(
            "mlp_tile_wgrad_fp32",
            (z.A_mlp if z.lora else 3 * H * inter) * 4 * (T > tile),
            0,
            ("A_mlp" if z.lora else "3·H·I") + "·4 if T > t",
            z.layer_phases("mlp_bwd"),
        )
    else:
        m = COMPILED_MLP_SAVED if z.compiled else 4
        t.add("mlp_saved", m * T * inter * 2, 0, f"{m}·T·I·2", z.layer_phases("mlp_bwd"))
        t.add("mlp_grads", 2 * T * inter * 2, 0, "2·T·I·2", z.layer_phases("mlp_bwd"))
