"""The disk tier: `disk` layers keep their checkpointed input in a scratch file under
memory.nvme_path.

    fn = disk_checkpoint_function(layer_index, nvme_path)  # placement_apply gives it to the layer
    disk_tier().close()                                    # remove the scratch dir (also at exit)

After a layer's forward its input is copied into a pinned bounce buffer and written by one
background thread (O_DIRECT where the filesystem allows, else a plain write, said once); before its
backward it is read back and its file removed, and the next layer down is read ahead. The recompute
is the pinned pool's (offload.store_checkpoint_function), so the results are bit-identical.
Design notes: docs/design/levers.md, section `disk_tier.py`.
"""

from __future__ import annotations

# torch is imported lazily: config/ and plan/ import this package without it.
import atexit
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

from ds_longctx.levers.offload import copy_to_host, store_checkpoint_function
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.parallel import disk, parallel_state
from ds_longctx.parallel.direct_io import ALIGN, DirectFile
from ds_longctx.parallel.disk import describe_os_error, user_path
from ds_longctx.parallel.parallel_state import local_world_size
from ds_longctx.parallel.units import GB

log = logging.getLogger("ds_longctx")
# the run's own directory under nvme_path (the only one it removes)
SCRATCH_PREFIX = "ds_longctx-disk-"
SWAP_PREFIX = "ds_longctx-zero-"  # ... and ZeRO-Infinity's (private_swap_dirs)


class DiskTierError(RuntimeError):
    """A disk-tier write or read failed: the message is one line naming the path and the fix."""


