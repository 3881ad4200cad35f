"""Which layout may resume a checkpoint (checkpoint/layout_change.py): the global batch kept or
allowed to change, the sample stream's offset, the planner asked about the new machine."""

import pytest

from ds_longctx.checkpoint.layout import CheckpointError
from ds_longctx.checkpoint.layout_change import check_layout, plan_problem, sample_offset
from ds_longctx.config import RunConfig
from ds_longctx.plan.geometry import ModelGeometry


def meta(world=8, sp=8, micro_batch=1, grad_accum=2, step=10, **more):
    return {
        "step": step,
        "run": {
            "world_size": world,
            "sp_size": sp,
            "dp_size": world // sp,
            "micro_batch": micro_batch,
            "grad_accum": grad_accum,
        },
        **more,
    }


def test_the_same_layout_is_no_change_and_another_keeping_the_batch_is_one_line():
    assert check_layout(RunConfig(sp_size=8, grad_accum=2), 8, meta(), "'ck'") is None
    line = check_layout(RunConfig(sp_size=2, grad_accum=1), 4, meta(), "'ck'")
    assert line.startswith("resume: layout world 8 = sp 8 x dp 1 -> world 4 = sp 2 x dp 2;")


def test_another_batch_is_refused_naming_the_grad_accum_that_keeps_it_unless_allowed():
    with pytest.raises(
        CheckpointError, match=r"trained 2 sequences a step .* set grad_accum 1 to keep it"
    ):
        check_layout(RunConfig(sp_size=2, grad_accum=2), 4, meta(), "'ck'")
    with pytest.raises(
        CheckpointError, match=r"no grad_accum keeps it at dp 4 x micro_batch 1; choose a dp that"
    ):
        check_layout(RunConfig(sp_size=1, grad_accum=1), 4, meta(), "'ck'")
    line = check_layout(
        RunConfig(sp_size=2, grad_accum=2, allow_batch_change=True), 4, meta(), "'ck'"
    )
    assert (
        "global batch 2 -> 4 sequences a step (allow_batch_change): the sample stream continues at "
        "sample 20" in line
    )


def test_the_sample_stream_continues_from_the_samples_consumed():
    assert sample_offset(None, 4) == 0
    assert sample_offset(meta(), 2) == 0  # 10 steps of 2: samples 0..19, step 10 of 2 starts at 20
    assert (
        sample_offset(meta(), 4) == 20 - 40
    )  # step 10 of 4 sequences starts at 20 + (10 - 10) * 4
    assert (
        sample_offset(meta(samples=23), 1) == 23 - 10
    )  # a resume that already moved it keeps its count


def test_the_planner_refuses_1m_tokens_on_2_x_141_gb_naming_860160():
    """The issue's case: a 1M-token Qwen3-8B run saved on 8 GPUs resumed on 2 x 141 GB (256 GB
    host)."""
    geom = ModelGeometry.from_name_or_path("qwen3-8b")
    said = plan_problem(geom, 1_048_576, 2, 141, 256, 2)
    assert (
        "does not fit 2 x 141 GB GPUs with 256 GB host a node (the longest that fits is 860,160 "
        "tokens)" in said
    )
    assert plan_problem(geom, 1_048_576, 8, 141, 1000, 8) is None  # its own machine fits it
    assert plan_problem(geom, 1_048_576, 2, None, 256, 2) is None  # no GPU: nothing to plan
