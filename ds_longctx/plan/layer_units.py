"""What one decoder layer's backward holds at its peak, in units of the layer's hidden states (E = T·H·2) or of its
projections' outputs, per way of running it (eager HF ops, compiled token-wise ops, the tiled layer, an offloaded
layer restored from our pool): each count with what it is made of. plan/layer_terms.py multiplies them into its
layer-phase terms.
"""

# Hidden-size tensors (units of E = T·H·2) live in the top layer's backward. HF's eager RMSNorm keeps an
# fp32 upcast (2 units) + the bf16 normed copy for its weight grad (1), and its output is saved by the next
# matmul (1): 4 units per norm.
#   mlp_bwd: norm1 (4) + norm2 (4) + grad of the layer output (1) + grad of the MLP input being built (1) = 10
#   attn_bwd: norm1 (4) + residual-stream grad (1) + grad of the q/k/v-proj input being built (1)   = 6
HIDDEN_UNITS_MLP_BWD = 10
HIDDEN_UNITS_ATTN_BWD = 6
# With the token-wise ops compiled (fused_ops compile, and auto on a GPU: levers/fused_ops.py) each norm keeps only
# its bf16 input and its output (saved by the next matmul), each q/k norm its bf16 input, and SwiGLU gate, up and
# their product:
#   mlp_bwd 5, final norm 2 (its input and output); q/k norm 1 copy; MLP 3 saved (+ 2 grads)
#   attn_bwd: norm1's output (1) + the residual-stream grad (1) = 2, while the kernel's backward holds its buffers;
#             norm1's input is the layer's checkpoint (counted there), the q/k/v-proj input grad comes after
# calibrated: see docs/calibration.md#layer-units
COMPILED_UNITS_MLP_BWD = 5
COMPILED_UNITS_ATTN_BWD = 2
COMPILED_FINAL_NORM_UNITS = 2
COMPILED_QK_NORM_SAVED_COPIES = 1
COMPILED_MLP_SAVED = 3
# With tiled_layer (levers/tiled_layer.py) the norms run inside the tiles and save nothing of full length:
#   mlp_bwd: h = x + o_proj(attn), the MLP tiles' saved input (1) + grad of the layer output (1) + grad of h
#            being built (1) = 3
#   attn_bwd: the grad of h on the residual branch (1), while the kernel's backward holds its buffers; the grad of x
#             from the q/k/v tiles and the sum come after it has freed them (dQ's fp32 accumulator alone is
#             hq·S·d·4 >= 2·E), so they are not the phase's peak = 1.
# (tests/levers/test_tiled_layer.py counts what the layer saves.) calibrated: see docs/calibration.md#layer-units
TILED_LAYER_UNITS_MLP_BWD = 3
TILED_LAYER_UNITS_ATTN_BWD = 1
# A hybrid model's top gated DeltaNet layer after its MLP's backward (phase lin_norm_bwd): the post-attention norm's
# eager backward (zero-centred RMSNorm, never compiled) while every tensor the mixer saved is alive:
#   norm1's fp32 input, fp32 normed copy and bf16 output (5) + norm2's fp32 input (2) + its backward in flight: the
#   mul's, the mean's and the pow's fp32 grads (2 + 2 + 6) and the bf16 grad for the residual stream (1) = 18
# calibrated: see docs/calibration.md#layer-units
LIN_NORM_BWD_UNITS = 18
# An offloaded layer's backward with our pool (levers/offload.py's PooledCheckpoint) holds, beyond a kept layer's:
# its input restored from the host (1), its output's grad (1: `grads`, passed in and held by the Function until its
# nested backward returns, where a kept layer's is freed as its residual branch consumes it) and the recomputed output
# itself (1: `outputs` / `pairs`, the roots of that nested backward, alive until it returns).
# calibrated: see docs/calibration.md#layer-units
POOLED_LAYER_UNITS = 3
# q_norm / k_norm save the same 3 units per head-vector: fp32 upcast (2) + bf16 normed copy (1); v and the
# RoPE outputs are not saved (RoPE saves cos/sin only; v goes straight into the all-to-all).
QK_NORM_SAVED_COPIES = 3
