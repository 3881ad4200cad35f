"""benchmarks/bench_planner.py's held-out bookkeeping (CPU): plan specs with their model and
budgets, the verdict against both budgets, what makes two predictions the same plan, predictions
from several files, `--check`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, bench_planner


def test_held_out_plan_specs_carry_their_model_and_budgets():
    """`seq_len:gpu_mem_gb[:flag+flag]`: `model=` picks the plan's model (not passed twice to
    `plan`); the table says NO when the run went over either budget the plan had (GPU: reserved +
    the plan's context term; host: Σ RSS)."""
    bp = bench_planner()
    seq, gb, model, args = bp.plan_args(
        "264192:40:model=qwen3-1.7b+host_mem_gb=60+tiled_layer", "qwen3-8b", 1
    )
    assert (seq, gb, model) == (264192, 40.0, "qwen3-1.7b")
    assert args == [
        "--model",
        "qwen3-1.7b",
        "--seq_len",
        "264192",
        "--gpus",
        "1",
        "--gpu_mem_gb",
        "40",
        "--host_mem_gb",
        "60",
        "--tiled_layer",
    ]
    assert bp.plan_args("1024:80", "qwen3-4b", 2)[2] == "qwen3-4b"
    with pytest.raises(SystemExit, match="model= needs a name"):
        bp.plan_args("1024:80:model=", "qwen3-8b", 1)
    row = {
        "spec": "s",
        "model": "qwen3-1.7b",
        "placement": "offload:28",
        "optimizer_offload": True,
        "measured_steps": [30e9, 33e9],
        "planned_reserved_bytes": 33.3e9,
        "planned_gpu_bytes": 34.9e9,
        "measured_host_bytes": 50e9,
        "planned_host_bytes": 54e9,
        "gpu_mem_gb": 40.0,
        "host_mem_gb": 60.0,
    }

    def verdict(r):
        return bp.plans_table([r]).splitlines()[-1].rstrip(" |").rsplit("|", 1)[-1].strip()

    assert verdict(row) == "yes" and "| 40 / 60 |" in bp.plans_table([row])
    # allocated beside reserved, where both were recorded: 26.1 measured vs 29.7 planned, reserved /
    # allocated 1.264
    both = dict(row, measured_allocated_steps=[25e9, 26.1e9], planned_allocated_bytes=29.7e9)
    assert "| 26.1 | 29.7 | -12.1% | 1.264 |" in bp.plans_table([both]) and verdict(both) == "yes"
    assert verdict(dict(row, measured_host_bytes=61e9)) == "NO"  # over the host budget only
    assert verdict(dict(row, measured_steps=[30e9, 38.5e9])) == "NO"  # 38.5 + 1.6 context > 40
    assert (
        verdict(dict(row, host_mem_gb=None, measured_host_bytes=61e9)) == "yes"
    )  # no host budget given
    # the host's share of a partial optimizer offload is in the row; a whole offload (or none) says
    # no share
    assert "| offload:28 | True (ratio 0.6) |" in bp.plans_table(
        [dict(row, optimizer_offload_ratio=0.6)]
    )
    assert "| offload:28 | True |" in bp.plans_table([dict(row, optimizer_offload_ratio=1.0)])
    assert "| offload:28 | False |" in bp.plans_table([dict(row, optimizer_offload=False)])


def test_a_held_out_prediction_is_the_same_plan_only_with_the_same_optimizer_share(tmp_path):
    """A plan's identity includes the host's share of a partial optimizer offload: read from
    plan.txt (written by `ds-longctx plan` for 1 x 141 GB + 128 GB host, where the search offloads
    part of the 8B's optimizer), compared by `plan_changed`; a prediction committed before the share
    was recorded counts as the whole offload (1.0)."""
    import sys

    from ds_longctx.plan import write

    bp = bench_planner()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from harness import read_plan
    finally:
        sys.path.pop(0)
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "65536",
                "--gpus",
                "1",
                "--gpu_mem_gb",
                "141",
                "--host_mem_gb",
                "128",
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 0
    )
    fresh = read_plan(tmp_path / "p")
    assert fresh["optimizer_offload"] and 0 < fresh["optimizer_offload_ratio"] < 1
    assert bp.plan_changed(dict(fresh), fresh) == ""
    old = {
        k: v for k, v in fresh.items() if k != "optimizer_offload_ratio"
    }  # predicted before the share was kept
    assert (
        bp.plan_changed(old, fresh)
        == f"optimizer_offload_ratio 1.0 -> {fresh['optimizer_offload_ratio']}"
    )
    whole = dict(fresh, optimizer_offload_ratio=1.0)
    assert bp.plan_changed(old, whole) == ""


