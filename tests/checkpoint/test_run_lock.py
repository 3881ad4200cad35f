"""One writer per run (checkpoint/run_lock.py), in-process: a second writer is refused naming the
holder, a launcher's lock covers its workers, a dead holder's lock is taken over with one line, and
a released lock leaves nothing behind. `ds-longctx train` refusing while another process writes its
output_dir: here, in-process, before any worker; two real resumes at once:
tests/distributed/test_resume.py; eval: tests/distributed/test_eval.py."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from ds_longctx.checkpoint import run_lock
from ds_longctx.checkpoint.run_lock import LOCK_FILE, RunLock, RunLockError, lock_holder
from tests.helpers import hold_lock


@pytest.fixture
def holder(tmp_path):
    """A process holding tmp_path/run's lock; killed after the test."""
    proc = hold_lock(tmp_path / "run")
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused_naming_the_holder_and_the_fix(tmp_path, holder):
    out = tmp_path / "run"
    before = (out / LOCK_FILE).read_text()
    with pytest.raises(RunLockError) as refused:
        RunLock.acquire(out)
    msg = str(refused.value)
    assert msg.startswith(
        f"output_dir={str(out)!r} is in use by pid {holder.pid} on host {socket.gethostname()} "
        f"since 20"
    )
    assert f"(or stop it: kill -TERM {holder.pid}), or choose another output_dir" in msg
    assert (
        lock_holder(out)["pid"] == holder.pid and (out / LOCK_FILE).read_text() == before
    )  # nothing changed
    assert run_lock.take(out, rank=1) is None  # only rank 0 takes it


def test_the_launchers_lock_covers_its_workers_and_no_one_else(tmp_path, holder):
    """A worker of `ds-longctx train` (its launcher named in $DS_LONGCTX_RUN_LOCK) runs under its
    launcher's lock; a worker of another launcher is refused."""
    out = tmp_path / "run"
    assert run_lock.take(out, launcher=f"{holder.pid}@{socket.gethostname()}") is None
    with pytest.raises(RunLockError, match=f"in use by pid {holder.pid}"):
        run_lock.take(out, launcher=f"{os.getpid()}@{socket.gethostname()}")


def test_a_dead_holders_lock_is_taken_over_with_one_line(tmp_path, caplog):
    out = tmp_path / "run"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    out.mkdir()
    record = {
        "pid": int(dead.stdout),
        "host": socket.gethostname(),
        "since": "2026-12-01 10:00:00",
        "command": "ds-longctx train --resume",
    }
    (out / LOCK_FILE).write_text(
        json.dumps(record)
    )  # what a killed run leaves: its record, no flock
    assert lock_holder(out) is None
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        lock = RunLock.acquire(out)
    assert [r.getMessage() for r in caplog.records] == [
        f"took over the lock of {out} left by pid {record['pid']} on host {record['host']} since "
        f"2026-12-01 10:00:00 (ds-longctx train --resume), which no longer holds it"
    ]
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert list(out.iterdir()) == []  # the file goes; `out` stays (the acquire did not make it)


def test_release_removes_the_lock_and_the_directories_it_made_only(tmp_path):
    out = tmp_path / "a" / "b"
    lock = RunLock.acquire(out)
    assert lock_holder(out)["pid"] == os.getpid()
    with pytest.raises(RunLockError):  # one process, two acquires: the second is refused too
        RunLock.acquire(out)
    lock.release()
    assert not (tmp_path / "a").exists()
    lock = RunLock.acquire(out)
    (out / "metrics.jsonl").write_text("{}\n")  # the run wrote: its directory stays
    run_lock.release_all()
    assert [p.name for p in out.iterdir()] == ["metrics.jsonl"]


