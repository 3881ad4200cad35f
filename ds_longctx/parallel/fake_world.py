"""One rank of a world of N in one process: torch's fake process group, collectives of a symmetric
world, counted.

Design notes: docs/design/parallel.md, section `fake_world.py`.
"""

from __future__ import annotations

# deepspeed and torch's fake process group are imported where a fake world starts.
# deepspeed and torch are imported in `start` only: light importers ask whether a rehearsal runs.
import os
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

REHEARSAL_ENV = "DS_LONGCTX_REHEARSAL"  # set while a process plays a rank: "R/N"


@dataclass
class CollectiveLog:
    """Payload bytes per (kind, group ranks) since `reset`, and calls per kind. More:
    docs/design/parallel.md."""

    bytes: dict = field(default_factory=lambda: defaultdict(int))
    calls: dict = field(default_factory=lambda: defaultdict(int))
    by_scope: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    scope: Optional[int] = None

    def add(self, kind: str, ranks: tuple, nbytes: int) -> None:
        self.bytes[(kind, ranks)] += nbytes
        self.calls[kind] += 1
        self.by_scope[self.scope][(kind, ranks)] += nbytes

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self.by_scope.clear()


_LOG: Optional[CollectiveLog] = None
_SAVED: dict = {}  # (module, name) -> original attribute, while installed
_ENV: dict = {}  # environment variable -> its value before `start` (None: unset)


def active() -> bool:
    """True while this process plays a rank of a fake world (`start` ... `stop`)."""
    return _LOG is not None


def collective_log() -> CollectiveLog:
    if _LOG is None:
        raise RuntimeError("no rehearsal is running (fake_world.start was not called)")
    return _LOG


def launcher_env(rank: int, world_size: int, per_node: int) -> dict:
    """The environment torchrun gives rank `rank` of `world_size` with `per_node` processes per
    node."""
    if not 0 <= rank < world_size or world_size % per_node:
        raise ValueError(
            f"rank {rank} of world {world_size} with {per_node} per node: need 0 <= rank < world "
            f"and per_node dividing world"
        )
    node = rank // per_node
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(node),
        "NODE_RANK": str(node),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        REHEARSAL_ENV: f"{rank}/{world_size}",
    }


def start(rank: int, world_size: int, per_node: int) -> CollectiveLog:
    """Set the launcher's environment for `rank`, start the fake process group and install the
    counting wrappers. Call before DeepSpeed starts its communication backend (it keeps references
    to the collectives)."""
    global _LOG
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:  # private API: say which torch lacks it
        raise RuntimeError(
            f"torch {torch.__version__} has no fake process group "
            f"(torch.testing._internal.distributed.fake_pg): {e}"
        ) from None
    if dist.is_initialized():
        raise RuntimeError("a process group is already running; a rehearsal needs a fresh process")
    env = launcher_env(rank, world_size, per_node)
    for var in (*env, "LOCAL_SIZE", "TORCH_DIST_INIT_BARRIER"):
        _ENV[var] = os.environ.get(var)
    os.environ.update(env)
    for var in (
        "LOCAL_SIZE",
        "TORCH_DIST_INIT_BARRIER",
    ):  # DeepSpeed's shared-memory op would wait for peers
        os.environ.pop(var, None)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    _LOG = CollectiveLog()
    _install()
    return _LOG


def stop() -> None:
    """Restore the original collectives and DeepSpeed's checks, destroy the fake group."""
    global _LOG
    for (mod, name), orig in _SAVED.items():
        if orig is _ABSENT:
            delattr(mod, name)
        else:
            setattr(mod, name, orig)
    _SAVED.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    _LOG = None
    for var, value in _ENV.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    _ENV.clear()


def refuse_in_rehearsal(what: str, error: type = RuntimeError) -> None:
    """Raise `error` where a rehearsal must not go (a checkpoint, an eval, an export). More:
    docs/design/parallel.md."""
    if active():
        raise error(
            f"{what} refused: this process is a rehearsal (rank {os.environ.get(REHEARSAL_ENV)} on "
            f"a fake process group): it saves no checkpoint, runs no eval and exports nothing"
        )


# ------------------------------------------------------------------ the symmetric world's
# collectives


def _ranks(group) -> tuple:
    return tuple(dist.get_process_group_ranks(group or c10d._get_default_group()))


