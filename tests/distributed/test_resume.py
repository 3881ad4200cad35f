"""Checkpoint and resume on CPU (ZeRO-3, 2 gloo processes, SP=2, fp32, a JSONL corpus through the
datasets pipeline): a run cut in two and resumed gives the straight run's losses and weights
exactly; SIGTERM saves and exits 0; a resume with another layout, a damaged checkpoint and a NaN
loss stop with a message and change nothing."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import ckpt_root
from ds_longctx.checkpoint.paths import read_latest
from tests.helpers import (
    ROOT,
    assert_saved_size,
    checkpoint_weights,
    cpu_env,
    read_metrics,
    rel_err,
    run_cli,
    start,
    text_run_args,
    torchrun,
    wait_for_steps,
    worker,
)

pytestmark = pytest.mark.slow


def train(nproc, args):
    return torchrun(nproc, ["ds_longctx.train", *args], module=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The straight 6-step run (saved at steps 4 and 6) and the 3 + resumed 3 run (saved at 3 and
    6); module-scoped: the refusal and resume-change tests reuse its checkpoints."""
    d = tmp_path_factory.mktemp("resume")
    base = text_run_args(d / "data")
    straight, cut = d / "straight", d / "cut"
    train(2, [*base, "--steps", "6", "--save_every", "4", "--output_dir", str(straight)])
    train(2, [*base, "--steps", "3", "--save_every", "3", "--output_dir", str(cut)])
    first = read_metrics(cut)
    train(2, [*base, "--steps", "6", "--resume", "--save_every", "3", "--output_dir", str(cut)])
    return {"base": base, "straight": straight, "cut": cut, "first": first}


def test_resume_gives_the_straight_runs_losses_and_weights(runs):
    straight, cut = read_metrics(runs["straight"]), read_metrics(runs["cut"])
    assert [r["step"] for r in cut] == [1, 2, 3, 4, 5, 6]  # appended to the same metrics.jsonl
    assert cut[:3] == runs["first"]
    assert [r["loss"] for r in cut] == [
        r["loss"] for r in straight
    ]  # fp32 ZeRO-3 on CPU: bit-identical
    a, b = checkpoint_weights(runs["straight"], "step6"), checkpoint_weights(runs["cut"], "step6")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    root = ckpt_root(runs["cut"])
    assert read_latest(root) == "step6" and not list(root.glob(".tmp-*"))
    meta = json.loads((root / "step6" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["run"]["world_size"] == 2 and meta["data"]["kind"] == "files"


def test_a_saved_checkpoint_is_the_size_preflight_counts(runs):
    """Full fine-tuning: 12 bytes per parameter (plan/planner.disk_checkpoint_bytes; LoRA:
    tests/distributed/
    test_lora.py), the free-space check's unit."""
    assert_saved_size(ckpt_root(runs["straight"]) / "step6")


def test_resume_that_changes_the_global_batch_is_refused_and_changes_nothing(runs):
    """2 processes at sp_size 1 (dp 2) would train 2 sequences a step where the checkpoint trained
    1; another layout with the same batch reshards (tests/distributed/test_reshard.py)."""
    cut = runs["cut"]
    before = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in cut.rglob("*"))
    args = [a if a != "2" else "1" for a in runs["base"]]  # --sp_size 1
    res = run_cli(
        ["train", *args, "--nproc", "2", "--steps", "9", "--resume", "--output_dir", str(cut)]
    )
    assert res.returncode == 2
    for frag in (
        "trained 1 sequences a step (dp 1 x micro_batch 1 x grad_accum 1)",
        "this run trains 2 (dp 2",
        "choose a dp that divides 1",
        "--allow_batch_change true",
    ):
        assert frag in res.stderr, res.stderr[-3000:]
    assert (
        sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in cut.rglob("*")) == before
    )


