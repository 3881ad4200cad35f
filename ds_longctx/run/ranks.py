"""What the ranks of a run do together before training: one timeout for every collective, and work that rank 0
does first (filling the datasets cache) with its refusal shared, so all ranks stop together.

    default_group_timeout(cfg.parallel.collective_timeout_s)         # before any process group exists
    data = rank0_first(lambda: build_data(cfg, hf_cfg, dp), rank)    # after init_distributed
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def default_group_timeout(seconds: float) -> None:
    """Make `seconds` the timeout of every process group created from now on, not only the world
    group (`new_group` would otherwise use torch's module default). Process-wide and never undone:
    this process lives for one run."""
    c10d.default_pg_timeout = timedelta(seconds=seconds)
    c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


def rank0_first(fn, rank: int):
    """fn() on rank 0, then on the others (rank 0 fills the datasets cache, the others read it). A ValueError
    on rank 0 is returned to every rank as its message, so all of them stop together."""
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
