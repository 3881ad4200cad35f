"""The shared-prompt attention (parallel/shared_prefix.py through ulysses._attend): queries stay the
row's, keys and values run over the virtual sequence, causal aligned bottom-right. Against each
document attended on its own (the two-pass reference, written here) and against the virtual-sequence
layout (queries gathered too), output and q/k/v gradients, fp32 on CPU."""

import logging

import pytest
import torch
import torch.nn.functional as F

from ds_longctx.parallel import attention, ulysses
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.shared_prefix import shared_layout
from tests.helpers import rel_err

H, HK, D = 4, 2, 8
# a plain document of 5, a branching one (prompt 6, chosen 3, rejected 4), another (prompt 1, chosen
# 2, rejected 1)
DOCS = [[0] * 5, [0] * 6 + [1] * 3 + [2] * 4, [0] + [1] * 2 + [2]]
PAD = 3  # SP padding after the row: one document of its own


def row(docs):
    """(position_ids, branch) of a row of documents given by their branch ids."""
    branch = torch.tensor([b for doc in docs for b in doc])
    pos = torch.cat([torch.arange(len(doc)) for doc in docs])
    for i, doc in enumerate(docs):  # each branch's positions continue its prompt's
        if 2 in doc:
            a, n0, n1 = sum(map(len, docs[:i])), doc.count(0), doc.count(1)
            pos[a + n0 + n1 : a + len(doc)] = torch.arange(n0, len(doc) - n1)
    return pos, branch


def two_pass(q, k, v, pos, branch, pad):
    """Each document, and each branch after its own copy of the prompt, through causal SDPA in fp32
    (q `[1, h, s, d]`, k/v `[1, hk, s, d]`, `pad` tokens of SP padding last): `[1, s, h, d]`."""
    q, k, v = (t.float() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.empty(1, q.shape[2], q.shape[1], q.shape[3], device=q.device)
    pos, branch = pos.tolist() + list(range(pad)), branch.tolist() + [0] * pad
    starts = [i for i, p in enumerate(pos) if p == 0 or i == len(pos) - pad] + [len(pos)]
    for a, b in zip(starts[:-1], starts[1:]):
        br = branch[a:b]
        prompt = [a + i for i, x in enumerate(br) if x == 0]
        for part in (1, 2) if 2 in br else (0,):
            own = [a + i for i, x in enumerate(br) if x == part]
            idx = own if part == 0 else prompt + own
            o = F.scaled_dot_product_attention(
                q[:, :, idx], k[:, :, idx], v[:, :, idx], is_causal=True
            )
            kept = idx if part < 2 else own  # the prompt's output: from its chosen pass
            out[0, kept] = o[0, :, -len(kept) :].transpose(0, 1)
    return out


@pytest.mark.parametrize("separate", [True, False], ids=["queries_once", "virtual_fallback"])
def test_shared_prompt_attention_equals_each_branch_after_its_own_prompt(
    separate, monkeypatch, caplog
):
    """Output and q/k/v grads: the new layout (queries once) and the virtual-sequence fallback (a
    backend without separate key documents, warned once) both equal the two-pass reference; a row
    with a plain document, two branching ones (one a 1-token prompt) and SP padding."""
    attention.select("sdpa", announce=False)
    if not separate:
        monkeypatch.setattr(attention, "SEPARATE_KEYS", ())
        monkeypatch.setattr(ulysses, "_WARNED_VIRTUAL", [False])
    pos, branch = row(DOCS)
    lay = shared_layout(pos, branch, PAD)
    assert lay.cu_seqlens_q.tolist() == [0, 5, 14, 18, 21, 22, 25]
    assert lay.cu_seqlens.tolist() == [0, 5, 14, 24, 27, 29, 32]
    s = len(pos) + PAD
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, n, s, D, generator=g) for n in (H, HK, HK)]
    dout = torch.randn(1, s, H, D, generator=g)
    attn = ulysses.UlyssesAttention(ParallelState.single(), H, HK)
    attn.shared = lay
    got, want = ([t.clone().requires_grad_() for t in base] for _ in range(2))
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        for _ in range(2):
            out = attn._attend(*got, D**-0.5, None)  # twice: one warning
    out.backward(dout)
    ref = two_pass(*want, pos, branch, PAD)
    ref.backward(dout)
    assert rel_err(out, ref) <= 1e-5
    for a, b in zip(got, want):
        assert rel_err(a.grad, b.grad) <= 1e-5
    fallbacks = [r for r in caplog.records if "queries run twice" in r.getMessage()]
    assert len(fallbacks) == (0 if separate else 1)


def test_bottom_right_mask_lets_a_short_query_document_read_its_prompt():
    """The masked CPU path where q and k documents differ: query i of a 2-query document over 5 keys
    sees keys 0..3+i; a 3-token document with equal lengths stays plain causal."""
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 5, 8])
    mask = attention._block_causal_mask(cu_q, 5, "cpu", cu_k, 8).int()
    want = torch.zeros(5, 8, dtype=torch.int)
    want[0, :4], want[1, :5] = 1, 1
    want[2:, 5:] = torch.tril(torch.ones(3, 3, dtype=torch.int))
    assert torch.equal(mask, want)
