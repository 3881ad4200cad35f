"""Whole-file I/O for the disk tier: O_DIRECT where the filesystem takes it, a plain write
otherwise, and the disk's bandwidth, measured once and recorded beside the data. Torch-free (the
planner reads the record).

    f = DirectFile(path)              # O_DIRECT if the filesystem allows (f.direct), else buffered
    f.write_from(buf, n); f.close()   # buf: an ALIGN-aligned writable buffer (create=False: read)
    bw = measure_bandwidth(dir)       # Bandwidth(write, read, source), kept in dir/BANDWIDTH_FILE
    bw = recorded_bandwidth(dir)      # that record, or ASSUMED (labelled as such)
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import time
from dataclasses import dataclass
from typing import Optional

ALIGN = 4096  # bytes: O_DIRECT's buffer address, file offset and length multiple
BANDWIDTH_FILE = ".ds_longctx-bandwidth.json"
# refused by a filesystem without O_DIRECT (tmpfs, some network or overlay filesystems)
NO_DIRECT_ERRNOS = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


@dataclass(frozen=True)
class Bandwidth:
    """A disk's sequential bandwidth, GB/s (1e9 bytes), and where the figure comes from."""

    write_gbs: float
    read_gbs: float
    source: str  # "assumed ..." or "measured on <path> (<date>, O_DIRECT|buffered)"

    @property
    def write_bytes_s(self) -> float:
        return self.write_gbs * 1e9

    @property
    def read_bytes_s(self) -> float:
        return self.read_gbs * 1e9

    def describe(self) -> str:
        return f"{self.write_gbs:.2f} GB/s write, {self.read_gbs:.2f} GB/s read ({self.source})"


# a conservative single datacenter NVMe (PCIe 4 drives are rated 3-7 GB/s); replaced by a
# measurement
ASSUMED = Bandwidth(
    1.5, 2.5, "assumed: measure with `ds-longctx plan --nvme_path DIR --measure_nvme`"
)


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """An anonymous page-aligned buffer of at least `nbytes` rounded up to ALIGN (what O_DIRECT
    needs)."""
    return mmap.mmap(-1, max(ALIGN, -(-nbytes // ALIGN) * ALIGN))


class DirectFile:
    """One file written and read whole, from offset 0. `direct`: whether O_DIRECT is on (else
    buffered)."""

    def __init__(self, path: str, direct: bool = True, create: bool = True):
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.fd = -1
        if self.direct:
            try:
                self.fd = os.open(path, flags | os.O_DIRECT, 0o600)
            except OSError as e:
                if e.errno not in NO_DIRECT_ERRNOS:
                    raise
                self.direct = False
        if self.fd < 0:
            self.fd = os.open(path, flags, 0o600)

    def write_from(self, buf, nbytes: int) -> None:
        """Write the first `nbytes` of `buf` (its length padded to ALIGN under O_DIRECT)."""
        view = memoryview(buf)[: -(-nbytes // ALIGN) * ALIGN if self.direct else nbytes]
        try:
            _all(os.pwrite, self.fd, view)
        except OSError as e:
            if not self.direct or e.errno not in NO_DIRECT_ERRNOS:
                raise
            self._buffered()  # opened, but the filesystem refuses the direct write itself
            _all(os.pwrite, self.fd, memoryview(buf)[:nbytes])

    def read_into(self, buf, nbytes: int) -> None:
        """Read the file's first `nbytes` into `buf`."""
        view = memoryview(buf)[: -(-nbytes // ALIGN) * ALIGN if self.direct else nbytes]
        got = _all(_pread, self.fd, view)
        if got < nbytes:
            raise OSError(errno.EIO, f"short read: {got} of {nbytes} bytes", self.path)

    def _buffered(self) -> None:
        os.close(self.fd)
        self.fd, self.direct = os.open(self.path, os.O_RDWR, 0o600), False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _pread(fd: int, view, offset: int) -> int:
    return os.preadv(fd, [view], offset)


def _all(op, fd: int, view) -> int:
    """Run `op(fd, view[done:], done)` until the whole view is done or the file ends; returns the
    bytes done."""
    done = 0
    while done < len(view):
        n = op(fd, view[done:], done)
        if n == 0:
            break
        done += n
    return done


def measure_bandwidth(directory: str, nbytes: int = 1 << 30, chunk: int = 64 << 20) -> Bandwidth:
    """Write then read `nbytes` in `chunk`s in `directory` (O_DIRECT where allowed, fsync'd; a
    buffered read after dropping the file's pages), record the result in directory/BANDWIDTH_FILE
    and return it."""
    path = os.path.join(directory, f".ds_longctx-bandwidth-probe-{os.getpid()}")
    buf = aligned_buffer(chunk)
    buf.write(os.urandom(min(chunk, 1 << 20)) * (len(buf) // min(chunk, 1 << 20)))
    f = DirectFile(path)
    try:
        t0 = time.perf_counter()
        for off in range(0, nbytes, chunk):
            _all(lambda fd, v, o, off=off: os.pwrite(fd, v, off + o), f.fd, memoryview(buf))
        os.fsync(f.fd)
        write_s = time.perf_counter() - t0
        if not f.direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        for off in range(0, nbytes, chunk):
            _all(lambda fd, v, o, off=off: _pread(fd, v, off + o), f.fd, memoryview(buf))
        read_s = time.perf_counter() - t0
    finally:
        f.close()
        os.unlink(path)
    how = "O_DIRECT" if f.direct else "buffered (no O_DIRECT here)"
    bw = Bandwidth(
        round(nbytes / write_s / 1e9, 3),
        round(nbytes / read_s / 1e9, 3),
        f"measured on {directory} ({time.strftime('%Y-%m-%d')}, {nbytes / 1e9:.1f} GB, {how})",
    )
    with open(os.path.join(directory, BANDWIDTH_FILE), "w") as out:
        json.dump(bw.__dict__, out)
    return bw


def recorded_bandwidth(directory: Optional[str]) -> Bandwidth:
    """The bandwidth recorded in `directory` by `measure_bandwidth`, else ASSUMED."""
    try:
        with open(os.path.join(directory or "", BANDWIDTH_FILE)) as f:
            return Bandwidth(**json.load(f))
    except (OSError, ValueError, TypeError):
        return ASSUMED
