"""A hybrid model's gated DeltaNet layers in the memory plan: what the top linear layer's backward
holds beyond the terms every layer shares, in phases of its own (lin_mlp_bwd, lin_norm_bwd,
lin_bwd). Phases and legend: docs/design/plan.md.
"""

from __future__ import annotations

from ds_longctx.parallel.parallel_state import local_linear_heads
from ds_longctx.plan.layer_units import LIN_NORM_BWD_UNITS
from ds_longctx.plan.memory_terms import LIN, LIN_MIX, LIN_MLP, LIN_NORM, Sizes, Terms

# chunk_gated_delta_rule's forward + backward peak, over its token-heads.
# calibrated: see docs/calibration.md#gated-delta
GATED_DELTA_PEAK_BYTES = 27.25e9
GATED_DELTA_PEAK_TOKEN_HEADS = 1_048_576 * 6
# In the bench's peak, counted elsewhere in a layer.
BENCH_OUTPUT_AND_GRAD_BYTES = 2 * 128 * 2
GATED_DELTA_BYTES_PER_TOKEN_HEAD = (
    GATED_DELTA_PEAK_BYTES / GATED_DELTA_PEAK_TOKEN_HEADS - BENCH_OUTPUT_AND_GRAD_BYTES
)
# What the mixer saves, per token and value head / per element of [T, hv·dv].
# calibrated: see docs/calibration.md#gated-delta
WY_BYTES_PER_TOKEN_HEAD = 64 * 2
NORM_SAVED_BYTES = 18


def linear_terms(t: Terms, z: Sizes) -> None:
    """The top gated DeltaNet layer's own tensors (module doc), per rank."""
    h, T, S = z.g.hybrid, z.T, z.S
    hk_l, hv_l = local_linear_heads(h.linear_heads, z.sp)
    dk, dv, hv = h.linear_key_dim, h.linear_value_dim, h.linear_value_heads
    c_l = 2 * hk_l * dk + hv_l * dv
    t.add(
        "lin_conv_in", S * c_l * 2, 0, "S·c'·2 (the exchanged q/k/v: the conv1d's saved input)", LIN
    )
    saved = (LIN_MLP, LIN_NORM)  # until the mixer's own backward
    t.add(
        "lin_rule_saved",
        S * (c_l * 2 + hv_l * (4 + 2 + WY_BYTES_PER_TOKEN_HEAD)),
        0,
        f"S·(c'·2 + hv'·(4+2+{WY_BYTES_PER_TOKEN_HEAD})) (the delta rule's q/k/v, g fp32, beta, WY "
        "matrix)",
        saved,
    )
    t.add(
        "lin_norm_saved",
        T * hv * dv * NORM_SAVED_BYTES,
        0,
        f"T·hv·dv·{NORM_SAVED_BYTES} (gated RMSNorm, out_proj)",
        saved,
    )
    t.add(
        "hidden_norm_bwd",
        LIN_NORM_BWD_UNITS * z.E,
        0,
        f"{LIN_NORM_BWD_UNITS}·T·H·2 (the norms' eager units: plan/layer_units.py)",
        (LIN_NORM,),
    )
    t.add(
        "lin_gates",
        T * hv * (4 + 2) * 2,
        0,
        "T·hv·(4+2)·2 (g fp32 and beta on the slice, and their grads)",
        LIN,
    )
    t.add(
        "lin_rule_bwd",
        round(S * hv_l * GATED_DELTA_BYTES_PER_TOKEN_HEAD),
        0,
        f"S·hv'·{GATED_DELTA_BYTES_PER_TOKEN_HEAD:.0f} (the kernel's fwd+bwd peak per token and "
        "value head)",
        (LIN_MIX,),
    )
    # the conv's input grad and its exchange back come after the kernel frees its buffers
    t.add(
        "lin_grads_local",
        T * hv * dv * 4,
        0,
        "T·hv·dv·4 (the rule output's and z's grads, beside the kernel)",
        (LIN_MIX,),
    )
