"""The per-layer placement plan: one value, made from the config, validated once, applied in one
place, read by the planner. (Numerics of a mixed plan under ZeRO-3 SP=2:
tests/distributed/test_placement.py.)"""

from __future__ import annotations

import copy

import pytest

from ds_longctx.levers import attention_cache
from ds_longctx.levers.placement import Place, PlacementPlan, resolve_placement
from ds_longctx.levers.placement_apply import (
    applied_placement,
    apply_placement,
    decoder_layers,
    remove_placement,
)
from ds_longctx.plan.planner import GB, Levers, ModelGeometry, plan_memory
from tests.helpers import tiny_model

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")


def resolve(offload=0, cache=0, checkpointing=True, placement=None, layers=36, auto=None):
    return resolve_placement(offload, cache, checkpointing, placement, layers, auto)


def test_counts_make_first_offloaded_last_cached():
    plan = resolve(offload=3, cache=2, layers=8)
    assert plan.layers == (Place.OFFLOAD,) * 3 + (Place.KEEP,) * 3 + (Place.CACHE,) * 2
    assert (plan.offloaded, plan.cached, plan.spec()) == (3, 2, "offload:3,keep:3,cache:2")
    assert plan.describe() == "offload:3,keep:3,cache:2 (layers 0-2 offload, 3-5 keep, 6-7 cache)"
    assert PlacementPlan.parse(plan.spec()) == plan  # the spec round-trips
    assert resolve(offload="all", layers=4).spec() == "offload:4"
    assert resolve(offload=1, cache="all", layers=4).spec() == "offload:1,cache:3"
    assert resolve(checkpointing=False, layers=3).spec() == "none:3"
    assert (
        resolve(offload="auto", cache=2, layers=8, auto=lambda: 30).spec() == "offload:6,cache:2"
    )  # capped
    assert resolve(placement="cache,offload:2,keep", layers=4).layers == (
        Place.CACHE,
        Place.OFFLOAD,
        Place.OFFLOAD,
        Place.KEEP,
    )


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(cache=3, layers=2), "attention_cache_layers=3 is more than the model's 2 layers"),
        (dict(cache=2, offload=1, layers=2), "keep attention_cache_layers + offload_layers <= 2"),
        (dict(cache=1, offload="all", layers=2), "overlaps offload_layers=all"),
        (dict(cache="all", offload="auto"), "is circular"),
        (dict(offload=5, layers=4), "offload_layers=5 is outside 0..4"),
        (dict(offload=-1), "offload_layers=-1 must be >= 0"),
        (dict(offload=2, checkpointing=False), "set activation_checkpointing: true"),
        (
            dict(placement="offload:2,keep:1", layers=4),
            "has 3 entries but the model has 4 decoder layers",
        ),
        (dict(placement="offload:2,stash:2", layers=4), "'stash' is not a placement"),
        (dict(placement="offload:0,keep:4", layers=4), "needs a positive layer count"),
        (
            dict(placement="offload:2,keep:2", offload=2, layers=4),
            "names every layer's place; drop offload_layers",
        ),
        (dict(placement="none:1,keep:3", layers=4), "mixes 'none'"),
    ],
)
def test_every_rule_refuses_naming_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("+", r"\+").replace("(", r"\(")):
        resolve(**kw)


def test_apply_routes_each_layer_and_remove_restores_the_model():
    """A plan without offloaded layers (those need DeepSpeed's checkpoint: the distributed test) is
    applied layer by layer, read back equal, and removed: checkpointing off again and every
    checkpoint function the original."""
    model = tiny_model()
    layers = decoder_layers(model)
    before = [layer.__dict__.get("_gradient_checkpointing_func", None) for layer in layers]
    assert applied_placement(model).spec() == "none:2"
    plan = PlacementPlan((Place.KEEP, Place.CACHE))
    assert apply_placement(model, plan) == plan == applied_placement(model)
    assert attention_cache.layer_slot(layers[0]) is None
    slot = attention_cache.layer_slot(layers[1])
    assert (
        slot is not None and not slot.on_host
    )  # a GPU slot on the cached layer's attention module
    assert all(layer.gradient_checkpointing for layer in layers)
    remove_placement(model)
    assert applied_placement(model).spec() == "none:2"
    assert all(attention_cache.layer_slot(layer) is None for layer in layers)
    assert [layer.__dict__.get("_gradient_checkpointing_func", None) for layer in layers] == before
    with pytest.raises(ValueError, match="plan has 3 entries"):
        apply_placement(model, PlacementPlan((Place.KEEP,) * 3))


