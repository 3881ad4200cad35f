"""offload.py's own pool (memory.pinned_pool) on CPU: an offloaded layer's input goes into its one
exact-size slot and comes back for the recompute; loss and every gradient equal a plain HF model's;
the slots are the same buffers every step (reused, no growth). The pinned (cudaHostRegister) copies
on a side stream run in tests/gpu; the pool under ZeRO-3 SP=2 in
tests/distributed/test_placement.py. The planner counts exact bytes for it."""

from __future__ import annotations

import copy

import pytest
import torch

from ds_longctx.levers import offload
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.levers.placement_apply import applied_placement, apply_placement, remove_placement
from ds_longctx.plan.planner import GB, Levers, ModelGeometry, plan_memory
from tests.helpers import rel_err, tiny_model


@pytest.mark.parametrize("spec", ["offload:2", "offload:1,keep:1", "keep:1,offload:1"])
def test_pool_offload_gives_plain_grads_and_reuses_its_slots(spec):
    ref = tiny_model(attn="sdpa")
    model = copy.deepcopy(ref)
    plan = PlacementPlan.parse(spec)
    assert apply_placement(model, plan, pinned_pool=True) == plan == applied_placement(model)
    slots = []
    try:
        for step in range(3):
            ids = torch.randint(
                0, ref.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(step)
            )
            for m in (ref, model):
                m.zero_grad(set_to_none=True)
            want, got = ref(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
            want.loss.backward()
            got.loss.backward()
            assert rel_err(got.loss, want.loss) <= 1e-6
            for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                assert rel_err(p.grad, q.grad) <= 1e-5, n
            slots.append({k: v.data_ptr() for k, v in offload.pool()._slots.items()})
            hidden = ref.config.hidden_size
            for i in plan.indices(*[p for p in plan.layers if p.value == "offload"]):
                assert offload.pool()._slots[i].shape == (1, 40, hidden)  # exactly the layer input
    finally:
        remove_placement(model)
        offload.pool().release()
    assert (
        slots[0] == slots[1] == slots[2] and len(slots[0]) == plan.offloaded
    )  # the same buffers, no growth


def test_planner_counts_the_pool_exactly():
    q8 = ModelGeometry.from_name_or_path("qwen3-8b")
    S, G, k = 196_608, 2, 36
    E = S // G * q8.hidden * 2  # 0.805 GB per layer: pow2 rounds it to 1 GiB
    pooled = plan_memory(q8, S, G, G, Levers(offload_layers=k, pinned_pool=True))
    rounded = plan_memory(q8, S, G, G, Levers(offload_layers=k))
    assert pooled.term("checkpoints").host_bytes == G * k * E
    assert rounded.term("checkpoints").host_bytes == G * k * (1 << 30)
    assert (rounded.host_peak_bytes - pooled.host_peak_bytes) / GB == pytest.approx(
        G * k * ((1 << 30) - E) / GB
    )
    # on the GPU, every layer offloaded: our pool's layer backward holds its restored input, its
    # output grad and its recomputed output (plan/layer_units.py POOLED_LAYER_UNITS); DeepSpeed's
    # offload engine its stash as well
    assert (
        pooled.term("offload_staging").gpu_bytes == 3 * E
        and rounded.term("offload_staging").gpu_bytes == 2 * E
    )


def test_the_reserved_pool_is_one_exact_block_sliced_per_layer_and_reused():
    """`plan_pool` + `reserve_pool` (the engine, at build): one allocation of exactly k slots of the
    layer input's size, slot i a slice of it; three steps use those slices (no slot of their own, no
    growth); a batch of another shape gets its own slot beside the block; release gives everything
    back. Planned but not reserved (the HF Trainer path): the first slot asked for makes the whole
    block."""
    ref = tiny_model(attn="sdpa")
    model = copy.deepcopy(ref)
    plan = PlacementPlan.parse("offload:2")
    apply_placement(model, plan, pinned_pool=True)
    hidden, pool = ref.config.hidden_size, offload.pool()
    try:
        n = offload.plan_pool([0, 1], 1, 40, hidden, torch.float32, pin=False)
        assert n == 2 * 40 * hidden * 4 and pool._block is None  # planned, nothing allocated yet
        assert (
            offload.reserve_pool() == n and pool._block.numel() == n and offload.reserve_pool() == 0
        )  # bytes
        base = pool._block.data_ptr()
        want = {0: base, 1: base + 40 * hidden * 4}
        for step in range(3):
            ids = torch.randint(
                0, ref.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(step)
            )
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            assert {k: v.data_ptr() for k, v in pool._slots.items()} == want and not pool._own
        short = torch.randint(0, ref.config.vocab_size, (1, 24))
        model(
            input_ids=short, labels=short
        ).loss.backward()  # another shape: own slots, the block stays
        assert (
            set(pool._own) == {0, 1}
            and pool._slots[0].shape == (1, 24, hidden)
            and pool._block.data_ptr() == base
        )
        model(
            input_ids=ids, labels=ids
        ).loss.backward()  # the reserved shape again: back to the block, own ones gone
        assert {k: v.data_ptr() for k, v in pool._slots.items()} == want and not pool._own
    finally:
        remove_placement(model)
        pool.release()
    assert not pool._slots and pool._block is None and pool.registered_bytes == 0


def test_a_planned_pool_is_made_whole_by_the_first_slot_asked_for():
    model = copy.deepcopy(tiny_model(attn="sdpa"))
    apply_placement(model, PlacementPlan.parse("offload:2"), pinned_pool=True)
    pool, hidden = offload.pool(), model.config.hidden_size
    try:
        offload.plan_pool([0, 1], 1, 40, hidden, torch.float32, pin=False)
        ids = torch.randint(0, model.config.vocab_size, (1, 40))
        model(input_ids=ids, labels=ids).loss.backward()
        base = pool._block.data_ptr()
        assert {k: v.data_ptr() for k, v in pool._slots.items()} == {
            0: base,
            1: base + 40 * hidden * 4,
        }
        assert not pool._own and pool._planned is None
    finally:
        remove_placement(model)
        pool.release()


def test_a_planned_pool_of_another_shape_is_dropped_not_made_beside_the_slots():
    model = copy.deepcopy(tiny_model(attn="sdpa"))
    apply_placement(model, PlacementPlan.parse("offload:2"), pinned_pool=True)
    pool, hidden = offload.pool(), model.config.hidden_size
    try:
        offload.plan_pool(
            [0, 1], 1, 64, hidden, torch.float32, pin=False
        )  # the run's batches are 40 tokens
        ids = torch.randint(0, model.config.vocab_size, (1, 40))
        model(input_ids=ids, labels=ids).loss.backward()
        assert pool._block is None and pool._planned is None and set(pool._own) == {0, 1}
    finally:
        remove_placement(model)
        pool.release()
