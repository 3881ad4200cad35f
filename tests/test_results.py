"""benchmarks/results/: the current files (one per question) are what benchmarks/results_merge.py
builds from the raw files under sessions/, every line traceable to its raw line; docs/results.md and
the README's generated blocks are what benchmarks/results_doc.py writes from the current files.

- A current file that differs from its rebuild (a raw file added without merging, a hand edit)
  fails, with the command that rebuilds it.
- A line of a current file whose `source` is a JSON line carries that line's every field unchanged
  (the `commit` is the one exception, and only with a `commit_note` saying where the right tree is
  named).
- The top level holds at most 16 entries besides sessions/.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.helpers import ROOT

RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def merge():
    """benchmarks/results_merge.py as a module (benchmarks/ holds its imports)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import results_merge

        yield results_merge
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def current(name: str) -> list:
    return [json.loads(x) for x in (RESULTS / name).read_text().splitlines() if x.strip()]


def test_current_files_are_their_rebuild_from_sessions(merge):
    built = merge.build(keep_checks=True)
    assert set(built) >= {
        "peers.jsonl",
        "longest.jsonl",
        "planner_runs.jsonl",
        "attention.jsonl",
        "levers.jsonl",
    }
    stale = [
        name
        for name, rows in built.items()
        if not (RESULTS / name).exists() or (RESULTS / name).read_text() != merge.text(rows)
    ]
    assert not stale, (
        f"benchmarks/results/{stale} differ from what sessions/ gives; rebuild them: python "
        f"benchmarks/results_merge.py (then python benchmarks/results_doc.py)"
    )


def test_every_line_carries_its_raw_line_unchanged(merge):
    checked = 0
    for name in merge.build(keep_checks=True):
        for row in current(name):
            if (
                name == "rehearsal.jsonl"
            ):  # committed as they came (results_merge's rules), not rebuilt from raw
                continue
            path, _, line = row["source"].partition("#")[0].partition(":")
            assert (RESULTS / path).exists(), (name, row["source"])
            if not line or not path.endswith(".jsonl"):
                continue
            raw = json.loads((RESULTS / path).read_text().splitlines()[int(line) - 1])
            changed = {k: (v, row.get(k)) for k, v in raw.items() if row.get(k) != v}
            if "commit_note" in row:  # the right tree, where the raw file names the device copy's
                assert changed.pop("commit", (row["commit_recorded"],))[0] == row["commit_recorded"]
            assert not changed, (name, row["source"], changed)
            checked += 1
    assert checked >= 100, checked


