"""plan/step_time.py: the analytic step of a plan against the committed rehearsals of the same
configs (benchmarks/results/rehearsal.jsonl, one H200 or H100 playing a rank), and what it counts
for a mixture of experts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.levers.placement import Place
from ds_longctx.plan import write
from ds_longctx.plan.cache_placement import ATTENTION_FWD_FLOPS
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.moe_terms import (
    MOE_MEASURED_ATTENTION_SECONDS,
    MOE_MEASURED_SECONDS,
    MOE_TOKENWISE_FLOPS,
    block_fwd_flops,
)
from ds_longctx.plan.planner import plan_memory
from ds_longctx.plan.step_time import (
    ATTENTION_BWD_FLOPS,
    H100_ATTENTION_BWD_FLOPS,
    H100_ATTENTION_FWD_FLOPS,
    predict_step,
)
from ds_longctx.run.placement_plan import run_placement
from tests.helpers import ROOT


def committed_plan(name: str):
    cfg = RunConfig.load(ROOT / "ds_configs" / name / "run.yaml")
    g = ModelGeometry.from_name_or_path(cfg.model.name)
    levers = Levers.from_run_config(cfg, run_placement(cfg, g.layers, 8, None))
    return cfg, plan_memory(
        g, cfg.train.seq_len, cfg.parallel.gpus_per_node, cfg.parallel.sp_size, levers
    )


@pytest.mark.parametrize(
    "name", ["qwen3-8b_1m_8x80gb", "qwen3-8b_max_2x141gb", "qwen3-8b_max_4x80gb"]
)
def test_the_analytic_step_is_within_3_percent_of_the_rehearsals(name):
    """Every committed rehearsal of the config (its predicted step: measured compute + the same
    interconnect model), at the rates of the GPU kind it ran on."""
    cfg, plan = committed_plan(name)
    rows = [
        json.loads(line)
        for line in (ROOT / "benchmarks/results/rehearsal.jsonl").read_text().splitlines()
    ]
    seen = [
        ("h100" if "H100" in r["device"] else "h200", r["predicted_seconds_per_step"])
        for r in rows
        if r["config"] == f"ds_configs/{name}/run.yaml"
    ]
    assert seen
    for gpu, s in seen:
        got = predict_step(plan, cfg.memory.gpu_budget_gb, gpu).seconds
        assert abs(got / s - 1) < 0.03, (gpu, got, s)


def test_the_moe_rate_is_the_measured_layers():
    """MOE_TOKENWISE_FLOPS from its measurement: 2 layers at 30B-A3B width, 131,072 tokens, forward
    + backward, less their attention, against the layers' forward FLOPs (projections + the block at
      top-k) x 3."""
    g = ModelGeometry.from_name_or_path("qwen3-30b-a3b")
    proj = 2 * 2 * g.hidden * (g.heads + g.kv_heads) * g.head_dim
    per_layer = (MOE_MEASURED_SECONDS - 2 * MOE_MEASURED_ATTENTION_SECONDS) / 2
    rate = 3 * (proj + block_fwd_flops(g)) * 131_072 / per_layer
    assert abs(rate / MOE_TOKENWISE_FLOPS - 1) < 0.02, rate


def test_moe_counts_experts_at_top_k_the_cache_and_the_tiles():
    g = ModelGeometry.from_name_or_path("qwen3-30b-a3b")
    base = plan_memory(g, 1 << 20, 8, 8, Levers(placement=None))
    top16 = plan_memory(replace(g, moe=replace(g.moe, top_k=16)), 1 << 20, 8, 8, Levers())
    t0, t16 = predict_step(base, 80, "h200"), predict_step(top16, 80, "h200")
    assert t16.tokenwise > 1.5 * t0.tokenwise and t16.attention == t0.attention
    cached = plan_memory(g, 1 << 20, 8, 8, Levers(attention_cache_layers=48))
    fwd = 2 * (1 << 20) ** 2 * 4 * 128 / ATTENTION_FWD_FLOPS
    saved = predict_step(base, 80, "h200").attention - predict_step(cached, 80, "h200").attention
    assert saved == pytest.approx(48 * fwd)
    tiled = plan_memory(g, 1 << 20, 8, 8, Levers(tiled_mlp=True, tile_tokens=2048))
    assert predict_step(tiled, 80, "h200").tokenwise > t0.tokenwise
    assert (
        t0.prediction.comm_seconds["all_to_all"] > 0
        and t0.prediction.comm_seconds["all_gather"] > 0
    )


def test_each_gpu_kind_counts_at_its_own_rates_and_an_unknown_kind_gets_no_time(tmp_path):
    """`plan --gpu h100` and `--gpu h200`: the attention at each kind's measured causal rates, each
    in its plan.txt; a kind without rates (a100) and a plan without a kind say the time is unknown
    instead of borrowing the H200's."""
    _, plan = committed_plan("qwen3-8b_1m_8x80gb")
    g, fwd = plan.geom, 2 * plan.seq_len**2 * (plan.geom.heads // plan.sp_size) * plan.geom.head_dim
    cached = sum(p in (Place.CACHE, Place.CACHE_OFFLOAD) for p in plan.placement.layers)
    seconds = {}
    for gpu, (f, b) in (
        ("h100", (H100_ATTENTION_FWD_FLOPS, H100_ATTENTION_BWD_FLOPS)),
        ("h200", (ATTENTION_FWD_FLOPS, ATTENTION_BWD_FLOPS)),
    ):
        t = predict_step(plan, 80, gpu)
        assert t.attention == pytest.approx(
            fwd * ((2 * g.layers - cached) / f + 2.5 * g.layers / b)
        )
        seconds[gpu] = t.seconds
    assert seconds["h100"] != pytest.approx(seconds["h200"], rel=1e-3)
    args = [
        "--model",
        "qwen3-8b",
        "--seq_len",
        "1048576",
        "--gpus",
        "8",
        "--gpu_mem_gb",
        "80",
        "--host_mem_gb",
        "560",
    ]
    for gpu in ("h100", "h200", "a100", None):
        assert (
            write.main(args + (["--gpu", gpu] if gpu else []) + ["--out", str(tmp_path / str(gpu))])
            == 0
        )
        line = next(
            x
            for x in (tmp_path / str(gpu) / "plan.txt").read_text().splitlines()
            if "predicted step" in x
        )
        if gpu in seconds:
            assert (
                line.startswith(f"predicted step on {gpu} (")
                and f"): {seconds[gpu]:.1f} s = " in line
            ), line
        else:
            assert (
                "unknown" in line
                and ("'a100'" if gpu else "pass --gpu") in line
                and " s = " not in line
            ), line
