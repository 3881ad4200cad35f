"""A mixture of experts' memory terms: what the top layer's sparse block holds in its backward,
whole or in tiles (levers/moe.py). The rest of an MoE step is a dense one's with the MoE layer's
parameter count. Per-row byte counts: docs/design/plan.md.
"""

from __future__ import annotations

from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.levers import Levers

# Measured Qwen3-MoE step and attention seconds, and the sparse token-wise rate derived from them.
# calibrated: see docs/calibration.md#tokenwise-flops
MOE_MEASURED_SECONDS = 2.42
MOE_MEASURED_ATTENTION_SECONDS = 0.87
MOE_TOKENWISE_FLOPS = 131e12
ROUTER_ROW_BYTES = 8  # + 6·E: the counted flag (fp32) and the top-k sum
DISPATCH_INDEX_BYTES = 36  # per row and expert: sort, gather and top-k indices (+ the weight)


def top_layer_sparse(g: ModelGeometry) -> bool:
    """Whether the top layer (the planner's worst) is a sparse MoE layer."""
    return g.moe is not None and g.moe.is_sparse(g.layers - 1)


def block_fwd_flops(g: ModelGeometry) -> int:
    """Forward FLOPs per token of one sparse block: k experts' grouped GEMMs and the router."""
    m = g.moe
    return 2 * (m.top_k * 3 * g.hidden * m.expert_intermediate + m.experts * g.hidden)


def tiled_moe_seconds(g: ModelGeometry, tokens: int) -> float:
    """Seconds tiling the sparse blocks adds to a step of `tokens` tokens: one more forward each."""
    return len(g.moe.sparse_layers) * tokens * block_fwd_flops(g) / MOE_TOKENWISE_FLOPS


def moe_lever_problem(g: ModelGeometry, lv: Levers) -> str | None:
    """Why these levers cannot run this mixture of experts, or None."""
    if g.moe is not None and lv.tiled_layer:
        return (
            f"tiled_layer: {g.name} is a mixture of experts; the tiled layer tiles gated MLPs "
            "only. Use tiled_mlp "
            "(it tiles the sparse block: router, experts and combine per tile) and set "
            "tiled_layer: false"
        )
    return None


def block_bytes(g: ModelGeometry, rows: int) -> tuple:
    """(router, dispatch, experts, backward grads) bytes of one sparse block over `rows` rows
    (module doc)."""
    m, H = g.moe, g.hidden
    E, k, width = m.experts, m.top_k, m.expert_intermediate
    return (
        rows * (6 * E + ROUTER_ROW_BYTES),
        rows * k * (2 * H + DISPATCH_INDEX_BYTES + m.weight_bytes),
        rows * k * (2 * H + 8 * width),
        6 * rows * k * H,
    )


def moe_terms(t, z, lv: Levers) -> None:
    """The top layer's sparse block in its backward (mlp_bwd), and the router's statistics (all)."""
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
            f"t·(6·E+8 + k·(4·H+8·I+38)) + 6·t·k·H (t={tile}, one tile's router, dispatch, experts "
            "and grads)",
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
    w = DISPATCH_INDEX_BYTES + m.weight_bytes
    t.add("moe_dispatch", dispatch, 0, f"T·k·(2·H+{w}) (k={k})", ("mlp_bwd",))
    t.add("moe_experts_saved", experts, 0, "T·k·(2·H+8·I)", ("mlp_bwd",))
    t.add("moe_bwd_grads", grads, 0, "6·T·k·H", ("mlp_bwd",))
