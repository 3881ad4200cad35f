"""The offloaded optimizer on CPU (gloo, 2 processes, SP=2, qwen3-tiny, fp32, DeepSpeedCPUAdam
JIT-built on first use): partial offload (`optimizer_offload_ratio 0.5`) and full offload train with
the losses of the optimizer kept "on the device" (torch AdamW), and DeepSpeed's real sub-groups are
the ones the planner splits (`plan/zero_buffers.py:optimizer_split`). On CPU DeepSpeed's accelerator
is the CPU, so both halves live in host memory: this checks the bookkeeping and the numerics;
tests/gpu/test_gpu.py checks the split on a GPU."""

import json

import pytest

from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.zero_buffers import offload_sub_group_elems, optimizer_split
from tests.helpers import checkpoint_weights, read_metrics, rel_err, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.cpu_adam]


def test_deepspeeds_sub_groups_are_the_planners(tmp_path):
    out = tmp_path / "info.json"
    torchrun(
        2, ["tests/distributed/offload_worker.py", "--ratio", "0.5", "--out", str(out)], timeout=900
    )
    info = json.loads(out.read_text())
    assert info["ratio"] == 0.5 and info["backup_optimizer"], (
        info
    )  # DeepSpeed took the partial-offload path
    assert info["optimizer"] == "DeepSpeedCPUAdam"
    geom = ModelGeometry.from_name_or_path("qwen3-tiny")
    numels = info["numels"]
    # many groups (DeepSpeed's default sub_group_size would make one): up to OFFLOAD_SUB_GROUPS,
    # fewer where single parameters outgrow a group, as here (the tiny model's embedding alone is 8
    # groups' worth)
    assert info["sub_groups"] == len(numels) >= 10
    on_gpu = sum(
        numels[: int((1 - 0.5) * len(numels))]
    )  # stage3.py: the first int((1 - ratio)·n) stay
    assert optimizer_split(geom, 2, 0.5) == (on_gpu, sum(numels) - on_gpu)
    assert min(numels[:-1]) >= offload_sub_group_elems(
        geom, 2
    )  # each closed at the size ds_config gave


BASE = [
    "ds_longctx.train",
    "--sp_size",
    "2",
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "256",
    "--steps",
    "3",
    "--dtype",
    "fp32",
    "--lr",
    "1e-3",
]


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    """3 steps with the optimizer on the device (torch AdamW), saved at steps 2 and 3."""
    out = tmp_path_factory.mktemp("offload") / "device"
    torchrun(
        2,
        [*BASE, "--save_every", "2", "--keep_checkpoints", "0", "--output_dir", str(out)],
        module=True,
        timeout=900,
    )
    return out


def test_partial_and_full_offload_train_as_the_device_optimizer(tmp_path, device_run):
    losses = {"device": [m["loss"] for m in read_metrics(device_run)]}
    for name, extra in (
        ("full", ["--optimizer_offload", "true"]),
        ("half", ["--optimizer_offload", "true", "--optimizer_offload_ratio", "0.5"]),
    ):
        out = tmp_path / name
        torchrun(2, [*BASE, *extra, "--output_dir", str(out)], module=True, timeout=900)
        losses[name] = [m["loss"] for m in read_metrics(out)]
    assert len(losses["device"]) == 3
    for name in ("full", "half"):
        assert all(rel_err(a, b) <= 1e-6 for a, b in zip(losses[name], losses["device"])), losses


def test_a_resume_that_offloads_the_optimizer_and_parameters_continues_the_device_run(
    tmp_path, device_run
):
    """The device run's step-2 checkpoint (torch AdamW's state) resumed with optimizer_offload and
    offload_params (DeepSpeed CPU Adam): step 3 starts from the same weights and makes the same
    update from the same Adam moments and step counters (run/resume_changes.py adopt_saved_state;
    without it CPU Adam fails at its first step)."""
    import shutil

    out = tmp_path / "resumed"
    shutil.copytree(device_run, out)
    res = torchrun(
        2,
        [
            *BASE,
            "--optimizer_offload",
            "true",
            "--offload_params",
            "true",
            "--resume",
            "--resume_tag",
            "step2",
            "--save_every",
            "3",
            "--output_dir",
            str(out),
        ],
        module=True,
        timeout=900,
    )
    assert (
        "resume: changed since step 2: save_every 2 -> 3, keep_checkpoints 0 -> 2, "
        "optimizer_offload False -> "
        "True, offload_params False -> True" in res.stderr
    ), res.stderr[-3000:]
    rows, device = read_metrics(out), read_metrics(device_run)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["loss"] == device[2]["loss"]
    w2, w3 = checkpoint_weights(device_run, "step2"), checkpoint_weights(device_run, "step3")
    new = checkpoint_weights(out, "step3")
    for k in w2:  # to fp32 rounding of weights near 1 (the norms') against updates of ~1e-3
        assert rel_err(new[k] - w2[k], w3[k] - w2[k]) < 1e-3, k
