"""The tests' multi-process launcher on CPU: each process of a job is forked from one server process
that has already imported torch, transformers, DeepSpeed and ds_longctx, instead of a fresh
interpreter that imports them again (about 4 s of CPU a process, most of a tiny job's time on the
2-core CI machine).

Two kinds of job:
- workers (`tests/helpers.torchrun`): each forked process gets what torchrun's agent gives a worker
  (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_ADDR/PORT,
  TORCHELASTIC_*); torchrun's agent itself does not run.
- launchers (`helpers.run_cli`: a `ds-longctx` command; `helpers.torchrun_nodes`: one torchrun agent
  per node): the forked process runs the command's own code, torchrun's agent included, and the
  agent's workers are forked from it (`_fork_torchrun_workers`) rather than started as `python -u -m
  MODULE`: the same environment, session and output files that Popen would give them.
Either way a process gets the caller's environment, its own session, fresh-interpreter signal
handlers, stdout and stderr into files; it runs the script (or `-m` module) as `__main__` and exits
without the interpreter's teardown. As under torchrun, one process that fails ends the others; a job
past its timeout is killed.

What a forked process shares with its parent is module state set before the fork (a memo, a logging
handler); a fresh interpreter would start without it. The real paths keep their own tests: launchers
started as processes (`deepspeed`, `accelerate launch`, `torchrun`, `ds-longctx train`:
tests/test_launch.py, test_stops.py,
test_train.py's deepspeed launcher, test_killed_rank.py), and `DS_LONGCTX_TEST_TORCHRUN=1` sends
every job of tests/helpers (torchrun, run_cli, torchrun_nodes) to fresh processes instead.

    argv = ["tests/distributed/grad_worker.py", "--sp", "2", "--out", "g.pt"]
    codes, outputs = run(2, argv, module=False, ...)

Protocol with the server (`python -m tests.forkrun`): "ready" once imported, then per job one JSON
line in (the task) and one out (each process's exit code: negative for a signal).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the workers import (a name that fails to import is skipped: an extra that is not installed)
PRELOAD = (
    "torch",
    "torch.distributed",
    "deepspeed",
    "yaml",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.llama.modeling_llama",
    "transformers.models.mistral.modeling_mistral",
    "ds_longctx.config",
    "ds_longctx.data",
    "ds_longctx.run.engine",
    "ds_longctx.run.train",
    "ds_longctx.run.evaluate",
    "ds_longctx.checkpoint.resume",
    "ds_longctx.integrations.hf_trainer",
    "peft",
    "trl",
    "ds_longctx.cli",
    "torch.distributed.run",
    "ds_longctx.run.train_loop",
    "ds_longctx.run.preflight",
    "ds_longctx.rehearsal.rehearse",
    "ds_longctx.checkpoint.export",
    "ds_longctx.run.eval_checkpoint",
    # what DeepSpeed's ZeRO optimizer check imports on first use (Muon's torch.compile:
    # torch._inductor)
    "deepspeed.runtime.zero.muon.muon_optimizer",
)
START_TIMEOUT_S = 300


# ----------------------------------------------------------------------------- the server (a
# process of its own)
def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _child(task: dict, rank: int) -> None:
    """In the forked process: torchrun's worker environment (a launcher task: none, and its own
    workers forked too), output to the task's files, the script, exit."""
    os.setsid()  # its own session: the server kills the process and anything it started together
    logs = Path(task["log_dir"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, name in ((1, f"rank{rank}.out"), (2, f"rank{rank}.err")):
        f = os.open(logs / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout.reconfigure(line_buffering=True)
    env = dict(task["env"])
    if task.get("launcher"):
        _fork_torchrun_workers()
    else:
        n = task["nproc"]
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            ROLE_RANK=str(rank),
            ROLE_NAME="default",
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            GROUP_WORLD_SIZE="1",
            ROLE_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(task["port"]),
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            TORCHELASTIC_RUN_ID="none",
            TORCHELASTIC_USE_AGENT_STORE="False",
        )
    os.chdir(task["cwd"])
    args = task["rank_args"][rank] if task.get("rank_args") else task["args"]
    _run_main(args, task["module"], env)


def _run_main(args: list[str], module: bool, env: dict) -> None:
    """Run `args` (a script or, with `module`, a module, then its arguments) as `__main__` in this
    forked process with exactly `env` and the signal handlers of a fresh interpreter, then
    `os._exit` with its exit status."""
    for sig in (
        signal.valid_signals()
    ):  # the handlers a parent installed (torchrun's agent: SIGTERM, SIGINT, ...)
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        import runpy

        first, *rest = args
        sys.argv = [first, *rest]
        if module:
            runpy.run_module(first, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = str(Path(first).resolve().parent)  # as `python script.py` puts it
            runpy.run_path(first, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001 (a worker's failure of any kind is its exit status, as in a fresh process)
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


class _ForkedWorker:
    """What torchrun's agent uses of a worker's `Popen` (pid, poll, wait, returncode), for a worker
    forked from the launcher's process instead of started as a fresh `python -u -m MODULE ...`."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode


def _fork_torchrun_workers() -> None:
    """In a launcher task (`ds-longctx train --nproc N`, `eval`): torchrun's agent, which runs in
    this process, forks each `python -u [-m] X ARGS` worker from it (everything imported) instead of
    starting a fresh interpreter. The worker gets what Popen would give it: its own session, the
    agent's environment and output files."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import (
        SubprocessHandler,
    )

    popen = SubprocessHandler._popen

    def fork_popen(handler, args: tuple, env: dict):
        cmd = [str(a) for a in args]
        if (
            len(cmd) < 3
            or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable)
            or cmd[1] != "-u"
        ):
            return popen(handler, args, env)
        module = cmd[2] == "-m"
        target = cmd[3:] if module else cmd[2:]
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the child would write this process's buffered output again
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                for fd, f in ((1, handler._stdout), (2, handler._stderr)):
                    if f is not None:
                        os.dup2(f.fileno(), fd)
                _run_main(target, module, env)
            finally:
                os._exit(70)
        return _ForkedWorker(pid)

    SubprocessHandler._popen = fork_popen


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _run_task(task: dict) -> list[int]:
    """Fork the task's processes and wait: all done, one failed (the others are killed) or the
    timeout passed."""
    pids = []
    for rank in range(task["nproc"]):
        pid = os.fork()
        if pid == 0:
            try:
                _child(task, rank)  # ends in os._exit
            finally:
                os._exit(70)
        pids.append(pid)
    codes: list = [None] * len(pids)
    deadline = time.monotonic() + task["timeout"]
    while time.monotonic() < deadline:
        for i, pid in enumerate(pids):
            if codes[i] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[i] = os.waitstatus_to_exitcode(status)
        if all(c is not None for c in codes) or any(c for c in codes if c is not None):
            break
        time.sleep(0.05)
    for i, pid in enumerate(pids):
        _kill(pid)  # the session: a finished process's children too
        if codes[i] is None:
            codes[i] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return codes


def serve() -> None:
    """Import PRELOAD, say "ready", then run one task per line of stdin until it closes."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    from ds_longctx.run.model import load_hf_config, model_class

    model_class(
        load_hf_config("qwen3-tiny")
    )  # transformers' lazy import structure, built once here
    out = sys.stdout
    print("ready", file=out, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps({"codes": _run_task(json.loads(line))}), file=out, flush=True)


# ----------------------------------------------------------------------------- the client (the test
# process)
_server: subprocess.Popen | None = None


def _start(env: dict) -> subprocess.Popen:
    """The server, its own stderr into a file (not the stderr pytest captures for the test that
    happens to start it)."""
    import tempfile

    log = Path(tempfile.mkdtemp(prefix="forkrun-")) / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkrun"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
        )
    proc.log = log
    if _readline(proc, START_TIMEOUT_S) != "ready":
        proc.kill()
        raise RuntimeError(
            f"tests/forkrun.py's server did not start (exit {proc.poll()}):\n"
            f"{log.read_text(errors='replace')[-4000:]}"
        )
    atexit.register(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else None


def run(
    nproc: int,
    args: list[str],
    module: bool,
    env: dict,
    port: int,
    log_dir: Path,
    timeout: float,
    launcher: bool = False,
    rank_args: list[list[str]] | None = None,
    cwd: Path | None = None,
) -> list[int]:
    """Run one job on the server (started on first use, with `env`, or again if it died); each
    process's exit code (negative: killed by that signal; -9 past `timeout`). Its output:
    `log_dir`/rank{r}.out and .err. `launcher`: one
    process without torchrun's worker environment, whose own torchrun workers are forked from it (a
    `ds-longctx` command). `rank_args`: each process's own arguments instead of `args` (several
    torchrun agents, one a node). `cwd`: the processes' working directory (default the repository
    root)."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = _start(env)
    task = {
        "nproc": nproc,
        "args": [str(a) for a in args],
        "module": module,
        "env": env,
        "port": port,
        "log_dir": str(log_dir),
        "timeout": timeout,
        "cwd": str(cwd or ROOT),
        "launcher": launcher,
        "rank_args": [[str(a) for a in r] for r in rank_args] if rank_args else None,
    }
    _server.stdin.write(json.dumps(task) + "\n")
    _server.stdin.flush()
    line = _readline(_server, timeout + 60)
    if not line:
        _server.kill()
        _server.wait()  # the next job starts a new server
        raise RuntimeError(
            f"tests/forkrun.py's server gave no answer for {args} within {timeout + 60:.0f}s:\n"
            f"{_server_log()}"
        )
    return json.loads(line)["codes"]


def outputs(log_dir: Path, nproc: int) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process of the job whose `log_dir` was given to `run`, in rank
    order."""
    return [
        tuple((Path(log_dir) / f"rank{r}.{s}").read_text(errors="replace") for s in ("out", "err"))
        for r in range(nproc)
    ]


def _server_log() -> str:
    return _server.log.read_text(errors="replace")[-4000:] if _server is not None else ""


if __name__ == "__main__":
    serve()
