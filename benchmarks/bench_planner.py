"""The planner against measured peaks: one fresh process per run, then a table of predicted vs
measured.

    python benchmarks/bench_planner.py --gpus 2 \\
        --runs qwen3-0.6b:65536:base,qwen3-8b:131072:offload --out $OUT
    # CPU, re-predict:
    python benchmarks/bench_planner.py --table benchmarks/results/planner_runs.jsonl

Each run is `model:seq_len:variant` (variant as bench_levers.py: base, offload, tiled, plain_loss,
joined with `+`). Every run is its own `torchrun ... bench_levers.py` process (one engine build, one
variant, `--first_steps` steps, expandable segments as train.py sets them), so its peak is that
variant's clean peak: no cache left over from another variant. Measured per run: GPU = the highest
`max_memory_reserved` over the steps after the first (max over ranks; bench_levers.py builds its
engine with the optimizer state made at build, but older rows are from runs whose first step made it
at its end), host = the highest sum over ranks of each rank's peak RSS (`ru_maxrss`, which includes
the pinned checkpoint buffers).

`--check FILE[,FILE]` says per committed prediction whether today's planner still makes that plan
(run it before a device session: a changed plan is no longer held out). FILE:
benchmarks/results/planner_runs.jsonl (every committed
prediction, `planner_commit` the planner that made it) or a raw predictions file. Exit status 1 when
any plan changed, so a script can stop before measuring a plan that is no longer held out.

`--table FILE` re-predicts stored runs with the current planner (no GPU) and writes the markdown
table: this is how a change to the planner's constants is checked against every measured run.

Whole plans, predicted first and committed, then run (held-out validation):
    # CPU:
    python benchmarks/bench_planner.py --plans 262144:64,262144:80,393216:141:pinned_pool --predict
    # GPU:
    python benchmarks/bench_planner.py --plans ... \\
        --predictions benchmarks/results/planner_runs.jsonl --out $OUT --commit SHA
Each plan is `seq_len:gpu_mem_gb[:flag+flag]` for --model on --gpus (flags: `ds-longctx plan`
switches without their dashes, `name=value` for valued ones). `--predict` writes
`planner_predictions_<date>.jsonl/.md` (`<date>b`, `c`, ... when taken): what `ds-longctx plan` says
(reserved = its peak less the cuda_context term, host, placement), under --out (default
harness.raw_dir: benchmarks/results/sessions/<date>; commit it, then `python
benchmarks/results_merge.py` adds it to planner_runs.jsonl). Otherwise each plan is written and run
with `ds-longctx train --config run.yaml --steps N`; measured: `max_memory_reserved` max over ranks
on every step, host Σ over ranks of peak RSS; `planner_plans_<date>.jsonl/.md` set them against the
given predictions (else the fresh plan's), with the budget (gpu_mem_gb) beside.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import (
    RESULTS,
    git_commit,
    gpu_name,
    raw_dir,
    read_lines,
    read_plan,
    run_job,
)  # benchmarks/: sys.path[0]

from ds_longctx.levers.gpu_budget import GB

ROOT = Path(__file__).resolve().parents[1]
GPU_TOL, HOST_TOL = 0.10, 0.15  # issue 4's bars: per-GPU peak within ±10%, host peak within ±15%


def measure(run: str, gpus: int, sp: int, steps: int, out: Path, timeout_s: int) -> dict:
    """Launch one bench_levers.py process for `run`; return its summary row (or the error)."""
    model, seq_len, variant = run.split(":")
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(gpus),
        str(ROOT / "benchmarks" / "bench_levers.py"),
        "--model",
        model,
        "--seq_len",
        seq_len,
        "--sp_size",
        str(sp),
        "--variants",
        variant,
        "--first_steps",
        str(steps),
        "--out",
        str(raw),
    ]
    log = out / f"log_{model}_{seq_len}_{variant}.txt"
    t = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t
    rows = (
        [
            json.loads(line)
            for line in (raw / f"levers_{model}_{seq_len}.jsonl").read_text().splitlines()
            if line.strip()
        ]
        if (raw / f"levers_{model}_{seq_len}.jsonl").exists()
        else []
    )
    rows = [r for r in rows if r["variant"] == variant]
    summary = {
        "run": run,
        "model": model,
        "seq_len": int(seq_len),
        "variant": variant,
        "gpus": gpus,
        "sp_size": sp,
        "rc": rc,
        "wall_s": round(wall, 1),
        "steps": rows,
    }
    if rows and not any(r["error"] for r in rows):
        steady = rows[1:] or rows
        summary.update(
            measured_gpu_gib=max(r["peak_reserved_gib"] for r in steady),
            measured_alloc_gib=max(r["peak_allocated_gib"] for r in steady),
            measured_host_gib=max(r["host_peak_rss_sum_gib"] for r in rows),
            seconds=steady[-1]["seconds"],
            mfu=steady[-1]["mfu"],
            levers=rows[0]["levers"],
        )
    return summary


def fresh(out: Path, stem: str, suffix: str) -> Path:
    """out/stem+suffix, or stem + b, c, ... when taken: committed predictions are never
    overwritten."""
    for tag in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        path = out / f"{stem}{tag}{suffix}"
        if not path.exists() and not path.with_suffix(".md").exists():
            return path
    raise SystemExit(f"{out}/{stem}*{suffix}: every name up to z is taken")


def predict(row: dict) -> tuple:
    """(GPU GiB, host GiB) the current planner gives for a stored run."""
    sys.path.insert(0, str(ROOT))
    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.plan.planner import Levers, ModelGeometry, plan_memory

    lv = dict(row["levers"])
    if "chunk_rows" in lv:  # rows written before the field took the run config's name
        lv["loss_chunk_rows"] = lv.pop("chunk_rows")
    if lv.get("placement"):
        lv["placement"] = PlacementPlan.parse(lv["placement"])
    plan = plan_memory(
        ModelGeometry.from_name_or_path(row["model"]),
        row["seq_len"],
        row["gpus"],
        row["sp_size"],
        Levers(**lv),
    )
    # reserved_bytes, not gpu_peak_bytes: max_memory_reserved does not see the CUDA context
    return plan.reserved_bytes / 2**30, plan.host_peak_bytes / 2**30


def table(rows: list) -> str:
    """Markdown: one line per measured run, errors in %, and whether each is inside the issue's
    bars."""
    lines = [
        "| set | model | tokens | variant | s/step | MFU | reserved GiB (measured) | predicted | "
        "error | host GiB (measured, Σ ranks) | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    n_ok = 0
    for r in rows:
        if "measured_gpu_gib" not in r:
            lines.append(
                f"| {r.get('set', '')} | {r['model']} | {r['seq_len']:,} | {r['variant']} | "
                f"failed (rc={r['rc']}) |||||||"
            )
            continue
        pg, ph = predict(r)
        # A CPU run has no GPU peak (0): its GPU error is undefined, shown as n/a and never
        # "inside".
        eg = pg / r["measured_gpu_gib"] - 1 if r["measured_gpu_gib"] else float("nan")
        eh = ph / r["measured_host_gib"] - 1
        ok = abs(eg) <= GPU_TOL and abs(eh) <= HOST_TOL
        n_ok += ok
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
        lines.append(
            f"| {r.get('set', '')} | {r['model']} | {r['seq_len']:,} | {r['variant']} | "
            f"{r['seconds']:.2f} | {mfu} | {r['measured_gpu_gib']:.2f} | {pg:.2f} | {eg:+.1%} | "
            f"{r['measured_host_gib']:.2f} | {ph:.2f} | {eh:+.1%} |"
        )
    lines.append(
        f"\n{n_ok} of {len(rows)} runs inside ±{GPU_TOL:.0%} GPU and ±{HOST_TOL:.0%} host."
    )
    return "\n".join(lines)


def plan_args(spec: str, model: str, gpus: int) -> tuple:
    """(seq_len, gpu_mem_gb, model, `ds-longctx plan` arguments) of one
    `seq_len:gpu_mem_gb[:flag+flag]` spec; a `model=NAME` flag overrides --model for that plan (one
    call can hold plans of several models)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--plans: {spec!r} is not seq_len:gpu_mem_gb[:flag+flag]")
    seq_len, gb = int(parts[0]), float(parts[1])
    flags = []
    for f in parts[2].split("+") if len(parts) == 3 and parts[2] else []:
        name, _, value = f.partition("=")
        if name == "model":
            if not value:
                raise SystemExit(f"--plans: {spec!r}: model= needs a name (qwen3-4b, a path)")
            model = value
            continue
        flags += [f"--{name}"] + ([value] if value else [])
    return (
        seq_len,
        gb,
        model,
        [
            "--model",
            model,
            "--seq_len",
            str(seq_len),
            "--gpus",
            str(gpus),
            "--gpu_mem_gb",
            f"{gb:g}",
            *flags,
        ],
    )


