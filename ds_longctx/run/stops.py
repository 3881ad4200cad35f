"""How a run stops: SIGTERM or SIGINT (every rank at the same step boundary, saved) or a dead
launcher (each worker ends itself), each stop with its exit code and one last line
(docs/reliability.md).

    stop = StopRequest().install()       # the loop asks `agreed()` once per step
    watch_launcher()                     # a worker ends itself when its launcher is gone
    with saving(step): ...               # the watch waits for a save; the launcher is told
    LauncherSignals(status_file)         # in `ds-longctx train`: later signals wait for the save

Exit codes: 0 done or stopped after saving, 1 failed, 2 refused, 128 + the signal from
`ds-longctx train` / `eval`. Why: docs/design/run.md."""

from __future__ import annotations

# torch is imported where the ranks agree on a stop: launchers import this module without it.
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Optional

import psutil

from ds_longctx.checkpoint.run_lock import release_all
from ds_longctx.run.refuse import last_line
from ds_longctx.run.run_log import say_now

FAILED = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# how long `ds-longctx train` lets its workers finish the current step and save after a signal
# before torchrun kills them (torch's own default is 30 s; a Qwen3-8B checkpoint is ~98 GB and a
# 1M-token step ~15 min)
STOP_GRACE_S = 3600
WATCH_POLL_S = 0.5
ABANDON_WINDOW_S = (
    10.0  # after the launcher's "waiting for the save" line, another signal within this abandons it
)
DEBOUNCE_S = (
    0.5  # signals closer than this to the previous one count as one (a held or mashed Ctrl-C)
)
STATUS_FILE_ENV = "DS_LONGCTX_STATUS_FILE"  # rank 0 writes "saving step N" there for the launcher
_saving: Optional[int] = None  # the step this worker is saving, None when not saving


def signal_exit(signum: int) -> int:
    """The shell's exit code of a command stopped by signal `signum` (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """SIGTERM / SIGINT set a flag; `agreed()` (collective, once per step) all-reduces it, so every
    rank stops at the same step boundary. install() / uninstall() restore the previous handlers."""

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}
        self._now: Optional[str] = (
            None  # what this process is doing while a signal ends it at once (`now`)
        )
        self._pid = os.getpid()

    @property
    def flag(self) -> bool:
        return bool(self.signum)

    def _on_signal(self, signum, frame) -> None:
        if self._now is not None:
            self._stop_now(signum)
        if not self.signum and os.environ.get("RANK", "0") == "0":
            say_now(
                f"\n[ds_longctx] {signal_name(signum)}: stopping at the end of this step, then "
                "saving\n"
            )
        self.signum = self.signum or signum

    @contextlib.contextmanager
    def now(self, what: str, left: str = "nothing trained, nothing saved"):
        """Within the block a signal ends the process at once; rank 0's last line names `what` and
        `left`."""
        self._now, self._left = what, left
        try:
            if self.signum:  # one came before the block
                self._stop_now(self.signum)
            yield
        finally:
            self._now = None

    def _stop_now(self, signum: int) -> None:

        if os.getpid() == self._pid:  # not a forked datasets worker: the run's own process says it
            release_all()
            rank = int(os.environ.get("RANK", "0"))
            if rank == 0:
                os.write(2, b"\n")  # past a progress bar's line
            last_line(
                f"stopped by {signal_name(signum)} while {self._now}: {self._left}",
                signal_exit(signum),
                rank,
            )
        os._exit(signal_exit(signum))

    def install(self) -> "StopRequest":
        for s in SIGNALS:
            self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def agreed(self, device) -> int:
        """The signal some rank got (0: none), the same on every rank. Collective."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.signum
        t = torch.tensor([float(self.signum)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())


_watching: Optional[threading.Thread] = None


def watch_launcher(poll_s: float = WATCH_POLL_S) -> Optional[threading.Thread]:
    """A worker with LOCAL_RANK ends itself (exit FAILED) within `poll_s` of its launcher's death,
    after any save in progress. Idempotent. Why: docs/design/run.md."""
    global _watching
    if _watching is not None or "LOCAL_RANK" not in os.environ:
        return _watching
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        if _saving is not None:
            _say(
                f"rank {os.environ.get('RANK', '?')}: its launcher (pid {launcher}) is gone; "
                f"finishing the save of step {_saving} first"
            )
        while _saving is not None:
            time.sleep(poll_s)
        try:
            print(
                f"[ds_longctx] rank {os.environ.get('RANK', '?')}: its launcher (pid {launcher}) "
                f"is gone; ending this worker (nothing saved since the last checkpoint)",
                file=sys.stderr,
                flush=True,
            )
        except OSError:  # stderr was a pipe to the launcher
            pass
        os._exit(FAILED)

    _watching = threading.Thread(target=watch, name="ds_longctx-launcher-watch", daemon=True)
    _watching.start()
    return _watching


def _say(line: str) -> None:
    try:
        print(f"[ds_longctx] {line}", file=sys.stderr, flush=True)
    except OSError:  # stderr was a pipe to a launcher that is gone
        pass


def _status(text: str) -> None:
    """Rank 0 writes what the workers are doing to $DS_LONGCTX_STATUS_FILE."""
    path = os.environ.get(STATUS_FILE_ENV)
    if path and os.environ.get("RANK", "0") == "0":
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass


@contextlib.contextmanager
def saving(step: int):
    """The block saves step `step`: the launcher watch lets it finish, the launcher is told."""
    global _saving
    _saving = step
    _status(f"saving step {step}")
    try:
        yield
    finally:
        _saving = None
        _status(f"exiting after saving step {step}")


class LauncherSignals:
    """SIGINT / SIGTERM in `ds-longctx train` / `eval`: the first is forwarded; a later one says
    what the workers do, and one within ABANDON_WINDOW_S of that kills them (`abandoned`) and
    forwards."""

    def __init__(self, status_file: str, forward):
        self.status_file, self.forward = status_file, forward
        self.first = 0  # the first signal's number
        self.abandoned = ""  # what was abandoned, "" when nothing
        self._warned = self._last = -1e9

    def status(self) -> str:
        try:
            with open(self.status_file) as f:
                return f.read().strip()
        except OSError:
            return ""

    def __call__(self, signum, frame) -> None:
        now, last = time.monotonic(), self._last
        self._last = now
        if not self.first:
            self.first = signum
            return self.forward(signum, frame)
        if now - last < DEBOUNCE_S:
            return None
        doing = self.status()
        doing = doing or "finishing the step, then saving it"
        if now - self._warned <= ABANDON_WINDOW_S:
            self.abandoned = doing
            _say(f"{signal_name(signum)} again: abandoning ({doing}); the workers are killed")
            kill_children()
            return self.forward(signum, frame)
        self._warned = now
        _say(
            f"{signal_name(signum)}: the workers are {doing}; waiting for them. "
            f"{signal_name(signum)} again within "
            f"{ABANDON_WINDOW_S:.0f} s abandons it (the last complete checkpoint stays)"
        )
        return None


def kill_children() -> None:
    """SIGKILL to every process this one started, their children too."""

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def end_on_signal(what: str) -> None:
    """For a job with nothing to save (eval): a signal ends the process at once, exit 0, rank 0's
    line last."""

    def handler(signum, frame) -> None:
        last_line(
            f"{what} stopped by {signal_name(signum)}: nothing written",
            signal_exit(signum),
            int(os.environ.get("RANK", "0")),
        )
        sys.stderr.flush()
        os._exit(0)

    for s in SIGNALS:
        signal.signal(s, handler)
