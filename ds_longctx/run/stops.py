"""How a run stops: on SIGTERM or SIGINT (every rank at the same step boundary, saved), when its launcher dies (each
worker ends itself), and the exit code and last line of each stop (the table in README's "Exit codes and stops").

    stop = StopRequest().install()       # SIGTERM and SIGINT set a flag; the loop asks `agreed()` once per step
    watch_launcher()                     # at a worker's start: end this process when its launcher is gone

Exit codes: 0 every step trained, or a worker stopped by a signal after saving (torchrun, accelerate and deepspeed
see a clean exit); 1 a failure (FAILED: a NaN/inf loss with its one line, an error with its traceback, a dead or
hung rank, a worker whose launcher died); 2 a refusal (run/refuse.py); 128 + the signal's number from
`ds-longctx train` / `eval` stopped by SIGINT (130) or SIGTERM (143), the workers' save done (`signal_exit`).
"""

from __future__ import annotations

# torch is imported where the ranks agree on a stop: launchers import this module without it.
import os
import signal
import sys
import threading
import time
from typing import Optional

from ds_longctx.run.refuse import last_line

FAILED = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# how long `ds-longctx train` lets its workers finish the current step and save after a signal before torchrun
# kills them (torch's own default is 30 s; a Qwen3-8B checkpoint is ~112 GB and a 1M-token step ~15 min)
STOP_GRACE_S = 3600
WATCH_POLL_S = 0.5


def signal_exit(signum: int) -> int:
    """The shell's exit code of a command stopped by signal `signum` (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """SIGTERM and SIGINT set a flag (the first signal's number); `agreed()` (collective, once per step) all-reduces
    it, so every rank stops at the same step boundary, saves and exits 0. install()/uninstall() put the previous
    handlers back."""

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}

    @property
    def flag(self) -> bool:
        return bool(self.signum)

    def _on_signal(self, signum, frame) -> None:
        if not self.signum and os.environ.get("RANK", "0") == "0":
            os.write(2, f"\n[ds_longctx] {signal_name(signum)}: stopping at the end of this step, then saving\n"
                        .encode())
        self.signum = self.signum or signum

    def install(self) -> "StopRequest":
        for s in SIGNALS:
            self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def agreed(self, device) -> int:
        """The signal some rank got (0: none), the same on every rank. Collective when a process group exists."""
        import torch
        import torch.distributed as dist
        if not dist.is_initialized():
            return self.signum
        t = torch.tensor([float(self.signum)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())


_watching: Optional[threading.Thread] = None


def watch_launcher(poll_s: float = WATCH_POLL_S) -> Optional[threading.Thread]:
    """A worker started by a launcher (LOCAL_RANK set: torchrun, `accelerate launch`, the `deepspeed` launcher,
    `ds-longctx train`) ends itself within `poll_s` of its launcher's death (exit FAILED, one line on stderr).

    Those launchers start workers in their own sessions (torchrun) or cannot pass a signal on when they are killed
    (SIGKILL), so a killed launcher left its workers training, saving and pruning checkpoints. The launcher is this
    process's parent (torchrun's agent runs inside torchrun, accelerate and `ds-longctx train`; deepspeed's is
    `deepspeed.launcher.launch`): when it dies the kernel gives the worker another parent, which a daemon thread sees
    in getppid(). A process without a launcher (plain `python -m ds_longctx.train`) is not watched: its parent is
    a shell that may leave it running on purpose (nohup). Idempotent."""
    global _watching
    if _watching is not None or "LOCAL_RANK" not in os.environ:
        return _watching
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        try:
            print(f"[ds_longctx] rank {os.environ.get('RANK', '?')}: its launcher (pid {launcher}) is gone; ending "
                  f"this worker (nothing saved since the last checkpoint)", file=sys.stderr, flush=True)
        except OSError:  # stderr was a pipe to the launcher
            pass
        os._exit(FAILED)

    _watching = threading.Thread(target=watch, name="ds_longctx-launcher-watch", daemon=True)
    _watching.start()
    return _watching


def end_on_signal(what: str) -> None:
    """For a job with nothing to save (`ds-longctx eval`): SIGTERM / SIGINT end this process at once, exit 0, rank 0's
    line last ("eval stopped by SIGINT: nothing written"; the launcher exits 128 + the signal)."""
    def handler(signum, frame) -> None:
        last_line(f"{what} stopped by {signal_name(signum)}: nothing written", signal_exit(signum),
                  int(os.environ.get("RANK", "0")))
        sys.stderr.flush()
        os._exit(0)

    for s in SIGNALS:
        signal.signal(s, handler)
