"""Suite-wide set-up: one torch thread per pytest process; DeepSpeed's CPU Adam op, built once, in
the background.

DeepSpeedCPUAdam is JIT-built by torch's cpp_extension on first use (about 100 s of one core on the
2-core CI machine) into torch's extension cache (TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions), where every later process loads it in a second. The README's test
command builds it after the install (`python -m tests.build_ops`); where that did not run and a
collected test is marked `cpu_adam`, the build starts as soon as collection ends, at the lowest CPU
priority, so it runs on whatever core the other tests leave idle; the marked tests run last and wait
for it (a cached build loads at once). Several pytest processes (xdist) may start it together:
torch's lock on the extension directory makes one build and the others wait and load it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One intra-op thread in every pytest process, set before torch is imported: the suite runs two
# pytest processes and their children on two cores, where torch's default of a thread per core makes
# its OpenMP threads spin against each other and a small test runs several times slower.
# Subprocesses get the same from helpers.cpu_env.
os.environ.setdefault("OMP_NUM_THREADS", "1")

BUILD = ["-m", "tests.build_ops"]  # prints "cpu_adam ready" once built
BUILD_TIMEOUT_S = 1200
_build: dict = {}


def _start_build() -> None:
    from tests.helpers import ROOT, cpu_env

    log = Path(tempfile.mkdtemp(prefix="cpu_adam-")) / "build.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, *BUILD],
            env=cpu_env(),
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(19),
            start_new_session=True,
        )
    _build.update(proc=proc, log=log)


def pytest_configure(config):
    if (
        "torch" in sys.modules
    ):  # imported before this file (a plugin): the environment came too late
        sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The tests marked `slow` (multi-process) first, so that pytest-xdist hands out its longest
    modules before the short ones fill in around them; the tests marked `cpu_adam` last, so that the
    build has the whole run to finish. Stable order otherwise."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("cpu_adam") is not None,
            item.get_closest_marker("slow") is None,
        )
    )


def pytest_collection_finish(session):
    if session.config.option.collectonly or _build:
        return
    if any(item.get_closest_marker("cpu_adam") for item in session.items):
        _start_build()


def pytest_sessionfinish(session):
    """A build still running (its tests deselected by -x, or failed first) is interrupted: SIGINT
    lets torch release its lock on the extension directory (a killed build would leave it, and every
    later load would wait on it)."""
    proc = _build.get("proc")
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="session")
def cpu_adam():
    """DeepSpeedCPUAdam is built and in torch's extension cache (the background build waited
    for)."""
    if not _build:
        _start_build()
    proc = _build["proc"]
    try:
        code = proc.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    log = _build["log"].read_text(errors="replace")
    assert code == 0 and "cpu_adam ready" in log, (
        f"building DeepSpeed's CPU Adam failed ({code}):\n{log[-4000:]}"
    )
    return os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")


@pytest.fixture(autouse=True)
def _cpu_adam_for_marked(request):
    if request.node.get_closest_marker("cpu_adam"):
        request.getfixturevalue("cpu_adam")


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as `ds-longctx models get` converts it, from its machine-wide cache
    (converted there once: checkpoint/real_models.ensure_cached)."""
    from ds_longctx.checkpoint.real_models import ensure_cached

    return ensure_cached("smollm2-135m-instruct")