def test_predictions_from_several_files_keep_the_one_that_is_todays_plan(tmp_path):
    """`--predictions a.jsonl,b.jsonl`: every spec found; where two files predicted the same spec,
    the one whose plan today's planner still makes (held out) wins over a later one that differs;
    else the later file's."""
    bp = bench_planner()
    plan = {
        "placement": "keep:28",
        "optimizer_offload": True,
        "optimizer_offload_ratio": 1.0,
        "planned_reserved_bytes": 30e9,
        "planned_host_bytes": 50e9,
    }
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(
        json.dumps(dict(plan, spec="x", commit="old"))
        + "\n"
        + json.dumps(dict(plan, spec="y", commit="old"))
        + "\n"
    )
    b.write_text(
        json.dumps(dict(plan, spec="x", commit="new", planned_host_bytes=60e9))
        + "\n"
        + json.dumps(dict(plan, spec="y", commit="new", planned_host_bytes=60e9))
        + "\n\n"
    )
    fresh = {"x": dict(plan, spec="x"), "y": dict(plan, spec="y", planned_host_bytes=70e9)}
    got = bp.pick_predictions(f"{a},{b}", fresh)
    assert got["x"]["commit"] == "old"  # today's plan is a's prediction
    assert got["y"]["commit"] == "new"  # neither matches: the later file's
    assert bp.pick_predictions("", fresh) == {}


def test_check_says_which_committed_predictions_are_still_held_out(tmp_path, capsys):
    """`bench_planner --check`: a committed prediction whose plan today's planner still makes is
    held out; one with another host figure is not, and the line says what moved."""
    bp = bench_planner()
    # a prediction made here by today's planner, written as `--predict` commits one (a committed
    # file's rows go stale once the planner moves: the partial offloads of
    # planner_predictions_2026-12-01j did at 579cba8)
    row = bp.predict_plans(
        ["65536:40:model=qwen3-1.7b+host_mem_gb=24"], "qwen3-1.7b", 1, tmp_path / "plans"
    )[0]
    assert "error" not in row and row["gpus"] == 1, row
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(row) + "\n" + json.dumps(dict(row, planned_host_bytes=1e9)) + "\n")
    assert bp.check_predictions(str(f)) == 1
    same, moved = capsys.readouterr().out.splitlines()
    assert same.endswith("x1: held out (same plan today)")
    assert f"planned_host_bytes 1000000000.0 -> {row['planned_host_bytes']}" in moved
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps(row) + "\n")
    codes = [
        subprocess.run(
            [sys.executable, "benchmarks/bench_planner.py", "--check", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).returncode
        for path in (held, f)
    ]
    assert codes == [0, 1]  # the command's exit status: 1 where a plan changed


def test_a_one_step_peak_before_the_adam_moments_is_not_steady():
    steady = bench_planner().steady_gpu_peak
    lazy = {"measured_steps": [85e9], "optimizer_state_at_build": False, "optimizer_offload": False}
    assert not steady(lazy)
    assert steady({**lazy, "optimizer_state_at_build": True})  # the moments made before step 1
    assert steady({**lazy, "measured_steps": [80e9, 85e9]})  # step 2 holds them either way
    assert steady(
        {**lazy, "optimizer_offload": True}
    )  # the moments on the host, not in the GPU peak
    assert steady({"measured_steps": [85e9]})  # rows before the field: all ran 2 steps or more


def test_a_second_validate_in_one_session_keeps_the_first_ones_rows_in_the_table(
    tmp_path, monkeypatch
):
    """`planner_plans_<date>.jsonl` appends; its `.md` is the table of every row in it, so two
    validate stages of one session (two models, one after the other) leave both rows in both files.
    The run itself is faked (no GPU): a metrics.jsonl of two steps where `train` writes it."""
    import argparse

    bp = bench_planner()

    def fake_run(argv, log_path, timeout_s):
        run = log_path.parent / "run"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": s,
                        "loss": 1.0,
                        "seconds": 1.0,
                        "peak_gpu_bytes": 20e9 + s,
                        "peak_gpu_allocated_bytes": 19e9,
                    }
                )
                + "\n"
                for s in (1, 2)
            )
        )
        log_path.write_text("optimizer state: made at build\n")
        return 0, 30e9, 2.0

    monkeypatch.setattr(bp, "run_job", fake_run)
    a = argparse.Namespace(
        predictions="",
        commit="abc1234",
        gpus=1,
        steps=2,
        timeout_s=60,
        longest=None,
        model="qwen3-0.6b",
    )
    specs = ["65536:40:model=qwen3-0.6b+host_mem_gb=60", "65536:40:model=qwen3-1.7b+host_mem_gb=60"]
    for spec in specs:
        bp.run_plans(a, [spec], tmp_path)
    (jl,) = tmp_path.glob("planner_plans_*.jsonl")
    assert [json.loads(x)["spec"] for x in jl.read_text().splitlines()] == specs
    table = jl.with_suffix(".md").read_text()
    assert all(f"| {spec} |" in table for spec in specs), table
