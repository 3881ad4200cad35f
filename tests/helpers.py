"""The test toolbox: environments for subprocesses, the relative error, the tiny reference model,
the multi-process harness (torchrun on CPU/gloo, the `ds-longctx` CLI), the refusal check
(`refused`: a bad input stops before the engine and leaves output_dir as it was) and
benchmarks/bench_planner.py loaded as a module. The small local corpus (tokenizers, chat templates,
documents) is tests/corpus.py.

Heavy imports (torch, transformers, deepspeed) stay inside the functions, so importing this module
is cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ds_longctx.parallel.parallel_state import free_port  # noqa: F401 (the tests' rendezvous ports)
from tests.corpus import documents, make_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- environments
def cpu_env() -> dict:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        CUDA_VISIBLE_DEVICES="",
    )
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def gpu_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="4", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def gpus_here(most: int = 2) -> int:
    """The GPU tests' world size: every GPU here, `most` at most. A lever's test that is not about
    SP runs at SP = this (SP=2 on 2 GPUs, SP=1 on one), so a one-GPU machine still runs it."""
    import torch

    return min(most, torch.cuda.device_count())


def read_metrics(output_dir, name: str = "metrics.jsonl") -> list[dict]:
    """The JSON lines of `output_dir`/metrics.jsonl (or of another file there: eval_curve.jsonl)."""
    return [
        json.loads(line)
        for line in (Path(output_dir) / name).read_text().splitlines()
        if line.strip()
    ]


def checkpoint_weights(output_dir, tag: str) -> dict:
    """{name: fp32 tensor} of the ZeRO-3 checkpoint `tag` of a run's `output_dir` (DeepSpeed's
    zero_to_fp32)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from ds_longctx.checkpoint.resume import ckpt_root

    return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root(output_dir)), tag=tag)


# ----------------------------------------------------------------------------- numerics
def rel_err(a, b, norm: str = "fro") -> float:
    """The relative error of `a` against the reference `b` (tensors or numbers), computed in
    float64.

    norm="fro":         ||a - b|| / ||b|| (Frobenius); ||a|| when ||b|| == 0 (so 0 when both are
    zero). norm="max":         max|a - b| / max|b| (max|b| clamped at 1e-30): relative to the
    tensor's scale, so
                        near-zero elements do not dominate.
    norm="elementwise": max over elements of |a - b| / |b| (for references with no zero element).
    """
    import torch

    a = torch.as_tensor(a).detach().to(torch.float64)
    b = torch.as_tensor(b).detach().to(torch.float64)
    if norm == "fro":
        b_norm = b.norm()
        if b_norm == 0:
            return float(a.norm())
        return float((a - b).norm() / b_norm)
    if norm == "max":
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
    if norm == "elementwise":
        return float(((a - b).abs() / b.abs()).max())
    raise ValueError(f"norm={norm!r}: use 'fro', 'max' or 'elementwise'")


# ----------------------------------------------------------------------------- the tiny model
def tiny_config(attn: str = "sdpa", model: str = "qwen3-tiny"):
    """The HF config of the shipped `qwen3-tiny` geometry (2 layers, hidden 64, 8 query / 2 KV
    heads, vocab 512), or of another shipped `model` (`qwen3.5-tiny`: 3 gated DeltaNet layers and 1
    full), with attention implementation `attn`."""
    from ds_longctx.run.model import load_hf_config

    cfg = load_hf_config(model)
    cfg._attn_implementation = attn
    return cfg


def tiny_model(
    seed: int = 0, attn: str = "sdpa", dtype=None, device: str = "cpu", model: str = "qwen3-tiny"
):
    """A plain HF causal LM (no DeepSpeed, no Ulysses) of the `qwen3-tiny` geometry (or shipped
    `model`), in train mode, with the engine's deterministic weights for `seed` (`init_weights`: one
    draw per parameter name, from a generator of the parameter's device, so the same weights as an
    engine on the same device type, in every process)."""
    from ds_longctx.run.model import init_weights, model_class

    cfg = tiny_config(attn, model)
    model = model_class(cfg)(cfg).to(device)
    init_weights(model, seed, cfg.initializer_range)
    if dtype is not None:
        model = model.to(dtype)
    return model.train()


# ----------------------------------------------------------------------------- multi-process runs
def torchrun_cmd(
    nproc: int,
    args: list[str],
    module: bool = False,
    port: int | None = None,
    nodes: int = 1,
    node_rank: int = 0,
) -> list[str]:
    """The torchrun command line for `args` (a script path + its args, or a module + its args when
    `module`). `nodes` > 1: one "node" of several started on this machine (`--nnodes`,
    `--node_rank`, the c10d rendezvous of the generated launch.txt on a localhost `port`, which
    every node's command must share)."""
    if nodes == 1:
        rdzv = ["--master_addr", "127.0.0.1", "--master_port", str(port or free_port())]
    else:
        rdzv = [
            "--nnodes",
            str(nodes),
            "--node_rank",
            str(node_rank),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        *rdzv,
        *(["-m"] if module else []),
        *args,
    ]


