"""Helpers for the run-level distributed tests (resume, SIGTERM, killed rank): start `ds_longctx.train` under
torchrun in the background, wait for its metrics, find and signal one rank's worker process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, cpu_env, free_port, read_metrics
from tests.data_helpers import documents, make_tokenizer, write_jsonl


def text_run_args(d: Path) -> list[str]:
    """A small JSONL corpus + word-level tokenizer under `d`; the train options that read it (fp32, SP=2)."""
    if not (d / "c.jsonl").exists():
        d.mkdir(parents=True, exist_ok=True)
        make_tokenizer(d / "tok")
        write_jsonl(d / "c.jsonl", documents(120, seed=1))
    return ["--model", "qwen3-tiny", "--seq_len", "64", "--dtype", "fp32", "--lr", "1e-3", "--sp_size", "2",
            "--data", str(d / "c.jsonl"), "--tokenizer", str(d / "tok"), "--data_cache_dir", str(d / "cache")]


def train_cmd(nproc: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), "-m", "ds_longctx.train", *args]


def start(nproc: int, args: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "w")
    return subprocess.Popen(train_cmd(nproc, args), env=cpu_env(), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_for_steps(proc: subprocess.Popen, out: Path, n: int, log: Path, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and len(read_metrics(out)) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended ({proc.returncode}) before {n} steps:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {n} steps within {timeout}s:\n{log.read_text()[-4000:]}")


def worker(proc: subprocess.Popen, rank: int):
    """The psutil.Process of the torchrun worker with RANK == rank."""
    import psutil
    deadline = time.time() + 30
    while time.time() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "ds_longctx.train" in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no worker with RANK={rank}")
