"""Readers of the raw text files under benchmarks/results/sessions/ that are not JSON: `ds-longctx
plan --find_max_len` transcripts (longest_planned_*.txt), the tables of planner_runs_*.md, and a
stdlib corpus run's summary.txt. Each returns the numbers as the file prints them (GB = 1e9 bytes,
GiB = 2**30), with the line they are on; nothing is computed.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

# transcripts whose header names the planner only as "the commit that adds this file" (or the one
# after another): the commit `git log --diff-filter=A` gives for the file
PLANNER_COMMITS = {
    "longest_planned_2026-12-01.txt": "5af0d3a",
    "longest_planned_2026-12-01b.txt": "daa32ac",
    "longest_planned_2026-12-01c.txt": "cdf5c8c",
    "longest_planned_2026-12-01d.txt": "2d69b00",
    "longest_planned_2026-12-02.txt": "4c53428",
}


def number(text: str) -> float:
    return float(text.replace(",", ""))


def plan_command(line: str) -> dict:
    """The machine of one `$ ds-longctx plan ...` line: model, gpus, nodes, GPU and host budgets,
    other flags."""
    args, out, flags = shlex.split(line.lstrip("$ "))[2:], {}, []
    i = 0
    while i < len(args):
        key = args[i].lstrip("-")
        if key in ("model", "gpus", "nodes", "gpu_mem_gb", "host_mem_gb") and i + 1 < len(args):
            out[key] = args[i + 1] if key == "model" else number(args[i + 1])
            i += 2
            continue
        flags.append(args[i])
        i += 1
    for key in ("gpus", "nodes"):
        if key in out:
            out[key] = int(out[key])
    return {**out, "flags": flags}


def parse_longest(path: Path) -> list:
    """(line, row) of every `plan --find_max_len` in a transcript: the command's machine, the
    longest seq_len, the planned GB per GPU and host, the placement, the levers line, and the
    planner's commit."""
    lines = path.read_text().splitlines()
    head = re.search(r"commit ([0-9a-f]{7})\b", lines[0])
    commit = PLANNER_COMMITS.get(path.name) or (head[1] if head else None)
    rows, cur = [], None
    for i, line in enumerate(lines, 1):
        if line.startswith("$ ds-longctx plan"):
            cur = {**plan_command(line), "command": line[2:].strip(), "planner_commit": commit}
            rows.append((i, cur))
        elif cur is None:
            continue
        elif (
            m := re.search(r"longest seq_len that fits = ([\d,]+) tokens", line)
        ) and "seq_len" not in cur:
            cur["seq_len"] = int(number(m[1]))
        elif m := re.match(r"planned: ([\d.]+) GB per GPU, ([\d.]+) GB host", line):
            cur.setdefault("planned_gpu_gb", float(m[1]))
            cur.setdefault("planned_host_gb", float(m[2]))
        elif m := re.match(r"placement per layer: (\S+)", line):
            cur.setdefault("placement", m[1])
        elif m := re.match(r"\S+: seq_len=[\d,]+ .*? \| (.*)$", line):
            cur.setdefault("levers", m[1])
    return rows


def md_rows(path: Path) -> list:
    """(line, row) of every row of the markdown tables of a planner_runs_*.md: the run, its
    placement, tree, fused ops, the measured and predicted reserved GB (the highest step where
    several are given), host GB (measured as Σ ranks; a rank-0 figure is kept as a note only), the
    GPU budget and whether the run stayed under it. A placement written "same" is the row
    above's."""
    out, head = [], None
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("|"):
            head = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if head is None:
            head = cells
        elif not set(line) <= set("|-: "):
            row = md_row(head, cells)
            if row.get("placement") == "same" and out:  # "same": the row above's
                row["placement"] = out[-1][1]["placement"]
            out.append((i, row))
    return out


def floats(cell: str) -> list:
    return [number(x) for x in re.findall(r"\d[\d,]*\.?\d*", cell)]


def md_row(head: list, cells: list) -> dict:
    row = {"run": cells[0]}
    for j, (h, c) in enumerate(zip(head, cells)):
        nxt = cells[j + 1] if j + 1 < len(cells) else ""
        if h in ("placement", "fused ops", "tree"):
            row[{"fused ops": "fused_ops", "tree": "commit"}.get(h, h)] = c
        elif h.startswith("reserved GB") and "measured_reserved_gb" not in row:
            row["measured_reserved_gb"], row["planned_reserved_gb"] = max(floats(c)), floats(nxt)[0]
        elif h.startswith("host GB") and "planned_host_gb" not in row:
            row["planned_host_gb"] = floats(nxt)[0]
            if "rank 0" in c:
                row["measured_host_note"] = c
            else:
                row["measured_host_gb"] = floats(c)[0]
        elif h == "budget":
            row["gpu_mem_gb"] = floats(c)[0]
        elif h == "under it":
            row["under_budget"] = "yes" in c
    return row


def parse_stdlib_summary(path: Path) -> dict:
    """A stdlib corpus run's summary.txt (benchmarks/stdlib_corpus.sh writes it): the corpus line,
    the train line and the eval table, plus the run's seq_len (run.yaml) and model size
    (model_config.json) beside it."""
    import json

    import yaml

    text = path.read_text()
    corpus = re.search(
        r"corpus: Python (\S+) stdlib, ([\d,]+) documents \((\d+) held out\), ([\d,]+) tokens, "
        r"longest (\S+) \(([\d,]+)\), prepared in ([\d.]+) s",
        text,
    )
    train = re.search(
        r"train: (\d+) steps, loss ([\d.]+) -> ([\d.]+), ([\d.]+) s/step \(median after the first "
        r"quarter\), peak GPU ([\d.]+) GiB, skipped rows (\d+)",
        text,
    )
    evals = [
        dict(
            zip(
                (
                    "step",
                    "eval_loss",
                    "first_bucket",
                    "last_bucket",
                    "near_half",
                    "far_half",
                    "far_minus_near",
                ),
                (int(m[1]), *map(float, m.groups()[1:])),
            )
        )
        for m in re.finditer(
            r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)$",
            text,
            re.M,
        )
    ]
    run = yaml.safe_load((path.parent / "run.yaml").read_text())
    model = json.loads((path.parent / "model_config.json").read_text())
    return {
        "python": corpus[1],
        "documents": int(number(corpus[2])),
        "held_out_documents": int(corpus[3]),
        "tokens": int(number(corpus[4])),
        "longest_document": corpus[5],
        "longest_tokens": int(number(corpus[6])),
        "prepare_seconds": float(corpus[7]),
        "steps": int(train[1]),
        "loss_first": float(train[2]),
        "loss_last": float(train[3]),
        "seconds_per_step": float(train[4]),
        "peak_gpu_gib": float(train[5]),
        "skipped_rows": int(train[6]),
        "seq_len": run["train"]["seq_len"],
        "hidden_size": model["hidden_size"],
        "layers": model["num_hidden_layers"],
        "vocab_size": model["vocab_size"],
        "evals": evals,
    }
