"""Fused token-wise kernels: RMSNorm, SwiGLU and rotary as one fused kernel each (Liger-Kernel, or
torch.compile).

Design notes: docs/design/levers.md, section `fused_ops.py`. Calibration:
`docs/calibration.md#fused-ops-auto`.
"""

from __future__ import annotations

# Liger (optional) and TorchDynamo (only for `compile`) are imported inside the functions that use
# them.
import functools
import importlib
import inspect
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from ds_longctx.parallel.patching import own_forward, restore_saved

log = logging.getLogger("ds_longctx")

_PREV = "_ds_longctx_fused_ops_forward"
_ROPE = "_ds_longctx_prev_rope"


def liger_available() -> bool:
    try:
        import liger_kernel.ops.rms_norm  # noqa: F401  (imports triton)

        return True
    except Exception:
        return False


# What `auto` picks on a CUDA GPU, and why (the reason is logged). calibrated: see
# docs/calibration.md#fused-ops-auto
AUTO_CUDA = (
    "compile",
    "auto: CUDA GPU; torch.compile measured fastest of compile, liger and none, with the same "
    "losses (benchmarks/results/peers.jsonl; docs/calibration.md#fused-ops-auto)",
)


def resolve_fused_ops(name: str, on_cuda: bool) -> tuple:
    """(kind that runs: liger | compile | none, the reason logged). `auto`: compile on CUDA, none on
    CPU (where runs are tests and a compilation buys nothing)."""
    if name != "auto":
        return name, "asked for"
    return AUTO_CUDA if on_cuda else ("none", "auto: no CUDA GPU")


def check_fused_ops(name: str, on_cuda: bool) -> None:
    """Refuse `fused_ops` where it cannot run, naming the fix."""
    if name in ("none", "compile", "auto"):
        return
    if not on_cuda:
        raise ValueError(
            f"fused_ops={name!r} needs a CUDA GPU (Triton kernels); use fused_ops: compile or none "
            "on CPU"
        )
    if not liger_available():
        raise ValueError(
            f"fused_ops={name!r} but liger-kernel does not import; `pip install liger-kernel`, "
            f"fused_ops: compile, or fused_ops: none"
        )


def _rms_math(x, weight, eps):
    """HF's Qwen3 / Llama RMSNorm: fp32 statistics, cast back, then the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _silu_mul(gate, up):
    return F.silu(gate) * up


def _kernels(kind: str, rope):
    """(rms(x, w, eps), silu_mul(gate, up), rotary function) of one backend. `rope` is the modeling
    module's own."""
    if kind == "liger":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        return (
            (lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)),
            LigerSiLUMulFunction.apply,
            liger_rotary_pos_emb,
        )
    if kind == "compile":
        return _compiled(rope)
    raise ValueError(f"fused_ops={kind!r} is not one of liger, compile")


# TorchDynamo's per-function graph limit (`recompile_limit`); a run needs 14
# (docs/design/levers.md). calibrated: see docs/calibration.md#compile-shapes
COMPILE_SHAPES = 64


@functools.lru_cache(maxsize=None)
def _compiled(rope):
    """The same math, each chain fused by TorchInductor (Triton on GPU, C++ on CPU). More:
    docs/design/levers.md."""
    import torch._dynamo

    kw = {"dynamic": False}
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        kw["recompile_limit"] = COMPILE_SHAPES
    elif torch._dynamo.config.recompile_limit < COMPILE_SHAPES:
        log.info(
            "fused ops (torch.compile): torch._dynamo.config.recompile_limit %d -> %d (one graph "
            "per shape and grad mode of a tiled run)",
            torch._dynamo.config.recompile_limit,
            COMPILE_SHAPES,
        )
        torch._dynamo.config.recompile_limit = COMPILE_SHAPES
    return torch.compile(_rms_math, **kw), torch.compile(_silu_mul, **kw), torch.compile(rope, **kw)


def _is_gated_silu_mlp(m) -> bool:
    act = getattr(m, "act_fn", None)
    return (
        all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj"))
        and act is not None
        and type(act).__name__ in ("SiLU", "SiLUActivation")
    )


def _patch(module, forward) -> None:
    module.__dict__.setdefault(_PREV, own_forward(module))
    module.forward = forward


def apply_fused_ops(model: nn.Module, kind: str = "liger") -> list:
    """Route RMSNorm, SwiGLU and rotary through fused kernels: Liger-Kernel's (`liger`) or
    TorchInductor's compilation of HF's own math (`compile`) (module doc). Returns what was
    routed."""
    modeling = importlib.import_module(type(model).__module__)
    own_rope = (
        model.__dict__[_ROPE][1]
        if _ROPE in model.__dict__
        else getattr(modeling, "apply_rotary_pos_emb", None)
    )
    rms, silu_mul, rope = _kernels(kind, own_rope)
    routed = set()
    for m in model.modules():
        if (
            type(m).__name__.endswith("RMSNorm")
            and hasattr(m, "weight")
            and hasattr(m, "variance_epsilon")
        ):
            _patch(m, functools.partial(lambda x, _m: rms(x, _m.weight, _m.variance_epsilon), _m=m))
            routed.add("rms_norm")
        elif _is_gated_silu_mlp(m):
            _patch(
                m,
                functools.partial(
                    lambda x, _m: _m.down_proj(silu_mul(_m.gate_proj(x), _m.up_proj(x))), _m=m
                ),
            )
            routed.add("swiglu")
    text = model.config.get_text_config()
    partial = (getattr(text, "rope_parameters", None) or {}).get(
        "partial_rotary_factor", 1.0
    ) < 1 or getattr(text, "partial_rotary_factor", 1.0) < 1
    if own_rope is not None and not (
        kind == "liger" and partial
    ):  # Liger's rotary rotates the whole head
        if _ROPE not in model.__dict__:
            model.__dict__[_ROPE] = (modeling, own_rope)
        modeling.apply_rotary_pos_emb = rope
        routed.add("rope")
    names = sorted(routed)
    log.info(
        "fused ops (%s): %s",
        "Liger-Kernel" if kind == "liger" else "torch.compile",
        ", ".join(names) or "none",
    )
    return names


def remove_fused_ops(model: nn.Module) -> None:
    """Undo `apply_fused_ops`: every patched module's own forward back, the rotary function back."""
    restore_saved(model, _PREV)
    saved = model.__dict__.pop(_ROPE, None)
    if saved is not None:
        modeling, fn = saved
        modeling.apply_rotary_pos_emb = fn
