"""The rehearsal tables: each rehearsed rank against its plan and the bars (bench_planner's GPU_TOL,
HOST_TOL), each `--layers` row beside the whole rehearsal of the same config, rank, length and
commit, and the README's predicted step times (`benchmarks/results/rehearsal.jsonl`; rows written by
ds_longctx/rehearsal/rehearse.py)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from bench_planner import GPU_TOL, HOST_TOL  # the bars: one home
from results_format import META, gb, n, result_file, src, table

ROOT = Path(__file__).resolve().parents[1]


def off(measured, planned) -> str:
    """A rehearsal's measured value against its plan: measured / planned - 1."""
    return f"{measured / planned - 1:+.1%}" if planned and measured else ""


def in_bars(r: dict) -> str:
    """yes where the rank's peak GPU is within GPU_TOL of the plan and under the budget and its host
    RSS within HOST_TOL of the plan's share per process."""
    gpu, plan, host, host_plan = (
        r.get(k)
        for k in (
            "peak_gpu_bytes",
            "planned_gpu_bytes",
            "host_rss_bytes",
            "planned_host_bytes_per_process",
        )
    )
    if not (gpu and plan and host and host_plan):
        return ""
    ok = (
        abs(gpu / plan - 1) <= GPU_TOL
        and gpu < r["gpu_budget_bytes"]
        and abs(host / host_plan - 1) <= HOST_TOL
    )
    return "yes" if ok else "no"


def rehearsal(d: dict) -> str:
    rows = [
        [
            r.get("config"),
            r.get("rank"),
            r.get("role"),
            n(r.get("seq_len")),
            r.get("layers"),
            gb(r.get("peak_gpu_bytes")),
            gb(r.get("planned_gpu_bytes")),
            off(r.get("peak_gpu_bytes"), r.get("planned_gpu_bytes")),
            gb(r.get("gpu_budget_bytes")),
            gb(r.get("host_rss_bytes")),
            gb(r.get("planned_host_bytes_per_process")),
            off(r.get("host_rss_bytes"), r.get("planned_host_bytes_per_process")),
            in_bars(r),
            r.get("compute_seconds_per_step"),
            r.get("predicted_seconds_per_step"),
            r.get("status"),
            r.get("date"),
            r.get("commit"),
            r.get("device"),
            src(r) if "source" in r else "`rehearsal.jsonl`",
        ]
        for r in d.get("rehearsal", [])
    ]
    out = table(
        [
            "config",
            "rank",
            "role",
            "tokens",
            "layers run",
            "peak GPU GB",
            "planned",
            "vs plan",
            "budget",
            "host RSS GB",
            "planned per process",
            "vs plan",
            f"in bars (±{GPU_TOL:.0%} GPU, under budget, ±{HOST_TOL:.0%} host)",
            "compute s/step",
            "predicted s/step",
            "status",
            *META,
        ],
        rows,
    )
    pairs = layers_pairs(d)
    if pairs:
        out += (
            "\n`--layers` against the whole step: each rehearsal of some layers beside the "
            "rehearsal of all of "
            "them of the same config, rank, length and commit (extrapolated / whole - 1).\n\n"
        )
        out += table(
            [
                "config",
                "rank",
                "tokens",
                "commit",
                "layers run",
                "peak GPU GB",
                "whole",
                "peak vs whole",
                "compute s/step",
                "whole",
                "time vs whole",
                "host GB",
                "whole",
                "host vs whole",
            ],
            pairs,
        )
    return out


def every_layer(r: dict) -> bool:
    """A rehearsal row that ran all of the model's layers ("36/36")."""
    run, total = r["layers"].split("/")
    return run == total


