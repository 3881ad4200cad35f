"""How a run stops, on CPU (2 gloo processes, SP=2, fp32): SIGINT and SIGTERM to `ds-longctx train`
save the step the ranks stopped at and end the command with one line and 130 / 143 (no torchrun
traceback); resuming from those saves gives the uninterrupted run's losses bit for bit; SIGKILL of
any launcher's process group leaves no worker alive after 15 s."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ds_longctx.checkpoint.layout import ckpt_root
from ds_longctx.checkpoint.paths import read_latest
from tests.helpers import (
    ROOT,
    cpu_env,
    free_port,
    read_metrics,
    run_cli,
    torchrun_cmd,
    wait_for_steps,
    worker,
)

pytestmark = pytest.mark.slow
RUN = [
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "64",
    "--sp_size",
    "2",
    "--dtype",
    "fp32",
    "--lr",
    "1e-3",
]
LONG = 40  # steps the interrupted runs are given: they are stopped long before


def start_cli(args, log):
    """`ds-longctx train --nproc 2 ARGS` in its own session (so a signal or killpg reaches it
    alone), output to log."""
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "ds_longctx.cli", "train", "--nproc", "2", *args],
            env=cpu_env(),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def interrupt(proc, out, log, sig, after_steps):
    """Send `sig` to the launcher once metrics.jsonl has `after_steps` lines; (exit code,
    output)."""
    try:
        wait_for_steps(proc, out, after_steps, log)
        proc.send_signal(sig)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return rc, log.read_text()


def last_line(text):
    return [line for line in text.replace("\r", "\n").splitlines() if line.strip()][-1]


def test_sigint_then_sigterm_save_their_step_and_the_resumed_losses_are_the_straight_runs(tmp_path):
    out = tmp_path / "cut"
    # 1. SIGINT (Ctrl-C) during a step: the ranks finish it, save it, and the command says so last,
    # exit 130
    rc, text = interrupt(
        start_cli([*RUN, "--steps", str(LONG), "--output_dir", str(out)], tmp_path / "a.log"),
        out,
        tmp_path / "a.log",
        signal.SIGINT,
        2,
    )
    k = read_metrics(out)[-1]["step"]
    assert rc == 130, text[-3000:]
    saved = ckpt_root(out) / f"step{k}"
    assert last_line(text) == (
        f"stopped by SIGINT at step {k} of {LONG}: saved {saved}; the same command with "
        f"--resume continues it"
    )
    assert (
        "Traceback" not in text
        and "SignalException" not in text
        and "KeyboardInterrupt" not in text
    )
    assert read_latest(ckpt_root(out)) == f"step{k}" and k < LONG
    # 2. resumed, then SIGTERM: the same at a later step m, exit 143
    rc, text = interrupt(
        start_cli(
            [*RUN, "--steps", str(LONG), "--resume", "--output_dir", str(out)], tmp_path / "b.log"
        ),
        out,
        tmp_path / "b.log",
        signal.SIGTERM,
        k + 2,
    )
    m = read_metrics(out)[-1]["step"]
    assert rc == 143 and last_line(text).startswith(
        f"stopped by SIGTERM at step {m} of {LONG}: saved "
    ), text[-3000:]
    assert read_latest(ckpt_root(out)) == f"step{m}" and k + 2 <= m < LONG
    # 3. the uninterrupted run of m steps: the same losses, bit for bit (fp32 ZeRO-3 on CPU)
    straight = tmp_path / "straight"
    res = run_cli(
        ["train", "--nproc", "2", *RUN, "--steps", str(m), "--output_dir", str(straight)],
        output_dir=straight,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    cut = read_metrics(out)
    assert [r["step"] for r in cut] == list(range(1, m + 1))
    assert [r["loss"] for r in cut] == [r["loss"] for r in read_metrics(straight)]


def _script_env(**extra):
    env = {
        k: v
        for k, v in cpu_env().items()
        if k not in ("NGPU", "CONFIG", "DRY_RUN", "ACCELERATE_CONFIG", "DS_CONFIG", "MASTER_PORT")
    }
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


# the committed config's 36-layer placement does not fit the tiny model's 2 layers (the default
# placement), and its planned world of 8 is not these 2 processes (parallel.nodes / gpus_per_node
# cleared)
SCRIPT_ARGS = [*RUN, "--placement", "null", "--nodes", "null", "--gpus_per_node", "null"]
LAUNCHERS = {
    "ds-longctx train": lambda out: (
        [
            sys.executable,
            "-m",
            "ds_longctx.cli",
            "train",
            "--nproc",
            "2",
            *RUN,
            "--steps",
            str(10 * LONG),
            "--output_dir",
            str(out),
        ],
        cpu_env(),
    ),
    "torchrun": lambda out: (
        torchrun_cmd(
            2,
            ["ds_longctx.train", *RUN, "--steps", str(10 * LONG), "--output_dir", str(out)],
            module=True,
        ),
        cpu_env(),
    ),
    "deepspeed": lambda out: (
        [
            "bash",
            "launch/deepspeed.sh",
            *SCRIPT_ARGS,
            "--steps",
            str(10 * LONG),
            "--output_dir",
            str(out),
        ],
        _script_env(NGPU="2", MASTER_PORT=str(free_port())),
    ),
    "accelerate launch": lambda out: (
        [
            "bash",
            "launch/accelerate.sh",
            *SCRIPT_ARGS,
            "--steps",
            str(10 * LONG),
            "--output_dir",
            str(out),
        ],
        _script_env(NGPU="2", MASTER_PORT=str(free_port())),
    ),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_sigkill_of_the_launchers_process_group_leaves_no_worker_alive(launcher, tmp_path):
    """torchrun (also inside `ds-longctx train` and `accelerate launch`) starts its workers in their
    own sessions: killing the launcher's group left them training on (run/stops.watch_launcher)."""
    out, log = tmp_path / "run", tmp_path / "log.txt"
    cmd, env = LAUNCHERS[launcher](out)
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    workers = []
    try:
        wait_for_steps(proc, out, 1, log)
        workers = [worker(proc, 0), worker(proc, 1)]
        os.killpg(proc.pid, signal.SIGKILL)
        t0 = time.time()
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, (
            f"{len(alive)} worker(s) alive {time.time() - t0:.0f} s after the launcher's group was "
            f"killed:\n{log.read_text()[-3000:]}"
        )
    finally:
        for w in workers:
            if w.is_running():
                w.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_ctrl_c_through_a_pipe_whose_reader_dies_saves_and_the_stop_line_is_in_the_runs_log(
    tmp_path,
):
    """`ds-longctx train ... | cat`, Ctrl-C to the terminal's group: the reader dies with the
    launcher's signal, the ranks' writes to the dead pipe end nothing, the step is saved and the
    stop line is train.log's last."""
    out = tmp_path / "piped"
    reader = subprocess.Popen(
        ["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, process_group=0
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ds_longctx.cli",
            "train",
            "--nproc",
            "1",
            *RUN[:4],
            "--dtype",
            "fp32",
            "--steps",
            str(10 * LONG),
            "--output_dir",
            str(out),
        ],
        env=cpu_env(),
        cwd=ROOT,
        stdout=reader.stdin,
        stderr=subprocess.STDOUT,
        process_group=reader.pid,
    )
    reader.stdin.close()
    try:
        wait_for_steps(proc, out, 1, out / "train.log")
        os.killpg(
            reader.pid, signal.SIGINT
        )  # what a terminal's Ctrl-C does: the whole foreground group
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.kill()
    text = (out / "train.log").read_text()
    k = read_metrics(out)[-1]["step"]
    assert reader.wait() == -signal.SIGINT and rc == 130, text[-3000:]
    assert last_line(text) == (
        f"stopped by SIGINT at step {k} of {10 * LONG}: saved {ckpt_root(out) / f'step{k}'}; "
        f"the same command with --resume continues it"
    )
    assert read_latest(ckpt_root(out)) == f"step{k}" and "BrokenPipeError" not in text
    assert (
        "_ds_longctx" not in (ckpt_root(out) / f"step{k}" / "config.json").read_text()
    )  # no key of ours
    assert (
        "weights random init (no checkpoint); tokenizer none (synthetic data or token ids); output "
        f"also in {out / 'train.log'}"
        in text
        and f"TensorBoard events in {out / 'tensorboard'}" in text
    )
