"""The environment a worker process starts with: the launcher's, with this project's defaults filled
in."""

from __future__ import annotations

# torch is imported where the environment needs to know about CUDA: the CLI imports this module
# without it.
import os

from ds_longctx.run.stops import STOP_GRACE_S


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def worker_env() -> dict:
    """This environment plus the workers' defaults (DS_ACCELERATOR, one OpenMP thread, no tokenizers
    threads, no warnings, torchrun's grace after a signal)."""
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cuda" if has_cuda() else "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(STOP_GRACE_S))
    return env
