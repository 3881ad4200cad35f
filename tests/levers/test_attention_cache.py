"""attention_cache.py on CPU: same loss and gradients as plain checkpointing (the reference: a plain HF model,
no checkpointing), and the attention kernel really runs once per cached layer instead of twice. Which layers
cache, and the rules against overlapping offload, are the placement plan's (tests/levers/test_placement.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ds_longctx.parallel import attention
from ds_longctx.parallel import ulysses
from ds_longctx.levers.attention_cache import is_attention_kernel
from ds_longctx.levers.placement import PlacementPlan, apply_placement, remove_placement
from ds_longctx.parallel.parallel_state import ParallelState
from tests.helpers import rel_err, tiny_model

ONE = ParallelState(world_size=1, rank=0, sp_size=1, sp_rank=0, dp_size=1, dp_rank=0)


class KernelCalls(TorchDispatchMode):
    """Counts attention forward kernels (by op name) dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += is_attention_kernel(func)
        return func(*args, **(kwargs or {}))


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    counter = KernelCalls()
    with counter:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, counter.calls


@pytest.mark.parametrize("path", ["sdpa", "ulysses_sp1"])
@pytest.mark.parametrize("n_cached", [1, 2])  # the tiny model has 2 layers
def test_cache_gives_plain_grads_and_skips_the_recompute_kernel(path, n_cached):
    ref = tiny_model()
    ids = torch.randint(0, ref.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1))
    model = copy.deepcopy(ref)
    if path == "ulysses_sp1":
        attention.select("sdpa", announce=False)
        ulysses.register(model, ONE)
    L = ref.config.num_hidden_layers
    loss_ref, grads_ref, calls_plain = loss_and_grads(ref, ids)  # no checkpointing: the reference
    assert calls_plain == L
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _, _, calls_ckpt = loss_and_grads(model, ids)
    assert calls_ckpt == 2 * L  # plain checkpointing runs every layer's kernel again in backward
    plan = PlacementPlan.from_counts(L, cache=n_cached)
    try:
        assert apply_placement(model, plan) == plan and plan.cached == n_cached
        loss, grads, calls = loss_and_grads(model, ids)
    finally:
        remove_placement(model)
        if path == "ulysses_sp1":
            ulysses.unregister(model)
    assert calls == 2 * L - n_cached  # the cached layers' recompute returned the kept output
    assert rel_err(loss, loss_ref, norm="max") <= 1e-6
    for n, g in grads_ref.items():
        assert rel_err(grads[n], g, norm="max") <= 1e-5, n
    # removed: back to recomputing every kernel
    assert loss_and_grads(model, ids)[2] == 2 * L


def test_kernel_names():
    aten = torch.ops.aten
    assert is_attention_kernel(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert is_attention_kernel(aten._scaled_dot_product_efficient_attention.default)
    assert is_attention_kernel(aten._scaled_dot_product_cudnn_attention.default)
    assert not is_attention_kernel(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    assert not is_attention_kernel(aten.mm.default)