def torchrun(
    nproc: int,
    args: list[str],
    module: bool = False,
    env: dict | None = None,
    timeout: int = 600,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run `args` on `nproc` processes (CPU/gloo unless `env` says otherwise), blocking;
    AssertionError with the output's tail when it fails. With the default environment the processes
    are forked from the pre-imported server of tests/forkrun.py (torchrun's worker environment,
    without its agent); with another `env`, or with DS_LONGCTX_TEST_TORCHRUN=1, under torchrun
    itself. `cwd`: the working directory (default the repository root)."""
    if env is None and os.environ.get("DS_LONGCTX_TEST_TORCHRUN") != "1":
        return _forked(nproc, args, module, timeout, cwd)
    cmd = torchrun_cmd(nproc, args, module)
    res = subprocess.run(
        cmd, env=env or cpu_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT
    )
    if res.returncode and "terminate called without an active exception" in res.stderr:
        # Seen once in CI (2026-11-30, the suite's first multi-process test, rank 1 SIGABRT at
        # start-up, passed on rerun); cause not found. One retry on that exact signature only, on a
        # fresh port; see issue notes.
        cmd[cmd.index("--master_port") + 1] = str(free_port())
        res = subprocess.run(
            cmd,
            env=env or cpu_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or ROOT,
        )
    if res.returncode:
        raise AssertionError(
            f"{' '.join(cmd)} failed "
            f"({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
        )
    return res


def _forked(
    nproc: int, args: list[str], module: bool, timeout: int, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`torchrun` through tests/forkrun.py: the ranks' outputs joined in rank order; the exit code a
    failing rank's own (else a killed rank's signal as 128 + its number), or 0."""
    import tempfile

    from tests import forkrun

    with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
        codes = forkrun.run(
            nproc, args, module, cpu_env(), free_port(), Path(tmp), timeout, cwd=cwd
        )
        out, err = zip(*forkrun.outputs(Path(tmp), nproc))
    failed = [c for c in codes if c > 0] + [
        128 - c for c in codes if c < 0
    ]  # a rank's own failure first
    cmd = ["forkrun", f"--nproc {nproc}", *(["-m"] if module else []), *map(str, args)]
    res = subprocess.CompletedProcess(cmd, failed[0] if failed else 0, "".join(out), "".join(err))
    if res.returncode:
        tails = "\n".join(
            f"--- rank {r} (exit {c}):\n{o[-2000:]}\n{e[-4000:]}"
            for r, (c, o, e) in enumerate(zip(codes, out, err))
        )
        raise AssertionError(f"{' '.join(cmd)} failed (exit codes {codes}):\n{tails}")
    return res


def torchrun_nodes(
    nodes: int,
    nproc: int,
    args: list[str],
    module: bool = False,
    env: dict | None = None,
    timeout: int = 600,
    output_dir: Path | None = None,
) -> list[str]:
    """Run `args` as `nodes` "nodes" of `nproc` processes on this machine: one torchrun agent per
    node, started together, one world of nodes·nproc ranks (each node's LOCAL_WORLD_SIZE is nproc).
    Blocking; returns each node's output; AssertionError with every node's tail when one fails (the
    others are stopped).

    The start-up / exit SIGABRT that `torchrun` retries on is retried here too, once, on a fresh
    port, with the run's `output_dir` put back as it was before (absent, or a copy: a resumed run's
    checkpoint)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "output_dir"
        if output_dir is not None and Path(output_dir).exists():
            shutil.copytree(output_dir, saved)
        codes, out = _run_nodes(nodes, nproc, args, module, env, timeout)
        if any(codes) and any("terminate called without an active exception" in o for o in out):
            if output_dir is not None:
                shutil.rmtree(output_dir, ignore_errors=True)
                if saved.exists():
                    shutil.copytree(saved, output_dir)
            codes, out = _run_nodes(nodes, nproc, args, module, env, timeout)
    if any(codes):
        tails = "\n".join(
            f"--- node {r} ({c}):\n{o[-4000:]}" for r, (c, o) in enumerate(zip(codes, out))
        )
        raise AssertionError(
            f"{nodes} nodes x {nproc} processes of {' '.join(args)} failed:\n{tails}"
        )
    return out


def _run_nodes(
    nodes: int, nproc: int, args: list[str], module: bool, env: dict | None, timeout: int
):
    """One attempt of `torchrun_nodes`: (exit codes, outputs). A node still running once another
    failed (it would wait for it) or at `timeout` is killed with its workers (each agent leads its
    own process group). With the default environment the agents are forked from tests/forkrun.py's
    server, and their workers from them."""
    import signal
    import tempfile

    port = free_port()
    if (
        env is None and os.environ.get("DS_LONGCTX_TEST_TORCHRUN") != "1"
    ):  # the agents forked, as run_cli's command
        from tests import forkrun

        agents = [
            torchrun_cmd(nproc, args, module, port, nodes, r)[2:] for r in range(nodes)
        ]  # after `python -m`
        with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
            codes = forkrun.run(
                nodes,
                agents[0],
                True,
                cpu_env(),
                port,
                Path(tmp),
                timeout,
                launcher=True,
                rank_args=agents,
            )
            return codes, [out + err for out, err in forkrun.outputs(Path(tmp), nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"node{r}.log" for r in range(nodes)]
        procs = []
        for r, log in enumerate(
            logs
        ):  # output to files: a full pipe would stall a node the others wait for
            with open(log, "w") as f:
                procs.append(
                    subprocess.Popen(
                        torchrun_cmd(nproc, args, module, port, nodes, r),
                        env=env or cpu_env(),
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                        start_new_session=True,
                    )
                )
        deadline = time.time() + timeout
        while time.time() < deadline:
            codes = [p.poll() for p in procs]  # every one polled (reaped) each round
            if all(c is not None for c in codes) or any(
                codes
            ):  # all done, or one failed: the rest would hang
                break
            time.sleep(0.2)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return [p.returncode for p in procs], [log.read_text() for log in logs]


def run_cli(
    args: list[str],
    env: dict | None = None,
    timeout: int = 900,
    output_dir: Path | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """`ds-longctx ARGS` (python -m ds_longctx.cli) from the repo root, output captured; the caller
    checks it.

    With the default environment the command, and the torchrun workers it starts, are forked from
    the pre-imported server of tests/forkrun.py (its agent, checks and exit paths are the command's
    own); with another `env`, or with DS_LONGCTX_TEST_TORCHRUN=1, a fresh `python -m
    ds_longctx.cli`.

    `output_dir`: the one directory the command writes. Given, a run that a worker's abort ended
    (the signature `torchrun` retries on, seen at the exit of 2-process `ds-longctx train` and
    `eval` runs under a busy pytest) is removed and run once more. `cwd`: the working directory
    (default the repository root)."""
    for _ in range(2):
        res = _cli_once(args, env, timeout, cwd)
        if (
            output_dir is None
            or not res.returncode
            or "terminate called without an active exception" not in res.stderr
        ):
            return res
        shutil.rmtree(output_dir, ignore_errors=True)
    return res


def _cli_once(
    args: list[str], env: dict | None, timeout: int, cwd: Path | None
) -> subprocess.CompletedProcess:
    if env is None:
        return run_module(["ds_longctx.cli", *args], timeout=timeout, cwd=cwd)
    return subprocess.run(
        [sys.executable, "-m", "ds_longctx.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def run_module(
    args: list[str], extra_env: dict | None = None, timeout: int = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`python -m ARGS` (a module, then its arguments) from the repo root (or `cwd`) in the CPU
    environment plus `extra_env`, output captured; the caller checks it. Forked from
    tests/forkrun.py's pre-imported server (the torchrun workers it starts too), unless
    DS_LONGCTX_TEST_TORCHRUN=1 asks for a fresh interpreter."""
    env = cpu_env() | (extra_env or {})
    cmd = [sys.executable, "-m", *map(str, args)]
    if os.environ.get("DS_LONGCTX_TEST_TORCHRUN") == "1":
        return subprocess.run(
            cmd, env=env, capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout
        )
    import tempfile

    from tests import forkrun

    with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
        [code] = forkrun.run(
            1, args, True, env, free_port(), Path(tmp), timeout, launcher=True, cwd=cwd
        )
        [(out, err)] = forkrun.outputs(Path(tmp), 1)
    return subprocess.CompletedProcess(cmd, code, out, err)


def start(
    nproc: int, args: list[str], log: Path, env: dict | None = None, launcher: bool = False
) -> subprocess.Popen:
    """`ds_longctx.train ARGS` under torchrun in the background (`launcher`: under `ds-longctx
    train`), stdout and stderr to `log`."""
    cmd = (
        [sys.executable, "-m", "ds_longctx.cli", "train", "--nproc", str(nproc), *args]
        if launcher
        else torchrun_cmd(nproc, ["ds_longctx.train", *args], module=True)
    )
    with open(log, "w") as f:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            cmd, env=env or cpu_env(), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT
        )