class DiskTier:
    """One process's scratch files, bounce buffers and I/O thread (writes and reads run in order on
    it)."""

    def __init__(self, nvme_path: str):
        self.root = user_path(nvme_path)
        self.dir: Optional[str] = None  # made on the first write (tempfile.mkdtemp: ours alone)
        self.direct: Optional[bool] = None  # O_DIRECT on the last file (None: nothing written yet)
        self.bytes_written = 0
        self.wait_s = 0.0  # the compute thread's time blocked on the disk (put's and get's waits)
        self.stall_s = 0.0  # the GPU's time inside put / get (CUDA timing events, once ended)
        self._counted = (0, 0.0, 0.0)  # (bytes_written, wait_s, stall_s) at the last step_stats
        self._stalls: list = []  # (start, end) events around a put / get not yet counted
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ds_longctx-disk")
        # the last write: the write buffer is busy until it ends
        self._write: Optional[Future] = None
        self._reads: dict = {}  # key -> its read-ahead into the read buffer
        self._bufs: dict = {}  # "w" / "r" -> an ALIGN-aligned uint8 tensor (pinned on CUDA)
        self._order: list = []  # keys in the order their last write came
        self._sizes: dict = {}  # key -> bytes of its last write
        self._said_buffered = self._said_where = False

    # ---------------------------------------------------------------- the store
    # (offload.store_checkpoint_function)
    def put(self, key, hidden) -> tuple:
        """Start writing `hidden` (one layer's input) to its file; returns the handle `get`
        takes."""
        import torch

        nbytes = hidden.numel() * hidden.element_size()
        stall = self._stall_start(hidden.device)
        self._wait(self._write)
        buf = self._buffer("w", nbytes, hidden.is_cuda)
        flat = hidden.detach().reshape(-1).view(torch.uint8)
        event = None
        if hidden.is_cuda:  # the layer's forward runs beside the copy
            event = copy_to_host(buf[:nbytes], flat)
        else:
            buf[:nbytes].copy_(flat)
        self._stall_end(stall)
        if key in self._order:
            self._order.remove(key)
        self._order.append(key)
        self._sizes[key] = nbytes
        self._write = self._io.submit(self._write_file, self._path(key), buf, nbytes, event)
        return key, tuple(hidden.shape), hidden.dtype, hidden.device, nbytes

    def get(self, handle):
        """The input `put` wrote, back on its device; then the next layer down is read ahead."""
        import torch

        key, shape, dtype, device, nbytes = handle
        stall = self._stall_start(device)
        read = self._reads.pop(key, None)
        if read is None:  # not read ahead: the buffer is ours once the pending reads are done
            for other in self._reads.values():
                self._wait(other)
            self._reads.clear()
            read = self._read(key, nbytes, device.type == "cuda")
        self._wait(read)
        out = torch.empty(shape, dtype=dtype, device=device)
        # synchronous: the read buffer is free again after it
        out.reshape(-1).view(torch.uint8).copy_(self._bufs["r"][:nbytes])
        self._stall_end(stall)
        at = self._order.index(key) if key in self._order else 0
        if at > 0:
            below = self._order[at - 1]
            self._reads[below] = self._read(below, self._sizes[below], device.type == "cuda")
        return out

    # ---------------------------------------------------------------- files and buffers
    def _read(self, key, nbytes: int, pin: bool) -> Future:
        buf = self._buffer("r", nbytes, pin)
        return self._io.submit(self._read_file, self._path(key), buf, nbytes)

    def _path(self, key) -> str:
        if self.dir is None:
            os.makedirs(self.root, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.root)
            if not self._said_where:  # the directory is made again each step: said once
                self._said_where = True
                _on_exit(self.close)
                log.info(
                    "disk tier: disk layers' checkpoints in %s (each file removed once read)",
                    self.dir,
                )
        return os.path.join(self.dir, f"layer{key}.bin")

    def _buffer(self, which: str, nbytes: int, pin: bool):
        """The bounce buffer `which`, at least `nbytes` (rounded up to ALIGN), its start
        ALIGN-aligned."""
        import torch

        buf = self._bufs.get(which)
        need = -(-nbytes // ALIGN) * ALIGN
        if buf is None or buf.numel() < need:
            if which == "r":
                for read in self._reads.values():
                    self._wait(read)
                self._reads.clear()
            raw = torch.empty(need + ALIGN, dtype=torch.uint8, pin_memory=pin)
            skip = -raw.data_ptr() % ALIGN
            self._bufs[which] = buf = raw[skip : skip + need]
        return buf

    def _write_file(self, path: str, buf, nbytes: int, event) -> None:
        if event is not None:
            event.synchronize()
        try:
            f = DirectFile(path)
            try:
                f.write_from(buf.numpy(), nbytes)
            finally:
                f.close()
        except OSError as e:
            e.filename, e.needed = e.filename or path, nbytes
            raise
        self._note_direct(f.direct, path)
        self.bytes_written += nbytes

    def _read_file(self, path: str, buf, nbytes: int) -> None:
        """Read `path` back and remove it (each checkpoint is read once); the scratch directory goes
        with its last file, so between steps nothing of the run is on disk."""
        f = DirectFile(path, direct=bool(self.direct), create=False)
        try:
            f.read_into(buf.numpy(), nbytes)
        finally:
            f.close()
        os.unlink(path)
        if self.dir is not None and not os.listdir(self.dir):
            os.rmdir(self.dir)
            self.dir = None

    def _note_direct(self, direct: bool, path: str) -> None:
        self.direct = direct
        if not direct and not self._said_buffered:
            self._said_buffered = True
            log.warning(
                "disk tier: %s takes no O_DIRECT; writing through the page cache instead (same "
                "data, host memory may grow)",
                os.path.dirname(path),
            )

    def _wait(self, job: Optional[Future]) -> None:
        """Wait for `job`; its OSError becomes one line naming the path and the fix
        (DiskTierError)."""
        if job is None:
            return
        t0 = time.perf_counter()
        try:
            job.result()
        except OSError as e:
            where = e.filename or self.dir or self.root
            raise DiskTierError(
                f"disk tier: {describe_os_error(e, where, getattr(e, 'needed', None))}; free space "
                f"under {self.root} or lower "
                f"memory.nvme_gb and plan again (ds-longctx plan --nvme_gb)"
            ) from None
        finally:
            self.wait_s += time.perf_counter() - t0

    def _stall_start(self, device):
        """A timing event on the compute stream where put / get starts (None off CUDA)."""
        import torch

        if device.type != "cuda":
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def _stall_end(self, start) -> None:
        """Close `start`'s interval; the intervals the GPU has passed are counted and let go."""
        import torch

        if start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._stalls.append((start, end))
        self._count_stalls(wait=False)

    def _count_stalls(self, wait: bool) -> None:
        while self._stalls and (wait or self._stalls[0][1].query()):
            start, end = self._stalls.pop(0)
            end.synchronize()
            self.stall_s += start.elapsed_time(end) / 1e3

    def step_stats(self) -> tuple:
        """(bytes written, seconds the compute thread waited, seconds the GPU spent inside put and
        get: idle on the disk plus get's copy back) since the last call."""
        self._count_stalls(wait=True)
        now = (self.bytes_written, self.wait_s, self.stall_s)
        then, self._counted = self._counted, now
        return tuple(a - b for a, b in zip(now, then))

    def close(self) -> None:
        """Wait for the I/O thread and remove the scratch directory (the run's own; nvme_path itself
        stays)."""
        self._io.shutdown(wait=True, cancel_futures=True)
        if self.dir is not None and os.path.isdir(self.dir):
            for key in self._order:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, f"layer{key}.bin"))
            with contextlib.suppress(OSError):  # holds a file it did not write: left as it is
                os.rmdir(self.dir)
        self.dir = None


_TIERS: dict = {}  # nvme_path -> this process's DiskTier


def disk_tier(nvme_path: Optional[str] = None) -> DiskTier:
    """This process's tier for `nvme_path` (made on first use); without a path, the one there is."""
    if nvme_path is None:
        return next(iter(_TIERS.values()))
    if nvme_path not in _TIERS:
        _TIERS[nvme_path] = DiskTier(nvme_path)
    return _TIERS[nvme_path]


