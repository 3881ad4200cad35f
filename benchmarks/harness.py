"""What the benchmark drivers share: run a job as its own process tree (its log, its ranks' host
peak, a clean stop), read its JSON lines and its plan, name the commit and the device, and check the
common arguments.

    rc, host_peak_bytes, wall_s = run_job(argv, log_path, timeout_s)
    plan = read_plan(plan_dir)            # `ds-longctx plan`'s numbers from plan.txt
Used by bench_peers.py, bench_hf_trainer.py and bench_planner.py (benchmarks/ is sys.path[0] when
they run).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

from ds_longctx.parallel.parallel_state import free_port  # noqa: F401 (the benchmarks' rendezvous ports)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (
    ROOT / "benchmarks" / "results"
)  # current files at the top (results_merge.py); raw files under sessions/
ALLOC_CONF = (
    "expandable_segments:True"  # the guide's setting; ds_longctx's train entry sets the same
)


def raw_dir() -> str:
    """Where a driver writes its raw files by default: $OUT on a device, else
    benchmarks/results/sessions/<today> (committed there, then folded into the current files by
    `python benchmarks/results_merge.py`)."""
    import datetime

    return os.environ.get("OUT") or str(RESULTS / "sessions" / datetime.date.today().isoformat())


def parse_choices(ap, flag: str, text: str, allowed) -> list:
    """The comma-separated `text` of `flag` as a list, every item one of `allowed` (else `ap.error`,
    exit 2)."""
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad:
        ap.error(f"{flag}: unknown {bad}; choose from {list(allowed)}")
    return items


def check_steps(ap, steps: int) -> None:
    if steps < 2:
        ap.error(f"--steps {steps}: need >= 2 (the first step is left out of the median)")


def read_plan(plan_dir: Path) -> dict:
    """The plan's numbers from its plan.txt (GB = 1e9 bytes): planned per-GPU peak (with the CUDA
    context), reserved peak (without it: what max_memory_reserved reports) and allocated peak
    (without the allocator slack either: what max_memory_allocated reports), host peak and host
    budget, placement, optimizer offload and its host share (1.0: all of it, or no offload),
    parameter offload, attention backward head groups."""
    text = (plan_dir / "plan.txt").read_text()
    gpu, host = re.search(r"^planned: ([\d.]+) GB per GPU, ([\d.]+) GB host", text, re.M).groups()
    ctx = float(re.search(r"^cuda_context\s+\S+\s+([\d.]+)", text, re.M).group(1))
    host_budget = re.search(r"^budget: .*?GB per GPU, ([\d.]+) GB host", text, re.M)
    slack = float(re.search(r"^allocator_slack\s+\S+\s+([\d.]+)", text, re.M).group(1))
    return {
        "host_mem_gb": float(host_budget.group(1)) if host_budget else None,
        "planned_gpu_bytes": int(float(gpu) * 1e9),
        "planned_reserved_bytes": int((float(gpu) - ctx) * 1e9),
        "planned_allocated_bytes": int((float(gpu) - ctx - slack) * 1e9),
        "planned_host_bytes": int(float(host) * 1e9),
        "placement": re.search(r"^placement per layer: (\S+)", text, re.M).group(1),
        "optimizer_offload": "optimizer_offload=True" in text,
        "command": text.splitlines()[0],
        "optimizer_offload_ratio": float(r.group(1))
        if (r := re.search(r"optimizer_offload=True \(ratio ([\d.]+)\)", text))
        else 1.0,
        "offload_params": " offload_params=True" in text,
        "attn_bwd_head_groups": int(m.group(1))
        if (m := re.search(r" attn_bwd_head_groups=(\d+)", text))
        else 1,
    }


class RankMemory:
    """Peak host memory of a job: the sum over its ranks of each rank's VmHWM (the peak RSS that
    ru_maxrss reports, pinned buffers included), polled from /proc. A rank is a descendant started
    with LOCAL_RANK in its environment whose parent was not (launchers and agents are left out, and
    so are a rank's own helper processes)."""

    def __init__(self, pid: int, every_s: float = 1.0):
        self.pid, self.every_s, self.peak, self._rank, self.ranks = pid, every_s, {}, {}, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self):
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return
        for p in kids:
            try:
                if p.pid not in self._rank:
                    parent = p.parent()
                    self._rank[p.pid] = "LOCAL_RANK" in p.environ() and not (
                        parent and "LOCAL_RANK" in parent.environ()
                    )
                    if self._rank[p.pid]:
                        self.ranks.append(
                            p
                        )  # the Process object: signals to it are safe from pid reuse
                if self._rank[p.pid]:
                    for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peak[p.pid] = max(
                                self.peak.get(p.pid, 0), int(line.split()[1]) * 1024
                            )
            except (psutil.Error, OSError):
                continue

    def stop(self) -> int:
        """Σ over ranks of peak RSS, after one last sample."""
        self._stop.set()
        self._thread.join()
        self.sample()
        return sum(self.peak.values())


def end_tree(proc, ranks) -> None:
    """Stop what this run started and left alive: the launcher, its descendants, and the ranks seen
    (torch's agent starts each rank in its own session, so a killed launcher can leave them
    orphaned)."""
    import psutil

    roots, procs = list(ranks), []
    if proc.poll() is None:
        roots.append(psutil.Process(proc.pid))
    for p in roots:
        try:
            if p.is_running():  # False once the pid belongs to another process
                procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def run_job(argv: list[str], log_path: Path, timeout_s: float) -> tuple:
    """(exit code or None on timeout, host peak bytes, wall seconds)."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        mem = RankMemory(proc.pid).start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        host = mem.stop()
        end_tree(proc, mem.ranks)
    return rc, host, time.perf_counter() - t0


def read_lines(path: Path) -> list[dict]:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )


def git_commit(given: str | None) -> str:
    """`given` (--commit) when set: a device copy of the tree can carry a stale .git; else `git
    rev-parse`."""
    if given:
        return given
    r = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"


def gpu_name() -> str:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return (
            r.stdout.splitlines()[0].strip()
            if r.returncode == 0 and r.stdout.strip()
            else "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "cpu"


def fresh_dir(base: Path) -> Path:
    d, i = base, 1
    while d.exists():
        i += 1
        d = base.with_name(f"{base.name}_{i}")
    d.mkdir(parents=True)
    return d
