"""Start local workers of a module under torchrun's agent, in this process, and end with their one last line.

    rc = launch_holding(out, FIX, nproc, argv, "ds_longctx.train", saves=True)   # `ds-longctx train` / `eval`

The workers' last line (run/refuse.py) is printed last and its exit code returned; signals reach the workers and
wait for their save (run/stops.py). torch is imported inside the functions: `ds-longctx --help` answers without it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def torchrun_args(
    nproc: int, run_args: list[str], module: str = "ds_longctx.train"
) -> argparse.Namespace:
    """torchrun's parsed arguments that start `nproc` local processes of `module` with `run_args` (what
    `python -m torch.distributed.run ... -m MODULE RUN_ARGS` would parse). `run_args` are handed over as they are,
    never parsed by torchrun: its parser takes an abbreviation of its own options anywhere on the line (`--nproc`
    is ambiguous with its `--nproc-per-node`), even after the module."""
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
    """`launch` while this process holds `out`'s lock (checkpoint/run_lock.py), named to the workers in
    $DS_LONGCTX_RUN_LOCK; exits 2 where another process took it since the check. `saves`: `out` is a training run's
    (its checkpoints are named after an abandoned save)."""
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
    import signal
    import tempfile

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
    return _last_word(recorded, signals, signum, failure, output_dir)


def _last_word(recorded, signals, signum: int, failure, output_dir: str | None) -> int:
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
            f"stopped by {signal_name(signum)} before the workers reached a step boundary: nothing saved by this "
            f"run (an earlier checkpoint, if any, is unchanged)",
            file=sys.stderr,
            flush=True,
        )
        return signal_exit(signum)
    if failure is not None:
        print(failure.format_msg().strip(), file=sys.stderr, flush=True)
        codes = [f.exitcode for f in failure.failures.values() if f.exitcode and f.exitcode > 0]
        return codes[0] if codes else 1
    return 0


def abandoned_line(signals, output_dir: str | None) -> str:
    """The last line after a save (or the step before it) was abandoned by a repeated signal."""
    from ds_longctx.checkpoint.layout import ckpt_root
    from ds_longctx.checkpoint.paths import read_latest
    from ds_longctx.run.stops import signal_name

    latest = None
    if output_dir is not None:
        try:
            latest = read_latest(ckpt_root(output_dir))
        except (ValueError, OSError):
            latest = None
    kept = (
        f"the last complete checkpoint, {ckpt_root(output_dir) / latest}, is unchanged: --resume "
        f"continues it"
        if latest
        else "no earlier checkpoint of this run exists"
    )
    return f"stopped by {signal_name(signals.first)}, then abandoned ({signals.abandoned}): {kept}"
