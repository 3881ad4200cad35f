"""One optimizer step of a rank, timed, as `ds-longctx train` runs it (run/train_loop.py) and as a rehearsal
measures it (run/rehearsal_rank.py): the batch (`data.get`), `forward_backward`, the optimizer `step`.

    s = timed_step(engine, data, step, micro_batch)     # s.loss, s.seconds, s.peak_reserved, ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class TimedStep:
    loss: float            # token-mean loss of the step, averaged over the dp replicas
    tokens: int            # supervised tokens of the step over all replicas
    seconds: float         # from the batch to the end of the optimizer step, CUDA-synchronized at both ends
    peak_reserved: int     # torch.cuda.max_memory_reserved over the step, bytes (0 without CUDA)
    peak_allocated: int    # torch.cuda.max_memory_allocated over the step, bytes (0 without CUDA)


def timed_step(engine, data, step: int, micro_batch: int,
               before_optimizer: Optional[Callable] = None) -> TimedStep:
    """Make optimizer step `step + 1` (`step` are done) on this rank's dp replica: its rows of `data` at `step`,
    loss and gradients, then the optimizer step. `before_optimizer(result)` runs between the backward and the
    optimizer step (train stops there on a non-finite loss, the weights untouched). The peak-memory counters are
    reset at the start, so the peaks are this step's."""
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    st = engine.state
    t0 = time.perf_counter()
    batch = data.get(step, micro_batch, st.dp_rank, st.dp_size)
    res = engine.forward_backward(batch.input_ids, batch.position_ids, batch.labels)
    if before_optimizer is not None:
        before_optimizer(res)
    engine.step()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return TimedStep(loss=res.loss, tokens=res.tokens, seconds=seconds,
                     peak_reserved=torch.cuda.max_memory_reserved() if on_gpu else 0,
                     peak_allocated=torch.cuda.max_memory_allocated() if on_gpu else 0)
