"""What one layer's backward holds per way of running it (plan/layer_units.py), as the planner's
terms count it: HF's eager ops against compiled ones, the tiled layer, an offloaded layer restored
from our pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.plan.planner import Levers, ModelGeometry, plan_memory

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")


def test_tiled_layer_drops_the_full_length_norm_tensors_and_tiles_the_qkv_work():
    """levers/tiled_layer.py: the norms' and q/k norms' full-length saved tensors leave both layer
    phases (3 and 1 hidden units instead of eager 10 / 6, no qk_norm_saved); the q/k/v tiles' own
    terms join attn_bwd; the MLP is tiled."""
    T, H, hq, hkv, d = 131_072, Q8.hidden, Q8.heads, Q8.kv_heads, Q8.head_dim
    E = T * H * 2
    base = Levers(tiled_mlp=True, tile_tokens=4096, fused_ops="none")
    plain, tiled = (
        plan_memory(Q8, 1 << 20, 8, 8, replace(base, tiled_layer=tl)) for tl in (False, True)
    )
    assert (
        plain.term("hidden_mlp_bwd").gpu_bytes == 10 * E
        and tiled.term("hidden_mlp_bwd").gpu_bytes == 3 * E
    )
    assert (
        plain.term("hidden_attn_bwd").gpu_bytes == 6 * E
        and tiled.term("hidden_attn_bwd").gpu_bytes == 1 * E
    )
    assert plain.term("qk_norm_saved").gpu_bytes > 0 and not any(
        t.name == "qk_norm_saved" for t in tiled.terms
    )
    assert tiled.term("qkv_tile").gpu_bytes == 4096 * (6 * H + 4 * (hq + 2 * hkv) * d) * 2
    assert tiled.term("qkv_tile_wgrad_fp32").gpu_bytes == (hq + 2 * hkv) * d * H * 4
    assert (
        tiled.term("mlp_tile").gpu_bytes == plain.term("mlp_tile").gpu_bytes
    )  # the MLP tiles as before
    pb, tb = dict(plain.phase_bytes), dict(tiled.phase_bytes)
    assert tb["mlp_bwd"] < pb["mlp_bwd"] - 7 * E and tb["attn_bwd"] < pb["attn_bwd"] - 2 * E
    assert Levers.from_run_config(RunConfig(tiled_layer=True)).tiled_layer
    assert RunConfig(**replace(base, tiled_layer=True).run_config_fields()).memory.tiled_layer


def test_compiled_token_wise_ops_save_fewer_full_length_tensors_than_eager():
    """fused_ops auto / compile (what a GPU run does) vs none / liger (HF's eager units): the final
    norm 2 vs 4 E, the layer's hidden-size tensors 5 / 2 vs 10 / 6 E, one q/k-norm copy vs 3, SwiGLU
    3 saved T·I vs 4 (benchmarks/probe_fused_ops_saved.py and a 4B memory snapshot:
    docs/calibration.md#layer-units)."""
    S, G = 1 << 20, 8
    T, H, inter, hq, hkv, d = S // G, Q8.hidden, Q8.intermediate, Q8.heads, Q8.kv_heads, Q8.head_dim
    E = T * H * 2
    units = {}
    for ops in ("auto", "compile", "none", "liger"):
        p = plan_memory(Q8, S, G, G, Levers(fused_ops=ops))
        units[ops] = (
            p.term("final_norm").gpu_bytes / E,
            p.term("hidden_mlp_bwd").gpu_bytes / E,
            p.term("hidden_attn_bwd").gpu_bytes / E,
            p.term("qk_norm_saved").gpu_bytes / (T * (hq + hkv) * d * 2),
            p.term("mlp_saved").gpu_bytes / (T * inter * 2),
        )
    assert units["auto"] == units["compile"] == (2, 5, 2, 1, 3)
    assert units["none"] == units["liger"] == (4, 10, 6, 3, 4)
    with pytest.raises(
        ValueError, match=r"fused_ops='fast' is not one of auto, none, liger, compile"
    ):
        Levers(fused_ops="fast")
    # the run config carries it both ways; the default (auto) is not written into generated configs
    lv = Levers.from_run_config(RunConfig(fused_ops="none"))
    assert (
        lv.fused_ops == "none" and RunConfig(**lv.run_config_fields()).kernels.fused_ops == "none"
    )
    assert "fused_ops" not in Levers().run_config_fields()


def test_an_offloaded_layer_restores_into_the_room_the_kept_layers_freed():
    """Offloaded layers are the lowest, so their backward runs after every kept checkpoint and GPU
    cache is freed: with the pool an offloaded layer's 3 E (its restored input, its held output
    grad, its recomputed output) count only beyond what the kept layers held. DeepSpeed's engine:
    its calibrated 2 E always, and beside an offloaded optimizer
    its own measured fragmentation."""
    from ds_longctx.plan.layer_units import POOLED_LAYER_UNITS
    from ds_longctx.plan.planner import DS_OFFLOAD_FRAGMENTATION, OFFLOAD_FRAGMENTATION

    G, S = 2, 262_144
    E = S // G * Q8.hidden * 2
    pool = {
        k: plan_memory(Q8, S, G, G, Levers(offload_layers=k, pinned_pool=True))
        for k in range(Q8.layers + 1)
    }
    assert POOLED_LAYER_UNITS == 3
    assert pool[36].term("offload_staging").gpu_bytes == 3 * E  # nothing kept
    assert pool[35].term("offload_staging").gpu_bytes == 2 * E  # one kept checkpoint freed by then
    assert pool[33].term("offload_staging").gpu_bytes == 0
    peaks = [pool[k].gpu_peak_bytes for k in range(1, Q8.layers + 1)]
    assert peaks == sorted(
        peaks, reverse=True
    )  # more offloaded never costs more GPU (the search bisects on it)
    ds = plan_memory(Q8, S, G, G, Levers(offload_layers=33))
    assert ds.term("offload_staging").gpu_bytes == 2 * E

    def f(p):
        return 1 + p.term("allocator_slack").gpu_bytes / (
            p.reserved_bytes - p.term("allocator_slack").gpu_bytes
        )

    assert f(ds) == pytest.approx(OFFLOAD_FRAGMENTATION) and f(pool[33]) == pytest.approx(
        OFFLOAD_FRAGMENTATION
    )
    opt = Levers(offload_layers=33, optimizer_offload=True)
    assert f(plan_memory(Q8, S, G, G, opt)) == pytest.approx(DS_OFFLOAD_FRAGMENTATION)
    assert f(plan_memory(Q8, S, G, G, replace(opt, pinned_pool=True))) == pytest.approx(
        OFFLOAD_FRAGMENTATION
    )
