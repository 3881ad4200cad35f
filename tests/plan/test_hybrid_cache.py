"""plan/cache_placement.py for a hybrid model: the attention cache goes to its full-attention layers
only."""

from __future__ import annotations

from dataclasses import replace

from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.plan.planner import GB, ModelGeometry, plan_memory
from ds_longctx.plan.search import choose


def test_a_hybrid_caches_its_full_attention_layers_only_and_the_most_that_fit(monkeypatch):
    """Qwen3.5-4B at 1M on 8 x 141 GB and 8 x 80 GB, FlashAttention 4 verified at its head_dim 256
    (the cache's kernel pair): every cached layer is a full-attention one, the last of them; the
    plan fits; it caches the most full layers that fit (one more does not fit at any offload count),
    and its step is shorter than the uncached plan's. Without FA4 verified there, no cache."""
    from ds_longctx.parallel import kernel_rules
    from ds_longctx.plan.cache_placement import fastest_placement
    from ds_longctx.plan.step_time import predict_step

    g = ModelGeometry.from_name_or_path("qwen3.5-4b")
    full = [i for i, f in enumerate(g.attention_layers) if f]
    with monkeypatch.context() as m:
        m.setattr(kernel_rules, "FA4_VERIFIED_HEAD_DIMS", (128,))
        assert fastest_placement(choose(g, 1 << 20, 8, 80, 560), 80, 560).plan.placement.cached == 0
    for gpu_gb in (141, 80):
        c = choose(g, 1 << 20, 8, gpu_gb, 560)
        got = fastest_placement(c, gpu_gb, 560).plan
        cached = [i for i, p in enumerate(got.placement.layers) if p.value == "cache"]
        assert cached and cached == full[len(full) - len(cached) :]
        assert got.fits(0.9 * gpu_gb * GB, 0.9 * 560 * GB)
        assert (
            predict_step(got, gpu_gb, "h200").seconds < predict_step(c.plan, gpu_gb, "h200").seconds
        )
        if len(cached) < len(full):  # one more cached full layer fits at no offload count
            for off in range(c.plan.placement.offloaded, g.layers):
                if sum(g.attention_layers[off:]) <= len(cached):
                    break
                spec = PlacementPlan.from_counts(
                    g.layers, off, len(cached) + 1, cacheable=g.attention_layers
                )
                more = plan_memory(
                    g,
                    1 << 20,
                    8,
                    8,
                    replace(c.levers, offload_layers=0, attention_cache_layers=0, placement=spec),
                )
                assert not more.fits(0.9 * gpu_gb * GB, 0.9 * 560 * GB), spec.spec()