def test_ds_longctx_train_into_a_directory_in_use_is_refused_before_any_worker(
    tmp_path, holder, capsys
):
    """The launcher's precheck: exit 2, the holder named in the last line, nothing of the holder's
    touched."""
    from ds_longctx import cli

    out = tmp_path / "run"
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "train",
                "--nproc",
                "1",
                "--model",
                "qwen3-tiny",
                "--seq_len",
                "64",
                "--resume",
                "--steps",
                "9",
                "--output_dir",
                str(out),
            ]
        )
    err = capsys.readouterr().err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2 and last.startswith(
        f"refused before start: output_dir={str(out)!r} is in use by pid {holder.pid} on host "
    ), err
    assert sorted(p.name for p in out.iterdir()) == before and lock_holder(out)["pid"] == holder.pid


def test_checkpoint_convert_of_a_run_in_progress_is_refused(tmp_path, holder, capsys):
    from ds_longctx.checkpoint.convert import main

    (tmp_path / "run" / "checkpoints" / "step3").mkdir(parents=True)
    assert main(["convert", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"refused: output_dir={str(tmp_path / 'run')!r} is in use by pid {holder.pid}"
    ) and err.endswith("or convert it once that run has ended")


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_lock_file_that_is_a_link_or_a_fifo_is_refused_at_once_its_target_untouched(
    tmp_path, kind, capsys
):
    """The holder check (train's and eval's launcher) and the acquire (every writer: train, eval,
    convert) refuse a lock file that is not a regular file, in well under 5 s, without opening a
    FIFO for good or writing through a link; the link and its target stay as they were."""
    import time

    from ds_longctx import cli

    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("the user's own file\n")
    if kind == "symlink":
        (out / LOCK_FILE).symlink_to("../victim.txt")
    else:
        os.mkfifo(out / LOCK_FILE)
    what = "a symbolic link" if kind == "symlink" else "a FIFO"
    started = time.monotonic()
    for check in (
        lambda: lock_holder(out),
        lambda: RunLock.acquire(out),
        lambda: run_lock.take(out),
    ):
        with pytest.raises(
            RunLockError, match=f"its lock file {LOCK_FILE} is {what}, which no run"
        ):
            check()
    for resume in ([], ["--resume"]):
        with pytest.raises(SystemExit) as stopped:
            cli.main(
                [
                    "train",
                    "--nproc",
                    "1",
                    "--model",
                    "qwen3-tiny",
                    "--seq_len",
                    "64",
                    "--steps",
                    "1",
                    "--output_dir",
                    str(out),
                    *resume,
                ]
            )
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert stopped.value.code == 2 and last.startswith(
            f"refused before start: output_dir={str(out)!r}: its lock file {LOCK_FILE} is {what}"
        ), last
    assert time.monotonic() - started < 5
    assert victim.read_text() == "the user's own file\n" and sorted(
        p.name for p in out.iterdir()
    ) == [LOCK_FILE]
    assert (out / LOCK_FILE).is_symlink() if kind == "symlink" else (out / LOCK_FILE).is_fifo()


def test_a_tilde_output_dir_is_one_run_directory_with_one_lock(tmp_path, monkeypatch):
    """`~/rk` from the command line or a config file resolves once (parallel/disk.user_path): the
    files and the lock land in $HOME/rk, nothing in a literal ./~, and a second writer naming
    $HOME/rk by its absolute path is refused. A command's own path options (`--out=~/corpus`, which
    no shell expands) resolve the same way."""
    from ds_longctx.run.argv import parse_config

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    (cwd / "run.yaml").write_text("model: qwen3-tiny\noutput_dir: ~/rk\ndata_cache_dir: ~/cache\n")
    for argv in (["--output_dir", "~/rk"], ["--config", "run.yaml"]):
        cfg = parse_config(argv)
        assert cfg.train.output_dir == str(home / "rk")
    assert cfg.data.cache_dir == str(home / "cache")
    lock = run_lock.take(cfg.train.output_dir)
    with pytest.raises(RunLockError, match="is in use by pid"):
        RunLock.acquire(home / "rk")
    assert lock_holder(str(home / "rk"))["pid"] == os.getpid() and list(cwd.iterdir()) == [
        cwd / "run.yaml"
    ]
    lock.release()
    # a command's own path options: the same resolution
    from ds_longctx.corpora.prepare import parser

    assert parser().parse_args(["prepare", "--stdlib", "--out=~/corpus"]).out == str(
        home / "corpus"
    )
