"""One optimizer step of a rank, timed, as `ds-longctx train` runs it (run/train_loop.py) and as a
rehearsal measures it (rehearsal/rank.py): the batch (`data.get`), `forward_backward`, the optimizer
`step`.

    s = timed_step(engine, data, step, cfg.train)     # s.loss, s.seconds, s.peak_reserved, ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ds_longctx.data.rows import step_batches


@dataclass(frozen=True)
class TimedStep:
    loss: float  # the step's loss (train.loss_average) over every micro-batch and replica
    tokens: int  # trained tokens of the step over every micro-batch and replica
    lr: float  # the learning rate the step's optimizer update used
    seconds: (
        float  # from the batch to the end of the optimizer step, CUDA-synchronized at both ends
    )
    peak_reserved: int  # torch.cuda.max_memory_reserved over the step, bytes (0 without CUDA)
    peak_allocated: int  # torch.cuda.max_memory_allocated over the step, bytes (0 without CUDA)
    extra: dict = field(
        default_factory=dict
    )  # more of the step's metrics (objective dpo: its rewards)


def timed_step(
    engine, data, step: int, train, before_optimizer: Optional[Callable] = None
) -> TimedStep:
    """Make optimizer step `step + 1` (`step` are done) on this rank's dp replica: its micro-batches
    of `data` at `step` (train section: micro_batch, grad_accum), loss and gradients, then the
    optimizer step. `before_optimizer(result)` runs between the last backward and the optimizer
    step. The peaks are this step's."""
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    st = engine.state
    t0 = time.perf_counter()
    batches = step_batches(
        data,
        step,
        train.micro_batch,
        train.grad_accum,
        st.dp_rank,
        st.dp_size,
        engine.sample_offset,
    )
    res = engine.forward_backward(batches)
    if before_optimizer is not None:
        before_optimizer(res)
    lr = engine.ds.get_lr()[0]  # this step's: the scheduler moves on in `step`
    if on_gpu:
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    engine.step()
    if on_gpu:
        torch.cuda.synchronize()
    end = time.perf_counter()
    seconds = end - t0
    return TimedStep(
        loss=res.loss,
        tokens=res.tokens,
        lr=lr,
        seconds=seconds,
        peak_reserved=torch.cuda.max_memory_reserved() if on_gpu else 0,
        peak_allocated=torch.cuda.max_memory_allocated() if on_gpu else 0,
        extra={**res.extra, "optimizer_s": round(end - t1, 4)},
    )