def layers_pairs(d: dict) -> list:
    rows = d.get("rehearsal", [])
    whole = {
        (r["config"], r["rank"], r["seq_len"], r["commit"]): r
        for r in rows
        if r.get("status") == "ok" and every_layer(r)
    }
    out = []
    for r in rows:
        w = whole.get((r["config"], r["rank"], r["seq_len"], r["commit"]))
        if w is None or r is w or r.get("status") != "ok":
            continue
        out.append(
            [
                r["config"],
                r["rank"],
                n(r["seq_len"]),
                r["commit"],
                r["layers"],
                gb(r["peak_gpu_bytes"]),
                gb(w["peak_gpu_bytes"]),
                off(r["peak_gpu_bytes"], w["peak_gpu_bytes"]),
                r["compute_seconds_per_step"],
                w["compute_seconds_per_step"],
                off(r["compute_seconds_per_step"], w["compute_seconds_per_step"]),
                gb(r["host_rss_bytes"]),
                gb(w["host_rss_bytes"]),
                off(r["host_rss_bytes"], w["host_rss_bytes"]),
            ]
        )
    return out


def model_label(model: str) -> str:
    """`qwen3-30b-a3b` -> `Qwen3-30B-A3B` (a shipped geometry's name as the model card spells
    it)."""
    return "Qwen" + model[4:].upper() if model.startswith("qwen") else model


def plan_text(config: str) -> str:
    """The plan.txt beside a config's run.yaml ("" for a config not in the repository)."""
    return _read((ROOT / config).parent / "plan.txt")


@functools.lru_cache(maxsize=None)  # the tables ask once per rehearsal row
def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def plan_host_gb(config: str) -> int | None:
    """The host memory a plan was made for: --host_mem_gb of its plan.txt's header (`# generated by
    `ds-longctx plan
    ...`; do not edit`)."""
    found = re.search(r"--host_mem_gb (\d+)", plan_text(config).partition("\n")[0])
    return int(found[1]) if found else None


def newest_rehearsal(rows: list) -> list:
    """One config's rows, each rank's newest of the newest rehearsal: every layer run where one was,
    else K of L (the rows of one commit and one --layers)."""
    groups: dict = {}
    for r in rows:  # file order is the order they ran in
        groups.setdefault((every_layer(r), r["commit"], r["layers"]), {})[r["rank"]] = r
    whole = [k for k in groups if k[0]]
    return list(groups[(whole or list(groups))[-1]].values())


def rehearsed(d: dict) -> list:
    """README rows: per single-node committed config (ds_configs/), its newest rehearsal (one GPU
    playing each rank role; every layer, or K of L and extrapolated): the slowest role's predicted
    step and the highest GPU peak, beside a published step time of the same model, length and GPU
    count."""
    by: dict = {}
    for r in d.get("rehearsal", []):
        if (
            r.get("status") == "ok"
            and r.get("nodes", 1) == 1
            and r["config"].startswith("ds_configs/")
            and longest_plan(r["config"]) is None
        ):  # a longest plan's row is longest_rehearsed's
            by.setdefault(r["config"], []).append(r)
    timed = [
        r for r in d.get("longest", []) if r["kind"] == "published" and "seconds_per_step" in r
    ]
    rows = []
    for cfg, found in sorted(by.items()):
        ranks = newest_rehearsal(found)
        slow = max(ranks, key=lambda r: r["predicted_seconds_per_step"])
        top = max(ranks, key=lambda r: r["peak_gpu_bytes"])
        run, total = slow["layers"].split("/")
        peer = [
            p
            for p in timed
            if p["gpus"] == slow["world"]
            and p["model"].lower() == slow["model"].lower()
            and abs(p["seq_len"] / slow["seq_len"] - 1) < 0.01
        ]
        host = plan_host_gb(cfg)
        what, beside = objective_of(cfg), ""
        if what != "sft":
            beside = sft_beside(slow, by.get(cfg.replace(f"-{what}_", "_"), []))
        rows.append(
            [
                f"s/step, {model_label(slow['model'])}"
                + ("" if what == "sft" else f" {what.upper()} (one shared prompt)")
                + f", {n(slow['seq_len'])} tokens, "
                f"{slow['world']} x "
                f"{slow['gpu_budget_bytes'] / 1e9:.0f} GB ({slow['link'].split()[0]})"
                + (f" + {host} GB host" if host else ""),
                f"{len(ranks)} rank role{'s' if len(ranks) > 1 else ''} rehearsed on "
                f"{slow['device']}"
                + ("" if run == total else f", {run} of {total} layers run and extrapolated")
                + ": time predicted, memory measured"
                + (
                    ""
                    if slow.get("todays_config", True)
                    else " (the committed config has been re-planned "
                    "since: not yet rehearsed as it is)"
                ),
                f"{slow['predicted_seconds_per_step']:.1f} s (compute "
                f"{slow['compute_seconds_per_step']:.1f} s), "
                f"{gb(top['peak_gpu_bytes'])} GB peak GPU (plan {gb(top['planned_gpu_bytes'])})",
                beside
                or ", ".join(
                    f"{p['system']}: {p['seconds_per_step']:.1f} s, published{published_by(p)}, on "
                    f"{p['machine']}"
                    for p in peer
                ),
                result_file("rehearsal", *(["longest"] if peer else [])),
            ]
        )
    return rows