def with_value(args: list, key: str, value: str) -> list:
    """`args` with option `key` set to `value` (replaced where given: an option given twice is
    refused)."""
    out = list(args)
    if key in out:
        out[out.index(key) + 1] = value
        return out
    return [*out, key, value]


@pytest.mark.parametrize(
    "key, value, says",
    [("--dtype", "bf16", "model.dtype 'fp32' -> 'bf16'"), ("--seed", "7", "train.seed 0 -> 7")],
)
def test_resume_that_changes_the_model_or_data_order_is_refused_before_any_worker(
    runs, tmp_path, key, value, says
):
    """Refused by `ds-longctx train` itself (preflight, no worker started), exit 2, the reason in
    the last line."""
    t0 = time.time()
    args = with_value(runs["base"], key, value)
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *args,
            "--steps",
            "9",
            "--resume",
            "--output_dir",
            str(runs["cut"]),
        ],
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"refused before start: resume: this run changes {says} from checkpoint "
    ), last
    assert last.endswith(
        "resume with the checkpoint's values (its run.yaml) or start a new output_dir"
    )
    assert (
        "torch.distributed.run" not in res.stderr and "[rank" not in res.stderr
    )  # no worker started
    assert time.time() - t0 < 60
    assert [r["step"] for r in read_metrics(runs["cut"])] == [1, 2, 3, 4, 5, 6]


