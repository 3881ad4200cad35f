"""`ds-longctx rehearse` on a GPU: a world of one rehearsed on the fake process group against the
real run of the same config on this GPU (skipped without CUDA)."""

import json

import pytest
import torch

from tests.helpers import gpu_env, read_metrics, run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_world_of_one_rehearsed_peaks_as_the_real_run(tmp_path):
    """Qwen3-0.6B geometry (random weights), 16,384 tokens, bf16, 2 steps on one GPU: the
    rehearsal's peak reserved memory within 2% of `ds-longctx train`'s, both the maximum over the
    steps."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model:\n  name: qwen3-0.6b\n  dtype: bf16\ntrain:\n  seq_len: 16384\n  steps: 2\n"
        f"  output_dir: {tmp_path / 'real'}\nparallel:\n  sp_size: 1\n  nodes: 1\n  gpus_per_node: "
        "1\n"
    )
    real = run_cli(["train", "--nproc", "1", "--config", str(cfg)], env=gpu_env(), timeout=900)
    assert real.returncode == 0, real.stderr[-4000:]
    peak_real = max(r["peak_gpu_bytes"] for r in read_metrics(tmp_path / "real"))
    out = tmp_path / "rehearsal.jsonl"
    rh = run_cli(["rehearse", "--config", str(cfg), "--out", str(out)], env=gpu_env(), timeout=900)
    assert rh.returncode == 0, rh.stdout[-4000:] + rh.stderr[-4000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok" and row["finite"] and row["world"] == 1
    assert abs(row["peak_gpu_bytes"] / peak_real - 1) <= 0.02, (row["peak_gpu_bytes"], peak_real)