def objective_of(config: str) -> str:
    """A plan's train.objective, from its plan.txt header (sft where the plan names none)."""
    found = re.search(r"--objective (\w+)", plan_text(config).partition("\n")[0])
    return found[1] if found else "sft"


def sft_beside(row: dict, sft_rows: list) -> str:
    """The SFT plan of the same model, length and machine, rehearsed on the same device as `row`:
    its predicted step and the ratio; "" where none was."""
    same = [r for r in sft_rows if r["device"] == row["device"] and r.get("status") == "ok"]
    if not same:
        return ""
    sft = max(newest_rehearsal(same), key=lambda r: r["predicted_seconds_per_step"])
    ratio = row["predicted_seconds_per_step"] / sft["predicted_seconds_per_step"]
    return (
        f"SFT of the same plan, rehearsed on {sft['device']}: "
        f"{sft['predicted_seconds_per_step']:.1f} s ({ratio:.2f}x)"
    )


def published_by(peer: dict) -> str:
    """` in <where>` for a published figure: its source's first words (TRL's docs example, a pull
    request), so two figures of one peer in one cell say which is which; "" without a source."""
    where = peer.get("paper", "").split(",")[0].split(" (")[0]
    return f" in {where}" if where else ""


def longest_plan(config: str) -> dict | None:
    """{"seq_len", "host_mem_gb"} of a plan made with --find_max_len, read from the plan.txt beside
    its run.yaml; None for a plan of a given length or a config not in the repository."""
    text = plan_text(config)
    found = re.search(r"longest seq_len that fits: ([\d,]+) tokens", text)
    if "--find_max_len" not in text.partition("\n")[0] or not found:
        return None
    return {"seq_len": int(found[1].replace(",", "")), "host_mem_gb": plan_host_gb(config)}


def longest_rehearsed(d: dict) -> list:
    """README row: the planner's longest lengths rehearsed at that length (one rank on one GPU,
    newest per config), how many are inside the bars, and each one's GPU peak against its plan."""
    newest = {}
    for r in d.get("rehearsal", []):
        plan = longest_plan(r["config"]) if r.get("status") == "ok" else None
        if plan and plan["seq_len"] == r["seq_len"]:
            newest[r["config"]] = (r, plan)
    if not newest:
        return []
    rows = sorted(newest.values(), key=lambda rp: -rp[0]["seq_len"])
    inside = sum(in_bars(r) == "yes" for r, _ in rows)
    each = []
    for r, plan in rows:
        host = f" + {plan['host_mem_gb']} GB host" if plan["host_mem_gb"] else ""
        each.append(
            f"{r['world']} x {r['gpu_budget_bytes'] / 1e9:.0f} GB{host}: {n(r['seq_len'])} tokens, "
            f"{gb(r['peak_gpu_bytes'])} GB (plan {gb(r['planned_gpu_bytes'])}, "
            f"{off(r['peak_gpu_bytes'], r['planned_gpu_bytes'])}), {r['layers']} layers"
        )
    devices = sorted({r["device"] for r, _ in rows})
    models = sorted({model_label(r["model"]) for r, _ in rows})
    return [
        [
            f"longest {', '.join(models)} plans, one rank rehearsed on {', '.join(devices)}",
            "measured against the plan",
            f"{inside} of {len(rows)} inside ±{GPU_TOL:.0%} GPU (under budget), ±{HOST_TOL:.0%} "
            "host",
            "; ".join(each),
            result_file("rehearsal"),
        ]
    ]
