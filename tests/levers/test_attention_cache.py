"""attention_cache.py on CPU: a cached layer's recompute takes the output its forward kept instead
of running the attention kernel again, and loss and every gradient equal a plain HF model's (the
reference: eager attention, no checkpointing). Here the GPU slot (`cache`); the host slot
(`cache+offload`, whose checkpoint goes through DeepSpeed's and so needs a process group) runs in
tests/distributed/test_placement.py (on CPU its "host" copy is a clone) and with real pinned copies
in tests/gpu. Which layers cache, and the rules about combining placements, are the placement plan's
(tests/levers/test_placement.py)."""

from __future__ import annotations

import contextlib
import copy
import logging

import pytest
import torch

from ds_longctx.levers import attention_cache
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.levers.placement_apply import apply_placement, decoder_layers, remove_placement
from ds_longctx.parallel import attention, ulysses
from ds_longctx.parallel.parallel_state import ParallelState
from tests.helpers import rel_err, tiny_model


@contextlib.contextmanager
def counted_forwards():
    """Count the attention kernel forwards run through a kernel pair (what the cache can skip), any
    backend."""
    calls = [0]
    real = attention.kernel_pair

    def counting(q, cu):
        pair = real(q, cu)
        if pair is None:
            return None
        fwd = pair.fwd

        def fwd_counted(*args):
            calls[0] += 1
            return fwd(*args)

        pair.fwd = fwd_counted
        return pair

    attention.kernel_pair = counting
    try:
        yield calls
    finally:
        attention.kernel_pair = real


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    attention_cache.new_step(decoder_layers(model))
    with counted_forwards() as calls:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, calls[0]


@pytest.fixture
def models():
    """(plain eager HF model, the same weights routed through our attention function at SP=1, input
    ids)."""
    attention.select("sdpa", announce=False)
    ref = tiny_model(attn="eager")
    model = copy.deepcopy(ref)
    ulysses.register(model, ParallelState.single())
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1)
    )
    yield ref, model, ids
    remove_placement(model)
    ulysses.unregister(model)


@pytest.mark.parametrize("spec", ["cache:1,keep:1", "keep:1,cache:1", "cache:2"])
def test_cache_gives_plain_grads_and_skips_the_recompute_kernel(models, spec):
    ref, model, ids = models
    L = ref.config.num_hidden_layers
    loss_ref, grads_ref, _ = loss_and_grads(ref, ids)  # eager, no checkpointing: the reference
    apply_placement(model, PlacementPlan.parse(f"keep:{L}"))
    _, _, calls_ckpt = loss_and_grads(model, ids)
    assert calls_ckpt == 2 * L  # plain checkpointing runs every layer's kernel again in backward
    remove_placement(model)
    plan = PlacementPlan.parse(spec)
    assert apply_placement(model, plan) == plan
    loss, grads, calls = loss_and_grads(model, ids)
    assert calls == 2 * L - plan.cached  # the cached layers' recompute took the kept output
    assert rel_err(loss, loss_ref, norm="max") <= 1e-6
    for n, g in grads_ref.items():
        assert rel_err(grads[n], g, norm="max") <= 1e-5, n
    assert (
        attention_cache.kept_bytes(decoder_layers(model)) == 0
    )  # every kept output was taken by its recompute
    remove_placement(model)
    apply_placement(model, PlacementPlan.parse(f"keep:{L}"))
    assert loss_and_grads(model, ids)[2] == 2 * L  # removed: back to recomputing every kernel


def test_a_step_without_backward_leaves_nothing_for_the_next(models):
    """An interrupted step (forward only) keeps outputs; new_step() drops them, so the next step's
    recompute runs on its own forward's outputs (grads equal the reference), and an eval forward
    keeps nothing."""
    ref, model, ids = models
    _, grads_ref, _ = loss_and_grads(ref, ids)
    apply_placement(model, PlacementPlan.parse("cache:2"))
    layers = decoder_layers(model)
    other = torch.randint(
        0, ref.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(9)
    )
    model(input_ids=other, labels=other)  # forward only: both slots now hold `other`'s outputs
    assert attention_cache.kept_bytes(layers) > 0
    _, grads, calls = loss_and_grads(model, ids)  # new_step() first
    assert calls == 2
    for n, g in grads_ref.items():
        assert rel_err(grads[n], g, norm="max") <= 1e-5, n
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    assert attention_cache.kept_bytes(layers) == 0
    model.train()