def steady_gpu_peak(row: dict) -> bool:
    """Whether a measured plan row's GPU peak is the steady state its plan is for: not when it ran
    one step with the optimizer on the GPU and DeepSpeed made the Adam moments only at that step's
    end (`optimizer_state_at_build: false`, the 860,160-token step of planner_runs_2026-12-01d.md;
    rows before the field all ran 2 steps or more)."""
    return not (
        row.get("optimizer_state_at_build") is False
        and len(row["measured_steps"]) == 1
        and not row.get("optimizer_offload")
    )


def spec_name(spec: str) -> str:
    """A plan spec as a directory name: `262144:80:lora_rank=16` -> `262144_80_lora_rank16`."""
    return spec.replace(":", "_").replace("+", "_").replace("=", "")


def predict_plans(specs: list, model: str, gpus: int, work: Path) -> list:
    rows = []
    for spec in specs:
        seq_len, gb, spec_model, args = plan_args(spec, model, gpus)
        d = work / f"plan_{spec_name(spec)}"
        res = subprocess.run(
            [sys.executable, "-m", "ds_longctx.cli", "plan", *args, "--out", str(d)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        row = {
            "spec": spec,
            "model": spec_model,
            "seq_len": seq_len,
            "gpus": gpus,
            "gpu_mem_gb": gb,
        }
        row.update(read_plan(d) if res.returncode == 0 else {"error": res.stderr.strip()[-300:]})
        rows.append(row)
    return rows


def append_longest(path: Path, row: dict, plan_dir: Path, run_dir: Path) -> None:
    """Issue 12's `longest.jsonl` line for a run that finished: its step time and peaks beside the
    plan's."""
    import yaml

    run = yaml.safe_load((plan_dir / "run.yaml").read_text())
    mem = run["memory"]
    line = {
        "seq_len": row["seq_len"],
        "gpus": row["gpus"],
        "gpu_mem_gb": row["gpu_mem_gb"],
        "host_mem_gb": row.get("host_mem_gb"),
        "seconds": row["step_seconds"][-1],
        "step_seconds": row["step_seconds"],
        "exit_seconds": row.get("exit_seconds"),
        "peak_gpu_bytes": max(row["measured_steps"]),
        "host_peak_bytes": row["measured_host_bytes"],
        "planned_gpu_bytes": row["planned_gpu_bytes"],
        "planned_reserved_bytes": row["planned_reserved_bytes"],
        "planned_host_bytes": row["planned_host_bytes"],
        "commit": row["commit"],
        "predicted_at": row.get("predicted_at"),
        "device": f"{row['gpus']} x {gpu_name()}",
        "config": {
            "placement": row["placement"],
            "optimizer_offload": row["optimizer_offload"],
            **{
                k: mem[k]
                for k in (
                    "tiled_mlp",
                    "tiled_layer",
                    "tile_tokens",
                    "pinned_pool",
                    "loss_chunk_rows",
                    "gpu_budget_gb",
                    "run_ahead_layers",
                )
                if k in mem
            },
            "sp_size": run["parallel"]["sp_size"],
            "run": str(run_dir / "run"),
        },
    }
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"longest: {json.dumps(line)}", flush=True)


# what a plan is; a prediction made before a key was recorded had the default (no partial optimizer
# offload)
PLAN_KEYS = {
    "placement": None,
    "optimizer_offload": None,
    "optimizer_offload_ratio": 1.0,
    "planned_reserved_bytes": None,
    "planned_host_bytes": None,
}


def plan_changed(given: dict, fresh: dict) -> str:
    """'' when today's plan for a spec is the committed prediction's; else what differs."""
    if "error" in fresh:
        return ""
    was = {k: given.get(k, d) for k, d in PLAN_KEYS.items()}
    return ", ".join(f"{k} {was[k]} -> {fresh.get(k)}" for k in PLAN_KEYS if was[k] != fresh.get(k))


def plans_table(rows: list) -> str:
    """Markdown: each plan's measured peaks against its prediction, and whether they stayed under
    the budgets (GPU: the measured reserved plus the plan's CUDA context term; host: Σ ranks' peak
    RSS, where the plan had a host budget)."""
    lines = [
        "| plan | model | placement | optimizer offload | reserved GB, every step (max rank) | "
        "predicted | "
        "error | allocated GB (max rank) | predicted | error | reserved / allocated | host GB (Σ "
        "ranks) | predicted | error | budget GB (GPU / host) | under it |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "measured_steps" not in r:
            lines.append(
                f"| {r['spec']} | {r.get('model', '')} | {r.get('placement', '')} | | "
                f"not measured: {r.get('error', '')} ||||||||||||"
            )
            continue
        m, pr, host = (
            max(r["measured_steps"]),
            r["planned_reserved_bytes"],
            r["measured_host_bytes"],
        )
        moved = r.get("plan_changed_since_prediction")
        spec = r["spec"] + (" (plan changed since its prediction: not held out)" if moved else "")
        under = m + r["planned_gpu_bytes"] - pr <= r["gpu_mem_gb"] * GB
        if r.get("host_mem_gb"):
            under = under and host <= r["host_mem_gb"] * GB
        budget = f"{r['gpu_mem_gb']:g}" + (
            f" / {r['host_mem_gb']:g}" if r.get("host_mem_gb") else ""
        )
        alloc, pa = max(r.get("measured_allocated_steps") or [0]), r.get("planned_allocated_bytes")
        allocated = (
            f"{alloc / GB:.1f} | {pa / GB:.1f} | {alloc / pa - 1:+.1%} | {m / alloc:.3f}"
            if alloc and pa
            else " | | | "
        )  # rows measured or predicted before these were recorded
        ratio = r.get("optimizer_offload_ratio", 1.0)
        offload = f"{r['optimizer_offload']}" + (
            f" (ratio {ratio:g})" if r["optimizer_offload"] and ratio < 1 else ""
        )
        lines.append(
            f"| {spec} | {r.get('model', '')} | {r['placement']} | {offload} | "
            f"{' / '.join(f'{x / GB:.1f}' for x in r['measured_steps'])} | {pr / GB:.1f} | "
            f"{m / pr - 1:+.1%} | {allocated} | {host / GB:.1f} | "
            f"{r['planned_host_bytes'] / GB:.1f} | "
            f"{host / r['planned_host_bytes'] - 1:+.1%} | {budget} | {'yes' if under else 'NO'} |"
        )
    return "\n".join(lines)


def read_predictions(files: str):
    """(file name, row) of every committed prediction in `files` (comma-separated jsonl), in file
    order. A row of planner_runs.jsonl (results_merge.py) is a prediction when it has a plan spec
    and the planner that made it (`planner_commit`, given as the row's `commit`); its runs measured
    against a fresh plan are not."""
    for f in filter(None, files.split(",")):
        for line in Path(f).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if "spec" not in r or ("planner_commit" in r and not r["planner_commit"]):
                # a lever run or a table row (no plan spec), a run of a fresh plan (no prediction)
                continue
            yield Path(f).name, dict(r, commit=r["planner_commit"]) if "planner_commit" in r else r


def pick_predictions(files: str, fresh: dict) -> dict:
    """Each spec's committed prediction from `files` (comma-separated jsonl): where several files
    predicted a spec, the one whose plan is today's (held out), else the last file's."""
    given = {}
    for _, r in read_predictions(files):
        prev = given.get(r["spec"])
        if prev is None or not (r["spec"] in fresh and not plan_changed(prev, fresh[r["spec"]])):
            given[r["spec"]] = r
    return given


def check_predictions(files: str) -> int:
    """Each committed prediction against today's planner (`plan_changed`), one line per spec: `held
    out` when the plan is the same, else what moved (a run of it would be measured against today's
    plan, not held out). The GPU count is each row's own. Returns the number that changed."""
    import tempfile

    changed = 0
    for name, r in read_predictions(files):
        fresh = predict_plans(
            [r["spec"]], r.get("model", "qwen3-8b"), r["gpus"], Path(tempfile.mkdtemp())
        )[0]
        moved = (
            plan_changed(r, fresh)
            if "error" not in fresh
            else f"today's plan fails: {fresh['error'][-120:]}"
        )
        changed += bool(moved)
        print(
            f"{name} {r['spec']} x{r['gpus']}: {moved or 'held out (same plan today)'}", flush=True
        )
    return changed


def run_plans(a, specs: list, out: Path) -> None:
    fresh = {r["spec"]: r for r in predict_plans(specs, a.model, a.gpus, out / "plans")}
    given = pick_predictions(a.predictions or "", fresh)
    path = out / f"planner_plans_{datetime.date.today().isoformat()}.jsonl"
    rows = []
    for spec in specs:
        row = dict(
            given.get(spec) or fresh[spec],
            predicted_at=(given.get(spec) or {}).get("commit", "fresh"),
            commit=git_commit(a.commit),
        )
        if (
            "planned_allocated_bytes" not in row and "error" not in fresh[spec]
        ):  # predicted before it was recorded:
            row["planned_allocated_bytes"] = fresh[spec][
                "planned_allocated_bytes"
            ]  # the same plan's (checked below)
        if spec in given and (moved := plan_changed(given[spec], fresh[spec])):
            # the run follows today's plan; measuring it against another plan's numbers would say
            # nothing
            row.update(fresh[spec], predicted_at="fresh", plan_changed_since_prediction=moved)
            print(
                f"{spec}: the plan changed since its prediction at {given[spec].get('commit')} "
                f"({moved}): measured against today's plan, not held out",
                flush=True,
            )
        d, plan_dir = (
            out / "plans" / f"run_{spec_name(spec)}",
            out / "plans" / f"plan_{spec_name(spec)}",
        )
        if "error" not in fresh[spec]:
            argv = [
                sys.executable,
                "-m",
                "ds_longctx.cli",
                "train",
                "--config",
                str(plan_dir / "run.yaml"),
                "--nproc",
                str(a.gpus),
                "--steps",
                str(a.steps),
                "--output_dir",
                str(d / "run"),
            ]
            d.mkdir(parents=True, exist_ok=True)
            rc, host, wall = run_job(argv, d / "log.txt", a.timeout_s)
            ended, metrics = time.time(), d / "run" / "metrics.jsonl"
            steps = read_lines(metrics)
            row.update(
                rc=rc,
                wall_seconds=round(wall, 1),
                measured_host_bytes=host,
                step_seconds=[m["seconds"] for m in steps if "loss" in m],
                # the Adam moments existed from step 1 on (run/optimizer_state.py), as the plan
                # counts them; without it DeepSpeed makes them at step 1's end and step 1 alone
                # understates the run
                optimizer_state_at_build="optimizer state: made at build"
                in (d / "log.txt").read_text(errors="replace"),
            )
            if (
                metrics.is_file()
            ):  # the last step's line is written just before "done": what exiting took after it
                row["exit_seconds"] = round(ended - metrics.stat().st_mtime, 1)
            peaks = [
                m.get("peak_gpu_bytes_max_rank", m.get("peak_gpu_bytes"))
                for m in steps
                if "loss" in m
            ]
            row["measured_allocated_steps"] = [
                m.get("peak_gpu_allocated_bytes_max_rank", m.get("peak_gpu_allocated_bytes"))
                for m in steps
                if "loss" in m
            ]
            if rc == 0 and peaks:
                row["measured_steps"] = peaks
            else:
                row["error"] = f"rc={rc}, {len(peaks)} step(s): see {d / 'log.txt'}"
        rows.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if a.longest and row.get("measured_steps"):
            append_longest(Path(a.longest), row, plan_dir, d)
        print(json.dumps({k: v for k, v in row.items() if k != "command"}), flush=True)
    # the table of every row in the jsonl (it appends: a second validate stage in one session adds
    # to the first's)
    path.with_suffix(".md").write_text(plans_table(read_lines(path)) + "\n")
    print(plans_table(rows))


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", default="", help="comma-separated model:seq_len:variant")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--sp_size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--timeout_s", type=int, default=400, help="per run; a run past it is recorded as failed"
    )
    ap.add_argument(
        "--deadline_s", type=float, default=0, help="skip runs that would start after this many s"
    )
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument(
        "--table",
        help="a stored planner_runs jsonl: re-predict its lever runs with today's planner",
    )
    ap.add_argument(
        "--plans", default="", help="comma-separated seq_len:gpu_mem_gb[:flag+flag] (module doc)"
    )
    ap.add_argument("--model", default="qwen3-8b", help="with --plans")
    ap.add_argument(
        "--predict", action="store_true", help="with --plans: write the predictions, run nothing"
    )
    ap.add_argument(
        "--check",
        help="committed predictions (jsonl; several comma-separated): say per spec whether "
        "today's planner still makes that plan (still held out), run nothing",
    )
    ap.add_argument(
        "--predictions", help="with --plans: committed predictions to measure against (jsonl, a,b)"
    )
    ap.add_argument(
        "--longest",
        help="with --plans: append each finished run to this longest.jsonl (issue 12's rows)",
    )
    ap.add_argument(
        "--commit", default=None, help="the tree's commit (the device copy has no reliable .git)"
    )
    a = ap.parse_args()
    if a.check:
        return 1 if check_predictions(a.check) else 0
    if a.plans:
        specs, out = [s for s in a.plans.split(",") if s], Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        if a.predict:
            import tempfile

            rows = [
                dict(r, commit=git_commit(a.commit))
                for r in predict_plans(specs, a.model, a.gpus, Path(tempfile.mkdtemp()))
            ]
            path = fresh(out, f"planner_predictions_{datetime.date.today().isoformat()}", ".jsonl")
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            md = [
                "| plan | placement | optimizer offload | reserved GB | GPU peak GB | host GB | "
                "budget GB |",
                "|---|---|---|---|---|---|---|",
            ]
            md += [
                f"| {r['spec']} | {r.get('placement', r.get('error', ''))} | "
                f"{r.get('optimizer_offload', '')} | "
                f"{r.get('planned_reserved_bytes', 0) / GB:.1f} | "
                f"{r.get('planned_gpu_bytes', 0) / GB:.1f} | "
                f"{r.get('planned_host_bytes', 0) / GB:.1f} | {r['gpu_mem_gb']:g} |"
                for r in rows
            ]
            path.with_suffix(".md").write_text("\n".join(md) + "\n")
            print("\n".join(md))
            return
        return run_plans(a, specs, out)
    if a.table:
        rows = [json.loads(line) for line in Path(a.table).read_text().splitlines() if line.strip()]
        md = table([r for r in rows if r.get("kind", "levers") == "levers"])
        if (
            Path(a.table).resolve().parent != RESULTS
        ):  # a raw file gets its table beside it; a current file none
            Path(a.table).with_suffix(".md").write_text(md + "\n")
        print(md)
        return
    (out := Path(a.out)).mkdir(parents=True, exist_ok=True)
    path = out / f"planner_runs_{datetime.date.today().isoformat()}.jsonl"
    t0, rows = time.perf_counter(), []
    for run in a.runs.split(","):
        if a.deadline_s and time.perf_counter() - t0 > a.deadline_s:
            print(f"skipped {run}: past --deadline_s {a.deadline_s}", flush=True)
            continue
        row = measure(run, a.gpus, a.sp_size, a.steps, out, a.timeout_s)
        rows.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "steps"}), flush=True)
    md = table(rows)
    path.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    sys.exit(main())
