"""The learning rate of every optimizer step: linear warm-up, then constant, cosine or linear decay to a floor.

    factor = lr_factor(cfg.optimizer, total_steps)     # factor(i): lr of step i + 1 over the peak lr
    torch.optim.lr_scheduler.LambdaLR(optimizer, factor)   # what `ds-longctx train` and the HF Trainer step

Step index i counts optimizer steps done (0 for the first step). Warm-up (W steps): i / W of the peak, as the HF
Trainer's schedules start. Then, with T steps in all, progress p = (i - W) / (T - 1 - W) runs from 0 to 1 at the last
step: cosine lr = floor + (peak - floor)(1 + cos(pi p)) / 2, linear lr = peak - (peak - floor) p, constant lr = peak.
"""

from __future__ import annotations

import math
from typing import Callable


def lr_factor(opt, total_steps: int) -> Callable[[int], float]:
    """The schedule of optimizer section `opt` over `total_steps` steps, as a multiplier of opt.lr (module doc)."""
    warm, peak, floor, kind = opt.warmup_steps, opt.lr, opt.min_lr, opt.schedule
    span = max(1, total_steps - 1 - warm)

    def factor(i: int) -> float:
        if i < warm:
            return i / warm
        if kind == "constant":
            return 1.0
        p = min(1.0, (i - warm) / span)
        shape = (1 + math.cos(math.pi * p)) / 2 if kind == "cosine" else 1 - p
        return (floor + (peak - floor) * shape) / peak

    return factor