def wait_for_steps(
    proc: subprocess.Popen, out: Path, n: int, log: Path, timeout: float = 240
) -> None:
    """Until `out`/metrics.jsonl has `n` steps; AssertionError if the run ends first or `timeout`
    passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and len(read_metrics(out)) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"run ended ({proc.returncode}) before {n} steps:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {n} steps within {timeout}s:\n{log.read_text()[-4000:]}")


def sigterm_once(argv: list[str], log: Path, ready: str, settle: float = 0.0) -> tuple:
    """Start `argv` from the repo root (CPU env, output to `log`), SIGTERM it once `ready` is in the
    log (and `settle` seconds more); (its exit code, seconds from the signal to its exit, the log's
    non-blank lines)."""
    import signal

    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env=cpu_env(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while ready not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(settle)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    return code, took, [line for line in log.read_text().splitlines() if line.strip()]


def hold_lock(out: Path) -> subprocess.Popen:
    """Another process holding `out`'s run lock (checkpoint/run_lock.py) until it is killed;
    returned once it holds it."""
    code = (
        "import sys, time; from ds_longctx.checkpoint.run_lock import RunLock; "
        "RunLock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out)],
        env=cpu_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held", "the lock holder did not start"
    return proc


def worker(proc: subprocess.Popen, rank: int):
    """The psutil.Process of the torchrun worker with RANK == rank."""
    import psutil

    deadline = time.time() + 30
    while time.time() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "ds_longctx.train" in " ".join(
                    child.cmdline()
                ):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no worker with RANK={rank}")


def assert_saved_size(tag_dir, ranks=2, **lora):
    """A real save of qwen3-tiny (fp32) against what preflight counts for it
    (plan/planner.disk_checkpoint_bytes): at least that, and at most 100 kB per rank more (its RNG
    file and the names in its pickles: ~70 kB here, whatever the model's size)."""
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.planner import disk_checkpoint_bytes

    size = sum(f.stat().st_size for f in tag_dir.rglob("*") if f.is_file())
    want = disk_checkpoint_bytes(
        ModelGeometry.from_name_or_path("qwen3-tiny"), dtype_bytes=4, **lora
    )
    assert want <= size <= want + 100_000 * ranks, (size, want)


def text_run_args(d: Path, docs: int = 120) -> list[str]:
    """A small JSONL corpus (`docs` documents) + word-level tokenizer under `d`; the train options
    that read it (fp32, SP=2)."""
    if not (d / "c.jsonl").exists():
        d.mkdir(parents=True, exist_ok=True)
        make_tokenizer(d / "tok")
        write_jsonl(d / "c.jsonl", documents(docs, seed=1))
    return [
        "--model",
        "qwen3-tiny",
        "--seq_len",
        "64",
        "--dtype",
        "fp32",
        "--lr",
        "1e-3",
        "--sp_size",
        "2",
        "--data",
        str(d / "c.jsonl"),
        "--tokenizer",
        str(d / "tok"),
        "--data_cache_dir",
        str(d / "cache"),
    ]


# ----------------------------------------------------------------------------- refusals
def snapshot(path: Path):
    """(relative path, size) of every file under `path`, sorted; None where it does not exist."""
    return (
        sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))
        if path.exists()
        else None
    )


def refused(out: Path, fragments, world: int = 1, **kw) -> str:
    """Run the pre-engine checks of train.main for RunConfig(**kw); assert a refusal naming every
    fragment and that `out` (the run's output_dir) is unchanged."""
    kw.setdefault("output_dir", str(out))
    from pydantic import ValidationError

    from ds_longctx.config import RunConfig, format_validation_error
    from ds_longctx.data import build_data, build_eval_data
    from ds_longctx.run.preflight import preflight

    before = snapshot(out)
    try:
        cfg = RunConfig(**kw)
        shape, _ = preflight(cfg, world)
        build_data(cfg, shape.hf_config, shape.dp)
        build_eval_data(cfg, shape.hf_config)
    except ValidationError as e:
        msg = format_validation_error(e)
    except ValueError as e:
        msg = str(e)
    else:
        raise AssertionError(f"not refused: {kw}")
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in: {msg}"
    assert snapshot(out) == before, "a refused run changed output_dir"
    return msg


# ----------------------------------------------------------------------------- benchmark drivers
def bench_planner():
    """benchmarks/bench_planner.py as a module (benchmarks/ holds its own imports: harness)."""
    import importlib.util
    import sys

    bench = ROOT / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("bench_planner", bench / "bench_planner.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(bench))
