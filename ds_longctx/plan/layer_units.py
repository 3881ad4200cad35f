"""Peak activation units of one decoder layer's backward (units of E = T·H·2), per way of running
it: eager HF, compiled token-wise ops, tiled layer, pooled offload. plan/layer_terms.py multiplies
them into its terms. Each count's breakdown: docs/design/plan.md; calibrated: see
docs/calibration.md#layer-units.
"""

# Eager HF ops: each RMSNorm keeps 4 units.
HIDDEN_UNITS_MLP_BWD = 10
HIDDEN_UNITS_ATTN_BWD = 6
# Compiled token-wise ops (levers/fused_ops.py).
COMPILED_UNITS_MLP_BWD = 5
COMPILED_UNITS_ATTN_BWD = 2
COMPILED_FINAL_NORM_UNITS = 2
COMPILED_QK_NORM_SAVED_COPIES = 1
COMPILED_MLP_SAVED = 3
# levers/tiled_layer.py: the norms run inside the tiles.
TILED_LAYER_UNITS_MLP_BWD = 3
TILED_LAYER_UNITS_ATTN_BWD = 1
# A hybrid model's top gated DeltaNet layer, phase lin_norm_bwd.
LIN_NORM_BWD_UNITS = 18
# An offloaded layer's backward with levers/offload.py's pool, beyond a kept layer's.
POOLED_LAYER_UNITS = 3
# q_norm / k_norm per head-vector, eager.
QK_NORM_SAVED_COPIES = 3