def test_resume_with_a_new_lr_and_schedule_applies_them_and_lists_them_in_one_line(runs, tmp_path):
    """lr 1e-3 -> 5e-4 and warmup_steps 0 -> 2 at checkpoint step3 (saved without a scheduler): step
    4 runs at the lr the new schedule gives it (warm-up over: 5e-4), from the same weights and Adam
    moments as the straight run's step 4, so its update is exactly half the straight run's; the
    metrics say 5e-4; one log line lists the changes."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(runs["cut"], cut)
    args = with_value(with_value(runs["base"], "--lr", "5e-4"), "--warmup_steps", "2")
    res = train(
        2,
        [
            *args,
            "--steps",
            "4",
            "--resume",
            "--resume_tag",
            "step3",
            "--save_every",
            "1",
            "--output_dir",
            str(cut),
        ],
    )
    lines = [x for x in (res.stdout + res.stderr).splitlines() if "resume: changed since" in x]
    assert len(lines) == 1 and lines[0].endswith(
        "resume: changed since step 3: steps 3 -> 4, lr 0.001 -> 0.0005, "
        "warmup_steps 0 -> 2, save_every 3 -> 1"
    ), lines
    rows, straight = read_metrics(cut), read_metrics(runs["straight"])
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[3]["loss"] == straight[3]["loss"]
    assert (rows[2]["lr"], rows[3]["lr"]) == (1e-3, 5e-4)
    w3, w4 = checkpoint_weights(runs["cut"], "step3"), checkpoint_weights(runs["straight"], "step4")
    new = checkpoint_weights(cut, "step4")
    # to fp32 rounding: weights near 1 (the norms') move by ~5e-4 a step, 1e-7 their ulp; lr kept:
    # 1.0
    for k in w3:
        assert rel_err(new[k] - w3[k], 0.5 * (w4[k] - w3[k])) < 1e-3, k


def test_sigterm_on_one_rank_saves_and_exits_cleanly(tmp_path, runs):
    out, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start(2, [*runs["base"], "--steps", "100000", "--output_dir", str(out)], log)
    try:
        wait_for_steps(proc, out, 2, log)
        worker(proc, 1).send_signal(
            signal.SIGTERM
        )  # one rank only: the ranks agree through an all-reduce
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, log.read_text()[-4000:]
    done = len(read_metrics(out))
    tag_dir, meta = resume.find_checkpoint(ckpt_root(out))  # complete, every file at its size
    assert meta["step"] == done and tag_dir.name == f"step{done}"
    assert (tag_dir / "rng_rank00000.pt").exists() and (tag_dir / "rng_rank00001.pt").exists()


def test_two_resumes_at_once_the_second_is_refused_and_the_first_goes_on(runs, tmp_path):
    """One writer per run. While `ds-longctx train --resume` runs (its launcher holds the lock), a
    second `ds-longctx train --resume` of the same run exits 2 before any worker, naming the first,
    and a direct torchrun of it is refused by its workers the same way; the first is not disturbed
    (each step once in metrics.jsonl, its SIGTERM save whole). Then metrics.jsonl turns unwritable
    (a link into /sys, where not even root creates a file): the run goes on, keeps the lines and its
    last line names them, printed above it; no traceback, no line lost."""
    import os
    import shutil

    out, log = tmp_path / "run", tmp_path / "first.log"
    shutil.copytree(runs["cut"], out)
    args = [
        *runs["base"],
        "--steps",
        "100000",
        "--resume",
        "--save_every",
        "100000",
        "--output_dir",
        str(out),
    ]
    with open(log, "w") as f:
        first = subprocess.Popen(
            [sys.executable, "-m", "ds_longctx.cli", "train", "--nproc", "2", *args],
            env=cpu_env(),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_steps(first, out, 8, log)  # 6 lines came with the copy
        second = run_cli(["train", "--nproc", "2", *args], timeout=300)
        last = [line for line in second.stderr.splitlines() if line.strip()][-1]
        assert second.returncode == 2 and last.startswith(
            f"refused before start: output_dir={str(out)!r} is in use by pid {first.pid} on host "
        ), second.stderr[-3000:]
        assert "torch.distributed.run" not in second.stderr and "Traceback" not in second.stderr
        with pytest.raises(AssertionError) as direct:
            torchrun(2, ["ds_longctx.train", *args], module=True)
        assert f"refused before start: output_dir={str(out)!r} is in use by pid {first.pid}" in str(
            direct.value
        )
        steps = [r["step"] for r in read_metrics(out)]
        assert steps == list(range(1, len(steps) + 1))  # the refused ones wrote nothing
        metrics = out / "metrics.jsonl"
        os.link(metrics, tmp_path / "kept.jsonl")  # every line written until the swap below
        os.symlink("/sys/ds_longctx_metrics.jsonl", tmp_path / "link")
        os.replace(tmp_path / "link", metrics)
        deadline = time.time() + 120
        while "line and later ones are kept" not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=180)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    text = log.read_text()
    last = [line for line in text.replace("\r", "\n").splitlines() if line.strip()][-1]
    done = resume.find_checkpoint(ckpt_root(out))[1]["step"]  # complete, every file at its size
    printed = [
        json.loads(line.partition(" line: ")[2])
        for line in text.splitlines()
        if line.startswith("[ds_longctx] unwritten metrics.jsonl line: ")
    ]
    kept = [r["step"] for r in read_metrics(tmp_path, "kept.jsonl")]
    assert rc == 143 and kept + [r["step"] for r in printed] == list(range(1, done + 1)), text[
        -3000:
    ]
    assert last.startswith(
        f"stopped by SIGTERM at step {done} of 100000: saved {ckpt_root(out)}/step"
        f"{done}; the same command with --resume continues it; {len(printed)} line(s) of "
        f"metrics.jsonl (steps {kept[-1] + 1}-{done}) were not written ("
    ), last
    assert f"{metrics} (" in last and last.endswith(") and are printed above"), last
    assert "Traceback" not in text


def test_nan_loss_stops_with_the_step(tmp_path):
    """A model whose RMSNorm takes the root of a negative number (rms_norm_eps -1): the loss is NaN
    at step 1. Under `ds-longctx train` the stop's line is the last one, exit 1, without torchrun's
    failure report. (An absurd lr, which made the NaN here before, is refused when the config is
    read.)"""
    out = tmp_path / "run"
    model = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text()) | {
        "rms_norm_eps": -1.0
    }
    (tmp_path / "nan.json").write_text(json.dumps(model))
    t0 = time.time()
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            "--model",
            str(tmp_path / "nan.json"),
            "--seq_len",
            "64",
            "--dtype",
            "fp32",
            "--steps",
            "5",
            "--output_dir",
            str(out),
        ],
        timeout=300,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped: loss is nan at step 1, before its optimizer step"), res.stderr[
        -3000:
    ]
    assert "Lower lr (now 0.0001)" in last and "ChildFailedError" not in res.stderr
    assert not (out / "metrics.jsonl").exists()
    assert time.time() - t0 < 120


def test_metrics_log_appends_on_resume_and_feeds_tensorboard(tmp_path, monkeypatch):
    """MetricsLog without processes: a resumed run drops lines past its checkpoint and appends; a
    fresh run keeps an old file aside; TensorBoard gets the scalars when torch.utils.tensorboard
    imports (faked here: tensorboard is not a dependency)."""
    import types

    from ds_longctx.run.metrics_log import MetricsLog

    written = []

    class Writer:
        def __init__(self, logdir, purge_step=None):
            written.append(("open", logdir, purge_step))

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def close(self):
            written.append(("close",))

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer)
    )
    row = {"loss": 1.0, "tokens_per_s": 2.0, "lr": 0.1, "seconds": 0.5}
    log = MetricsLog(tmp_path, 0, report_to="auto", enabled=True)
    for s in (1, 2, 3, 4):
        log.write({"step": s, **row})
    log.close()
    resumed = MetricsLog(
        tmp_path, 2, report_to="auto", enabled=True
    )  # checkpoint at step 2; steps 3-4 redone
    resumed.write({"step": 3, **row, "loss": 9.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [
        (1, 1.0),
        (2, 1.0),
        (3, 9.0),
    ]
    assert ("open", str(tmp_path / "tensorboard"), 3) in written and (
        "train/loss",
        9.0,
        3,
    ) in written
    MetricsLog(
        tmp_path, 0, report_to="none", enabled=True
    )  # a fresh run: the old file is kept aside
    assert (
        not (tmp_path / "metrics.jsonl").exists()
        and len(list(tmp_path.glob("metrics.*.jsonl"))) == 1
    )


def test_metrics_log_writes_eval_lines_and_the_curve_and_resumes_both(tmp_path, monkeypatch):
    """Eval lines go to metrics.jsonl beside the train lines (train lines unchanged) and to
    TensorBoard as eval/loss; the curve to eval_curve.jsonl, which a resume cuts at its checkpoint
    like metrics.jsonl."""
    import types

    from ds_longctx.run.evaluate import EvalResult
    from ds_longctx.run.metrics_log import MetricsLog

    written = []

    class Writer:
        def __init__(self, logdir, purge_step=None):
            pass

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer)
    )
    row = {"loss": 1.0, "tokens_per_s": 2.0, "lr": 0.1, "seconds": 0.5}
    log = MetricsLog(tmp_path, 0, report_to="auto", enabled=True)
    for s in (1, 2, 3, 4):
        log.write({"step": s, **row})
        if s % 2 == 0:
            log.write_eval(
                EvalResult(
                    loss=3.0 + s,
                    tokens=10,
                    rows=2,
                    edges=[0, 2, 4],
                    bucket_loss=[1.0, None],
                    bucket_tokens=[10, 0],
                    seconds=0.1,
                ),
                s,
            )
    rows = read_metrics(tmp_path)
    assert [(r["step"], "loss" in r, r.get("eval_loss")) for r in rows] == [
        (1, True, None),
        (2, True, None),
        (2, False, 5.0),
        (3, True, None),
        (4, True, None),
        (4, False, 7.0),
    ]
    assert rows[0] == {"step": 1, **row}
    assert ("eval/loss", 7.0, 4) in written and ("train/loss", 1.0, 4) in written
    curve = read_metrics(tmp_path, "eval_curve.jsonl")
    assert [(c["step"], c["edges"], c["loss"], c["tokens"]) for c in curve] == [
        (2, [0, 2, 4], [1.0, None], [10, 0]),
        (4, [0, 2, 4], [1.0, None], [10, 0]),
    ]
    MetricsLog(
        tmp_path, 3, report_to="none", enabled=True
    )  # resumed from step 3: the step-4 lines go
    assert [c["step"] for c in read_metrics(tmp_path, "eval_curve.jsonl")] == [2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 2, 3]
    MetricsLog(
        tmp_path, 0, report_to="none", enabled=True
    )  # a fresh run keeps the old curve aside too
    assert (
        not (tmp_path / "eval_curve.jsonl").exists()
        and len(list(tmp_path.glob("eval_curve.*.jsonl"))) == 1
    )


def test_metrics_lines_the_file_cannot_take_are_kept_retried_and_never_lost(
    tmp_path, monkeypatch, caplog, capsys
):
    """A full disk, then a permission, under metrics.jsonl (os.write faked: a few bytes, then the
    error): the file gets whole lines or none, one warning says why, the kept lines go in at the
    next write that works, and what is still unwritten at the end is printed and named in the run's
    last line (`close`'s note)."""
    import errno
    import logging
    import os

    from ds_longctx.parallel.disk import mount_point
    from ds_longctx.run.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, 0, report_to="none", enabled=True)
    log.write({"step": 1, "loss": 1.0})
    write, failing = os.write, {"errno": errno.ENOSPC}

    def flaky(fd, data):
        if failing["errno"] and b'"step"' in bytes(data):
            write(fd, bytes(data)[:5])
            raise OSError(failing["errno"], os.strerror(failing["errno"]))
        return write(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    path = tmp_path / "metrics.jsonl"
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        log.write({"step": 2, "loss": 2.0})
        log.write({"step": 3, "loss": 3.0})
        assert [r["step"] for r in read_metrics(tmp_path)] == [
            1
        ]  # the bytes of a failed write are cut back
        failing["errno"] = 0
        log.write({"step": 4, "loss": 4.0})
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(
        f"metrics: no space left on {mount_point(path)} writing {path} ("
    ) and said[0].endswith(
        "free); step 2's line and later ones are kept and written once the file takes them"
    )
    assert said[1:] == [f"metrics: {path} takes lines again: the 3 kept (steps 2-4) written"]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    failing["errno"] = errno.EACCES  # unwritable until the end
    log.write({"step": 5, "loss": 5.0})
    note = log.close()
    assert note == (
        f"1 line(s) of metrics.jsonl (steps 5-5) were not written (no permission to write {path} "
        f"(Permission denied)) and are printed above"
    )
    assert (
        '[ds_longctx] unwritten metrics.jsonl line: {"step": 5, "loss": 5.0}'
        in capsys.readouterr().err
    )
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_resume_from_a_checkpoint_that_does_not_load_is_refused_on_every_rank(runs, tmp_path):
    """A partition file that kept its size but not its content (only rank 1's): the ranks share
    their verdicts and all stop with rank 1's message, instead of rank 0 training on alone or
    hanging."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(runs["cut"], cut)
    part = ckpt_root(cut) / "step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(part.read_bytes())
    data[-200:] = bytes(200)  # the zip's central directory: torch.load cannot open it
    part.write_bytes(bytes(data))
    t0 = time.time()
    with pytest.raises(AssertionError) as failed:  # a rank's non-zero exit, each rank's output
        train(
            2,
            [
                *runs["base"],
                "--steps",
                "9",
                "--resume",
                "--collective_timeout_s",
                "30",
                "--output_dir",
                str(cut),
            ],
        )
    err = str(failed.value)
    assert "could not be loaded (rank 1: zero_pp_rank_1_mp_rank_00_optim_states.pt" in err, err[
        -3000:
    ]
    assert "use an earlier tag (resume_tag)" in err
    assert time.time() - t0 < 120
    assert [r["step"] for r in read_metrics(cut)] == [1, 2, 3, 4, 5, 6]
