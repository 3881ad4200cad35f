"""Which attention kernel may run a model, decided from its shape alone (no torch: the planner reads
it too).

FlashAttention 4 (parallel/attention.py's `fa4` backend and the kernel pair the attention cache
needs on a GPU) is verified (against an fp32 reference and inside the engine,
tests/gpu/test_attention_gpu.py) at FA4_VERIFIED_HEAD_DIMS only, so `auto` picks it only there. Its
Hopper kernels take FA3's tile configurations, made for head dims 64-256; below FA4_MIN_HEAD_DIM its
gradients are wrong, so it is refused. measured: see docs/calibration.md#fa4-head-dims
"""

from __future__ import annotations

from typing import Optional

from ds_longctx.parallel.parallel_state import divisors, local_kv_heads

FA4_VERIFIED_HEAD_DIMS = (128, 256)
FA4_MIN_HEAD_DIM = 64


def head_dim(cfg) -> int:
    """The attention head dim of a model config (a dict, or an HF config object): its `head_dim`,
    else hidden_size / num_attention_heads. The one home of this rule: plan/geometry.py and
    parallel/attention.py read it."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return get("head_dim") or get("hidden_size") // get("num_attention_heads")


def check_attention_heads(heads: int, kv_heads: int, where: str = "the model") -> None:
    """Grouped-query attention's rule, for the planner's geometry and the engine's preflight alike:
    every KV head serves a whole group of query heads (heads a multiple of kv_heads, 1 <= kv_heads
    <= heads). More: docs/design/parallel.md."""
    if kv_heads < 1 or kv_heads > heads or heads % kv_heads:
        fits = divisors(heads) if heads >= 1 else []
        raise ValueError(
            f"{where}: num_attention_heads={heads} with num_key_value_heads={kv_heads}: each KV "
            "head must serve a whole group of query heads (num_attention_heads a multiple of "
            f"num_key_value_heads); fix the config: num_key_value_heads one of {fits}"
        )


def fa4_verified(head_dim: Optional[int]) -> bool:
    """`auto` may pick FA4 for this head_dim (None: not known, as before the rule)."""
    return head_dim is None or head_dim in FA4_VERIFIED_HEAD_DIMS


def fa4_refusal(head_dim: Optional[int]) -> Optional[str]:
    """Why `attn_backend: fa4` is refused for this head_dim, or None."""
    if head_dim is not None and head_dim < FA4_MIN_HEAD_DIM:
        return (
            f"attn_backend='fa4' at head_dim={head_dim}: FlashAttention 4's Hopper kernels are "
            "made for head dims "
            f"{FA4_MIN_HEAD_DIM}-256, and at head_dim 16 their gradients disagreed with cuDNN "
            f"SDPA's here; use attn_backend='sdpa' (or 'auto')"
        )
    return None


def head_groups_split(groups: int, kv_heads: int, sp_size: int) -> bool:
    """`groups` split the KV heads each rank attends at this sp (kv_heads / sp, or 1 head when sp
    replicates them) evenly. More: docs/design/parallel.md."""
    return groups >= 1 and local_kv_heads(kv_heads, sp_size) % groups == 0


def check_head_groups(groups: int, kv_heads: int, sp_size: int) -> None:
    """Refuse `memory.attn_bwd_head_groups` that do not split the KV heads each rank attends
    (`head_groups_split`), naming the group counts that do."""
    local = local_kv_heads(kv_heads, sp_size)
    if not head_groups_split(groups, kv_heads, sp_size):
        fits = divisors(local)
        raise ValueError(
            f"attn_bwd_head_groups={groups}: each rank attends {local} KV head(s) ({kv_heads} over "
            f"sp_size={sp_size}), which {groups} groups do not split evenly; use one of {fits}"
        )


# ----------------------------------------------------------------------------- hybrid models' layer
# types
FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"
LAYER_KINDS = (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
)  # the token mixers this package runs (Ulysses around each)
# run as full causal: alike within its window (plan/hf_fields.window_problem)
SLIDING_ATTENTION = "sliding_attention"


def _getter(cfg):
    return cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))


def layer_types(cfg) -> tuple:
    """Each decoder layer's token mixer of a model config (a dict or an HF config). More:
    docs/design/parallel.md."""
    get = _getter(cfg)
    kinds = get("layer_types")
    return tuple(kinds) if kinds else (FULL_ATTENTION,) * int(get("num_hidden_layers") or 0)


def linear_heads(cfg) -> Optional[tuple]:
    """(linear_num_key_heads, linear_num_value_heads) of a model with gated-DeltaNet layers, None
    without any: what the sp-size rule (parallel_state.sp_size_problem) reads beside the attention
    heads."""
    if LINEAR_ATTENTION not in layer_types(cfg):
        return None
    get = _getter(cfg)
    return int(get("linear_num_key_heads")), int(get("linear_num_value_heads"))


def check_linear_heads(key_heads: int, value_heads: int, where: str = "the model") -> None:
    """The gated delta rule's grouped values: each key head serves a whole group of value heads
    (FLA's GVA and transformers' torch path both repeat the key heads value_heads // key_heads
    times)."""
    if key_heads < 1 or value_heads < key_heads or value_heads % key_heads:
        raise ValueError(
            f"{where}: linear_num_value_heads={value_heads} with linear_num_key_heads={key_heads}: "
            "each key head must serve a whole group of value heads; fix the config (value heads a "
            f"multiple of key heads)"
        )


# FLA's gated backward on Hopper gives wrong gradients with Triton >= 3.4.0 and < 3.7.1 (FLA #640),
# unless its tilelang backend takes that kernel. measured: see docs/calibration.md#fla-triton
FLA_UNSAFE_TRITON = ((3, 4, 0), (3, 7, 1))


def _version_tuple(version: str) -> tuple:
    parts = []
    for p in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def fla_triton_refusal(
    triton_version: Optional[str], hopper: bool, tilelang: bool
) -> Optional[str]:
    """Why FLA's gated-delta kernels may not train here (None: they may): a Hopper GPU with a Triton
    in FLA_UNSAFE_TRITON and no tilelang backend to take the broken backward kernel."""
    if not hopper or triton_version is None or tilelang:
        return None
    lo, hi = FLA_UNSAFE_TRITON
    if not lo <= _version_tuple(triton_version) < hi:
        return None
    return (
        f"FLA's gated-delta backward on Hopper with Triton {triton_version} (>= 3.4.0, < 3.7.1) "
        "gives wrong gradients (FLA #640); install tilelang (`pip install tilelang==0.1.15 "
        "apache-tvm-ffi==0.1.12`: FLA then "
        f"runs that kernel through it) or Triton >= 3.7.1, or set linear_attn_backend: torch (slow)"
    )
