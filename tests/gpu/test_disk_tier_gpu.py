"""CUDA-only: the disk tier (levers/disk_tier.py) on a GPU. The checkpoints leave the GPU through
pinned bounce buffers and a side thread, and come back with the pinned pool's losses and gradients
bit for bit (bf16, three steps, the read ahead in use). The scratch directory is gone after each
step. The CPU tests: tests/levers/test_disk_tier.py."""

import os

import pytest
import torch

from ds_longctx.levers import disk_tier
from tests.helpers import tiny_model
from tests.levers.test_disk_tier import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_disk_layers_on_gpu_equal_the_pinned_pool_bit_for_bit(tmp_path):
    def model():
        return tiny_model(seed=0, dtype=torch.bfloat16, device="cuda")

    try:
        _, want, want_grads = train("offload:2", steps=3, model=model(), pinned_pool=True)
        _, got, grads = train("disk:2", steps=3, model=model(), nvme_path=str(tmp_path))
        tier = disk_tier.disk_tier(str(tmp_path))
        assert tier._bufs["w"].is_pinned() and tier._bufs["r"].is_pinned()
        assert tier.dir is None and os.listdir(tmp_path) == []
    finally:
        disk_tier.close_all()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))
