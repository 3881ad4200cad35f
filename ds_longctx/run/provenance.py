"""A result row's provenance: the tree's commit, the device and the date (rehearsal rows and recall
rows)."""

from __future__ import annotations

# torch is imported where the GPU is named: importing this module does not load it.
import os
import subprocess
import time
from pathlib import Path

import psutil

COMMIT_ENV = (
    "DS_LONGCTX_COMMIT"  # the commit to record where the checkout's .git is not the tree's (a copy)
)


def commit() -> str:
    """The tree's commit: $DS_LONGCTX_COMMIT, else `git rev-parse` here (+ `-dirty` with uncommitted
    changes)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("-dirty" if dirty else "")) if sha else "unknown"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def device_name() -> str:
    """The GPU's name, or `cpu (N cores)`."""
    import torch

    return (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"cpu ({psutil.cpu_count()} cores)"
    )