def _me(group) -> int:
    return dist.get_rank(group) if group is not None else dist.get_rank()


def _reduced(t: torch.Tensor, op, n: int) -> None:
    """`t` in place as the reduction of n equal tensors."""
    if op in (None, dist.ReduceOp.SUM):
        t.mul_(n)
    elif op == dist.ReduceOp.PRODUCT:
        t.pow_(n)
    # AVG, MAX, MIN, BAND, BOR, BXOR of equal tensors: the tensor itself


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _arg(args, kwargs, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _all_gather_into_tensor(orig, *args, **kwargs):
    out, inp = _arg(args, kwargs, 0, "output_tensor"), _arg(args, kwargs, 1, "input_tensor")
    group = _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    out.view(-1).view(-1, inp.numel()).copy_(
        inp.reshape(1, -1).expand(out.numel() // inp.numel(), -1)
    )
    _LOG.add("all_gather", _ranks(group), _nbytes(out))
    return work


def _all_gather(orig, *args, **kwargs):
    outs, inp = _arg(args, kwargs, 0, "tensor_list"), _arg(args, kwargs, 1, "tensor")
    group = _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    for t in outs:
        t.copy_(inp)
    _LOG.add("all_gather", _ranks(group), sum(_nbytes(t) for t in outs))
    return work


def _reduce_scatter_tensor(orig, *args, **kwargs):
    out, inp = _arg(args, kwargs, 0, "output"), _arg(args, kwargs, 1, "input")
    op, group = _arg(args, kwargs, 2, "op", dist.ReduceOp.SUM), _arg(args, kwargs, 3, "group")
    work = orig(*args, **kwargs)
    n = inp.numel() // out.numel()
    out.view(-1).copy_(inp.reshape(n, -1)[_me(group)])
    _reduced(out, op, n)
    _LOG.add("reduce_scatter", _ranks(group), _nbytes(inp))
    return work


def _reduce_scatter(orig, *args, **kwargs):
    out, ins = _arg(args, kwargs, 0, "output"), _arg(args, kwargs, 1, "input_list")
    op, group = _arg(args, kwargs, 2, "op", dist.ReduceOp.SUM), _arg(args, kwargs, 3, "group")
    work = orig(*args, **kwargs)
    out.copy_(ins[_me(group)])
    _reduced(out, op, len(ins))
    _LOG.add("reduce_scatter", _ranks(group), sum(_nbytes(t) for t in ins))
    return work


def _all_to_all_single(orig, *args, **kwargs):
    out, inp = _arg(args, kwargs, 0, "output"), _arg(args, kwargs, 1, "input")
    out_splits, in_splits = (
        _arg(args, kwargs, 2, "output_split_sizes"),
        _arg(args, kwargs, 3, "input_split_sizes"),
    )
    group = _arg(args, kwargs, 4, "group")
    if out_splits or in_splits:
        raise NotImplementedError(
            "a rehearsal's all_to_all_single takes equal splits only (Ulysses' are equal)"
        )
    work = orig(*args, **kwargs)
    n, me = len(_ranks(group)), _me(group)
    own = inp.reshape(n, -1)[me]
    out.reshape(n, -1).copy_(own.unsqueeze(0).expand(n, -1))
    _LOG.add("all_to_all", _ranks(group), _nbytes(inp))
    return work


def _all_to_all(orig, *args, **kwargs):
    outs, ins = (
        _arg(args, kwargs, 0, "output_tensor_list"),
        _arg(args, kwargs, 1, "input_tensor_list"),
    )
    group = _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    own = ins[_me(group)]
    for t in outs:
        t.copy_(own)
    _LOG.add("all_to_all", _ranks(group), sum(_nbytes(t) for t in ins))
    return work


def _all_reduce(orig, *args, **kwargs):
    t, op = _arg(args, kwargs, 0, "tensor"), _arg(args, kwargs, 1, "op", dist.ReduceOp.SUM)
    group = _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    _reduced(t, op, len(_ranks(group)))
    _LOG.add("all_reduce", _ranks(group), _nbytes(t))
    return work


def _all_reduce_coalesced(orig, *args, **kwargs):
    ts, op = _arg(args, kwargs, 0, "tensors"), _arg(args, kwargs, 1, "op", dist.ReduceOp.SUM)
    group = _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    for t in ts:
        _reduced(t, op, len(_ranks(group)))
    _LOG.add("all_reduce", _ranks(group), sum(_nbytes(t) for t in ts))
    return work


def _broadcast(orig, *args, **kwargs):
    t, group = _arg(args, kwargs, 0, "tensor"), _arg(args, kwargs, 2, "group")
    work = orig(*args, **kwargs)
    _LOG.add("broadcast", _ranks(group), _nbytes(t))
    return work


def _unchanged(kind: str):
    """A collective that leaves its arguments as they are in a symmetric world (objects, barriers):
    counted, no
    bytes."""

    def wrapper(orig, *args, **kwargs):
        _LOG.add(kind, _ranks(kwargs.get("group")), 0)

    return wrapper


def _all_gather_object(orig, *args, **kwargs):
    objs, obj = _arg(args, kwargs, 0, "object_list"), _arg(args, kwargs, 1, "obj")
    objs[:] = [obj] * len(objs)
    _LOG.add("all_gather", _ranks(kwargs.get("group")), 0)


WRAPPERS = {
    "all_gather_into_tensor": _all_gather_into_tensor,
    "_all_gather_base": _all_gather_into_tensor,
    "all_gather_single": _all_gather_into_tensor,
    "all_gather": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "_reduce_scatter_base": _reduce_scatter_tensor,
    "reduce_scatter_single": _reduce_scatter_tensor,
    "reduce_scatter": _reduce_scatter,
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "broadcast": _broadcast,
    "barrier": _unchanged("barrier"),
    "monitored_barrier": _unchanged("barrier"),
    "broadcast_object_list": _unchanged("broadcast"),
    "all_gather_object": _all_gather_object,
}


_DEPTH = threading.local()


def _bind(orig, wrapper):
    """`wrapper` around `orig`; a collective called from inside another (torch 2.13's
    all_gather_into_tensor calls all_gather_single) goes straight to its original: the outer call
    counts and writes."""

    def call(*args, **kwargs):
        if getattr(_DEPTH, "n", 0):
            return orig(*args, **kwargs)
        _DEPTH.n = 1
        try:
            return wrapper(orig, *args, **kwargs)
        finally:
            _DEPTH.n = 0

    call.__name__ = getattr(orig, "__name__", "collective")
    call.__wrapped__ = orig
    return call


_ABSENT = object()


def _patch(obj, name: str, new) -> None:
    """Set `obj.name` (a module's or an instance's attribute); `stop` restores it (an instance's
    method by deleting the instance attribute that shadows it)."""
    saved = obj.__dict__.get(name, _ABSENT) if not isinstance(obj, type(os)) else getattr(obj, name)
    _SAVED.setdefault((obj, name), saved)
    setattr(obj, name, new)


def _install() -> None:
    """The wrappers on `torch.distributed` and `distributed_c10d` (both spellings are called), and
    DeepSpeed's compare-with-rank-0 checks as this rank's own lists."""
    for name, wrapper in WRAPPERS.items():
        orig = getattr(c10d, name, None)
        if orig is None:  # a name this torch does not have (all_gather_single is new in 2.13)
            continue
        new = _bind(orig, wrapper)
        for mod in (dist, c10d):
            if hasattr(mod, name):
                _patch(mod, name, new)
    try:
        import deepspeed
        import deepspeed.runtime.zero.utils as zero_utils
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return
    _patch(zero_utils, "assert_lst_len_same_as_other_ranks", lambda lst: None)
    _patch(zero_utils, "get_lst_from_rank0", lambda lst: list(lst))
    if (
        not torch.cuda.is_available()
    ):  # the CPU shared-memory comm op would JIT-build and wait for the other ranks
        _patch(
            deepspeed.ops,
            "__compatible_ops__",
            dict(deepspeed.ops.__compatible_ops__, deepspeed_shm_comm=False),
        )
        return
    # LOCAL_RANK is the played rank's (up to 7 on an 8-GPU node); this machine's one device stands
    # for it
    device = torch.cuda.current_device()
    acc = get_accelerator()
    _patch(acc, "set_device", lambda index: torch.cuda.set_device(device))
    _patch(acc, "device_name", lambda index=None: "cuda" if index is None else f"cuda:{device}")
    _patch(acc, "device", lambda index=None: torch.device("cuda", device))
