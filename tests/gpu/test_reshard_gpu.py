"""A checkpoint saved by a 2-process run (CPU, gloo, sp=2, fp32) resumed on 1 GPU: resharded through
its universal form, the run continues at step 3 with the straight CPU run's losses.

    pytest -q tests/gpu -k reshard
"""

import shutil

import pytest
import torch

from tests.helpers import cpu_env, gpu_env, read_metrics, rel_err, run_cli, text_run_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = 1e-4  # fp32 on both sides; the kernels differ (CPU gloo vs one CUDA device)


def test_a_two_process_checkpoint_resumes_on_one_gpu(tmp_path):
    base = [*text_run_args(tmp_path / "data"), "--fused_ops", "none"]
    base[base.index("--seq_len") + 1] = "256"
    src = tmp_path / "src"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *base,
            "--steps",
            "4",
            "--save_every",
            "2",
            "--output_dir",
            str(src),
        ],
        env=cpu_env(),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "gpu"
    shutil.copytree(src, out)
    shutil.rmtree(out / "checkpoints" / "step4")
    (out / "checkpoints" / "latest").write_text("step2")
    args = [a if a != "2" else "1" for a in base]  # --sp_size 1
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            *args,
            "--steps",
            "4",
            "--resume",
            "true",
            "--output_dir",
            str(out),
        ],
        env=gpu_env(),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resume: layout world 2 = sp 2 x dp 1 -> world 1 = sp 1 x dp 1" in res.stderr
    cpu, gpu = read_metrics(src), read_metrics(out)
    assert [r["step"] for r in gpu] == [1, 2, 3, 4]
    for a, b in zip(gpu[2:], cpu[2:]):
        assert rel_err(a["loss"], b["loss"]) <= TOL, (
            [r["loss"] for r in gpu],
            [r["loss"] for r in cpu],
        )
        assert a["lr"] == b["lr"]
