"""The learning rate of every optimizer step: linear warm-up, then constant, cosine or linear decay
to a floor.

    factor = lr_factor(cfg.optimizer, total_steps)  # factor(i): lr of step i + 1 over the peak lr
    # what `ds-longctx train` and the HF Trainer step:
    torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

Formulas: docs/design/plan.md.
"""

from __future__ import annotations

import math
from typing import Callable


def lr_factor(opt, total_steps: int) -> Callable[[int], float]:
    """The schedule of optimizer section `opt` over `total_steps` steps, as a factor of opt.lr."""
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
