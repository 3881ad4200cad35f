"""run/moe_checks.py: a mixture of experts' checks before any work and the warning of a sparse block
that runs untiled, each naming the value, the memory and the fix."""

from __future__ import annotations

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.shape import RunShape
from ds_longctx.run import moe_checks
from ds_longctx.run.model import load_hf_config
from ds_longctx.run.placement_plan import run_placement


def cfg(tmp_path, **kw):
    return RunConfig(
        **{"model": "qwen3-moe-tiny", "seq_len": 4096, "output_dir": str(tmp_path / "out"), **kw}
    )


def shape_of(c: RunConfig, world: int) -> RunShape:
    """The shape preflight builds for `c` on one node of `world` processes."""
    g = ModelGeometry.from_name_or_path(c.model.name)
    plan = run_placement(c, g.layers, world, c.memory.gpu_budget_gb, g)
    hf = load_hf_config(c.model.name)
    return RunShape(g, hf, c.train.seq_len, c.parallel.sp_size, world, world, plan)


def test_router_aux_loss_coef_is_the_runs_else_the_models_and_refused_for_a_dense_model(tmp_path):
    text = load_hf_config("qwen3-moe-tiny").get_text_config()
    assert moe_checks.router_aux_coef(cfg(tmp_path), text) == 0.01
    assert moe_checks.router_aux_coef(cfg(tmp_path, router_aux_loss_coef=0.0), text) == 0.0
    with pytest.raises(
        ValueError,
        match=r"router_aux_loss_coef=0.001 is set, but model='qwen3-tiny' has no experts",
    ):
        c = cfg(tmp_path, model="qwen3-tiny", router_aux_loss_coef=0.001)
        moe_checks.check_moe(c, shape_of(c, 1))


def test_a_block_the_tiles_cannot_compute_is_warned_with_its_cost_or_refused_over_the_budget(
    tmp_path, monkeypatch
):
    """The warning names the planner's extra GB; with a budget the untiled plan breaks, the run is
    refused."""
    c = cfg(
        tmp_path,
        model="qwen3-30b-a3b",
        seq_len=1 << 20,
        sp_size=8,
        tiled_mlp=True,
        tile_tokens=2048,
    )
    line = moe_checks.untiled_warning(c, {0: "its experts have has_bias=True"}, 8)
    extra = moe_checks.untiled_cost_gb(c, 8)
    assert (
        extra > 20
        and f"about {extra:.1f} GB more per GPU at seq_len=1,048,576" in line
        and "has_bias=True" in line
    )
    shape = shape_of(c, 8)  # the engine's warning: the run's geometry and plan, read no more

    def again(*a):
        raise AssertionError("read or planned again")

    monkeypatch.setattr(ModelGeometry, "from_name_or_path", again)
    monkeypatch.setattr(moe_checks, "run_placement", again)
    assert moe_checks.untiled_warning(c, {0: "its experts have has_bias=True"}, 8, shape) == line
    monkeypatch.undo()
    monkeypatch.setattr(
        moe_checks, "tile_problem", lambda block, fam: "its experts have has_bias=True"
    )
    # at 1M tokens on one GPU the tiny model's plan: 5.1 GB tiled, 6.0 GB untiled
    fits = cfg(tmp_path, tiled_mlp=True, tile_tokens=64, gpu_budget_gb=7, seq_len=1 << 20)
    moe_checks.check_moe(fits, shape_of(fits, 1))
    over = cfg(tmp_path, tiled_mlp=True, tile_tokens=64, gpu_budget_gb=5.5, seq_len=1 << 20)
    with pytest.raises(
        ValueError,
        match=r"tiled_mlp: the sparse MoE blocks of model='qwen3-moe-tiny' cannot run in "
        r"tiles \(its experts have has_bias=True\); untiled they need 0.9 GB more "
        r"per GPU, 6.0 GB in all, over gpu_budget_gb=5.5",
    ):
        moe_checks.check_moe(over, shape_of(over, 1))
