"""Attention cache: keep the attention kernel's output through the checkpoint, so the recompute skips attention.

With activation checkpointing every decoder layer runs its forward twice: once in the forward pass (keeping
only its input) and again in backward, to rebuild what backward needs. At long lengths attention dominates
that recompute: Qwen3-8B at 131,072 tokens spends ~72% of its model FLOPs in attention, so the second
attention forward is ~1/4 of all attention work in a step. Its backward needs only q, k, v (cheap to
rebuild: projections, norms, RoPE, the all-to-all) and the kernel's output and log-sum-exp.

This lever uses PyTorch's selective activation checkpointing (`torch.utils.checkpoint` with
`create_selective_checkpoint_contexts`): for the last `n` decoder layers the policy marks the attention
kernel's forward op MUST_SAVE, so the first forward stores its outputs (the output `[b, h/sp, s, d]` and the
fp32 log-sum-exp `[b, h/sp, s]`, plus a few scalars) and the recompute returns them instead of running the
kernel; everything else is recomputed as before. Cost: per cached layer S·(hq/sp)·d·2 + (hq/sp)·S·4 bytes
per GPU, for Qwen3-8B the size of one more layer checkpoint (planner term `attention_cache`).

Kernels it knows (aten ops, matched by name): the cuDNN, flash and efficient SDPA kernels, CPU flash SDPA,
varlen (`_flash_attention_forward`), and flash-attn's custom ops. The math SDPA backend is a chain of matmuls
and a softmax, not one op: nothing is cached there (the step is still correct).

Only for layers on torch's non-reentrant checkpoint: the layers whose checkpoints are offloaded go through
DeepSpeed's checkpoint (`offload.py`), which has no selective policy. Which layers cache is the placement
plan's (`placement.py`: the last `attention_cache_layers` layers, or an explicit plan); it also routes them.
"""

from __future__ import annotations

import logging
log = logging.getLogger("ds_longctx")

# forward kernels whose outputs are kept (names as `str(op)` ends them; their backward ops never match)
ATTENTION_OPS = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
                 "_flash_attention_forward", "_efficient_attention_forward",
                 "_flash_attn_forward", "_flash_attn_varlen_forward")


def is_attention_kernel(op) -> bool:
    """True for an attention forward kernel's op overload (e.g. aten._scaled_dot_product_cudnn_attention.default)."""
    name = str(op).split("::")[-1].split(".")
    return any(part in ATTENTION_OPS for part in name)


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if is_attention_kernel(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(_policy)


def checkpoint_with_attention_cache(function, *args, **kwargs):
    """torch's non-reentrant checkpoint with the attention-saving policy (a layer's `_gradient_checkpointing_func`)."""
    from torch.utils.checkpoint import checkpoint
    kwargs.pop("use_reentrant", None)
    return checkpoint(function, *args, use_reentrant=False, context_fn=_context_fn, **kwargs)
