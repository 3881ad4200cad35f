"""CUDA-only: fused RMSNorm / SwiGLU / rotary (Liger-Kernel, torch.compile) in the tiny Qwen3
against the plain HF model, bf16.

Tolerance: loss rel 1e-2, every gradient rel (Frobenius) 5e-2 against the plain bf16 model (both in
bf16: the fused kernels round at other points than HF's chains; the fp32 engine-level numerics are
tests/levers/test_fused_ops.py's routing check plus these)."""

import copy

import pytest
import torch

from ds_longctx.levers import fused_ops
from tests.helpers import rel_err, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
KINDS = [
    pytest.param(
        "liger", marks=pytest.mark.skipif(not fused_ops.liger_available(), reason="no liger-kernel")
    ),
    "compile",
]


@pytest.mark.parametrize("kind", KINDS)
def test_fused_layer_matches_plain_hf_bf16(kind):
    ref = tiny_model(attn="sdpa", device="cuda").to(torch.bfloat16)
    model = copy.deepcopy(ref)
    ids = torch.randint(
        0,
        ref.config.vocab_size,
        (1, 2048),
        device="cuda",
        generator=torch.Generator(device="cuda").manual_seed(1),
    )
    want = ref(input_ids=ids, labels=ids)
    want.loss.backward()
    assert fused_ops.apply_fused_ops(model, kind) == ["rms_norm", "rope", "swiglu"]
    try:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    finally:
        fused_ops.remove_fused_ops(model)
    assert rel_err(out.loss.float(), want.loss.float()) <= 1e-2
    worst = max(
        rel_err(p.grad.float(), q.grad.float())
        for p, q in zip(model.parameters(), ref.parameters())
    )
    assert worst <= 5e-2, worst
