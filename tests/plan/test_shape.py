"""plan/shape.py: the shape preflight builds is the run as the planner reads it, and the engine path
takes it without checking or planning again."""

from __future__ import annotations

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.run import engine, lever_order
from ds_longctx.run.placement_plan import run_placement
from ds_longctx.run.preflight import preflight, validate


class Reached(Exception):
    """The engine got past its checks to the process groups."""


def test_the_shape_is_the_plans_for_qwen3_tiny_at_sp2(tmp_path):
    cfg = RunConfig(model="qwen3-tiny", seq_len=256, sp_size=2, output_dir=str(tmp_path / "o"))
    shape = validate(cfg, 4, per_node=2)
    geom = ModelGeometry.from_name_or_path("qwen3-tiny")
    assert shape.geometry == geom and shape.text.num_hidden_layers == geom.layers
    sizes = (shape.seq_len, shape.sp, shape.dp, shape.world, shape.per_node, shape.nodes)
    assert sizes == (256, 2, 2, 4, 2, 2)
    assert shape.placement == run_placement(cfg, geom.layers, 4, None)
    assert preflight(cfg, 4, per_node=2)[0] == shape
    with pytest.raises(AttributeError):
        shape.sp = 1  # frozen


def test_build_engine_given_the_shape_checks_nothing_again(tmp_path, monkeypatch):
    cfg = RunConfig(model="qwen3-tiny", seq_len=64, output_dir=str(tmp_path / "o"))
    shape = validate(cfg, 1)
    calls = []

    def stop():
        raise Reached

    monkeypatch.setattr(engine, "init_distributed", stop)
    monkeypatch.setattr(engine, "validate", lambda *a, **k: calls.append(a) or shape)
    with pytest.raises(Reached):
        engine.build_engine(cfg, shape)
    assert calls == []
    with pytest.raises(Reached):  # without a shape: preflight's own validate builds it, once
        engine.build_engine(cfg)
    assert calls == [(cfg, 1)]


def test_the_engine_plans_again_only_for_auto_on_its_own_gpu(tmp_path, monkeypatch):
    """`offload_layers: auto` with gpu_budget_gb 40: the shape's plan, the planner's answer for the
    budget (24 of qwen3-8b's 36 layers offloaded at 32k on 8 GPUs); without a budget the shape's
    plan offloads none (no GPU to ask) and the engine on a 40 GB GPU plans again."""
    geom = ModelGeometry.from_name_or_path("qwen3-8b")

    def run(budget):
        kw = dict(offload_layers="auto", gpu_budget_gb=budget, output_dir=str(tmp_path / "o"))
        return RunConfig(model="qwen3-8b", seq_len=32768, **kw)

    budgeted, unbudgeted = run(40), run(None)
    shape, bare = validate(budgeted, 8), validate(unbudgeted, 8)
    assert shape.placement.spec() == "offload:24,keep:12" and bare.placement.spec() == "keep:36"
    real = lever_order.run_placement

    def refuse(*a):
        raise AssertionError("planned again")

    monkeypatch.setattr(lever_order, "run_placement", refuse)
    monkeypatch.setattr(lever_order.gpu_budget, "planning_gpu_gb", lambda budget: budget)  # no GPU
    assert lever_order.engine_placement(budgeted, geom.layers, 8, shape) == shape.placement
    assert lever_order.engine_placement(unbudgeted, geom.layers, 8, bare) == bare.placement
    monkeypatch.setattr(lever_order, "run_placement", real)
    monkeypatch.setattr(lever_order.gpu_budget, "planning_gpu_gb", lambda budget: 40.0)
    assert lever_order.engine_placement(unbudgeted, geom.layers, 8, bare) == shape.placement
