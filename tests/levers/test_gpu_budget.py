"""levers/gpu_budget.py: the allocator cap for the budget a plan was made for (the cap itself acts
on a GPU only: tests/gpu/test_gpu.py::test_gpu_budget_caps_what_side_stream_frees_would_reserve)."""

import pytest
import yaml

from ds_longctx.config import RunConfig
from ds_longctx.levers.gpu_budget import (
    CUDA_CONTEXT_BYTES,
    allocator_fraction,
    apply,
    out_of_budget,
)
from ds_longctx.plan import write

H200 = 150_754_820_096  # torch.cuda.get_device_properties().total_memory of an H200 (141 GB card)


def test_the_cap_is_the_budget_less_the_context_as_a_fraction_of_the_card():
    frac = allocator_fraction(64, H200)
    assert frac * H200 + CUDA_CONTEXT_BYTES == pytest.approx(64e9)
    assert allocator_fraction(141, H200) == pytest.approx((141e9 - CUDA_CONTEXT_BYTES) / H200)


def test_a_budget_of_the_whole_card_or_more_caps_nothing():
    assert allocator_fraction(151, H200) is None and allocator_fraction(1000, H200) is None


def test_a_budget_the_context_fills_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"gpu_budget_gb=1\.5 leaves nothing"):
        allocator_fraction(1.5, H200)
    with pytest.raises(ValueError, match="gpu_budget_gb=0.5"):
        RunConfig(model="qwen3-tiny", gpu_budget_gb=0.5)
    for bad in (-3, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            RunConfig(model="qwen3-tiny", gpu_budget_gb=bad)


def test_without_a_gpu_or_a_budget_nothing_is_set():
    assert apply(None) is None and apply(64) is None  # this machine has no CUDA


def test_the_plan_writes_its_budget_into_the_run_config(tmp_path):
    argv = [
        "--model",
        "qwen3-8b",
        "--seq_len",
        "262144",
        "--gpus",
        "2",
        "--gpu_mem_gb",
        "64",
        "--out",
        str(tmp_path),
    ]
    assert write.main(argv) == 0
    run = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert run["memory"]["gpu_budget_gb"] == 64.0
    assert RunConfig.load(tmp_path / "run.yaml").memory.gpu_budget_gb == 64.0


def test_the_out_of_memory_message_names_the_budget_and_the_fix():
    msg = out_of_budget(64.0, 2)
    assert (
        "step 2" in msg
        and "64 GB budget per GPU (memory.gpu_budget_gb)" in msg
        and "--gpu_mem_gb" in msg
    )
    assert "the GPU's memory" in out_of_budget(None, 1)
    assert out_of_budget(80.0, 0).startswith(
        "stopped: making the optimizer state before step 1 ran out of the 80 GB"
    )


def test_the_run_ahead_bound_is_a_no_op_without_a_gpu_and_defaults_to_two_layers():
    from ds_longctx.levers.gpu_budget import bound_run_ahead

    assert bound_run_ahead([object()], 2) == [] and bound_run_ahead([], 0) == []
    assert RunConfig(model="qwen3-tiny").memory.run_ahead_layers == 2
    with pytest.raises(ValueError):
        RunConfig(model="qwen3-tiny", run_ahead_layers=-1)
