"""parallel/disk.py: OS errors said in one line with the bytes needed and free (the reference:
shutil.disk_usage),
and the partial-directory marker: a directory without it, or whose maker still runs, is never
removed."""

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ds_longctx.parallel import disk


def test_size_text():
    assert [disk.size_text(n) for n in (80, 12_300, 540e6, 3.21e9, 112e9)] == [
        "80 bytes",
        "12.3 kB",
        "540 MB",
        "3.2 GB",
        "112 GB",
    ]


def test_describe_os_error_names_the_path_and_the_room(tmp_path):
    f = tmp_path / "metrics.jsonl"
    free = disk.size_text(shutil.disk_usage(tmp_path).free)
    mount = subprocess.run(
        ["df", "--output=target", str(tmp_path)], capture_output=True, text=True
    ).stdout.split()[-1]
    assert disk.mount_point(f) == Path(mount)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
    assert disk.describe_os_error(full, f, needed=3_200_000_000) == (
        f"no space left on {mount} writing {f} (needs ~3.2 GB, {free} free)"
    )
    assert disk.describe_os_error(OSError(errno.EDQUOT, "Disk quota exceeded"), f) == (
        f"disk quota exceeded writing {f} ({free} free)"
    )
    assert disk.describe_os_error(
        PermissionError(errno.EACCES, "Permission denied", str(f)), "x"
    ) == (f"no permission to write {f} (Permission denied)")
    assert disk.describe_os_error(OSError(errno.EROFS, "Read-only file system"), "/proc/x") == (
        "/proc/x is on a read-only filesystem"
    )
    assert disk.free_bytes(tmp_path / "not" / "yet") == shutil.disk_usage(tmp_path).free


def test_a_directory_without_the_marker_is_never_removed(tmp_path):
    foreign = tmp_path / "corpus.partial"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("a user's file")
    with pytest.raises(
        disk.NotOurs,
        match=r"corpus.partial' exists and was not made by ds_longctx \(no "
        r"\.ds_longctx-partial marker in it\), so it is left alone; move it away",
    ):
        disk.clear_partial(foreign, "move it away")
    assert (foreign / "mine.txt").read_text() == "a user's file"
    (tmp_path / "a_file.partial").write_text("x")
    with pytest.raises(disk.NotOurs):
        disk.clear_partial(tmp_path / "a_file.partial", "move it away")
    assert disk.clear_partial(tmp_path / "absent.partial", "move it away") is None


def test_a_partial_directory_is_removed_only_once_its_maker_is_gone(tmp_path):
    part = tmp_path / "corpus.partial"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        disk.make_partial(part)
        (part / disk.PARTIAL_MARKER).write_text(
            f'{{"pid": {live.pid}, "host": "{socket.gethostname()}", "since": "then", "command": '
            '"prepare"}'
        )
        with pytest.raises(
            disk.NotOurs,
            match=f"is being written by pid {live.pid} on host .* since then "
            f"\\(prepare\\); wait for it to end, or move it away",
        ):
            disk.clear_partial(part, "move it away")
    finally:
        live.kill()
        live.wait()
    assert part.is_dir()
    said = disk.clear_partial(part, "move it away")
    assert (
        said
        == f"removed {str(part)!r}, left unfinished by pid {live.pid} on host "
        f"{socket.gethostname()} since then (prepare)"
        and not part.exists()
    )
    disk.make_partial(part)  # this process's own: a done partial goes into place without its marker
    (part / "train.jsonl").write_text("{}\n")
    disk.finish_partial(part, tmp_path / "corpus")
    assert (
        sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["train.jsonl"]
        and not part.exists()
    )


def df(path) -> str:
    """The mount point `df` names for `path` (links followed)."""
    res = subprocess.run(["df", "--output=target", str(path)], capture_output=True, text=True)
    return res.stdout.split()[-1]


def test_a_full_disk_reached_through_a_link_is_named_by_its_own_mount_point(tmp_path):
    """ENOSPC under a link into another filesystem names the filesystem that is full (df's, links
    followed) and its free bytes, never the filesystem holding the link."""
    other = Path("/dev/shm")
    if not other.is_dir() or not os.access(other, os.W_OK) or df(other) == df(tmp_path):
        pytest.skip("no second writable filesystem (/dev/shm) here")
    target = Path(os.path.realpath(other)) / f"ds_longctx_test_{os.getpid()}"
    target.mkdir()
    try:
        (tmp_path / "runs").symlink_to(target)
        f = tmp_path / "runs" / "r" / "metrics.jsonl"
        free = disk.size_text(shutil.disk_usage(target).free)
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        said = disk.describe_os_error(full, f)
        assert said == f"no space left on {df(target)} writing {f} ({free} free)"
    finally:
        target.rmdir()


def test_an_out_on_a_read_only_filesystem_is_called_read_only_not_a_free_space_figure(
    tmp_path, monkeypatch, capsys
):
    """A read-only mount simulated (no such mount here): access(2) says EROFS for the directory and
    statvfs reports ST_RDONLY, as the kernel does. `data prepare --out` and `export --out` below it
    are refused naming the directory as read-only, no free space named, nothing made; a writable
    twin is not."""
    from ds_longctx import cli
    from ds_longctx.checkpoint.export import CheckpointError, check_out

    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    real_access, real_statvfs = os.access, os.statvfs

    def access(path, mode, **kw):
        if Path(path) == ro and mode & os.W_OK:
            return False  # EROFS
        return real_access(path, mode, **kw)

    def statvfs(path):
        st = real_statvfs(path)
        if Path(path) != ro:
            return st
        return os.statvfs_result((*st[:8], st.f_flag | os.ST_RDONLY, st.f_namemax))

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "statvfs", statvfs)
    assert disk.read_only(ro) and not disk.read_only(rw)
    assert disk.unwritable(ro / "a" / "b") == f"{ro} is on a read-only filesystem"
    assert disk.unwritable(rw / "a") is None
    out = ro / "new" / "corpus"
    with pytest.raises(SystemExit) as stopped:
        cli.main(["data", "prepare", "--stdlib", "--out", str(out)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.strip().splitlines() == [
        f"refused: --out {str(out)!r} cannot be written: {ro} is on a read-only filesystem; "
        f"choose a writable --out"
    ], err
    with pytest.raises(CheckpointError) as refused:
        check_out(str(ro / "hf"))
    assert str(refused.value) == (
        f"export: --out {str(ro / 'hf')!r} cannot be written ({ro} is on a read-only "
        f"filesystem); choose a writable --out"
    )
    assert not any(ro.iterdir()) and "free" not in err + str(refused.value)
