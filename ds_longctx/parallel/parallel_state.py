"""SP/DP layout and process groups in one frozen object, which owns the sequence-parallel size rule.

Design notes: docs/design/parallel.md, section `parallel_state.py`.
"""

from __future__ import annotations

# torch and deepspeed are imported inside the functions that use them: config/ and plan/ import this
# module.
import logging
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional


def sp_size_problem(
    sp_size: int,
    world_size: int,
    num_heads: Optional[int] = None,
    num_kv_heads: Optional[int] = None,
    per_node: Optional[int] = None,
    linear_heads: Optional[tuple] = None,
) -> Optional[str]:
    """Why `sp_size` cannot run (None if it can). More: docs/design/parallel.md."""
    if sp_size < 1 or world_size % sp_size:
        return f"sp_size={sp_size} does not divide world_size={world_size}"
    if per_node is not None and per_node % sp_size:
        return (
            f"sp_size={sp_size} does not divide the {per_node} processes per node, so an SP group "
            f"would straddle nodes (its all-to-all over the inter-node network)"
        )
    if num_heads is None:
        return None
    if num_heads % sp_size:
        return f"sp_size={sp_size} must divide num_attention_heads={num_heads}"
    if num_kv_heads % sp_size and sp_size % num_kv_heads:
        return (
            f"sp_size={sp_size} neither divides num_key_value_heads={num_kv_heads} nor is a "
            f"multiple of it (KV-head replication)"
        )
    if linear_heads is not None:
        hk, hv = linear_heads
        if hv % sp_size:
            return (
                f"sp_size={sp_size} must divide linear_num_value_heads={hv} (the gated-DeltaNet "
                f"layers: each rank runs whole value heads over the whole sequence)"
            )
        if hk % sp_size and sp_size % hk:
            return (
                f"sp_size={sp_size} neither divides linear_num_key_heads={hk} nor is a multiple of "
                f"it (key-head replication in the gated-DeltaNet layers)"
            )
    return None


