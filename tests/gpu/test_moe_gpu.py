"""Qwen3-30B-A3B (a mixture of experts) on one GPU (skipped without CUDA): a reduced-depth model at
full width planned, trained with `ds-longctx train` against its plan, and the committed 1M-token 8 x
80 GB config rehearsed.

    pytest -q tests/gpu/test_moe_gpu.py  # one H200 (141 GB); each run prints its peaks and seconds

What is checked: the loss is finite every step; the GPU peak (torch's max reserved) within ±10% of
the plan's reserved bytes, the host RSS within ±15% of the plan's host per GPU; the log names the
experts' kernel (grouped_mm with torch's grouped GEMM on Hopper). The first test's seconds per step
re-measure plan/moe_terms.MOE_MEASURED_SECONDS' width.
"""

import json
import re

import pytest
import torch

from tests.helpers import ROOT, gpu_env, read_metrics, run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
LAYERS = 4  # of 48: full width, the depth one GPU holds with room for 131,072 tokens


def reduced_config(tmp_path, layers: int = LAYERS, name: str = "qwen3-30b-a3b"):
    cfg = json.loads((ROOT / f"ds_longctx/models/{name}.json").read_text())
    cfg["num_hidden_layers"] = layers
    path = tmp_path / f"{name}-reduced.json"
    path.write_text(json.dumps(cfg))
    return path


def plan_and_train(tmp_path, args: list, steps: int = 2):
    """`ds-longctx plan ARGS --out plan` for 1 GPU of this size, then `ds-longctx train` on it:
    (plan dir, the plan's
    per-GPU reserved and host bytes, the metrics, the run's output)."""
    gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    out = tmp_path / "plan"
    plan = run_cli(
        ["plan", *args, "--gpus", "1", "--gpu_mem_gb", f"{gb:.0f}", "--out", str(out)],
        env=gpu_env(),
        timeout=600,
    )
    assert plan.returncode == 0, plan.stderr[-4000:]
    text = (out / "plan.txt").read_text()
    planned_gpu = float(re.search(r"planned: ([\d.]+) GB per GPU, ([\d.]+) GB host", text).group(1))
    planned_host = float(
        re.search(r"planned: ([\d.]+) GB per GPU, ([\d.]+) GB host", text).group(2)
    )
    run_dir = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            "--config",
            str(out / "run.yaml"),
            "--steps",
            str(steps),
            "--output_dir",
            str(run_dir),
        ],
        env=gpu_env(),
        timeout=3600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return text, planned_gpu, planned_host, read_metrics(run_dir), res.stdout + res.stderr


def check_against_plan(planned_gpu, planned_host, rows, log):
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    peak = max(r["peak_gpu_bytes"] for r in rows) / 1e9
    host = max(r["host_rss_bytes"] for r in rows) / 1e9
    print(
        f"GPU peak {peak:.1f} GB (plan {planned_gpu:.1f}), host {host:.1f} GB (plan "
        f"{planned_host:.1f}), {rows[-1]['seconds']:.2f} s/step"
    )
    assert abs(peak / planned_gpu - 1) <= 0.10, (peak, planned_gpu)
    assert abs(host / planned_host - 1) <= 0.15, (host, planned_host)
    assert (
        "MoE experts: grouped_mm (torch.nn.functional.grouped_mm)" in log
        or "MoE experts: grouped_mm (torch._grouped_mm)" in log
    ), log[-3000:]


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_reduced_depth_at_131072_tokens_runs_as_planned(tmp_path, name):
    """Each MoE family's shipped geometry at full width, 4 layers."""
    model = reduced_config(tmp_path, name=name)
    _, gpu, host, rows, log = plan_and_train(
        tmp_path, ["--model", str(model), "--seq_len", "131072"]
    )
    check_against_plan(gpu, host, rows, log)


def test_reduced_depth_30b_a3b_at_its_longest_length_runs_as_planned(tmp_path):
    model = reduced_config(tmp_path)
    text, gpu, host, rows, log = plan_and_train(
        tmp_path, ["--model", str(model), "--find_max_len"], steps=1
    )
    assert "longest seq_len that fits" in text
    check_against_plan(gpu, host, rows, log)


def test_the_committed_1m_8x80gb_config_rehearses_inside_the_bars(tmp_path):
    """Each distinct rank role, 4 of 48 layers run and extrapolated: GPU within ±10% of the plan and
    under its budget, host within ±15%; the predicted step printed beside the analytic one of its
    plan.txt."""
    cfg = ROOT / "ds_configs/qwen3-30b-a3b_1m_8x80gb/run.yaml"
    out = tmp_path / "rehearsal.jsonl"
    res = run_cli(
        ["rehearse", "--config", str(cfg), "--rank", "roles", "--layers", "4", "--out", str(out)],
        env=gpu_env(),
        timeout=7200,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for r in rows:
        assert r["status"] == "ok" and r["finite"], r
        assert abs(r["gpu_vs_plan"]) <= 0.10 and abs(r["host_vs_plan"]) <= 0.15, r
        assert r["peak_gpu_bytes"] <= r["gpu_budget_bytes"], r
        print(f"rank {r['rank']}: predicted {r['predicted_seconds_per_step']:.1f} s/step")
    print(
        next(
            line
            for line in (cfg.parent / "plan.txt").read_text().splitlines()
            if "predicted step" in line
        )
    )