def test_the_planners_terms_read_the_plan():
    """Checkpoints on GPU / host, the attention cache and the top layer's attention buffers all
    follow the plan: the same counts placed differently change exactly the top-layer terms."""
    S, G = 131_072, 2
    E = S // G * Q8.hidden * 2
    top = PlacementPlan.parse("offload:10,keep:24,cache:2")  # the top layer cached
    low = PlacementPlan.parse("offload:10,cache:2,keep:24")  # same counts, the top layer not cached
    a = plan_memory(Q8, S, G, G, Levers(placement=top))
    b = plan_memory(Q8, S, G, G, Levers(placement=low))
    assert a.placement == top and b.placement == low
    for p in (a, b):
        assert p.term("checkpoints").gpu_bytes == (Q8.layers - 10) * E
        assert p.term("checkpoints").host_bytes == G * 10 * (1 << (E - 1).bit_length())
        assert p.term("attention_cache").gpu_bytes == 2 * (S * 16 * 128 * 2 + 16 * S * 4)
    assert a.term("attn_out_a2a").gpu_bytes == 0 and a.term("softmax_lse_fp32").gpu_bytes == 0
    assert (
        b.term("attn_out_a2a").gpu_bytes == S * 16 * 128 * 2
        and b.term("softmax_lse_fp32").gpu_bytes == 16 * S * 4
    )
    # counts and the equivalent explicit plan are one plan to the planner
    counts = plan_memory(Q8, S, G, G, Levers(offload_layers=10, attention_cache_layers=2))
    assert counts.placement == top and counts.gpu_peak_bytes == a.gpu_peak_bytes
    assert "placement: offload:10,keep:24,cache:2" in a.table()
    with pytest.raises(ValueError, match="not both"):
        Levers(offload_layers=1, placement=top)
    assert a.gpu_peak_bytes < 141 * GB
    # cache+offload: the layer's checkpoint and its kept output on the host, no power-of-two
    # rounding: each kept output + LSE in its region of the pinned pool, which has room for 128 more
    # LSE rows and 64 KiB of small tensors
    host = plan_memory(
        Q8, S, G, G, Levers(placement=PlacementPlan.parse("cache+offload:10,keep:24,cache:2"))
    )
    per_layer = S * 16 * 128 * 2 + 16 * S * 4
    region = per_layer + 16 * 128 * 4 + 65536
    assert host.term("attention_cache").gpu_bytes == 2 * per_layer
    assert host.term("attention_cache").host_bytes == G * 10 * region
    assert host.term("checkpoints").host_bytes == a.term("checkpoints").host_bytes
    assert host.host_step_bytes - a.host_step_bytes == G * 10 * region


def test_levers_and_run_config_map_both_ways():
    from ds_longctx.config import RunConfig
    from ds_longctx.run.placement_plan import run_placement

    cfg = RunConfig(
        model="qwen3-8b",
        seq_len=4096,
        offload_layers=30,
        attention_cache_layers=2,
        tiled_mlp=True,
        loss_chunk_rows=1024,
        optimizer_offload=True,
    )
    plan = run_placement(cfg, Q8.layers, 8, None)
    lv = Levers.from_run_config(cfg, plan)
    assert (lv.loss_chunk_rows, lv.tiled_mlp, lv.optimizer_offload, lv.placement) == (
        1024,
        True,
        True,
        plan,
    )
    back = RunConfig(model="qwen3-8b", seq_len=4096, **lv.run_config_fields())
    assert run_placement(back, Q8.layers, 8, None) == plan and back.memory.placement == plan.spec()
    assert back.optimizer.offload and not back.optimizer.torch_adam
    counted = RunConfig(
        model="qwen3-8b", seq_len=4096, **Levers(offload_layers=30).run_config_fields()
    )
    assert counted.memory.offload_layers == 30 and counted.memory.placement is None
    assert copy.deepcopy(plan) == plan