def divisors(n: int) -> list:
    """The divisors of n >= 1, ascending, in O(sqrt(n)): a config may give any head count."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def valid_sp_sizes(
    world_size: int,
    num_heads: int,
    num_kv_heads: int,
    per_node: Optional[int] = None,
    linear_heads: Optional[tuple] = None,
) -> list:
    """Every sp_size in 1..world_size that `sp_size_problem` accepts, ascending. Only divisors of
    world_size can be (its first rule), so only they are asked."""
    return [
        sp
        for sp in divisors(world_size)
        if sp_size_problem(sp, world_size, num_heads, num_kv_heads, per_node, linear_heads) is None
    ]


def local_linear_heads(linear_heads: tuple, sp_size: int) -> tuple:
    """(key heads, value heads) each rank runs in a gated-DeltaNet layer after the exchange: hk / sp
    (or 1 replicated key head when sp > hk) and hv / sp."""
    hk, hv = linear_heads
    return max(hk // sp_size, 1), hv // sp_size


def local_kv_heads(num_kv_heads: int, sp_size: int) -> int:
    """The KV heads each rank attends after Ulysses' exchange. More: docs/design/parallel.md."""
    return max(num_kv_heads // sp_size, 1)


def check_sp_size(
    sp_size: int,
    world_size: int,
    num_heads: Optional[int] = None,
    num_kv_heads: Optional[int] = None,
    per_node: Optional[int] = None,
    across_fix: str = "",
    linear_heads: Optional[tuple] = None,
) -> None:
    """Raise ValueError naming the valid sizes if `sp_size` cannot run on `world_size` ranks with
    these heads (and `per_node` processes per node). `across_fix` is appended when the node boundary
    is the problem."""
    problem = sp_size_problem(sp_size, world_size, num_heads, num_kv_heads, per_node, linear_heads)
    if problem is None:
        return
    if sp_size >= 1 and world_size % sp_size:
        more = f" or launch a multiple of {sp_size} processes"
    else:
        more = across_fix if per_node is not None and per_node % max(sp_size, 1) else ""
    if num_heads is None:
        ok = [
            sp
            for sp in divisors(world_size)
            if sp_size_problem(sp, world_size, per_node=per_node) is None
        ]
    else:
        ok = valid_sp_sizes(world_size, num_heads, num_kv_heads, per_node, linear_heads)
    raise ValueError(f"{problem}; try one of {ok}{more}")


def check_planned_world(
    nodes: Optional[int], gpus_per_node: Optional[int], world_size: int, per_node: int
) -> None:
    """Refuse a launch of `world_size` processes, `per_node` per node, when the config was planned
    for another world (`parallel.nodes` x `parallel.gpus_per_node`; None: any). Raises ValueError
    naming both worlds and fixes."""
    if nodes is None and gpus_per_node is None:
        return
    want_per = gpus_per_node or world_size // (nodes or 1)
    want_nodes = nodes or max(world_size // want_per, 1)
    if (want_nodes * want_per, want_per) == (world_size, per_node):
        return
    have_nodes = max(world_size // max(per_node, 1), 1)
    raise ValueError(
        f"this config was planned for {want_nodes * want_per} processes ({want_nodes} node(s) x "
        f"{want_per}); this launch has {world_size} ({have_nodes} node(s) x {per_node}): its "
        "memory plan "
        f"holds for its own world only. Launch {want_nodes} x {want_per}, plan this world "
        "(ds-longctx "
        f"plan --nodes {have_nodes} --gpus {per_node} ...), or set parallel.nodes: null and "
        f"parallel.gpus_per_node: null to run it anyway"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now. More: docs/design/parallel.md."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_world_size(world_size: int) -> int:
    """Processes on this node, from the launcher's environment: LOCAL_WORLD_SIZE (torchrun,
    accelerate), LOCAL_SIZE (deepspeed's launcher), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun);
    `world_size` (one node) if none is set, e.g. plain `python`."""
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return world_size


def dp_size(world_size: int, sp_size: int) -> int:
    """Data-parallel replicas: world_size / sp_size (checked)."""
    check_sp_size(sp_size, world_size)
    return world_size // sp_size


@dataclass(frozen=True)
class ParallelState:
    world_size: int
    rank: int
    sp_size: int
    sp_rank: int
    dp_size: int
    dp_rank: int
    sp_group: Any = None  # ProcessGroup of this rank's SP peers (None when sp_size == 1)
    dp_group: Any = (
        None  # ProcessGroup of the ranks holding the same sequence slice (None when dp_size == 1)
    )

    @classmethod
    def single(cls) -> "ParallelState":
        """One process, no groups (sp_size 1)."""
        return cls(world_size=1, rank=0, sp_size=1, sp_rank=0, dp_size=1, dp_rank=0)

    @classmethod
    def build(
        cls,
        sp_size: int,
        num_heads: Optional[int] = None,
        num_kv_heads: Optional[int] = None,
        linear_heads: Optional[tuple] = None,
    ) -> "ParallelState":
        """Validate `sp_size` against the world and the heads, then create the SP and DP groups
        (collective: every rank must call it). Needs torch.distributed initialised unless sp_size ==
        1."""
        import torch.distributed as dist

        if not dist.is_initialized():
            if sp_size != 1:
                raise RuntimeError(
                    f"sp_size={sp_size} needs torch.distributed; launch with torchrun/deepspeed"
                )
            return cls.single()
        world, rank = dist.get_world_size(), dist.get_rank()
        check_sp_size(sp_size, world, num_heads, num_kv_heads, linear_heads=linear_heads)
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
        return cls(
            world_size=world,
            rank=rank,
            sp_size=sp_size,
            sp_rank=rank % sp_size,
            dp_size=dp,
            dp_rank=rank // sp_size,
            sp_group=sp_group,
            dp_group=dp_group,
        )


def init_distributed(timeout_s: Optional[float] = None) -> None:
    """Start torch.distributed through DeepSpeed (nccl on GPU, gloo on CPU). No-op if both are
    started. `timeout_s`: the process-group timeout (parallel.collective_timeout_s); None keeps
    DeepSpeed's default.

    Notes: docs/design/parallel.md, `parallel_state.py`.
    """
    import deepspeed
    import deepspeed.comm
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if dist.is_initialized():
        if not deepspeed.comm.is_initialized():
            deepspeed.init_distributed(dist_backend=backend)  # wraps the running group, starts none
        return
    if not torch.cuda.is_available():
        # the shared-memory comm op JIT-compiles for ~66 s on CPU and is not needed with gloo
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if (
        "RANK" not in os.environ
    ):  # plain `python`: a world of one, on a port no other job here holds
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT") or str(free_port()),
        )
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    deepspeed.init_distributed(dist_backend=backend, **timeout)


def leave(code: int = 0) -> None:
    """End this process now that its work is written: barrier, tear every process group down, flush,
    `os._exit`.

    Notes: docs/design/parallel.md, `parallel_state.py`.
    """
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    for fn in AT_LEAVE:  # what atexit would do (os._exit skips it): scratch files removed
        fn()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


AT_LEAVE: list = []  # callables `leave` runs before os._exit (levers/disk_tier.py's cleanup)