def test_a_changed_raw_number_makes_the_current_file_stale(merge, tmp_path, monkeypatch):
    """The rebuild reads sessions/: one raw step time changed there changes peers.jsonl's line (so
    the staleness test above would fail on it)."""
    raw = RESULTS / "sessions" / "2026-11-30" / "peers.jsonl"
    rows = [json.loads(x) for x in raw.read_text().splitlines()]
    rows[0]["seconds_per_step"] += 1
    fake = tmp_path / "sessions" / "2026-11-30"
    fake.mkdir(parents=True)
    (fake / "peers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(merge, "RESULTS", tmp_path)
    monkeypatch.setattr(merge, "SESSIONS", tmp_path / "sessions")
    got = merge.build_simple()["peers.jsonl"]
    assert got[0]["seconds_per_step"] == current("peers.jsonl")[0]["seconds_per_step"] + 1
    assert got[0]["source"] == "sessions/2026-11-30/peers.jsonl:1"


def test_top_level_holds_one_file_per_question():
    top = sorted(p.name for p in RESULTS.iterdir() if p.name != "sessions")
    assert len(top) <= 18, top
    assert (RESULTS / "sessions").is_dir()
    assert not [n for n in top if n.startswith("session_") or any(c.isdigit() for c in n)], (
        top
    )  # nothing dated


def test_every_plan_row_says_whether_it_is_todays_plan():
    """Each committed prediction and each planned length carries the check results_merge.py made
    with the planner of `checked_at`: `todays_plan` (and what moved, where it did), `todays_seq_len`
    for a planned length."""
    rows = [r for r in current("planner_runs.jsonl") if "spec" in r]
    assert len(rows) >= 60 and all(
        isinstance(r["todays_plan"], bool) and r["checked_at"] for r in rows
    )
    assert all(r["todays_plan"] == ("todays_plan_change" not in r) for r in rows)
    planned = [r for r in current("longest.jsonl") if r["kind"] == "planned"]
    assert planned and all(
        r["todays_plan"] == (r["todays_seq_len"] == r["seq_len"]) for r in planned
    )


def test_bench_planner_reads_the_predictions_of_planner_runs():
    """`bench_planner.py --check / --predictions benchmarks/results/planner_runs.jsonl`: each
    prediction row and each run of a prediction, as made by the planner of its `planner_commit`;
    lever runs, table rows and runs of a fresh plan (no prediction) are left out."""
    from tests.helpers import bench_planner

    rows = current("planner_runs.jsonl")
    got = [r for _, r in bench_planner().read_predictions(str(RESULTS / "planner_runs.jsonl"))]
    want = [r for r in rows if r["kind"] in ("plan", "prediction") and r["planner_commit"]]
    assert [(r["spec"], r["source"]) for r in got] == [(r["spec"], r["source"]) for r in want]
    assert all(g["commit"] == w["planner_commit"] for g, w in zip(got, want))
    plans = [(g, w) for g, w in zip(got, want) if w["kind"] == "plan"]
    assert plans and all(
        g["commit"] == w["predicted_at"] for g, w in plans
    )  # the planner's, not the run's tree
    assert any(w["commit"] != w["predicted_at"] for _, w in plans)


@pytest.fixture(scope="module")
def doc():
    """benchmarks/results_doc.py as a module."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import results_doc

        yield results_doc
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_docs_results_and_the_generated_blocks_are_current(doc):
    """docs/results.md, and every `<!-- results:NAME -->` block of README.md and docs/*.md, is what
    benchmarks/results_doc.py writes from today's current files."""
    out = doc.outputs()
    assert "docs/results.md" in out and "README.md" in out
    stale = [rel for rel, text in out.items() if (ROOT / rel).read_text() != text]
    assert not stale, f"{stale} are stale; rewrite them: python benchmarks/results_doc.py"


def test_a_number_edited_inside_a_block_is_written_back(doc):
    """A generated block whose number was changed by hand is not what the generator writes (so the
    test above fails)."""
    data = doc.load()
    text = (
        "before\n<!-- results:planner_accuracy -->\nold\n<!-- /results:planner_accuracy "
        "-->\nafter\n"
    )
    good = doc.fill(text, data)
    digit = next(re.finditer(r"\d+ of \d+", good))
    edited = good[: digit.start()] + "0 of 99" + good[digit.end() :]
    assert edited != good and doc.fill(edited, data) == good
    assert good.startswith("before\n") and good.endswith("after\n")


def test_the_planner_counts_are_the_notebooks(doc):
    """The held-out counts the docs give (results_tables.accuracy) are the ones
    notebooks/memory_plan.ipynb prints from the same rows (its committed output, which
    tests/test_notebooks.py re-executes)."""
    import nbformat
    import results_tables

    nb = nbformat.read(ROOT / "notebooks" / "memory_plan.ipynb", as_version=4)
    printed = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    a = results_tables.accuracy(doc.load())
    assert (
        f"{a['gpu_in']} of {a['gpu_n']} held-out runs inside ±10% GPU ({a['one_step']} one-step"
        in printed
    )
    assert f"{a['host_in']} of {a['host_n']} held-out runs inside ±15% host" in printed


def test_rehearsal_rows_are_judged_against_their_plan_and_paired_with_their_whole_step(doc):
    """A rehearsal row is in the bars only with its GPU peak within ±10% of the plan and under the
    budget and its host within ±15%; a --layers row is set beside the whole-step row of the same
    config, rank, length and commit only."""
    import results_rehearsal as t

    base = {
        "config": "c/run.yaml",
        "rank": 0,
        "seq_len": 1024,
        "commit": "aaa",
        "status": "ok",
        "planned_gpu_bytes": 100e9,
        "gpu_budget_bytes": 105e9,
        "planned_host_bytes_per_process": 10e9,
        "host_rss_bytes": 10e9,
    }
    whole = {**base, "layers": "36/36", "peak_gpu_bytes": 104e9, "compute_seconds_per_step": 200.0}
    assert t.in_bars(whole) == "yes"
    assert (
        t.in_bars({**whole, "peak_gpu_bytes": 106e9}) == "no"
    )  # within 10% of the plan, past the budget
    assert t.in_bars({**whole, "peak_gpu_bytes": 89e9}) == "no"
    assert t.in_bars({**whole, "host_rss_bytes": 11.6e9}) == "no"
    part = {**base, "layers": "6/36", "peak_gpu_bytes": 102e9, "compute_seconds_per_step": 210.0}
    other_tree = {**part, "commit": "bbb"}
    pairs = t.layers_pairs({"rehearsal": [part, whole, other_tree]})
    assert len(pairs) == 1
    assert (
        pairs[0][3] == "aaa" and pairs[0][7] == f"{102 / 104 - 1:+.1%}" and pairs[0][10] == "+5.0%"
    )
    assert pairs[0][13] == "+0.0%"


def test_readme_counts_the_longest_plans_rehearsed_at_their_length(doc, tmp_path):
    """Only a rehearsal of a --find_max_len plan at the length that plan found counts as a longest
    plan rehearsed (newest per config); a shorter check of the same plan and a plan of a given
    length do not."""
    import results_rehearsal as t

    def config(name, first, found):
        d = tmp_path / name
        d.mkdir()
        (d / "plan.txt").write_text(
            f"# generated by `ds-longctx plan {first}`; do not edit\nbudget: ...\n"
            + (
                f"longest seq_len that fits: {found:,} tokens (a multiple of 1024)\n"
                if found
                else "planned: 1.0 GB per GPU\n"
            )
        )
        return str(d / "run.yaml")

    longest = config(
        "max", "--model m --find_max_len --gpus 8 --gpu_mem_gb 80 --host_mem_gb 1024", 3_335_168
    )
    given = config("given", "--model m --seq_len 1048576 --gpus 8 --gpu_mem_gb 80", None)
    row = {
        "status": "ok",
        "world": 8,
        "gpu_budget_bytes": 80e9,
        "planned_gpu_bytes": 70e9,
        "planned_host_bytes_per_process": 100e9,
        "host_rss_bytes": 100e9,
        "layers": "4/36",
        "device": "GPU X",
        "model": "qwen3-8b",
    }
    rows = [
        {
            **row,
            "config": longest,
            "seq_len": 3_335_168,
            "peak_gpu_bytes": 90e9,
        },  # older, out of the bars
        {**row, "config": longest, "seq_len": 3_335_168, "peak_gpu_bytes": 72.5e9},
        {**row, "config": longest, "seq_len": 262_144, "peak_gpu_bytes": 1e9},
        {**row, "config": given, "seq_len": 1_048_576, "peak_gpu_bytes": 71e9},
    ]
    assert t.longest_plan(longest) == {"seq_len": 3_335_168, "host_mem_gb": 1024}
    assert t.longest_plan(given) is None
    [readme_row] = t.longest_rehearsed({"rehearsal": rows})
    assert readme_row[1] == "measured against the plan" and readme_row[2].startswith(
        "1 of 1 inside"
    )
    assert (
        readme_row[3]
        == "8 x 80 GB + 1024 GB host: 3,335,168 tokens, 72.5 GB (plan 70.0, +3.6%), 4/36 layers"
    )
    assert t.longest_rehearsed({"rehearsal": rows[2:]}) == []
    assert readme_row[0].startswith("longest Qwen3-8B plans")


def test_readme_step_rows_take_the_slowest_role_and_a_peer_of_the_same_model(tmp_path, monkeypatch):
    """A committed 1M config's README row: its newest rehearsal (every layer run where one was), the
    slowest rank role's predicted step and the highest GPU peak of its roles, `K of L layers` said
    where it was extrapolated, the host its plan was made for, and beside it only a published step
    of the same model, GPU count and length."""
    import results_rehearsal as t

    monkeypatch.setattr(t, "ROOT", tmp_path)
    d = tmp_path / "ds_configs" / "moe_1m"
    d.mkdir(parents=True)
    (d / "plan.txt").write_text(
        "# generated by `ds-longctx plan --model qwen3-30b-a3b --seq_len 1048576 --gpus 8 "
        "--gpu_mem_gb 80 --host_mem_gb 1024`; do not edit\n"
    )
    row = {
        "status": "ok",
        "config": "ds_configs/moe_1m/run.yaml",
        "model": "qwen3-30b-a3b",
        "world": 8,
        "seq_len": 1_048_576,
        "gpu_budget_bytes": 80e9,
        "planned_gpu_bytes": 70.5e9,
        "link": "nvlink-h100 (x)",
        "device": "GPU X",
        "layers": "4/48",
        "compute_seconds_per_step": 1.0,
    }
    rows = [
        {
            **row,
            "rank": 0,
            "commit": "old",
            "predicted_seconds_per_step": 999.0,
            "peak_gpu_bytes": 79e9,
        },
        {
            **row,
            "rank": 0,
            "commit": "new",
            "predicted_seconds_per_step": 345.7,
            "peak_gpu_bytes": 67.6e9,
        },
        {
            **row,
            "rank": 7,
            "commit": "new",
            "predicted_seconds_per_step": 343.2,
            "peak_gpu_bytes": 68.4e9,
        },
    ]
    published = {
        "kind": "published",
        "system": "TRL",
        "gpus": 8,
        "machine": "8 x H100",
        "seq_len": 1_048_576,
    }
    peers = [
        {**published, "model": "Qwen3-30B-A3B", "seconds_per_step": 483.0},
        {**published, "model": "Qwen3-8B", "seconds_per_step": 364.0},
    ]
    [r] = t.rehearsed({"rehearsal": rows, "longest": peers})
    assert r[0] == "s/step, Qwen3-30B-A3B, 1,048,576 tokens, 8 x 80 GB (nvlink-h100) + 1024 GB host"
    assert r[1].startswith("2 rank roles rehearsed on GPU X, 4 of 48 layers run and extrapolated")
    assert r[2] == "345.7 s (compute 1.0 s), 68.4 GB peak GPU (plan 70.5)"
    assert r[3] == "TRL: 483.0 s, published, on 8 x H100"
    # two figures of one peer in one cell: each names its source
    cited = [{**p, "paper": 'TRL documentation, "1M+ tokens"'} for p in peers]
    [r] = t.rehearsed({"rehearsal": rows, "longest": cited})
    assert r[3] == "TRL: 483.0 s, published in TRL documentation, on 8 x H100"
    # a rehearsal of every layer, though older, is the row's
    whole = {
        **row,
        "rank": 0,
        "commit": "older",
        "layers": "48/48",
        "predicted_seconds_per_step": 350.0,
        "peak_gpu_bytes": 70e9,
    }
    [r] = t.rehearsed({"rehearsal": [whole, *rows], "longest": peers})
    assert r[1].startswith("1 rank role rehearsed on GPU X:") and r[2].startswith("350.0 s")
    # a config re-planned since its rehearsal says so
    [r] = t.rehearsed(
        {"rehearsal": [{**x, "todays_config": False} for x in rows], "longest": peers}
    )
    assert r[1].endswith(
        "(the committed config has been re-planned since: not yet rehearsed as it is)"
    )


def test_a_rehearsal_row_says_whether_its_config_is_still_the_committed_one(merge):
    """`todays_config`: the run.yaml at the row's commit sets what today's does (keys added since
    aside), asked of git. Every rehearsal row of a committed config carries it; one whose config the
    planner re-planned is False."""
    import subprocess

    rows = [r for r in current("rehearsal.jsonl") if r["config"].startswith("ds_configs/")]
    if subprocess.run(
        ["git", "cat-file", "-e", rows[0]["commit"]], cwd=ROOT, capture_output=True
    ).returncode:
        pytest.skip("this clone does not hold the rehearsed commits")
    assert all(merge.config_check(r, {}) == {"todays_config": r["todays_config"]} for r in rows)
    assert {r["todays_config"] for r in rows} == {True, False}
    assert merge.config_check({**rows[-1], "config": "elsewhere/run.yaml"}, {}) is None


def test_readme_speed_rows_carry_gpu_memory_and_say_why_ours_is_higher(doc):
    """A speed row is measured, with each system's peak GPU memory; where ds_longctx holds more than
    every peer, the row says its plan spends the budget on speed, naming the run's placement (read
    from the result line)."""
    import results_tables as t

    def line(system, seconds, peak, placement=None):
        cfg = {
            "model": "qwen3-4b",
            **(
                {"observed": {"run_config": {"memory": {"placement": placement}}}}
                if placement
                else {}
            ),
        }
        return {
            "system": system,
            "seq_len": 1024,
            "seconds_per_step": seconds,
            "peak_gpu_bytes": peak,
            "device": "GPU X",
            "gpus": 2,
            "source": "s/peers.jsonl:1",
            "config": cfg,
        }

    fast = line("ds_longctx", 20.0, 120e9, "cache:36")
    row = t.speed_row(
        {
            "peers": [
                fast,
                line("alst", 30.0, 90e9),
                line("ds_longctx", 25.0, 80e9, "keep:36"),
                line("alst", 10.0, 10e9) | {"gpus": 1},
            ]
        },
        "qwen3-4b",
        2,
        1024,
    )
    assert (
        row[1] == "measured"
        and row[2].startswith("20.0 s, 120.0 GB peak GPU (by design")
        and "cache:36" in row[2]
    )
    assert row[3] == "DeepSpeed ALST: 30.0 s, 90.0 GB peak GPU"
    assert row[0] == "s/step, Qwen3-4B, 1,024 tokens, 2 x GPU X"  # the 1-GPU run is another row's
    row = t.speed_row({"peers": [fast, line("alst", 30.0, 130e9)]}, "qwen3-4b", 2, 1024)
    assert (
        row[2] == "20.0 s, 120.0 GB peak GPU"
        and row[4] == "[peers.jsonl](benchmarks/results/peers.jsonl)"
    )


def test_readme_gets_each_other_models_newest_longest_run_with_its_depth(doc):
    """A run at a planned longest length of a model other than Qwen3-8B: one README row per model
    and machine, the newest, its depth named where reduced; Qwen3-8B's runs stay in their own
    rows."""
    import results_tables as t

    base = {
        "kind": "run",
        "gpus": 1,
        "gpu_mem_gb": 141.0,
        "host_mem_gb": 128.0,
        "step_seconds": [1.0],
        "peak_gpu_bytes": 110e9,
        "planned_reserved_bytes": 120e9,
        "host_peak_bytes": 50e9,
        "planned_host_bytes": 51e9,
    }
    rows = [
        {**base, "model": "qwen3.5-4b", "layers": "32/32", "seq_len": 362_496},
        {**base, "model": "qwen3.5-4b", "layers": "32/32", "seq_len": 375_808},  # newer
        {**base, "model": "qwen3-30b-a3b", "layers": "1/48", "seq_len": 1_730_560},
        {**base, "model": "qwen3-8b", "seq_len": 156_672},
    ]
    got = {r[0]: r for r in t.other_longest({"longest": rows})}
    m = "1 x 141 GB + 128 GB host"
    assert set(got) == {f"longest Qwen3.5-4B, {m}", f"longest Qwen3-30B-A3B, {m}"}
    q35 = got["longest Qwen3.5-4B, 1 x 141 GB + 128 GB host"]
    assert q35[1] == "planned, then run (measured)"
    assert q35[2] == "375,808 tokens, 110.0 GB peak GPU (plan 120.0), 50.0 GB host (plan 51.0)"
    assert (
        got["longest Qwen3-30B-A3B, 1 x 141 GB + 128 GB host"][1]
        == "planned, then run (measured, 1 of 48 layers)"
    )
