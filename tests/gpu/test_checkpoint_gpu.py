"""Checkpoint and resume on CUDA with the weights-only loader (checkpoint/files.py), SP = the GPUs
here (2 at most): a run saved at step 2 and resumed gives the straight run's losses and weights, in
bf16 (DeepSpeed's bf16 optimizer files, its LossScaler) and in fp32 with the optimizer offloaded
(CPU Adam's state); the RNG files hold the CUDA generators' states as tensors, and every file passes
the weights-only check.

    pytest -q tests/gpu -k resume
"""

import json

import pytest
import torch

from tests.helpers import gpu_env, gpus_here, read_metrics, rel_err, run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
N = gpus_here() if torch.cuda.is_available() else 0


@pytest.mark.parametrize(
    "case, loss_tol, weight_tol", [("bf16", 1e-2, 1e-3), ("fp32_offload", 1e-5, 1e-5)]
)
def test_resume_on_gpu_gives_the_straight_runs_losses_with_the_weights_only_loader(
    tmp_path, case, loss_tol, weight_tol
):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from ds_longctx.checkpoint import files
    from ds_longctx.checkpoint.layout import ckpt_root

    extra = (
        ["--dtype", "bf16"]
        if case == "bf16"
        else ["--dtype", "fp32", "--optimizer_offload", "true"]
    )
    base = [
        "train",
        "--nproc",
        str(N),
        "--sp_size",
        str(N),
        "--model",
        "qwen3-tiny",
        "--seq_len",
        "512",
        "--lr",
        "1e-3",
        "--weight_decay",
        "0.01",
        "--fused_ops",
        "none",
        *extra,
    ]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    for args, out in (
        (["--steps", "4", "--save_every", "4"], straight),
        (["--steps", "2", "--save_every", "2"], cut),
        (["--steps", "4", "--save_every", "2", "--resume"], cut),
    ):
        res = run_cli([*base, *args, "--output_dir", str(out)], env=gpu_env())
        assert res.returncode == 0, res.stderr[-3000:]
    a, b = read_metrics(straight), read_metrics(cut)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert all(rel_err(x["loss"], y["loss"]) <= loss_tol for x, y in zip(a, b)), (
        [r["loss"] for r in a],
        [r["loss"] for r in b],
    )
    tag = ckpt_root(cut) / "step2"  # the one the resume read
    meta = json.loads((tag / "meta.json").read_text())
    assert meta["format"] == 2 and files.problem(tag, meta, None) is None
    rng = files.load(tag / "rng_rank00000.pt")
    assert len(rng["cuda"]) == torch.cuda.device_count() and rng["cuda"][0].dtype == torch.uint8
    with files.weights_only_loads():
        wa = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root(straight)), tag="step4")
        wb = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root(cut)), tag="step4")
    assert wa.keys() == wb.keys()
    worst = max(rel_err(wb[k], wa[k]) for k in wa)
    assert worst <= weight_tol, worst
