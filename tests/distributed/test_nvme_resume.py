"""The disk tier's resume on CPU (ZeRO-3, 2 gloo processes, SP=2, fp32): a run with a layer's
checkpoints on disk and the optimizer state on NVMe (ZeRO-Infinity, `memory.nvme_optimizer`), cut at
step 2 and resumed, gives the host-offload run's losses exactly. qwen3-tiny's one sub-group per rank
is under DeepSpeed's 1 MiB swap minimum (kept in memory, so a resume without NVMe is exact too);
qwen3-tiny-d128's is swapped to files.

Needs DeepSpeed's async_io op (libaio; JIT-built on first use, minutes on two cores): runs with
DS_LONGCTX_NVME_TESTS=1 where the op can be built, as the GPU tests run where CUDA is."""

import functools
import os
import shutil

import pytest

from tests.helpers import read_metrics, text_run_args, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.cpu_adam]


@functools.cache
def _aio() -> bool:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return bool(AsyncIOBuilder().is_compatible(verbose=False))


@pytest.fixture(autouse=True)
def _needs_aio():
    if os.environ.get("DS_LONGCTX_NVME_TESTS") != "1":
        pytest.skip("set DS_LONGCTX_NVME_TESTS=1 (builds DeepSpeed's async_io op: minutes)")
    if not _aio():
        pytest.skip("DeepSpeed's async_io op cannot be built here (no libaio)")


def train(args):
    return torchrun(2, ["ds_longctx.train", *args], module=True)


@pytest.mark.parametrize("model", ["qwen3-tiny", "qwen3-tiny-d128"])
def test_an_nvme_optimizer_run_resumed_gives_the_host_offload_runs_losses(tmp_path, model):
    base = text_run_args(tmp_path / "data") + ["--optimizer_offload", "true"]
    base[base.index("--model") + 1] = model
    nvme_path = str(tmp_path / "nvme")
    disk = ["--placement", "disk,offload", "--pinned_pool", "true", "--nvme_path", nvme_path]
    nvme = [*disk, "--nvme_optimizer", "true"]
    host, cut = tmp_path / "host", tmp_path / "cut"
    train([*base, "--steps", "4", "--output_dir", str(host)])
    train([*base, *nvme, "--steps", "2", "--save_every", "2", "--output_dir", str(cut)])
    swap_files = list((cut / "checkpoints" / "step2" / "offloaded_tensors").rglob("*.swp"))
    assert bool(swap_files) == (model == "qwen3-tiny-d128"), swap_files
    if not swap_files:  # every sub-group in the ZeRO files: a resume without NVMe reads them
        shutil.copytree(cut, tmp_path / "off")
        train([*base, *disk, "--steps", "4", "--resume", "--output_dir", str(tmp_path / "off")])
    train([*base, *nvme, "--steps", "4", "--resume", "--output_dir", str(cut)])
    want = [r["loss"] for r in read_metrics(host)]
    assert [r["step"] for r in read_metrics(cut)] == [1, 2, 3, 4]
    # step 3: the restored weights; step 4: step 3's update (Adam moments, bias-correction step)
    assert [r["loss"] for r in read_metrics(cut)] == want
    if not swap_files:
        assert [r["loss"] for r in read_metrics(tmp_path / "off")] == want
