"""Shared test helpers: launching multi-process (gloo) workers and the plain-HF reference model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env() -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def gpu_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="4", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def torchrun(nproc: int, args: list[str], timeout: int = 600, module: bool = False,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `args` (a script path + its args, or `-m mod ...` when module) under torchrun on CPU/gloo."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *(["-m"] if module else []), *args]
    res = subprocess.run(cmd, env=env or cpu_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if res.returncode and "terminate called without an active exception" in res.stderr:
        # Seen once in CI (2026-11-30, the suite's first multi-process test, rank 1 SIGABRT at start-up, passed
        # on rerun); cause not found. One retry on that exact signature only, on a fresh port; see issue notes.
        cmd[cmd.index("--master_port") + 1] = str(free_port())
        res = subprocess.run(cmd, env=env or cpu_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if res.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")
    return res


def read_metrics(output_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(output_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]


def rel(a, b) -> float:
    import torch
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def reference_model(seed: int = 0, model: str = "qwen3-tiny", dtype=None, device: str = "cpu"):
    """A plain HF Qwen3 (no DeepSpeed, no Ulysses) with the same deterministic weights as the engine
    on the same device type (init_weights draws from a generator of the parameter's device)."""
    import torch
    from ds_longctx.run.model import init_weights, load_hf_config, model_class
    cfg = load_hf_config(model)
    cfg._attn_implementation = "eager"
    m = model_class(cfg)(cfg).to(device)
    init_weights(m, seed, cfg.initializer_range)
    if dtype is not None:
        m = m.to(dtype)
    return m.train()


@pytest.fixture
def tmp_out(tmp_path):
    return tmp_path
