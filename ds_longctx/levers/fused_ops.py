"""Fused token-wise kernels: RMSNorm, SwiGLU and rotary as one Liger-Kernel Triton kernel each.

HF's Qwen3 / Llama layers run these as chains of elementwise ops (RMSNorm: cast, square, mean, rsqrt, multiply,
cast, multiply; SwiGLU: silu then multiply; rotary: rotate_half, two multiplies, an add), each reading and
writing the whole [s/sp, H] or [s/sp, I] tensor: the `other` row of the step profile (3.5-3.7 s of a 24-31 s step
at 131,072 tokens, benchmarks/results/profile_131072_2026-11-30.md). Liger-Kernel fuses each chain into one pass
and keeps fewer tensors for backward.

    names = apply_fused_ops(model)    # ["rms_norm", "swiglu", "rope"], what was routed
    remove_fused_ops(model)           # every module and the modeling module's rotary function restored

What is patched (instance level, so other models in the process are untouched, except rotary, below):
- every `*RMSNorm` module with `weight` and `variance_epsilon`: `LigerRMSNormFunction` (Llama casting: compute in
  fp32, cast back, then the weight), not in place;
- every gated MLP (`gate_proj`, `up_proj`, `down_proj`, silu activation): `down(LigerSiLUMul(gate(x), up(x)))`
  (the Linear modules are still called, so ZeRO-3's hooks gather their weights as usual). Tiled MLP, applied after
  this in the engine, replaces the MLP forward again: with it on, the MLP runs tiled and the SwiGLU is not fused;
- rotary: `apply_rotary_pos_emb` in the model's modeling module (a module-level function the attention forward
  looks up at call time) set to Liger's, and put back by `remove_fused_ops`.
Needs CUDA and Triton (`pip install liger-kernel`); refused elsewhere. Numerics: tests/gpu/test_fused_ops_gpu.py.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn

log = logging.getLogger("ds_longctx")

_PREV = "_ds_longctx_prev_forward"
_ROPE = "_ds_longctx_prev_rope"


def liger_available() -> bool:
    try:
        import liger_kernel.ops.rms_norm  # noqa: F401  (imports triton)
        return True
    except Exception:
        return False


def check_fused_ops(name: str, on_cuda: bool) -> None:
    """Refuse `fused_ops` where it cannot run, naming the fix."""
    if name == "none":
        return
    if not on_cuda:
        raise ValueError(f"fused_ops={name!r} needs a CUDA GPU (Triton kernels); use fused_ops: none on CPU")
    if not liger_available():
        raise ValueError(f"fused_ops={name!r} but liger-kernel does not import; `pip install liger-kernel` or "
                         f"fused_ops: none")


def _rms_forward(module):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def forward(hidden_states):
        return LigerRMSNormFunction.apply(hidden_states, module.weight, module.variance_epsilon, 0.0, "llama", False)
    return forward


def _swiglu_forward(mlp):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    def forward(x):
        return mlp.down_proj(LigerSiLUMulFunction.apply(mlp.gate_proj(x), mlp.up_proj(x)))
    return forward


def _is_gated_silu_mlp(m) -> bool:
    act = getattr(m, "act_fn", None)
    return all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj")) and act is not None and \
        type(act).__name__ in ("SiLU", "SiLUActivation")


def _patch(module, forward) -> None:
    module.__dict__.setdefault(_PREV, module.__dict__.get("forward"))
    module.forward = forward


def apply_fused_ops(model: nn.Module) -> list:
    """Route RMSNorm, SwiGLU and rotary through Liger's kernels (module doc). Returns what was routed."""
    routed = set()
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "weight") and hasattr(m, "variance_epsilon"):
            _patch(m, _rms_forward(m))
            routed.add("rms_norm")
        elif _is_gated_silu_mlp(m):
            _patch(m, _swiglu_forward(m))
            routed.add("swiglu")
    modeling = importlib.import_module(type(model).__module__)
    if hasattr(modeling, "apply_rotary_pos_emb"):
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        if _ROPE not in model.__dict__:
            model.__dict__[_ROPE] = (modeling, modeling.apply_rotary_pos_emb)
        modeling.apply_rotary_pos_emb = liger_rotary_pos_emb
        routed.add("rope")
    names = sorted(routed)
    log.info("fused ops (Liger-Kernel): %s", ", ".join(names) or "none found")
    return names


def remove_fused_ops(model: nn.Module) -> None:
    """Undo `apply_fused_ops`: every patched module's own forward back, the rotary function back."""
    for m in model.modules():
        if _PREV in m.__dict__:
            prev = m.__dict__.pop(_PREV)
            if prev is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = prev
    saved = model.__dict__.pop(_ROPE, None)
    if saved is not None:
        modeling, fn = saved
        modeling.apply_rotary_pos_emb = fn
