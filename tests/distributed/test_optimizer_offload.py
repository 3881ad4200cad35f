"""The offloaded optimizer on CPU (gloo, 2 processes, SP=2, qwen3-tiny, fp32, DeepSpeedCPUAdam JIT-built on first
use): partial offload (`optimizer_offload_ratio 0.5`) and full offload train with the losses of the optimizer kept
"on the device" (torch AdamW), and DeepSpeed's real sub-groups are the ones the planner splits
(`plan/zero_buffers.py:optimizer_split`). On CPU DeepSpeed's accelerator is the CPU, so both halves live in host memory:
this checks the bookkeeping and the numerics; tests/gpu/test_gpu.py checks the split on a GPU."""

import json

import pytest

from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.zero_buffers import offload_sub_group_elems, optimizer_split
from tests.helpers import read_metrics, rel_err, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.cpu_adam]


def test_deepspeeds_sub_groups_are_the_planners(tmp_path):
    out = tmp_path / "info.json"
    torchrun(2, ["tests/distributed/offload_worker.py", "--ratio", "0.5", "--out", str(out)], timeout=900)
    info = json.loads(out.read_text())
    assert info["ratio"] == 0.5 and info["backup_optimizer"], info  # DeepSpeed took the partial-offload path
    assert info["optimizer"] == "DeepSpeedCPUAdam"
    geom = ModelGeometry.from_name_or_path("qwen3-tiny")
    numels = info["numels"]
    # many groups (DeepSpeed's default sub_group_size would make one): up to OFFLOAD_SUB_GROUPS, fewer where single
    # parameters outgrow a group, as here (the tiny model's embedding alone is 8 groups' worth)
    assert info["sub_groups"] == len(numels) >= 10
    on_gpu = sum(numels[:int((1 - 0.5) * len(numels))])  # stage3.py: the first int((1 - ratio)·n) stay
    assert optimizer_split(geom, 2, 0.5) == (on_gpu, sum(numels) - on_gpu)
    assert min(numels[:-1]) >= offload_sub_group_elems(geom, 2)  # each closed at the size ds_config gave


def test_partial_and_full_offload_train_as_the_device_optimizer(tmp_path):
    base = ["ds_longctx.train", "--sp_size", "2", "--model", "qwen3-tiny", "--seq_len", "256", "--steps", "3",
            "--dtype", "fp32", "--lr", "1e-3"]
    losses = {}
    for name, extra in (("device", []), ("full", ["--optimizer_offload", "true"]),
                        ("half", ["--optimizer_offload", "true", "--optimizer_offload_ratio", "0.5"])):
        out = tmp_path / name
        torchrun(2, [*base, *extra, "--output_dir", str(out)], module=True, timeout=900)
        losses[name] = [m["loss"] for m in read_metrics(out)]
    assert len(losses["device"]) == 3
    for name in ("full", "half"):
        assert all(rel_err(a, b) <= 1e-6 for a, b in zip(losses[name], losses["device"])), losses
