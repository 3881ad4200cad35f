"""CUDA-only: the shared-prompt attention (queries once, keys and values over the virtual sequence:
cu_seqlens_q !=
cu_seqlens_k, causal aligned bottom-right) on each GPU backend, forward and backward, against fp32
SDPA run on each branch after its own copy of the prompt
(tests/parallel/test_shared_prefix.two_pass), bf16 inputs, head_dim 128. Tolerances as
tests/gpu/test_attention_gpu.py: output 1e-2, dq / dk / dv 2e-2.

pytest -q tests/gpu/test_shared_prefix_gpu.py
"""

import pytest
import torch

from ds_longctx.parallel import attention, ulysses
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.shared_prefix import shared_layout
from tests.helpers import rel_err
from tests.parallel.test_shared_prefix import row, two_pass

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# a plain document, a branching one (prompt 2,500, chosen 300, rejected 200), a short one (prompt
# 60, 1 and 37)
DOCS = [[0] * 700, [0] * 2500 + [1] * 300 + [2] * 200, [0] * 60 + [1] + [2] * 37]
PAD = 7
BACKENDS = [
    pytest.param(
        "fa4",
        1,
        marks=pytest.mark.skipif(not attention.fa4_available(), reason="FA4 not installed"),
    ),
    pytest.param(
        "fa4",
        2,
        marks=pytest.mark.skipif(not attention.fa4_available(), reason="FA4 not installed"),
    ),
    pytest.param(
        "flash_attn",
        1,
        marks=pytest.mark.skipif(
            not attention.flash_attn_available(), reason="flash-attn not installed"
        ),
    ),
    ("sdpa", 1),  # torch's varlen_attn
]


@pytest.mark.parametrize("backend,groups", BACKENDS)
def test_shared_prompt_varlen_bottom_right_matches_fp32_two_pass(backend, groups):
    """16 query / 4 KV heads over 3,811 tokens; `groups`: FA4's grouped backward
    (attn_bwd_head_groups)."""
    attention.select(backend, announce=False, head_dim=128)
    assert attention.separate_keys()
    pos, branch = row(DOCS)
    lay = shared_layout(pos, branch, PAD)
    s, h, hk, d = len(pos) + PAD, 16, 4, 128
    g = torch.Generator(device="cuda").manual_seed(57)
    base = [
        torch.randn(1, n, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for n in (h, hk, hk)
    ]
    dout = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    attn = ulysses.UlyssesAttention(ParallelState.single(), h, hk)
    attn.shared = lay
    got = [t.clone().requires_grad_() for t in base]
    attention.set_head_groups(groups)
    try:
        out = attn._attend(*got, d**-0.5, None)
        out.backward(dout)
    finally:
        attention.set_head_groups(1)
    want = [t.float().requires_grad_() for t in base]
    ref = two_pass(*want, pos.cuda(), branch.cuda(), PAD)
    ref.backward(dout.float())
    errs = {"out": rel_err(out.float(), ref)}
    errs.update({n: rel_err(a.grad.float(), b.grad) for n, a, b in zip("qkv", got, want)})
    assert errs["out"] <= 1e-2 and max(errs.values()) <= 2e-2, errs
