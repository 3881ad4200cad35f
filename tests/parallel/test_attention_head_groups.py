"""The attention backward over groups of KV heads (`memory.attn_bwd_head_groups`,
parallel/attention.py): the same grads as the whole-head backward and as plain SDPA, on CPU through
SDPA's flash kernel pair; bad group counts refused with the fix; the run config carries it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ds_longctx.config import RunConfig
from ds_longctx.parallel import attention, kernel_rules
from tests.helpers import rel_err


@pytest.fixture(autouse=True)
def cpu_sdpa():
    attention.select("sdpa", announce=False)
    yield
    attention.set_head_groups(1)


def run(q, k, v, dout, groups):
    attention.set_head_groups(groups)
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attention.attend(q, k, v, q.shape[-1] ** -0.5)
    out.backward(dout)
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("h,hk,groups", [(8, 2, 2), (8, 8, 4), (6, 3, 3), (4, 1, 1)])
def test_grouped_backward_gives_the_whole_backward_and_plain_sdpa_grads(h, hk, groups, monkeypatch):
    calls = []
    bwd = attention._CpuFlashSDPA.bwd
    monkeypatch.setattr(
        attention._CpuFlashSDPA,
        "bwd",
        lambda self, *a: calls.append(a[1].shape[1]) or bwd(self, *a),
    )
    g = torch.Generator().manual_seed(h * 10 + hk)
    s, d = 96, 16
    q, k, v = (torch.randn(2, n, s, d, generator=g) for n in (h, hk, hk))
    dout = torch.randn(2, s, h, d, generator=g)
    assert attention.kernel_pair(q, None) is not None  # the CPU pair: what the grouping splits
    whole = run(q, k, v, dout, 1)
    assert calls == [h]
    grouped = run(q, k, v, dout, groups)
    assert (
        calls[1:] == [h // groups] * groups
    )  # one kernel backward per group, each on its query heads
    for a, b in zip(whole, grouped):
        assert rel_err(b, a) <= 1e-5
    # the reference: plain SDPA with its own autograd, KV repeated per query head
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(
        qr, kr.repeat_interleave(h // hk, 1), vr.repeat_interleave(h // hk, 1), is_causal=True
    ).transpose(1, 2)
    ref.backward(dout)
    for got, want in zip(grouped, (ref, qr.grad, kr.grad, vr.grad)):
        assert rel_err(got, want) <= 1e-4


def test_a_group_count_that_does_not_split_the_heads_is_refused_with_the_choices():
    with pytest.raises(
        ValueError,
        match=r"attn_bwd_head_groups=3: each rank attends 4 KV head\(s\) \(8 over "
        r"sp_size=2\).*use one of \[1, 2, 4\]",
    ):
        kernel_rules.check_head_groups(3, 8, 2)
    with pytest.raises(
        ValueError, match=r"each rank attends 1 KV head\(s\) \(8 over sp_size=16\).*\[1\]"
    ):
        kernel_rules.check_head_groups(2, 8, 16)  # KV heads replicated past sp 8: one per rank
    kernel_rules.check_head_groups(4, 8, 2)
    with pytest.raises(ValueError, match="must be >= 1"):
        attention.set_head_groups(0)
    with pytest.raises(ValueError, match="attn_bwd_head_groups"):
        RunConfig(attn_bwd_head_groups=0)
    assert RunConfig(attn_bwd_head_groups=4).memory.attn_bwd_head_groups == 4


def test_preflight_refuses_groups_the_model_cannot_split():
    from ds_longctx.run.preflight import validate

    cfg = RunConfig(model="qwen3-tiny", seq_len=64, sp_size=1, attn_bwd_head_groups=3)
    from ds_longctx.run.model import load_hf_config

    kv = load_hf_config("qwen3-tiny").get_text_config().num_key_value_heads
    with pytest.raises(ValueError, match=f"attn_bwd_head_groups=3: each rank attends {kv} KV head"):
        validate(cfg, world_size=1, per_node=1)


def test_a_model_trained_with_grouped_backward_gets_the_plain_hf_grads():
    """A tiny Qwen3 routed through our attention (SP=1) with the backward over every KV head
    separately: loss and every parameter's grad as the plain eager HF model's, with the attention
    cache placement on as well."""
    import copy

    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.levers.placement_apply import apply_placement, remove_placement
    from ds_longctx.parallel import ulysses
    from ds_longctx.parallel.parallel_state import ParallelState
    from tests.helpers import tiny_model

    ref = tiny_model(attn="eager")
    groups = ref.config.num_key_value_heads
    assert groups > 1
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(3)
    )
    out = ref(input_ids=ids, labels=ids)
    out.loss.backward()
    for spec in (None, f"cache:{ref.config.num_hidden_layers}"):
        model = copy.deepcopy(ref)
        model.zero_grad(set_to_none=True)
        ulysses.register(model, ParallelState.single())
        if spec:
            apply_placement(model, PlacementPlan.parse(spec))
        attention.set_head_groups(groups)
        try:
            got = model(input_ids=ids, labels=ids)
            got.loss.backward()
        finally:
            attention.set_head_groups(1)
            remove_placement(model)
            ulysses.unregister(model)
        assert rel_err(got.loss.detach(), out.loss.detach()) <= 1e-5
        for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
            assert rel_err(p.grad, r.grad) <= 1e-4, (spec, name)
