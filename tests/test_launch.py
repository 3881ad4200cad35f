"""launch/deepspeed.sh and launch/accelerate.sh: env-var defaults, "$@" passthrough, dry run, and
real 2-process CPU runs of each launcher on the tiny model (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ds_longctx.plan import write
from tests.helpers import ROOT, cpu_env, free_port, read_metrics

DEFAULT_CONFIG = "ds_configs/qwen3-8b_1m_8x141gb/run.yaml"
# the committed config places Qwen3-8B's 36 layers one by one: the tiny model (2 layers) takes the
# default placement
TINY = [
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "64",
    "--steps",
    "2",
    "--sp_size",
    "2",
    "--dtype",
    "fp32",
    "--placement",
    "null",
    "--nodes",
    "null",
    "--gpus_per_node",
    "null",
]


def script_env(**extra) -> dict:
    """The caller's environment with the launcher variables removed (so the scripts' defaults apply)
    and this venv's bin first on PATH (deepspeed, accelerate)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NGPU", "CONFIG", "DRY_RUN", "MASTER_PORT", "ACCELERATE_CONFIG", "DS_CONFIG")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def launch(script: str, args: list, env: dict, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", f"launch/{script}", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_deepspeed_dry_run_defaults_and_passthrough():
    res = launch(
        "deepspeed.sh", ["--steps", "10", "--output_dir", "runs/a b"], script_env(DRY_RUN="1")
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"deepspeed --num_gpus 8 --module ds_longctx.train --config {DEFAULT_CONFIG} "
        "--steps 10 --output_dir runs/a\\ b\n"
    )


def test_deepspeed_dry_run_env_overrides():
    cfg = "ds_configs/qwen3-8b_max_2x141gb/run.yaml"
    res = launch(
        "deepspeed.sh", [], script_env(DRY_RUN="1", NGPU="2", CONFIG=cfg, MASTER_PORT="29555")
    )
    assert (
        res.stdout
        == f"deepspeed --num_gpus 2 --master_port 29555 --module ds_longctx.train --config {cfg}\n"
    )


def test_accelerate_dry_run_defaults_and_passthrough():
    res = launch("accelerate.sh", ["--steps", "10"], script_env(DRY_RUN="1"))
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        "accelerate launch --config_file launch/accelerate.yaml --num_processes 8 "
        "--deepspeed_config_file ds_configs/qwen3-8b_1m_8x141gb/ds_config.json "
        f"-m ds_longctx.train --config {DEFAULT_CONFIG} --steps 10\n"
    )


def test_accelerate_dry_run_env_overrides():
    cfg = "ds_configs/qwen3-8b_max_4x80gb/run.yaml"
    res = launch(
        "accelerate.sh",
        ["--lr", "1e-5"],
        script_env(DRY_RUN="1", NGPU="4", CONFIG=cfg, MASTER_PORT="1"),
    )
    assert res.stdout == (
        "accelerate launch --config_file launch/accelerate.yaml --num_processes 4 "
        "--main_process_port 1 --deepspeed_config_file "
        "ds_configs/qwen3-8b_max_4x80gb/ds_config.json "
        f"-m ds_longctx.train --config {cfg} --lr 1e-5\n"
    )


@pytest.mark.parametrize("script", ["deepspeed.sh", "accelerate.sh"])
def test_missing_config_fails_fast(script):
    res = launch(script, [], script_env(DRY_RUN="1", CONFIG="no/such/run.yaml"))
    assert res.returncode == 2 and "CONFIG=no/such/run.yaml" in res.stderr and not res.stdout


def test_launch_accelerate_yaml_matches_the_generator():
    acc = yaml.safe_load((ROOT / "launch" / "accelerate.yaml").read_text())
    ds_file = acc["deepspeed_config"].pop("deepspeed_config_file")
    want = write.accelerate_config(8)
    want["deepspeed_config"].pop("deepspeed_config_file")
    assert (
        acc == want
        and (ROOT / ds_file).is_file()
        and ds_file == str(Path(DEFAULT_CONFIG).parent / "ds_config.json")
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", ["deepspeed.sh", "accelerate.sh"])
def test_two_cpu_processes_train(script, tmp_path):
    """The committed 8x141 GB config (no offload there) with the tiny model's overrides, 2 gloo
    ranks, SP=2."""
    env = script_env(
        **{
            k: v
            for k, v in cpu_env().items()
            if k
            in (
                "DS_ACCELERATOR",
                "OMP_NUM_THREADS",
                "PYTHONWARNINGS",
                "CUDA_VISIBLE_DEVICES",
                "PYTHONPATH",
            )
        },
        NGPU="2",
        MASTER_PORT=str(free_port()),
    )
    res = launch(script, TINY + ["--output_dir", str(tmp_path)], env, timeout=600)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 for r in rows)
    from ds_longctx.config import RunConfig

    run = RunConfig.load(
        tmp_path / "run.yaml"
    ).flat()  # what train.py ran: the config + the overrides
    assert (run["model"], run["sp_size"], run["seq_len"], run["dtype"]) == (
        "qwen3-tiny",
        2,
        64,
        "fp32",
    )


def test_detach_and_wait_follow_a_job_to_its_exit_status(tmp_path):
    env = script_env(RUN_DIR=str(tmp_path / "job"))
    job = ["bash", "-c", "echo started; printf 'step 1\\rstep 2\\r'; sleep 2; exit 3"]
    res = launch("detach.sh", job, env)
    assert res.returncode == 0 and "started:" in res.stdout, res.stderr
    # a second job into the same RUN_DIR while the first runs is refused (its log would be
    # overwritten)
    again = launch("detach.sh", ["true"], env)
    assert again.returncode == 2 and "still running" in again.stderr
    res = launch("wait.sh", ["30"], env)
    assert res.returncode == 3, res.stdout + res.stderr  # the job's own exit status
    # the progress bar's \r updates come out one per line
    assert res.stdout.splitlines()[:3] == ["started", "step 1", "step 2"]
    assert (tmp_path / "job" / "rc").read_text().strip() == "3"


def test_wait_says_still_running_and_no_job(tmp_path):
    env = script_env(RUN_DIR=str(tmp_path / "job"))
    missing = launch("wait.sh", ["1"], env)
    assert missing.returncode == 2 and "no job" in missing.stderr
    assert launch("detach.sh", ["sleep", "60"], env).returncode == 0
    pgid = int((tmp_path / "job" / "pid").read_text())
    try:
        res = launch("wait.sh", ["1"], env)
        assert res.returncode == 75 and "still running" in res.stdout
    finally:
        os.killpg(pgid, 9)  # what the script's header says: kill -- -PID stops the whole job
    res = launch("wait.sh", ["10"], env)
    # the kill took the wrapper that writes rc too: wait says the job is gone rather than waiting on
    assert res.returncode == 1 and "gone without an exit status" in res.stderr
