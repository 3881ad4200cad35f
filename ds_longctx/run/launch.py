"""Start local workers of a module under torchrun's agent, in this process, and end with their one
last line.

    # `ds-longctx train` / `eval`:
    rc = launch_holding(out, FIX, nproc, argv, "ds_longctx.train", saves=True)

The workers' last line (run/refuse.py) is printed last and its exit code returned; signals reach the
workers and wait for their save (run/stops.py). torch is imported inside the functions: `ds-longctx
--help` answers without it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import socket
import sys
import tempfile
from pathlib import Path


def torchrun_args(
    nproc: int, run_args: list[str], module: str = "ds_longctx.train"
) -> argparse.Namespace:
    """torchrun's parsed arguments that start `nproc` local processes of `module` with `run_args`
    (what `python -m torch.distributed.run ... -m MODULE RUN_ARGS` would parse). `run_args` are
    handed over as they are, never parsed by torchrun: its parser takes an abbreviation of its own
    options anywhere on the line (`--nproc` is ambiguous with its `--nproc-per-node`), even after
    the module."""
    from torch.distributed.run import get_args_parser

    from ds_longctx.parallel.parallel_state import free_port

    args = get_args_parser().parse_args(
        [
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            module,
        ]
    )
    args.training_script_args = list(run_args)
    return args


def launch_holding(
    out, fix: str, nproc: int, args: list[str], module: str, saves: bool = False
) -> int:
    """`launch` while this process holds `out`'s lock (checkpoint/run_lock.py), named to the workers
    in $DS_LONGCTX_RUN_LOCK; exits 2 where another process took it since the check. `saves`: `out`
    is a training run's (its checkpoints are named after an abandoned save)."""
    from ds_longctx.checkpoint.run_lock import LOCK_ENV, lock_env_value, take
    from ds_longctx.run.refuse import refuse

    try:
        lock = take(out, fix)
    except ValueError as e:
        refuse(f"refused before start: {e}")
    from ds_longctx.run.run_log import guarded_output

    os.environ[LOCK_ENV] = lock_env_value()
    try:
        with guarded_output():  # the terminal may go away (`| tee` ended by Ctrl-C): run/run_log.py
            return launch(nproc, args, module, str(out) if saves else None)
    finally:
        os.environ.pop(LOCK_ENV, None)
        if lock is not None:
            lock.release()


def launch(nproc: int, args: list[str], module: str, output_dir: str | None = None) -> int:
    """Start `nproc` local workers of `module` under torchrun's agent (in this process). The
    workers' last line (run/refuse.last_line) is printed last and its exit code returned; signals
    reach the workers and wait for their save (run/stops.LauncherSignals). Another failure ends with
    torchrun's summary and its exit code."""
    import torch.distributed.elastic.multiprocessing.api as elastic
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    from ds_longctx.run.refuse import REFUSAL_FILE_ENV, recorded_line
    from ds_longctx.run.run_log import LOG_NAME, keep_log
    from ds_longctx.run.stops import SIGNALS, STATUS_FILE_ENV, LauncherSignals
    from ds_longctx.run.worker_env import worker_env

    os.environ.update(worker_env())
    failure, signum, torch_handler = None, 0, elastic._terminate_process_handler
    with tempfile.TemporaryDirectory(prefix="ds_longctx-") as tmp:
        os.environ[REFUSAL_FILE_ENV] = path = os.path.join(tmp, "last_line.txt")
        os.environ[STATUS_FILE_ENV] = os.path.join(tmp, "status.txt")
        signals = LauncherSignals(os.environ[STATUS_FILE_ENV], torch_handler)
        # what the agent installs for its signals (paired below)
        elastic._terminate_process_handler = signals
        try:
            run(torchrun_args(nproc, args, module))
        except ChildFailedError as e:
            failure = e
        except SignalException as e:
            signum = int(e.sigval)
        finally:
            # the workers are gone: nothing is left to stop (a late press must not cut the line)
            for s in SIGNALS:
                signal.signal(s, signal.SIG_IGN)
            elastic._terminate_process_handler = torch_handler
            os.environ.pop(REFUSAL_FILE_ENV, None)
            os.environ.pop(STATUS_FILE_ENV, None)
        recorded = recorded_line(path)
    if output_dir is not None and (Path(output_dir) / LOG_NAME).is_file():
        keep_log(output_dir)  # the workers' log: the last line too
    return _last_word(recorded, signals, signum, failure, output_dir, nproc)


def _last_word(
    recorded, signals, signum: int, failure, output_dir: str | None, nproc: int = 1
) -> int:
    """Print the launch's last line; its exit code (`launch`'s doc)."""
    from ds_longctx.run.stops import signal_exit, signal_name

    if signals.abandoned:
        print(abandoned_line(signals, output_dir), file=sys.stderr, flush=True)
        return signal_exit(signals.first)
    if recorded is not None:
        print(recorded[1], file=sys.stderr, flush=True)
        return recorded[0]
    if signum:
        print(
            f"stopped by {signal_name(signum)} before the workers reached a step boundary: nothing "
            f"saved by this run (an earlier checkpoint, if any, is unchanged)",
            file=sys.stderr,
            flush=True,
        )
        return signal_exit(signum)
    if failure is not None:
        print(failure.format_msg().strip(), file=sys.stderr, flush=True)
        print(failed_rank_line(failure.failures, nproc, output_dir), file=sys.stderr, flush=True)
        codes = [f.exitcode for f in failure.failures.values() if f.exitcode and f.exitcode > 0]
        return codes[0] if codes else 1
    return 0


