"""SP/DP process groups in one frozen object.

Layout (world W, sequence-parallel degree sp, data-parallel degree dp = W / sp): SP groups are runs of
consecutive ranks, so on one node the all-to-all stays on the fastest links:

    W=4, sp=2:  SP groups [0,1] [2,3]      DP groups [0,2] [1,3]

DeepSpeed is *not* given this as an `mpu`: in DeepSpeed 0.19.8 the two ZeRO-3 gradient-reduction paths
disagree on SP averaging (`__avg_scatter_contiguous_grads` divides by W/sp, `__avg_scatter_grads`, the
default with reduce_scatter, by W), so gradients would depend on a bucket-size setting. DeepSpeed sees a
plain W-rank data-parallel world (ZeRO-3 partitions over all W ranks, gradients averaged over W) and
`engine.LossHead` scales the loss by sp, which makes that average the mean over the dp replicas.
sp_size == 1 is the explicit no-op path: no SP group is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ds_longctx.plan.planner import sp_sizes as valid_sp_sizes  # the one rule, shared with the planner (no torch there)


@dataclass(frozen=True)
class ParallelState:
    world_size: int
    rank: int
    sp_size: int
    sp_rank: int
    dp_size: int
    dp_rank: int
    sp_group: Any = None  # ProcessGroup of this rank's SP peers (None when sp_size == 1)
    dp_group: Any = None  # ProcessGroup of the ranks holding the same sequence slice (None when dp_size == 1)


def check_sp_size(sp_size: int, world_size: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise before any work if sp_size fits neither the world size nor the model's heads."""
    if world_size % sp_size:
        ok = valid_sp_sizes(world_size, num_heads, num_kv_heads)
        raise ValueError(f"sp_size={sp_size} does not divide world_size={world_size}; use one of {ok} "
                         f"or launch a multiple of {sp_size} processes")
    if num_heads % sp_size:
        ok = valid_sp_sizes(num_heads, num_heads, num_kv_heads)  # every sp the heads allow, any world size
        raise ValueError(f"sp_size={sp_size} must divide num_attention_heads={num_heads}; try one of {ok}")
    if num_kv_heads % sp_size and sp_size % num_kv_heads:
        raise ValueError(f"sp_size={sp_size} neither divides num_key_value_heads={num_kv_heads} nor is a multiple "
                         f"of it (KV-head replication); try one of {valid_sp_sizes(num_heads, num_heads, num_kv_heads)}")


def build_parallel_state(sp_size: int) -> ParallelState:
    """Create the SP and DP groups (collective: every rank must call it). Needs torch.distributed initialised."""
    if not dist.is_initialized():
        if sp_size != 1:
            raise RuntimeError(f"sp_size={sp_size} needs torch.distributed; launch with torchrun/deepspeed")
        return ParallelState(world_size=1, rank=0, sp_size=1, sp_rank=0, dp_size=1, dp_rank=0)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % sp_size:
        raise ValueError(f"sp_size={sp_size} does not divide world_size={world}")
    dp = world // sp_size
    sp_group = dp_group = None
    # new_group is collective over the world: every rank creates every group, keeps its own.
    if sp_size > 1:
        for g in range(dp):
            ranks = list(range(g * sp_size, (g + 1) * sp_size))
            grp = dist.new_group(ranks)
            if rank in ranks:
                sp_group = grp
    if dp > 1:
        for s in range(sp_size):
            ranks = list(range(s, world, sp_size))
            grp = dist.new_group(ranks)
            if rank in ranks:
                dp_group = grp
    return ParallelState(world_size=world, rank=rank, sp_size=sp_size, sp_rank=rank % sp_size, dp_size=dp,
                         dp_rank=rank // sp_size, sp_group=sp_group, dp_group=dp_group)
