"""The optimizer's state made at build, so step 1 holds what every later step holds.

`materialize` runs one zero-gradient, zero-lr step per sub-group, which leaves weights and moments
unchanged, then resets the step counters; optimizers outside `SUPPORTED` are left alone, the reason
logged. Why: docs/design/run.md (measured: docs/calibration.md#optimizer-state-at-build)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")

# optimizer class names whose state is {step, exp_avg, exp_avg_sq[, max_exp_avg_sq]} made on the
# first step(), with a per-parameter `step` counter (an int, or a tensor for torch's)
SUPPORTED = ("Adam", "AdamW", "FusedAdam", "DeepSpeedCPUAdam")


def optimizers(zo) -> list:
    """The optimizers ZeRO-3 steps its sub-groups with (the main one, a partial offload's GPU
    AdamW)."""
    return [zo.optimizer] + (
        [zo.backup_optimizer] if getattr(zo, "backup_optimizer", None) is not None else []
    )


def skip_reason(zo) -> Optional[str]:
    """Why `materialize` leaves this optimizer's state to its lazy default, or None."""
    if not all(
        hasattr(zo, a) for a in ("_optimizer_step", "fp32_partitioned_groups_flat", "optimizer")
    ):
        return (
            f"{type(zo).__name__} is not DeepSpeed's ZeRO-3 optimizer as of 0.19 (no per-sub-group "
            "step)"
        )
    if getattr(zo, "swap_optimizer", False):
        return "the optimizer state is swapped to NVMe"
    if getattr(zo, "torch_autocast_gradscaler", None) is not None:
        return "torch autocast's GradScaler would count the warm-up step as one of its own"
    if getattr(zo, "zenflow", False):
        return "ZenFlow steps the host's sub-groups its own way"
    others = sorted({type(o).__name__ for o in optimizers(zo)} - set(SUPPORTED))
    if others:
        return f"optimizer {', '.join(others)} is not one of {', '.join(SUPPORTED)}"
    return None


def materialize(zo) -> tuple[int, str]:
    """Create the state of every sub-group of ZeRO-3 optimizer `zo` that has none. Returns (the
    sub-groups made, a build-log line). Call before the first step."""
    why = skip_reason(zo)
    if why:
        return 0, f"left to the first step ({why})"
    opts = optimizers(zo)
    saved = [(g, g["lr"], g.get("weight_decay")) for o in opts for g in o.param_groups]
    had_group_step = [(g, "step" in g) for o in opts for g in o.param_groups]
    made, bytes_before = [], _state_bytes(opts)
    # one zero gradient buffer per device, the largest sub-group's size, as stage3.py's own init
    # makes
    zero = None
    try:
        for g, _, wd in saved:
            g["lr"] = 0.0
            if wd is not None:
                g["weight_decay"] = 0.0
        for i, p in enumerate(zo.fp32_partitioned_groups_flat):
            if p is None or any(p in o.state and len(o.state[p]) for o in opts):
                continue
            grad = p.grad
            if grad is None:
                if (
                    zero is None
                    or zero.device != p.device
                    or zero.dtype != p.dtype
                    or zero.numel() < p.numel()
                ):
                    largest = max(
                        q.numel() for q in zo.fp32_partitioned_groups_flat if q is not None
                    )
                    zero = torch.zeros(largest, dtype=p.dtype, device=p.device)
                p.grad = zero.narrow(0, 0, p.numel()).view_as(p)
            # an offloaded sub-group's pinned gradient buffer, kept by DeepSpeed across steps: zeros
            # at build
            else:
                grad.zero_()
            try:
                zo._optimizer_step(i)
            finally:
                p.grad = grad
            made.append(p)
    finally:
        for g, lr, wd in saved:
            g["lr"] = lr
            if wd is not None:
                g["weight_decay"] = wd
        for g, had in had_group_step:
            if not had:
                g.pop("step", None)
        for st in (
            o.state[p] for p in made for o in opts if p in o.state
        ):  # only the state made here
            if "step" in st:
                if torch.is_tensor(st["step"]):
                    st["step"].zero_()
                else:
                    st["step"] = 0
    del zero
    grown = _state_bytes(opts) - bytes_before
    names = ", ".join(sorted({type(o).__name__ for o in opts}))
    if not made:
        return 0, f"already there for every sub-group ({names}: a resumed checkpoint's)"
    return len(
        made
    ), f"made at build for {len(made)} sub-groups ({names}, {_size(grown)} on this rank)"


def at_start(cfg: RunConfig, zo, rank: int) -> int:
    """`optimizer.state_at_build` before the first step and after any resume's load; logs one line
    on rank 0 and returns the sub-groups made."""
    if not cfg.optimizer.state_at_build or zo is None:
        return 0
    made, line = materialize(zo)
    if rank == 0:
        log.info("optimizer state: %s", line)
    return made


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _state_bytes(opts) -> int:
    return sum(
        t.numel() * t.element_size()
        for o in opts
        for st in o.state.values()
        for t in st.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
