"""A mixture of experts' memory terms: what the top layer's sparse block holds in its backward (plan/layer_terms.py's
mlp terms for a dense layer), whole or in tiles (levers/moe.py). The rest of an MoE step is a dense one's with the
MoE layer's parameter count (plan/geometry.py: `gathered_layers` holds all E experts of each live layer, ZeRO-3
gathers them as any parameter; `layer_grads_bf16` their gradients).

Per row of the slice (n = T rows, or t in a tile), bytes, bf16 (k experts per token, E experts, H hidden, I expert
width), what transformers' grouped_mm path saves for the backward with levers/moe.py's router (counted by
tests/levers/test_moe.py with saved-tensor hooks):
    router      6·E + 8          softmax's fp32 probabilities, the bf16 logits the load-balancing gradient reads,
                                 the row's counted flag and top-k sum
    dispatch    k·(2·H + 38)     every token copied once per expert it goes to ([T·k, H], the grouped GEMM's input),
                                 the sort / gather / top-k indices and weights
    experts     k·(2·H + 8·I)    the gate_up output [T·k, 2I], its SiLU and product [T·k, I] each, the down output
                                 [T·k, H] (kept for the routing weights' product)
and in the backward, at the routing weights' product, three [T·k, H] buffers (the incoming grad, the product's grad,
the weights' grad before its row sum): 6·T·k·H. Tiled, a tile's own of all these, and the fp32 sums of the block's
weight grads (tiled_mlp.TiledRows) beside the bf16 grad each tile's grouped GEMM backward makes: 6·P_block.
"""

from __future__ import annotations

from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.levers import Levers

# transformers' Qwen3-MoE at 30B-A3B width on one H200 (2 layers, bf16, grouped_mm experts, 131,072 tokens): forward +
# backward of the model, and one layer's SDPA attention within it, seconds; what is left of a layer at its forward FLOPs
# x 3 is the rate of a sparse layer's token-wise work (projections, router, experts), plan/step_time.py's rate for
# sparse layers (tests/plan/test_step_time.py derives it). calibrated: see docs/calibration.md#tokenwise-flops
MOE_MEASURED_SECONDS = 2.42
MOE_MEASURED_ATTENTION_SECONDS = 0.87
MOE_TOKENWISE_FLOPS = 131e12
ROUTER_ROW_BYTES = 8  # + 6·E: the counted flag (fp32) and the top-k sum
DISPATCH_INDEX_BYTES = (
    38  # per row and expert: the sort, gather and top-k indices (int64) and weights
)


def top_layer_sparse(g: ModelGeometry) -> bool:
    """Whether the top layer (the planner's worst) is a sparse MoE layer."""
    return g.moe is not None and g.moe.is_sparse(g.layers - 1)


def block_fwd_flops(g: ModelGeometry) -> int:
    """Forward FLOPs per token of one sparse block: the grouped GEMMs of the k experts a token goes to (k·3·H·I_e
    multiply-adds) and the router (E·H)."""
    m = g.moe
    return 2 * (m.top_k * 3 * g.hidden * m.expert_intermediate + m.experts * g.hidden)


def tiled_moe_seconds(g: ModelGeometry, tokens: int) -> float:
    """What tiling the sparse blocks costs a step on one rank of `tokens` tokens: one more forward of each block (the
    tiles' recompute), at MOE_TOKENWISE_FLOPS."""
    return len(g.moe.sparse_layers) * tokens * block_fwd_flops(g) / MOE_TOKENWISE_FLOPS


def moe_lever_problem(g: ModelGeometry, lv: Levers) -> str | None:
    """Why these levers cannot run this mixture of experts (None: they can): the tiled layer tiles gated MLPs only."""
    if g.moe is not None and lv.tiled_layer:
        return (
            f"tiled_layer: {g.name} is a mixture of experts; the tiled layer tiles gated MLPs only. Use tiled_mlp "
            f"(it tiles the sparse block: router, experts and combine per tile) and set tiled_layer: false"
        )
    return None


def block_bytes(g: ModelGeometry, rows: int) -> tuple:
    """(router, dispatch, experts, backward grads) bytes of one sparse block over `rows` rows (module doc)."""
    m, H = g.moe, g.hidden
    E, k, width = m.experts, m.top_k, m.expert_intermediate
    return (
        rows * (6 * E + ROUTER_ROW_BYTES),
        rows * k * (2 * H + DISPATCH_INDEX_BYTES),
        rows * k * (2 * H + 8 * width),
        6 * rows * k * H,
    )


def moe_terms(t, z, lv: Levers) -> None:
    """The top layer's sparse block in its backward (phase mlp_bwd), whole or tiled (`lv.tiled_mlp`); the router's
    load-balancing statistics (phase all)."""
    g, T = z.g, z.T
    m = g.moe
    E, k = m.experts, m.top_k
    t.add(
        "moe_router_stats",
        (2 * E + 1) * 8 + E * 4,
        0,
        "(2·E+1)·8 + E·4 (C, P, R in fp64; the gradient row)",
    )
    if lv.tiled_mlp:
        tile = min(lv.tile_tokens or g.hidden, T)
        router, dispatch, experts, grads = block_bytes(g, tile)
        t.add(
            "moe_tile",
            router + dispatch + experts + grads,
            0,
            f"t·(6·E+8 + k·(4·H+8·I+38)) + 6·t·k·H (t={tile}, one tile's router, dispatch, experts and grads)",
            ("mlp_bwd",),
        )
        t.add("moe_tile_hidden", 2 * tile * g.hidden * 2, 0, f"2·t·H·2 (t={tile})", ("mlp_bwd",))
        block = z.A_mlp if z.lora else m.block_params(g.hidden)
        t.add(
            "moe_tile_wgrad",
            6 * block * (T > tile),
            0,
            f"(4+2)·P_block if T > t (fp32 sums + a tile's bf16 grad; P_block={block:,})",
            ("mlp_bwd",),
        )
        return
    router, dispatch, experts, grads = block_bytes(g, T)
    t.add("moe_router", router, 0, "T·(6·E+8)", ("mlp_bwd",))
    t.add("moe_dispatch", dispatch, 0, f"T·k·(2·H+38) (k={k})", ("mlp_bwd",))
    t.add("moe_experts_saved", experts, 0, "T·k·(2·H+8·I)", ("mlp_bwd",))
    t.add("moe_bwd_grads", grads, 0, "6·T·k·H", ("mlp_bwd",))
