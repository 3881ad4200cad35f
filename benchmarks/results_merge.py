"""Build the current results files of benchmarks/results/ (one per question) from the raw files
under benchmarks/results/sessions/, which hold what each device session and benchmark run wrote, as
it wrote it.

    # rebuild them; check each plan against today's planner (minutes):
    python benchmarks/results_merge.py
    # rebuild them; keep the `todays_plan` checks they hold (seconds):
    python benchmarks/results_merge.py --keep_checks
    # name each current file that differs from its rebuild:
    python benchmarks/results_merge.py --diff

Rules:
- A current file is never edited by hand. New raw files go under sessions/ (a device session's files
  as sessions/<session>/, other runs' under sessions/<date>/: the drivers' default output,
  harness.raw_dir), then this script rebuilds the current files and both are committed.
  tests/test_results.py fails while they differ.
- Every row is a raw row (or the numbers of one line of a raw file), plus `source` (the file under
  benchmarks/results/, `:line` where it has lines), `date`, and the commit the tree ran at: the raw
  `commit`, or where that is empty or names another tree, the commit the session notes give
  (COMMITS, with where they say it). Numbers are copied, never computed. The one column that asks
  the code is `todays_plan` (planner_runs.jsonl): whether today's planner still makes the row's plan
  (bench_planner.plan_changed), with `checked_at`, the commit it asked.
- rehearsal.jsonl is not built here: its rows are committed as they come; its one asked column is
  `todays_config` (whether the committed run.yaml is still the one the row rehearsed).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import RESULTS  # benchmarks/ is sys.path[0] when this file runs
from results_raw import md_rows, parse_longest, parse_stdlib_summary

SESSIONS = RESULTS / "sessions"
NOTES = "sessions/README.md"  # the session notes: what each session ran, at which tree
# raw files whose own `commit` is empty or names another tree than the one that ran: (tree, where
# the notes say so)
COMMITS = {
    "attention_2026-12-06.jsonl": (
        "9e7d87d",
        f"{NOTES}, session_2026-12-06_h100x1-20261206T2036: a git archive of the tree, no .git",
    ),
    "attention_2026-11-30.jsonl": (
        "5ec1da5",
        f"{NOTES}, issue 11 section: the rows' 3655a3e is the device copy's",
    ),
    "levers_qwen3-0.6b_131072_2026-11-30.jsonl": (
        "e231c9e",
        f"{NOTES}, issue 3 (b): the device tree had no .git",
    ),
    "levers_qwen3-8b_131072_2026-11-30.jsonl": (
        "e231c9e",
        f"{NOTES}, issue 3 (b): the device tree had no .git",
    ),
    "levers_qwen3-8b_262144_2026-11-30.jsonl": (
        "e231c9e",
        f"{NOTES}, issue 3 (b): the device tree had no .git",
    ),
    "profile_base_cudnn_131072.json": (
        "026edaf",
        "sessions/2026-11-30/profile_131072_2026-11-30.md",
    ),
    "profile_fa4_131072.json": ("026edaf", "sessions/2026-11-30/profile_131072_2026-11-30.md"),
    "profile_fa4_cache_all_131072.json": (
        "026edaf",
        "sessions/2026-11-30/profile_131072_2026-11-30.md",
    ),
    "chunked_loss_2026-11-30.json": ("72efce3", f"{NOTES}, issue 3 (a)"),
    "train_qwen3-8b_131072_sp2_2026-11-30.jsonl": ("cd4d4d8", f"{NOTES}, issue 2"),
    "long_range_all_labels_2026-11-30.json": (
        "7feaeb6",
        f"{NOTES}: 7feaeb6 plus a --supervise flag since replaced",
    ),
    "stdlib_corpus_cpu": ("2b1f0d1", f"{NOTES}, issue 28"),
    "peers_2026-12-04.jsonl": (
        "b22aeab",
        f"{NOTES}, 2026-12-04: the rows' 205c05a is the device copy's .git",
    ),
    "masked_step_2026-12-04.jsonl": (
        "b22aeab",
        f"{NOTES}, 2026-12-04: the rows' 205c05a is the device copy's .git",
    ),
    "stdlib_corpus_h200": (
        "54f7e5b",
        "notebooks/stdlib_corpus.ipynb: the log names the device copy's stale 906b5bf",
    ),
}
# what a raw file's rows do not say about themselves (the file name or the notes do)
META = {
    "train_qwen3-8b_131072_sp2_2026-11-30.jsonl": {
        "model": "qwen3-8b",
        "seq_len": 131072,
        "sp_size": 2,
        "gpus": 2,
        "variant": "train defaults",
        "device": "NVIDIA H200",
    },
    "stdlib_corpus_cpu": {"device": "CPU (2 cores, shared)"},
    **{
        f"long_range{k}_2026-11-30.json": {"device": "CPU (2 cores)"}
        for k in ("", "_all_labels", "_eval")
    },
    "stdlib_corpus_h200": {"device": "NVIDIA H200"},
}


# the model each device session's recall run scored (its rows name the directory it lay in there)
RECALL_MODELS = {
    "sessions/session_2026-12-06_h100x1-20261206T0529/recall_h100": (
        "SmolLM2-135M-Instruct (`models get smollm2-135m-instruct`)"
    )
}


def rel(path: Path) -> str:
    return path.relative_to(RESULTS).as_posix()


def jsonl(path: Path) -> list:
    """(line number, row) of every JSON line of `path`."""
    return [(i, json.loads(x)) for i, x in enumerate(path.read_text().splitlines(), 1) if x.strip()]


def date_of(text: str) -> str | None:
    m = re.search(r"(20\d\d)-?(\d\d)-?(\d\d)", text)
    return f"{m[1]}-{m[2]}-{m[3]}" if m else None


def found(pattern: str) -> list:
    return sorted(SESSIONS.rglob(pattern))


def annotate(row: dict, path: Path, line: int | str | None = None, **extra) -> dict:
    """`row` with where it came from: `source` (`path:line` for a line of a text file, `path#key[i]`
    for an item of a JSON file), `date` and the tree's `commit` (COMMITS where the raw one is not
    it)."""
    out = {**row, **META.get(path.name, {}), **extra}
    out["source"] = rel(path) + (line if isinstance(line, str) else f":{line}" if line else "")
    out["date"] = str(row.get("date") or date_of(out["source"]))[:10]
    if path.suffix == ".jsonl" and row.get("date"):  # a raw line's own date is kept as it is
        out["date"] = row["date"]
    if path.name in COMMITS:
        tree, note = COMMITS[path.name]
        if row.get("commit") != tree:
            out["commit_recorded"], out["commit_note"] = row.get("commit"), note
        out["commit"] = tree
    return out


def rows_of(pattern: str) -> list:
    return [annotate(r, p, i) for p in found(pattern) for i, r in jsonl(p)]


# each device session's preference run: what it trained (its metrics name only the run directory)
PREFERENCE_RUNS = {
    "sessions/session_2026-12-06_h100x1-20261206T0529/dpo_131k": {
        "objective": "dpo",
        "model_name": "SmolLM2-135M-Instruct",
        "device": "NVIDIA H100 80GB HBM3",
        "commit": "fdc7db0",
    }
}


def preference_runs() -> list:
    """One row per preference run of PREFERENCE_RUNS: each step's seconds, peak, loss and rewards as
    its metrics.jsonl holds them, and the reference pass as its log.txt says it."""
    out = []
    for path in found("metrics.jsonl"):
        meta = PREFERENCE_RUNS.get(rel(path.parent))
        if meta is None:
            continue
        steps = [r for _, r in jsonl(path)]
        log = (path.parent / "log.txt").read_text()
        ref = re.search(r"reference log-probs: (\d+) pairs in a first pass .*?\(([\d.]+) s\)", log)
        row = {
            **meta,
            "seq_len": steps[0]["tokens"],
            "steps": len(steps),
            "step_seconds": [r["seconds"] for r in steps],
            "peak_gpu_bytes": [r["peak_gpu_bytes"] for r in steps],
            "losses": [r["loss"] for r in steps],
            "rewards": [r[k] for r in steps for k in ("rewards/chosen", "rewards/rejected")],
            "reference_pairs": int(ref.group(1)) if ref else None,
            "reference_seconds": float(ref.group(2)) if ref else None,
        }
        out.append(annotate(row, path))
    return out


DISK_TIER_HEAD = re.compile(
    r"disk_tier: (\S+) commit (\S+) (\S+) on ([^,]+), \d+ \((\d+) GB\) \+ ([\d.]+) GB host "
    r"\+ (\d+) GB of"
)


def disk_tier_runs() -> list:
    """One row per benchmarks/disk_tier.sh run on a GPU: its disk_tier.json, with what its log's
    first line says it ran (commit, model, device, budgets) and its step count."""
    out = []
    for path in found("disk_tier.json"):
        head = DISK_TIER_HEAD.match((path.parent / "log.txt").read_text())
        if head is None:  # a CPU check: no GPU named
            continue
        when, commit, model, dev, gpu_gb, host_gb, nvme_gb = head.groups()
        row = {
            **json.loads(path.read_text()),
            "date": when,
            "commit": commit,
            "device": dev,
            "model": model,
            "machine": f"1 x {dev} ({gpu_gb} GB) + {float(host_gb):g} GB host + {nvme_gb} GB disk",
            "steps": len(jsonl(path.parent / "run" / "metrics.jsonl")),
        }
        out.append(annotate(row, path))
    return out


def build_simple() -> dict:
    """The current files that are their raw lines, each with its source; recall.jsonl: the device
    sessions' runs (a CPU check under sessions/<date>/ shows the tool working, not a
    measurement)."""
    levers = rows_of("levers_*.jsonl") + rows_of("train_qwen3-8b_*.jsonl")
    profile = [annotate(json.loads(p.read_text()), p) for p in found("profile_*.json")]
    chunked = []
    for p in found("chunked_loss*.json"):
        run = json.loads(p.read_text())
        meta = {k: v for k, v in run.items() if k != "results"}
        chunked += [
            annotate({**meta, **r}, p, f"#results[{i}]") for i, r in enumerate(run["results"])
        ]
    long_range = [
        annotate(json.loads(p.read_text()), p, name=re.sub(r"_\d{4}-\d\d-\d\d$", "", p.stem))
        for p in found("long_range*.json")
    ]
    stdlib = [
        annotate(parse_stdlib_summary(d / "summary.txt"), d, run=d.name)
        for d in found("stdlib_corpus_*")
        if (d / "summary.txt").is_file()
    ]
    return {
        "peers.jsonl": rows_of("peers*.jsonl"),
        "hf_trainer.jsonl": rows_of("hf_trainer*.jsonl"),
        "attention.jsonl": rows_of("attention_*.jsonl"),
        "levers.jsonl": levers,
        "profile.jsonl": profile,
        "chunked_loss.jsonl": chunked,
        "long_range.jsonl": long_range,
        "stdlib_corpus.jsonl": stdlib,
        "masked_step.jsonl": rows_of("masked_step_*.jsonl"),
        "preference.jsonl": preference_runs(),
        "disk_tier.jsonl": disk_tier_runs(),
        "recall.jsonl": [
            annotate(r, p, i, model_name=RECALL_MODELS[rel(p.parent)])
            for p in found("recall.jsonl")
            if rel(p).startswith("sessions/session_")
            for i, r in jsonl(p)
        ],
    }


def build_longest() -> list:
    """Planned lengths (every `plan --find_max_len` of longest_planned_*.txt), runs (longest.jsonl
    lines, the same run written twice kept once: the line with more fields) and what papers report
    (sessions/literature)."""
    planned = [
        annotate(r, p, i, kind="planned")
        for p in found("longest_planned_*.txt")
        for i, r in parse_longest(p)
    ]
    runs: dict = {}  # one run's key -> (its fields, the row)
    for p in found("longest.jsonl"):
        for i, r in jsonl(p):
            key = (r["seq_len"], r["gpus"], r["commit"], r["seconds"])
            if key not in runs or len(r) > runs[key][0]:
                runs[key] = len(r), annotate(r, p, i, kind="run")
    published = [
        annotate(r, p, i, kind="published") for p in found("published.jsonl") for i, r in jsonl(p)
    ]
    return planned + [r for _, r in runs.values()] + published


# planner_runs_*.md tables whose runs have no planner_plans line: what the file's text says of them
TABLES = {
    "planner_runs_2026-11-30b.md": {
        "planner_commit": "4242837",
        "commit": "4242837",
        "seq_len": 131072,
        "gpu_mem_gb": 141.0,
        "host_mem_gb": 256.0,
    },
    "planner_runs_2026-11-30c.md": {
        "planner_commit": "213b2e0",
        "commit": "213b2e0",
        "seq_len": 262144,
        "gpu_mem_gb": 129.0,
        "host_mem_gb": 256.0,
    },
    "planner_runs_2026-11-30d.md": {
        "seq_len": 262144,
        "prediction_spec": "262144:64",
        "host_mem_gb": 256.0,
        "skip": "262144:141:tiled_layer",
    },  # that run's planner_plans line is the row
}


def build_planner() -> list:
    """Every planner prediction, with its measurement where it ran (module doc of bench_planner.py):
    kind `levers` (the lever runs of bench_planner --runs), `plan` (a whole plan predicted,
    committed, then run), `table` (a run measured against its plan in a planner_runs_*.md table
    only), `prediction` (never run)."""
    preds = [
        annotate(r, p, i, kind="prediction", planner_commit=r.get("commit"), ran=False)
        for p in found("planner_predictions_*.jsonl")
        for i, r in jsonl(p)
    ]

    def joined(spec: str, gpus: int, commit: str, row: dict | None = None) -> list:
        """The sources of the predictions a run was measured against (the same plan, at the same
        planner)."""
        hits = [
            q
            for q in preds
            if q["spec"] == spec
            and q["gpus"] == gpus
            and q["commit"] == commit
            and (
                row is None
                or all(
                    q.get(k) == row.get(k) for k in ("planned_reserved_bytes", "planned_host_bytes")
                )
            )
        ]
        for q in hits:
            q["ran"] = True
        return [q["source"] for q in hits]

    levers = [
        annotate(r, p, i, kind="levers", held_out=r.get("set") == "validation")
        for p in found("planner_runs_*.jsonl")
        for i, r in jsonl(p)
    ]
    plans = []
    for p in found("planner_plans_*.jsonl"):
        for i, r in jsonl(p):
            at = r.get("predicted_at")
            held = at not in (None, "fresh") and not r.get("plan_changed_since_prediction")
            plans.append(
                annotate(
                    r,
                    p,
                    i,
                    kind="plan",
                    planner_commit=at if held else None,
                    held_out=held,
                    prediction_source=joined(r["spec"], r["gpus"], at, r) if held else [],
                )
            )
    tables = []
    for p in found("planner_runs_*.md"):
        meta = TABLES.get(p.name)
        for i, r in md_rows(p) if meta else []:
            if r["run"].startswith(meta.get("skip", "\0")):
                continue
            row = {k: v for k, v in meta.items() if k != "skip"}
            if "prediction_spec" in row:  # the planner that predicted it is the prediction's
                row["planner_commit"] = next(
                    q["commit"] for q in preds if q["spec"] == row["prediction_spec"]
                )
                row["prediction_source"] = joined(row["prediction_spec"], 2, row["planner_commit"])
            tables.append(
                annotate(
                    {"model": "qwen3-8b", "gpus": 2, **row, **r},
                    p,
                    i,
                    kind="table",
                    held_out=True,
                    device="2 x NVIDIA H200",
                )
            )
    return levers + plans + tables + [q for q in preds if not q["ran"]]


def git_head() -> str:
    """The commit whose planner answers `todays_plan` (+ "+changes" where ds_longctx/ differs from
    it)."""

    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=RESULTS, capture_output=True, text=True
        ).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "+changes" if git("status", "--porcelain", "../../ds_longctx") else ""
    )


def plan_check(r: dict, fresh: dict) -> dict | None:
    """A planner_runs row with a plan spec: `todays_plan` True when today's planner makes the same
    plan (placement, optimizer share, reserved and host bytes), else False with `todays_plan_change`
    saying what moved."""
    from bench_planner import plan_changed, predict_plans

    if "spec" not in r:
        return None
    key = (r["spec"], r.get("model", "qwen3-8b"), r["gpus"])
    if key not in fresh:
        fresh[key] = predict_plans([key[0]], key[1], key[2], Path(tempfile.mkdtemp()))[0]
    now = fresh[key]
    change = (
        f"today's plan fails: {now['error'][-120:]}" if "error" in now else plan_changed(r, now)
    )
    return {"todays_plan": not change, **({"todays_plan_change": change} if change else {})}


def longest_check(r: dict, fresh: dict) -> dict | None:
    """A planned longest.jsonl row: `todays_seq_len`, what its command gives today, and
    `todays_plan` (the same)."""
    if r["kind"] != "planned":
        return None
    if r["command"] not in fresh:
        out = subprocess.run(
            [sys.executable, "-m", "ds_longctx.cli", *shlex.split(r["command"])[1:]],
            capture_output=True,
            text=True,
            cwd=RESULTS.parents[1],
        )
        m = re.search(r"longest seq_len that fits = ([\d,]+) tokens", out.stdout)
        fresh[r["command"]] = int(m[1].replace(",", "")) if m else None
    n = fresh[r["command"]]
    return {"todays_seq_len": n, "todays_plan": n == r["seq_len"]}


def config_check(r: dict, fresh: dict) -> dict | None:
    """A rehearsal row of a committed config: `todays_config`, whether its run.yaml sets what the
    rehearsed one set (every key both files have, at the row's commit and now: keys added since take
    their defaults); None where git does not have that commit."""
    import yaml

    if not r.get("config", "").startswith("ds_configs/") or not r.get("commit"):
        return None
    then = subprocess.run(
        ["git", "show", f"{r['commit']}:{r['config']}"], cwd=RESULTS, capture_output=True, text=True
    )
    if then.returncode:
        return None

    def flat(d: dict, at: str = "") -> dict:
        return {
            k: v
            for key, val in d.items()
            for k, v in (
                flat(val, f"{at}{key}.").items() if isinstance(val, dict) else [(at + key, val)]
            )
        }

    old, new = (
        flat(yaml.safe_load(then.stdout)),
        flat(yaml.safe_load((RESULTS.parents[1] / r["config"]).read_text())),
    )
    unread = {"train.output_dir"} | (
        {"data.layout"} if new.get("data.source") == "synthetic" else set()
    )  # no rows
    return {
        "todays_config": all(old[k] == new[k] for k in old.keys() & new.keys() if k not in unread)
    }


CHECKS = ("todays_plan", "todays_plan_change", "todays_seq_len", "todays_config", "checked_at")


def row_key(r: dict) -> str:
    """A row's name across rebuilds: its source, else (the oldest rehearsal rows) what it rehearsed,
    where and when."""
    return r.get("source") or "|".join(
        str(r.get(k)) for k in ("config", "rank", "commit", "date", "layers")
    )


def check(rows: list, ask, kept: dict | None) -> None:
    """Set each row's checks with `ask` (row, cache) -> dict or None (not a row it checks), tagged
    with the commit that answered; `kept`: {source: the checks the current file holds}, used instead
    of asking."""
    head, cache = (git_head() if kept is None else None), {}
    for r in rows:
        if kept is not None:
            r.update(kept.get(row_key(r), {}))
        elif (got := ask(r, cache)) is not None:
            r.update(got, checked_at=head)


def build(keep_checks: bool) -> dict:
    """{current file name: its rows}."""
    files = {
        **build_simple(),
        "longest.jsonl": build_longest(),
        "planner_runs.jsonl": build_planner(),
    }
    rehearsal = RESULTS / "rehearsal.jsonl"  # as committed, its checks asked again
    files["rehearsal.jsonl"] = [
        {k: v for k, v in r.items() if k not in CHECKS} for _, r in jsonl(rehearsal)
    ]
    for name, ask in (
        ("planner_runs.jsonl", plan_check),
        ("longest.jsonl", longest_check),
        ("rehearsal.jsonl", config_check),
    ):
        kept = None
        if keep_checks:
            path = RESULTS / name
            rows = jsonl(path) if path.exists() else []
            kept = {row_key(r): {k: v for k, v in r.items() if k in CHECKS} for _, r in rows}
        check(files[name], ask, kept)
    return files


def text(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--keep_checks", action="store_true", help="keep the todays_plan columns the files hold"
    )
    ap.add_argument(
        "--diff", action="store_true", help="change nothing; name each file that differs (exit 1)"
    )
    a = ap.parse_args(argv)
    stale = []
    for name, rows in build(a.keep_checks or a.diff).items():
        path = RESULTS / name
        if not path.exists() or path.read_text() != text(rows):
            stale.append(name)
            if not a.diff:
                path.write_text(text(rows))
        print(f"{name}: {len(rows)} rows" + (" (differs)" if name in stale else ""))
    return 1 if a.diff and stale else 0


if __name__ == "__main__":
    sys.exit(main())