# a rank's own record of a collective it gave up on (gloo, NCCL); NCCL's watchdog may SIGABRT
# instead
TIMED_OUT = re.compile(r"[Tt]imed out|timeout caused|operation timeout")
# failures seen this close to the first came before the agent's SIGKILL (30 s after its SIGTERM)
FIRST_S = 10
# timeouts this close to the first are the ranks that waited (a later one, a stopped rank continued,
# was late): exact times (run/refuse.GAVE_UP_AT) of ranks that gave up at their deadlines differ by
# their entries into the collective; whole seconds (torch's record, NCCL's abort) by up to 2 more
WAITED_EXACT_S = 0.5
WAITED_S = 2


def failed_rank_line(failures: dict, nproc: int, output_dir: str | None) -> str:
    """The last line after workers failed (torchrun's ProcessFailure by rank): the rank killed by a
    signal from outside, else the ranks the others timed out waiting for, else the first to fail;
    pid, host and what is on disk."""
    host = socket.gethostname()

    def who(ranks) -> str:
        named = [
            f"rank {r} (pid {failures[r].pid} on {host})" if r in failures else f"rank {r}"
            for r in ranks
        ]
        return ", ".join(named)

    first = min(f.timestamp for f in failures.values())
    killed = [
        r
        for r, f in sorted(failures.items())
        if f.exitcode < 0
        and -f.exitcode not in (signal.SIGTERM, signal.SIGABRT)
        and f.timestamp <= first + FIRST_S
    ]
    timed = {
        r: f
        for r, f in failures.items()
        if TIMED_OUT.search(_said(f)) or f.exitcode == -signal.SIGABRT
    }
    waited = _waited(timed)
    hung = [r for r in range(nproc) if r not in waited]
    if killed:
        sigs = sorted({failures[r].signal_name() for r in killed})
        what = (
            f"{who(killed)} died, killed by {'/'.join(sigs)} (from outside the run: kill, the OOM "
            "killer)"
        )
    elif waited and hung:
        what = (
            f"{who(hung)} hung: {'rank' if len(waited) == 1 else 'ranks'} "
            f"{', '.join(map(str, waited))} gave up waiting for "
            f"{'it' if len(hung) == 1 else 'them'} in a collective (parallel.collective_timeout_s)"
        )
    elif waited:
        what = "every rank timed out in a collective (parallel.collective_timeout_s)"
    else:
        r = min(failures, key=lambda r: (failures[r].timestamp, r))
        f = failures[r]
        said = _said(f).strip().splitlines()
        how = said[0][:200] if said else f"exit code {f.exitcode}"
        what = f"{who([r])} failed first ({how}; its traceback above)"
    kept = kept_checkpoint(output_dir, partial=True) if output_dir else "this launch saves nothing"
    return f"{what}; {kept}"


def _waited(timed: dict) -> list[int]:
    """The ranks of `timed` (ProcessFailure by rank, each a timeout) that gave up waiting: the first
    to give up and those within WAITED_EXACT_S of it where both recorded their exact time, else
    within WAITED_S in whole seconds."""
    exact = {r: _gave_up_at(f) for r, f in timed.items()}
    when = {r: float(f.timestamp) if exact[r] is None else exact[r] for r, f in timed.items()}
    if not when:
        return []
    first = min(when, key=lambda r: (when[r], r))

    def waited(r: int) -> bool:
        if exact[r] is not None and exact[first] is not None:
            return exact[r] - exact[first] <= WAITED_EXACT_S
        return int(when[r]) <= int(when[first]) + WAITED_S

    return sorted(r for r in timed if waited(r))


def _gave_up_at(failure) -> float | None:
    """The exact time a worker's error file records (run/refuse.record_failure), or None."""
    from ds_longctx.run.refuse import GAVE_UP_AT

    m = failure.message
    info = m.get("extraInfo") if isinstance(m, dict) else None
    at = info.get(GAVE_UP_AT) if isinstance(info, dict) else None
    return float(at) if type(at) in (int, float) and math.isfinite(at) else None


def _said(failure) -> str:
    """The exception a worker recorded (torch's error file: a message string or a dict holding one),
    or ''."""
    m = failure.message
    m = m.get("message", "") if isinstance(m, dict) else m
    return m if isinstance(m, str) and failure.error_file != "<N/A>" else ""  # torch's "no file"


def kept_checkpoint(output_dir: str | None, partial: bool = False) -> str:
    """What a stopped run leaves: its last complete checkpoint (`--resume` continues it); `partial`:
    and a partial save left there."""
    from ds_longctx.checkpoint.layout import ckpt_root
    from ds_longctx.checkpoint.paths import partial_saves, read_latest

    if output_dir is None:
        return "no earlier checkpoint of this run exists"
    root = ckpt_root(output_dir)
    try:
        latest = read_latest(root)
    except (ValueError, OSError):
        latest = None
    kept = (
        f"the last complete checkpoint, {root / latest}, is unchanged: --resume continues it"
        if latest
        else "no earlier checkpoint of this run exists"
    )
    left = [p.name for p in partial_saves(root)] if partial else []
    return kept + (f" ({', '.join(left)}: a partial save the next one removes)" if left else "")


def abandoned_line(signals, output_dir: str | None) -> str:
    """The last line after a save (or the step before it) was abandoned by a repeated signal."""
    from ds_longctx.run.stops import signal_name

    return (
        f"stopped by {signal_name(signals.first)}, then abandoned ({signals.abandoned}): "
        f"{kept_checkpoint(output_dir)}"
    )
