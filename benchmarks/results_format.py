"""Cell formats shared by the results tables (results_tables, results_rehearsal): a markdown table,
numbers, GB (1e9 bytes), a planner error (planned / measured - 1), and each row's date, commit,
device and source link."""

from __future__ import annotations

import re


def table(head: list, rows: list) -> str:
    if not rows:
        return ""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def n(x) -> str:
    return f"{x:,}" if x is not None else ""


def gb(b) -> str:
    return f"{b / 1e9:.1f}" if b is not None else ""


def err(planned, measured) -> str:
    return f"{planned / measured - 1:+.1%}" if planned and measured else ""


def src(r: dict) -> str:
    """The row's source as a link from docs/ (file name and line as its text)."""
    path, where = re.match(r"([^:#]+)(.*)", r["source"]).groups()
    return f"[{path.rsplit('/', 1)[-1]}{where}](../benchmarks/results/{path})"


def result_file(*stems: str) -> str:
    """Links, from the repository root (the README), to the current result files `stems`
    (benchmarks/results/)."""
    return ", ".join(f"[{s}.jsonl](benchmarks/results/{s}.jsonl)" for s in stems)


def device(r: dict) -> str:
    """The row's device, or the one its session directory names (h200x2: two H200s)."""
    d = r.get("device")
    if not d and (m := re.search(r"h200x(\d)", r["source"])):
        return f"{m[1]} x NVIDIA H200"
    return d if not d or re.search(r" x |-x\d", d) or not r.get("gpus") else f"{r['gpus']} x {d}"


def meta(r: dict) -> list:
    return [r.get("date"), r.get("commit") or "not recorded", device(r), src(r)]


META = ["date", "commit", "device", "source"]