def step_stats() -> dict:
    """This process's disk tier since the last call, for a metrics line: `disk_written_bytes`,
    `disk_wait_s` (the compute thread blocked on a write or read) and `disk_gpu_stall_s` (the GPU's
    time from where a put or get was issued to where it returned: what the disk added to the step,
    with get's copy back; 0 off CUDA). {} without a disk layer."""
    if not _TIERS:
        return {}
    stats = [tier.step_stats() for tier in _TIERS.values()]
    return {
        "disk_written_bytes": sum(s[0] for s in stats),
        "disk_wait_s": round(sum(s[1] for s in stats), 3),
        "disk_gpu_stall_s": round(sum(s[2] for s in stats), 3),
    }


def close_all() -> None:
    """Close every tier of this process (tests; atexit does it at the end)."""
    for tier in list(_TIERS.values()):
        tier.close()
    _TIERS.clear()


def disk_checkpoint_function(layer_index: int, nvme_path: str) -> Callable:
    """The `_gradient_checkpointing_func` of a `disk` layer (placement_apply.apply_placement sets
    it)."""
    checkpoint = store_checkpoint_function(disk_tier(nvme_path), layer_index)
    # placement_apply.applied_placement reads a layer's place back by this
    checkpoint.disk_tier = True
    return checkpoint


def nvme_space_problem(
    cfg, text_config, world: int, per_node: Optional[int], params: int, placement: PlacementPlan
):
    """Why nvme_path's filesystem cannot hold this node's disk tier (None: it can, or there is
    none): each rank's disk layers' checkpoints (`placement`'s, micro_batch x seq_len/sp_size x
    hidden) and, with nvme_optimizer / nvme_params, its fp32 optimizer state (16 bytes a parameter)
    / bf16 parameters (2), over `world` ranks, times the node's ranks; at least nvme_gb where LoRA
    hides the state."""
    import torch

    mem, t = cfg.memory, cfg.train
    if mem.nvme_path is None:
        return None
    on_disk = placement.on_disk
    dtype = cfg.model.dtype
    cuda_bf16 = dtype == "bf16" or (dtype == "auto" and torch.cuda.is_available())
    tokens = t.micro_batch * -(-t.seq_len // cfg.parallel.sp_size)
    rank = on_disk * tokens * text_config.hidden_size * (2 if cuda_bf16 else 4)
    state = (16 if mem.nvme_optimizer else 0) + (2 if mem.nvme_params else 0)
    rank += state * params // world if not cfg.lora.rank else 0
    need = rank * (local_world_size(world) if per_node is None else per_node)
    if state and cfg.lora.rank and mem.nvme_gb:
        need = max(need, int(mem.nvme_gb * GB))
    free = disk.free_bytes(user_path(mem.nvme_path))
    if not need or free is None or need <= free:
        return None
    return (
        f"nvme_path={mem.nvme_path!r}: the disk tier needs ~{disk.size_text(need)} on "
        f"{disk.mount_point(user_path(mem.nvme_path))} and it has {disk.size_text(free)} free; "
        "free space there, give an nvme_path on a larger disk, or plan again within it "
        f"(ds-longctx plan --nvme_gb {free // GB:.0f})"
    )


def private_swap_dirs(ds_config: dict) -> dict:
    """`ds_config` with ZeRO-Infinity's nvme_path (offload_optimizer / offload_param: nvme) moved
    into a directory this process makes under it, removed at exit: DeepSpeed empties its swap folder
    at start, and so touches only ours."""
    zero = ds_config.get("zero_optimization", {})
    blocks = [zero.get(k) for k in ("offload_optimizer", "offload_param")]
    blocks = [b for b in blocks if b and b.get("device") == "nvme"]
    if not blocks:
        return ds_config
    root = user_path(blocks[0]["nvme_path"])
    os.makedirs(root, exist_ok=True)
    made = tempfile.mkdtemp(prefix=SWAP_PREFIX, dir=root)
    for block in blocks:
        block["nvme_path"] = made

    def remove():
        shutil.rmtree(made, ignore_errors=True)

    _on_exit(remove)
    log.info("ZeRO-Infinity swap files in %s (removed at exit)", made)
    return ds_config


def _on_exit(close: Callable) -> None:
    """Run `close` at exit, in `parallel_state.leave` and on SIGTERM / SIGINT / SIGHUP where nothing
    else handles them."""
    atexit.register(close)
    parallel_state.AT_LEAVE.append(close)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _close_and_reraise)
        except ValueError:  # not the main thread: atexit alone
            pass


def _close_and_reraise(signum, frame) -> None:
    for close in parallel_state.AT_LEAVE:
        close()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
