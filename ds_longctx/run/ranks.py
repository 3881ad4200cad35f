"""What the ranks do together before training: one timeout for every collective, and rank 0's work
first with its refusal shared.

    default_group_timeout(cfg.parallel.collective_timeout_s)       # before any process group
    data = rank0_first(lambda: build_data(cfg, hf_cfg, dp), rank)  # after init_distributed
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def default_group_timeout(seconds: float) -> None:
    """Make `seconds` the timeout of every process group made from now on. Process-wide."""
    c10d.default_pg_timeout = timedelta(seconds=seconds)
    c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


def rank0_first(fn, rank: int):
    """fn() on rank 0, then on the others; rank 0's ValueError is raised on every rank."""
    msg = [None]
    if rank == 0:
        try:
            out = fn()
        except ValueError as e:
            msg = [str(e)]
    if dist.is_initialized():
        dist.broadcast_object_list(msg, src=0)
    if msg[0] is not None:
        raise ValueError(msg[0])
    return out if rank == 0 else fn()