def test_a_kernel_without_a_pair_recomputes_and_says_so(models, caplog):
    ref, model, ids = models
    attention.select(
        "sdpa_math", announce=False
    )  # math SDPA on CPU: no forward that returns its LSE
    attention._WARNED_SLOT[0] = False
    apply_placement(model, PlacementPlan.parse("cache:2"))
    _, grads_ref, _ = loss_and_grads(ref, ids)
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        _, grads, calls = loss_and_grads(model, ids)
    assert calls == 0 and "cached layers recompute attention" in caplog.text
    for n, g in grads_ref.items():
        assert rel_err(grads[n], g, norm="max") <= 1e-5, n
    attention.select("sdpa", announce=False)


@pytest.mark.parametrize("room", ["planned", "too small"])
def test_offloaded_caches_live_in_their_pool_regions_every_step(models, caplog, room):
    """`cache+offload` on every layer with the pool (levers/offload.py): `plan_pool` with a region
    per cached layer (`cache_region_bytes`) and `reserve_pool` make one block holding the checkpoint
    slots and the regions; three steps copy each layer's kept output + LSE into the same views
    carved from its region (no buffers of its own, no growth), the recompute skips the kernel, and
    loss and grads equal plain HF's. A region too small for the kernel's tensors: a warning naming
    the layer, the slot's own buffers (on CPU: clones), the same loss and grads."""
    from ds_longctx.levers import offload

    ref, model, ids = models
    cfg, L, S = ref.config, ref.config.num_hidden_layers, ids.shape[1]
    loss_ref, grads_ref, _ = loss_and_grads(ref, ids)
    apply_placement(model, PlacementPlan.parse(f"cache+offload:{L}"), pinned_pool=True)
    per = offload.cache_region_bytes(1, S, cfg.num_attention_heads, cfg.head_dim, 4)
    # output [1, S, hq, d] fp32 + LSE [1, hq, S + 128 rows] fp32 + 64 KiB
    assert (
        per
        == S * cfg.num_attention_heads * cfg.head_dim * 4
        + cfg.num_attention_heads * (S + 128) * 4
        + 65536
    )
    pool = offload.pool()
    try:
        n = offload.plan_pool(
            range(L),
            1,
            S,
            cfg.hidden_size,
            torch.float32,
            pin=False,
            cache_regions={i: per if room == "planned" else 1024 for i in range(L)},
        )
        assert offload.reserve_pool() == n and pool._block.numel() == n
        lo, hi = pool._block.data_ptr(), pool._block.data_ptr() + n
        ptrs = []
        with caplog.at_level(logging.WARNING, logger="ds_longctx"):
            for _ in range(3):
                loss, grads, calls = loss_and_grads(model, ids)
                assert calls == L  # every layer's recompute took its kept output
                assert rel_err(loss, loss_ref, norm="max") <= 1e-6
                for name, g in grads_ref.items():
                    assert rel_err(grads[name], g, norm="max") <= 1e-5, name
                slots = [attention_cache.layer_slot(layer) for layer in decoder_layers(model)]
                assert not any(s._own for s in slots)
                if room == "planned":
                    ptrs.append([t.data_ptr() for s in slots for t in s._bufs])
                    assert (
                        all(lo <= p < hi for p in ptrs[-1]) and len(ptrs[-1]) == 2 * L
                    )  # output + LSE each
                else:
                    assert all(s._bufs is None for s in slots)
        if room == "planned":
            assert ptrs[0] == ptrs[1] == ptrs[2] and "pool region" not in caplog.text
        else:
            assert (
                "attention cache: layer 0 keeps" in caplog.text
                and "more than its pool region" in caplog.text
            )
    finally:
        pool.release()
    assert pool._block is None and not pool._regions
