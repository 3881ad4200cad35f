"""`plan.search`: which levers `choose` pulls, and `find_max_len`, on hand-checked cases."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from ds_longctx.config.model import SHIPPED_MODELS_DIR
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.plan.no_fit import NoFit
from ds_longctx.plan.planner import GB, GIB, Levers, ModelGeometry, plan_memory
from ds_longctx.plan.search import choose, find_max_len

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")
TINY = ModelGeometry.from_name_or_path("qwen3-tiny")


def test_choose_8b_1m_on_8x80_fits_with_sp8():
    c = choose(Q8, 1 << 20, 8, 80, 560)  # host as on the 8-GPU machines here (560 GiB)
    budget = 0.9 * 80 * GB
    assert (
        c.sp_size == 8
        and c.plan.gpu_peak_bytes <= budget
        and c.plan.host_peak_bytes <= 0.9 * 560 * GB
    )
    assert not c.levers.optimizer_offload and not c.levers.tiled_mlp and c.levers.chunked_loss
    k = c.levers.offload_layers
    assert 0 < k < Q8.layers  # only the layers that must leave the GPU
    assert (
        plan_memory(Q8, 1 << 20, 8, 8, replace(c.levers, offload_layers=k - 1)).gpu_peak_bytes
        > budget
    )
    for sp in (1, 2, 4):  # no smaller sp fits at all, whatever is offloaded
        lv = Levers(
            loss_chunk_rows=256,
            tiled_mlp=True,
            tile_tokens=4096,
            offload_layers=Q8.layers,
            optimizer_offload=True,
        )
        assert not plan_memory(Q8, 1 << 20, 8, sp, lv).fits(budget, 0.9 * 560 * GB)
    assert any("YaRN" in n for n in c.notes)


def test_8b_1m_on_8x80_by_hand():
    """At 1,048,576 tokens over sp=8 one checkpointed layer input is T·H·2 = 131,072·4096·2 bytes =
    1 GiB."""
    c = choose(Q8, 1 << 20, 8, 80, 560)
    assert c.levers == Levers(
        chunked_loss=True,
        loss_chunk_rows=4096,
        tiled_mlp=False,
        tile_tokens=None,
        offload_layers=21,
        optimizer_offload=False,
    )
    ck = c.plan.term("checkpoints")
    assert (
        ck.gpu_bytes == (36 - 21) * GIB and ck.host_bytes == 8 * 21 * GIB
    )  # 168 GiB pinned on the node
    assert c.plan.term("offload_staging").gpu_bytes == 2 * GIB
    assert (
        c.plan.term("mlp_saved").gpu_bytes == 3 * 131_072 * 12_288 * 2
    )  # 9.7 GB: compiled gate, up, their product
    assert c.plan.peak_phase == "mlp_bwd"


def test_default_sp_is_the_largest_valid():
    for gpus in (1, 2, 4, 8):
        assert (
            choose(Q8, 65_536, gpus, 141, 560).sp_size == gpus
        )  # every power of two up to 8 divides 32 and 8
    assert choose(TINY, 64, 8, 24, 560).sp_size == 8


def test_tiled_mlp_only_when_needed():
    easy = choose(Q8, 1 << 20, 8, 141, 560)
    assert (
        not easy.levers.tiled_mlp
        and easy.levers.tile_tokens is None
        and easy.levers.offload_layers == 0
    )
    n = 458_752
    hard = choose(Q8, n, 2, 141, 256)
    assert hard.levers.tiled_mlp and hard.levers.tile_tokens == 4096 and not hard.levers.tiled_layer
    untiled = replace(hard.levers, tiled_mlp=False, tile_tokens=None)
    for k in range(
        Q8.layers + 1
    ):  # without the tiles nothing fits at that length, whatever is offloaded
        assert not plan_memory(Q8, n, 2, 2, replace(untiled, offload_layers=k)).fits(
            0.9 * 141 * GB, 0.9 * 256 * GB
        )
    assert any(n.startswith("tiled_mlp=True: needed") for n in hard.notes)


def test_the_tiled_layer_and_the_pool_only_when_needed_and_before_offloading_the_optimizer():
    """At the longest length on 2 x 141 GB + 256 GB the search picks the tiled layer and the
    exact-size pool by itself (optimizer on the GPU); without either, no placement of checkpoints or
    optimizer fits there."""
    n = find_max_len(Q8, 2, 141, 256)
    hard = choose(Q8, n, 2, 141, 256)
    lv = hard.levers
    assert (
        lv.tiled_layer
        and lv.tiled_mlp
        and lv.pinned_pool
        and not lv.optimizer_offload
        and lv.offload_layers
    )
    assert any(x.startswith("tiled_layer=True: needed to fit") for x in hard.notes)
    assert any(x.startswith("pinned_pool=True: needed to fit;") for x in hard.notes)
    for drop in (dict(tiled_layer=False), dict(pinned_pool=False)):
        for opt in (False, True):
            for k in range(Q8.layers + 1):
                lv2 = replace(lv, offload_layers=k, optimizer_offload=opt, **drop)
                assert not plan_memory(Q8, n, 2, 2, lv2).fits(0.9 * 141 * GB, 0.9 * 256 * GB), (
                    drop,
                    opt,
                    k,
                )
    # LoRA: the tiled layer refuses LoRA's Linears, so the search never picks it there
    lora = choose(
        Q8,
        find_max_len(Q8, 2, 141, 256, base=Levers(lora_rank=16)),
        2,
        141,
        256,
        base=Levers(lora_rank=16),
    )
    assert not lora.levers.tiled_layer


def test_choose_8b_1m_on_1x24_does_not_fit():
    with pytest.raises(NoFit) as info:
        choose(Q8, 1 << 20, 1, 24, 128)
    e = info.value
    assert e.max_len == 0 and "Longest length that fits: 0" in str(
        e
    )  # 16 GB of bf16 weights + the loss head
    assert e.best.gpu_peak_bytes > 24 * GB


def test_choose_8b_1m_on_1x80_reports_the_longest_length():
    with pytest.raises(NoFit) as info:
        choose(Q8, 1 << 20, 1, 80, 256)
    e = info.value
    assert 65_536 < e.max_len < 1 << 20 and f"{e.max_len:,}" in str(e) and "GPUs" in str(e)
    assert choose(
        Q8, e.max_len, 1, 80, 256
    ).levers.optimizer_offload  # 8B's Adam state alone is 131 GB


def test_choose_prefers_no_offload_when_it_fits():
    c = choose(Q8, 8192, 8, 141, 1000)
    assert c.sp_size == 8 and c.levers.offload_layers == 0 and not c.levers.optimizer_offload
    assert not c.levers.tiled_mlp


def test_pinned_sp_size():
    free = choose(
        Q8, 131_072, 2, 141, 256
    )  # largest sp: one sequence over both GPUs, nothing needs to move
    pinned = choose(
        Q8, 131_072, 2, 141, 256, sp_size=1
    )  # dp=2: each GPU holds a whole 131k sequence
    assert (
        free.sp_size == 2 and free.levers.offload_layers == 0 and not free.levers.optimizer_offload
    )
    assert pinned.sp_size == 1 and pinned.levers.offload_layers > 0
    assert pinned.notes[0] == "sp_size=1: pinned"
    assert find_max_len(Q8, 2, 141, 256, sp_size=1) <= find_max_len(Q8, 2, 141, 256)
    with pytest.raises(ValueError, match="try one of"):
        choose(Q8, 4096, 8, 80, 560, sp_size=3)


@pytest.mark.parametrize(
    "model,gpus,gpu_gb,host_gb",
    [("qwen3-8b", 2, 141, 256), ("qwen3-0.6b", 1, 24, 64), ("qwen3-8b", 8, 80, 560)],
)
def test_find_max_len_agrees_with_choose(model, gpus, gpu_gb, host_gb):
    n = find_max_len(model, gpus, gpu_gb, host_gb)
    assert n > 0 and n % 1024 == 0
    choose(model, n, gpus, gpu_gb, host_gb)
    with pytest.raises(NoFit):
        choose(model, n + 1024, gpus, gpu_gb, host_gb)


def test_fastest_placement_takes_the_pool_when_it_caches_more_layers():
    """393,216 tokens on 2 x 141 GB + 256 GB: DeepSpeed's power-of-two host buffers (1.61 GB
    checkpoints in 2 GiB) leave room for 23 cached layers, the exact-size pool for all 36; the plan
    takes the pool and says why (and not the tiled layer: it would cache no more)."""
    from ds_longctx.plan.cache_placement import fastest_placement

    c = choose(Q8, 393_216, 2, 141, 256)
    assert not c.levers.pinned_pool
    got = fastest_placement(c, 141, 256)
    assert got.levers.pinned_pool and got.plan.placement.cached == Q8.layers
    assert got.plan.host_peak_bytes <= 0.9 * 256 * GB and got.plan.gpu_peak_bytes <= 0.9 * 141 * GB
    without = replace(c.levers, offload_layers=0, attention_cache_layers=0)
    for x in range(25):  # no layout of 24 cached layers fits without the pool
        for w in range(Q8.layers - 23):
            spec = ",".join(
                f"{k}:{v}"
                for k, v in (
                    ("offload", Q8.layers - 24 - w),
                    ("cache+offload", 24 - x),
                    ("keep", w),
                    ("cache", x),
                )
                if v > 0
            )
            plan = plan_memory(
                Q8, 393_216, 2, 2, replace(without, placement=PlacementPlan.parse(spec))
            )
            assert not plan.fits(0.9 * 141 * GB, 0.9 * 256 * GB), spec
    want = "pinned_pool=True: it lets 36 layers cache (without the added levers 23)"
    assert any(n.startswith(want) for n in got.notes)
    assert (
        not got.levers.tiled_layer
    )  # the tiled layer would cache no more here: not worth its cost


def test_fastest_placement_takes_the_tiled_layer_only_when_its_caches_outweigh_its_cost():
    """737,280 tokens on 2 x 141 GB + 256 GB: the tiled layer (with the pool: its restore holds one
    checkpoint on the GPU, DeepSpeed's offload two) frees GPU room for 2 more cached layers (7 vs
    5), whose attention forwards (~6.7 s) outweigh its estimated cost (~6.6 s): taken, and the note
    gives both numbers. With LoRA (which the tiled layer refuses) and at 262,144 (every layer cached
    without it) it is not."""
    from ds_longctx.plan.cache_placement import (
        TILED_LAYER_SECONDS_PER_TOKEN,
        attention_fwd_seconds,
        fastest_placement,
    )

    c = choose(Q8, 737_280, 2, 141, 256)
    got = fastest_placement(c, 141, 256)
    assert got.levers.tiled_layer and not c.levers.tiled_layer and got.plan.placement.cached == 7
    per = attention_fwd_seconds(got.plan)
    assert 2 * per > TILED_LAYER_SECONDS_PER_TOKEN * 368_640
    assert any(
        n.startswith("tiled_layer=True: for speed, 7 cached layers instead of 5") for n in got.notes
    )
    assert got.plan.gpu_peak_bytes <= 0.9 * 141 * GB and got.plan.host_peak_bytes <= 0.9 * 256 * GB
    lora = Levers(lora_rank=16)
    assert not fastest_placement(
        choose(Q8, 737_280, 2, 141, 256, base=lora), 141, 256
    ).levers.tiled_layer
    assert not fastest_placement(choose(Q8, 262_144, 2, 141, 256), 141, 256).levers.tiled_layer


def test_fastest_placement_caches_the_most_layers_that_fit_and_no_more():
    from ds_longctx.levers.placement import Place
    from ds_longctx.plan.cache_placement import fastest_placement

    for args in ((Q8, 1 << 20, 8, 141, 560), (Q8, 1 << 20, 8, 80, 560), (Q8, 262_144, 2, 141, 256)):
        c = choose(*args)
        got = fastest_placement(c, args[3], args[4])
        budget, host = 0.9 * args[3] * GB, 0.9 * args[4] * GB
        p = got.plan.placement
        n = p.cached
        assert got.plan.gpu_peak_bytes <= budget and got.plan.host_peak_bytes <= host
        assert n >= c.plan.placement.cached and n > 0, args
        # the levers are choice's, but for the pool and the tiled layer where the notes say they let
        # more layers cache
        added = dict(
            pinned_pool=got.levers.pinned_pool,
            tiled_layer=got.levers.tiled_layer,
            tiled_mlp=got.levers.tiled_mlp,
            tile_tokens=got.levers.tile_tokens,
            loss_chunk_rows=got.levers.loss_chunk_rows,
        )
        assert replace(got.levers, placement=None) == replace(
            c.levers, offload_layers=0, attention_cache_layers=0, **added
        )
        for lever, tag in (
            ("pinned_pool", "pinned_pool=True: it lets"),
            ("tiled_layer", "tiled_layer=True: for speed"),
        ):
            if getattr(got.levers, lever) != getattr(c.levers, lever):
                assert any(note.startswith(tag) for note in got.notes), (args, lever)
        # no plan with one more cached layer fits (every way to place n + 1 of them, by brute force)
        if n < Q8.layers:
            for x in range(n + 2):
                for w in range(Q8.layers - n):
                    spec = ",".join(
                        f"{k}:{v}"
                        for k, v in (
                            ("offload", Q8.layers - n - 1 - w),
                            ("cache+offload", n + 1 - x),
                            ("keep", w),
                            ("cache", x),
                        )
                        if v > 0
                    )
                    other = plan_memory(
                        Q8,
                        args[1],
                        args[2],
                        args[2],
                        replace(got.levers, placement=PlacementPlan.parse(spec)),
                    )
                    assert other.gpu_peak_bytes > budget or other.host_peak_bytes > host, (
                        args,
                        spec,
                    )
        # host-side layers first, GPU caches on top; the note says how much recompute it skips
        order = [
            p.layers.index(q)
            for q in (Place.OFFLOAD, Place.CACHE_OFFLOAD, Place.KEEP, Place.CACHE)
            if q in p.layers
        ]
        assert order == sorted(order)
        assert any(
            f"{n} of {Q8.layers} layers keep their attention output" in note for note in got.notes
        )


def test_auto_offload_counts_the_attention_cache():
    from ds_longctx.plan.search import fewest_offload_layers

    kw = dict(seq_len=196_608, gpus=2, sp_size=2, gpu_mem_gb=141)
    k0 = fewest_offload_layers(Q8, levers=Levers(tiled_mlp=False), **kw)
    k8 = fewest_offload_layers(Q8, levers=Levers(tiled_mlp=False, attention_cache_layers=8), **kw)
    assert k0 < k8 <= Q8.layers - 8  # the cached layers hold more, and they stay on the GPU
    lv = Levers(tiled_mlp=False, offload_layers=k8, attention_cache_layers=8)
    assert plan_memory(Q8, 196_608, 2, 2, lv).gpu_peak_bytes <= 0.9 * 141 * GB
    assert (
        plan_memory(Q8, 196_608, 2, 2, replace(lv, offload_layers=k8 - 1)).gpu_peak_bytes
        > 0.9 * 141 * GB
    )


def test_two_nodes_keep_sp_inside_a_node_and_need_fewer_offloads():
    one, two = choose(Q8, 1 << 20, 8, 80, 560), choose(Q8, 1 << 20, 8, 80, 560, nodes=2)
    assert two.sp_size == 8 and (two.plan.nodes, two.plan.world, two.plan.dp_size) == (2, 16, 2)
    # the ZeRO-3 share per GPU halves (16 bytes per parameter over 16 GPUs, not 8): fewer
    # checkpoints leave the GPU
    assert two.levers.offload_layers < one.levers.offload_layers
    assert "inside one node, dp=2 across 2 nodes" in two.notes[0]
    assert find_max_len(Q8, 2, 80, 256, nodes=2) > find_max_len(Q8, 2, 80, 256)
    with pytest.raises(ValueError, match="does not divide the 8 processes per node"):
        choose(Q8, 4096, 8, 80, 560, sp_size=16, nodes=2)


def test_no_fit_names_more_nodes_when_they_fit():
    n = find_max_len(Q8, 2, 80, 256)
    with pytest.raises(NoFit) as info:
        choose(Q8, n + 1024, 2, 80, 256)
    assert "Fix: 2 nodes like these (--nodes 2: ZeRO-3 partitions over 4 GPUs)." in str(info.value)
    choose(Q8, n + 1024, 2, 80, 256, nodes=2)


@pytest.mark.parametrize("gpus,host_gb", [(16, 32), (100000, 560)])
def test_no_fit_names_the_same_gpus_over_more_nodes_when_one_nodes_host_cannot_hold_them(
    gpus, host_gb
):
    """Too many processes for one node's host (each holds its build; 16 on 32 GB, or an absurd
    100,000 on 560 GB, where no host size fits): the fix spreads the same GPUs over nodes, the most
    per node that fits, and that plan fits. A count that fits on one node gets no such line."""
    with pytest.raises(NoFit) as info:
        choose(Q8, 131072, gpus, 80, host_gb)
    fixes = [
        line
        for line in str(info.value).splitlines()
        if line.startswith(f"Fix: the same {gpus} GPUs, ")
    ]
    assert len(fixes) == 1, str(info.value)
    per, nodes = (int(x) for x in re.search(r"--gpus (\d+) --nodes (\d+)", fixes[0]).groups())
    assert per * nodes == gpus and per < gpus
    choose(Q8, 131072, per, 80, host_gb, nodes=nodes)
    more = next(
        d for d in range(per + 1, gpus + 1) if gpus % d == 0
    )  # the next count per node: does not fit
    with pytest.raises(NoFit):
        choose(Q8, 131072, more, 80, host_gb, nodes=gpus // more)
    with pytest.raises(NoFit) as info:
        choose(Q8, 1 << 22, 2, 80, 256)  # the GPUs, not the host, are what runs out
    assert "Fix: the same" not in str(info.value)


def test_no_attention_cache_is_planned_where_fa4_is_not_verified():
    """The cache needs FA4's kernel pair, which `auto` takes only at verified head dims
    (parallel/kernel_rules.py): a head_dim-64 model (Qwen3-0.6B's 16 heads of 128 made 32 of 64) is
    planned without it, and says why; the same shape at head_dim 128 caches."""
    from ds_longctx.levers.placement import Place
    from ds_longctx.plan.cache_placement import fastest_placement

    g128 = ModelGeometry.from_name_or_path("qwen3-0.6b")
    g64 = replace(
        g128, heads=2 * g128.heads, kv_heads=2 * g128.kv_heads, head_dim=g128.head_dim // 2
    )
    for geom, cached in ((g128, True), (g64, False)):
        c = fastest_placement(choose(geom, 65536, 2, 141, 256), 141, 256)
        assert (
            c.plan.placement.count(Place.CACHE) + c.plan.placement.count(Place.CACHE_OFFLOAD) > 0
        ) == cached
        why = "head_dim 128/256 (this model: 64"
        assert any("no attention cache" in n and why in n for n in c.notes) == (not cached)


def test_head_dim_has_one_rule_for_the_planner_and_the_engine():
    """kernel_rules.head_dim: `head_dim` when the config gives one, else hidden / heads; the
    planner's geometry and the engine's attention read the same answer from a dict and from an HF
    config object."""
    from transformers import LlamaConfig, Qwen3Config

    from ds_longctx.parallel import kernel_rules
    from ds_longctx.parallel.attention import model_head_dim
    from ds_longctx.plan.geometry import ModelGeometry

    for hf, want in (
        (
            Qwen3Config(
                hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128
            ),
            128,
        ),
        (LlamaConfig(hidden_size=256, num_attention_heads=4), 64),
    ):
        assert (
            kernel_rules.head_dim(hf.to_dict())
            == kernel_rules.head_dim(hf)
            == model_head_dim(hf)
            == want
        )
        assert ModelGeometry.from_config(hf.to_dict()).head_dim == want
    bare = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 8,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "vocab_size": 64,
    }  # a config.json without head_dim, or with null
    assert kernel_rules.head_dim(bare) == kernel_rules.head_dim(dict(bare, head_dim=None)) == 32
    assert ModelGeometry.from_config(bare).head_dim == 32


def test_grouped_attention_backward_only_where_nothing_fits_without_it():
    """1 x 141 GB + 2 TB: the longest length needs the attention backward over the 8 KV heads one at
    a time (the lever after the tiled layer); without it nothing fits there, whatever is offloaded;
    shorter lengths that fit without it do not get it, and the note says why it is on."""
    n = find_max_len(Q8, 1, 141, 2000)
    c = choose(Q8, n, 1, 141, 2000)
    assert c.levers.attn_bwd_head_groups == 8 and c.levers.tiled_layer
    assert any(x.startswith("attn_bwd_head_groups=8: needed to fit") for x in c.notes)
    for k in range(Q8.layers + 1):
        lv = replace(c.levers, attn_bwd_head_groups=1, offload_layers=k)
        assert not plan_memory(Q8, n, 1, 1, lv).fits(0.9 * 141 * GB, 0.9 * 2000 * GB), k
    assert choose(Q8, 524_288, 1, 141, 2000).levers.attn_bwd_head_groups == 1


def test_parameters_are_offloaded_only_after_the_optimizer_and_only_where_nothing_fits_without():
    """1 x 141 GB + 2 TB: the longest length offloads the bf16 parameters too (>= ALST's 1.2M on one
    H200, planner only); without that, nothing fits there; a length that fits with the optimizer
    alone offloaded does not get it; LoRA never does."""
    n = find_max_len(Q8, 1, 141, 2000)
    assert n >= 1_200_000
    c = choose(Q8, n, 1, 141, 2000)
    assert c.levers.offload_params and c.levers.optimizer_offload
    assert any(
        x.startswith("offload_params=True: nothing fits with the optimizer alone offloaded")
        for x in c.notes
    )
    for k in range(Q8.layers + 1):
        lv = replace(c.levers, offload_params=False, offload_layers=k)
        assert not plan_memory(Q8, n, 1, 1, lv).fits(0.9 * 141 * GB, 0.9 * 2000 * GB), k
    shorter = choose(Q8, 655_360, 1, 141, 2000)
    assert shorter.levers.optimizer_offload and not shorter.levers.offload_params
    lora = Levers(lora_rank=16)
    assert not choose(
        Q8, find_max_len(Q8, 1, 141, 2000, base=lora), 1, 141, 2000, base=lora
    ).levers.offload_params


def test_a_partial_optimizer_offload_only_where_the_whole_one_breaks_the_host():
    """1 x 141 GB + 128 GB host (the one-H200 machine the device lends): the 8B's optimizer fits
    neither on the GPU nor, whole, on the host, at any offload count, so a partial offload holds the
    most the host can; one tenth more on the host does not fit. Where the host holds the whole
    optimizer (2 TB) it goes whole; a ratio the user gives or LoRA is never changed by the
    search."""
    n = find_max_len(Q8, 1, 141, 128)
    assert n >= 65_536
    c = choose(Q8, n, 1, 141, 128)
    lv = c.levers
    assert lv.optimizer_offload and 0 < lv.optimizer_offload_ratio < 1 and not lv.offload_params
    assert c.plan.fits(0.9 * 141 * GB, 0.9 * 128 * GB)
    assert any(
        x.startswith("optimizer_offload=True: nothing fits with it on GPU (partial: ")
        and "breaks the host budget" in x
        for x in c.notes
    )
    for k in range(Q8.layers + 1):
        for other in (dict(optimizer_offload=False), dict(optimizer_offload_ratio=1.0)):
            assert not plan_memory(Q8, n, 1, 1, replace(lv, offload_layers=k, **other)).fits(
                0.9 * 141 * GB, 0.9 * 128 * GB
            ), (k, other)
    with pytest.raises(NoFit):
        choose(
            Q8,
            n,
            1,
            141,
            128,
            base=Levers(optimizer_offload_ratio=round(lv.optimizer_offload_ratio + 0.1, 1)),
        )
    assert choose(Q8, n, 1, 141, 2000).levers.optimizer_offload_ratio == 1.0
    assert (
        choose(
            Q8, 32_768, 1, 141, 128, base=Levers(optimizer_offload_ratio=0.4)
        ).levers.optimizer_offload_ratio
        == 0.4
    )
    lora = Levers(lora_rank=16)
    assert choose(Q8, n, 1, 141, 128, base=lora).levers.optimizer_offload_ratio == 1.0


def test_the_plans_rope_note_is_what_train_does_at_that_length(tmp_path):
    """`rope_notes` asks levers/rope's own rules of the config.json: nothing within the trained
    context (Qwen3's published 32,768, not its max_position_embeddings 40,960); past it YaRN with
    train's factor; over a config that already carries YaRN, that YaRN's original length; Llama 3's
    scaled RoPE within its trained context, nothing (past it plan refuses:
    tests/run/test_hostile_inputs.py)."""
    from transformers import AutoConfig

    from ds_longctx.levers.rope import apply_rope_scaling
    from ds_longctx.plan.search_notes import rope_notes

    def geom_and_hf(cfg: dict):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        return ModelGeometry.from_name_or_path(d), AutoConfig.from_pretrained(d)

    qwen = json.loads((SHIPPED_MODELS_DIR / "qwen3-8b.json").read_text())
    g, hf = geom_and_hf(qwen)
    assert rope_notes(g, 32768) == []
    assert apply_rope_scaling(hf, 32768) is None  # train: unchanged there too
    (note,) = rope_notes(g, 36864)
    assert (
        note.endswith(f"factor {apply_rope_scaling(hf, 36864)['factor']:g})")
        and "trained context 32,768" in note
    )

    yarn = dict(
        qwen,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    )
    g, hf = geom_and_hf(yarn)
    (note,) = rope_notes(g, 262144)
    assert "trained context 32,768" in note and note.endswith(
        f"factor {apply_rope_scaling(hf, 262144)['factor']:g})"
    )

    llama3 = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    }
    g, hf = geom_and_hf(llama3)
    assert rope_notes(g, 131072) == [] and apply_rope_scaling(hf, 131072) is None
    plain = {
        k: v for k, v in llama3.items() if k not in ("rope_scaling", "max_position_embeddings")
    }
    g, hf = geom_and_hf(
        plain
    )  # no max_position_embeddings: LlamaConfig's default (2048), as train reads it
    (note,) = rope_notes(g, 4096)
    assert "trained context 2,048" in note and note.endswith(
        f"factor {apply_rope_scaling(hf, 4096)['factor']:g})"
    )
    with pytest.raises(
        ValueError, match="rope_parameters / rope_scaling = 'linear' is not a JSON object"
    ):
        geom_and_hf(dict(llama3, rope_scaling="linear"))
