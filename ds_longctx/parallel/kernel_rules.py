"""Which attention kernel may run a model, decided from its shape alone (no torch: the planner reads it too).

FlashAttention 4 (parallel/attention.py's `fa4` backend and the kernel pair the attention cache needs on a GPU) is
verified (against an fp32 reference and inside the engine, tests/gpu/test_attention_gpu.py) at FA4_VERIFIED_HEAD_DIMS
only, so `auto` picks it only there. Its Hopper kernels take FA3's tile configurations, made for head dims 64-256;
below FA4_MIN_HEAD_DIM its gradients are wrong, so it is refused. measured: see docs/calibration.md#fa4-head-dims
"""

from __future__ import annotations

from typing import Optional

from ds_longctx.parallel.parallel_state import local_kv_heads

FA4_VERIFIED_HEAD_DIMS = (128,)
FA4_MIN_HEAD_DIM = 64


def head_dim(cfg) -> int:
    """The attention head dim of a model config (a dict, or an HF config object): its `head_dim`, else
    hidden_size / num_attention_heads. The one home of this rule: plan/geometry.py and parallel/attention.py read it."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return get("head_dim") or get("hidden_size") // get("num_attention_heads")


def check_attention_heads(heads: int, kv_heads: int, where: str = "the model") -> None:
    """Grouped-query attention's rule, for the planner's geometry and the engine's preflight alike: every KV head
    serves a whole group of query heads (heads a multiple of kv_heads, 1 <= kv_heads <= heads). Else the model does not
    run (HF's attention repeats each KV head heads // kv_heads times and the shapes disagree, or trains to NaN)."""
    if kv_heads < 1 or kv_heads > heads or heads % kv_heads:
        fits = [n for n in range(1, heads + 1) if heads % n == 0] if heads >= 1 else []
        raise ValueError(f"{where}: num_attention_heads={heads} with num_key_value_heads={kv_heads}: each KV head must "
                         f"serve a whole group of query heads (num_attention_heads a multiple of num_key_value_heads); "
                         f"fix the config: num_key_value_heads one of {fits}")


def fa4_verified(head_dim: Optional[int]) -> bool:
    """`auto` may pick FA4 for this head_dim (None: not known, as before the rule)."""
    return head_dim is None or head_dim in FA4_VERIFIED_HEAD_DIMS


def fa4_refusal(head_dim: Optional[int]) -> Optional[str]:
    """Why `attn_backend: fa4` is refused for this head_dim, or None."""
    if head_dim is not None and head_dim < FA4_MIN_HEAD_DIM:
        return (f"attn_backend='fa4' at head_dim={head_dim}: FlashAttention 4's Hopper kernels are made for head dims "
                f"{FA4_MIN_HEAD_DIM}-256, and at head_dim 16 their gradients disagreed with cuDNN SDPA's here; use "
                f"attn_backend='sdpa' (or 'auto')")
    return None


def head_groups_split(groups: int, kv_heads: int, sp_size: int) -> bool:
    """`groups` split the KV heads each rank attends at this sp (kv_heads / sp, or 1 head when sp replicates them)
    evenly: the rule of `memory.attn_bwd_head_groups` (parallel/attention.py's grouped backward), which the run
    config's check, the planner's search and its notes all ask."""
    return groups >= 1 and local_kv_heads(kv_heads, sp_size) % groups == 0


def check_head_groups(groups: int, kv_heads: int, sp_size: int) -> None:
    """Refuse `memory.attn_bwd_head_groups` that do not split the KV heads each rank attends (`head_groups_split`),
    naming the group counts that do."""
    local = local_kv_heads(kv_heads, sp_size)
    if not head_groups_split(groups, kv_heads, sp_size):
        fits = [n for n in range(1, local + 1) if local % n == 0]
        raise ValueError(f"attn_bwd_head_groups={groups}: each rank attends {local} KV head(s) ({kv_heads} over "
                         f"sp_size={sp_size}), which {groups} groups do not split evenly; use one of {fits}")
