"""Ctrl-C during a checkpoint save, on CPU (2 gloo processes, SP=2, fp32, a checkpoint of about half
a GB): the launcher waits for the save, a deliberate repeat abandons it, and the previous checkpoint
stays resumable. Its own module so that it runs beside test_stops.py's (pytest-xdist's loadscope
keeps a module on one worker)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import ckpt_root
from ds_longctx.checkpoint.paths import read_latest
from ds_longctx.checkpoint.save import SAVE_PAUSE_ENV
from tests.distributed.test_stops import RUN, last_line
from tests.helpers import ROOT, cpu_env, read_metrics, run_cli

pytestmark = pytest.mark.slow


def save_seconds_model(tmp_path):
    """A Qwen3 config.json whose ZeRO-3 fp32 checkpoint is ~0.5 GB: a save of seconds on CPU."""
    cfg = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text())
    cfg.update(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, vocab_size=32000, head_dim=64
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "config.json"


def test_repeated_sigint_during_a_save_waits_then_a_deliberate_one_abandons_it(tmp_path):
    """Ctrl-C mashed while step 2 is being saved (~0.5 GB, held open 30 s by the debug pause with
    every file written): the launcher forwards one stop and waits; a press after its warning
    abandons the save (workers killed), step 1 stays complete and untouched, and the resumed run
    (the partial save set aside) trains step 2 again to the loss it had, bit for bit."""
    run = ["--model", str(save_seconds_model(tmp_path)), *RUN[2:]]
    out, log = tmp_path / "cut", tmp_path / "cut.log"
    env = cpu_env() | {SAVE_PAUSE_ENV: "30@2"}  # step 1 saves at once
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ds_longctx.cli",
                "train",
                "--nproc",
                "2",
                *run,
                "--steps",
                "3",
                "--save_every",
                "1",
                "--output_dir",
                str(out),
            ],
            env=env,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(proc, log, "checkpoint: saving step 2")
        for _ in range(4):  # mashed: one stop
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
        time.sleep(0.6)
        proc.send_signal(signal.SIGINT)  # told what runs
        wait_for_line(proc, log, "the workers are saving step 2; waiting for them")
        time.sleep(0.6)
        proc.send_signal(signal.SIGINT)  # deliberate: abandoned
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text, root = log.read_text(), ckpt_root(out)
    assert (
        rc == 130
        and "Traceback" not in text
        and text.count("stopping at the end of this step") == 1
    ), text[-3000:]
    assert last_line(text) == (
        f"stopped by SIGINT, then abandoned (saving step 2): the last complete checkpoint, "
        f"{root / 'step1'}, is unchanged: --resume continues it"
    ), text[-2000:]
    assert read_latest(root) == "step1" and resume.find_checkpoint(root)[1]["step"] == 1
    straight = [
        r["loss"] for r in read_metrics(out)
    ]  # steps 1 and 2, trained before the save was abandoned
    res = run_cli(
        ["train", "--nproc", "2", *run, "--steps", "3", "--resume", "--output_dir", str(out)]
    )
    assert res.returncode == 0 and "a save that never completed" in res.stderr, res.stderr[-3000:]
    resumed = [r["loss"] for r in read_metrics(out)]
    assert len(straight) == 2 and resumed[:2] == straight and len(resumed) == 3


def wait_for_line(proc, log, line, timeout=240):
    deadline = time.time() + timeout
    while line not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
