"""The memory model: hand-computed values, exact offload accounting, monotonicity (choices:
test_search.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import ds_longctx
from ds_longctx.config import RunConfig
from ds_longctx.plan.planner import (
    GB,
    GIB,
    Levers,
    ModelGeometry,
    checkpoint_bytes_per_token,
    plan_memory,
    sp_sizes_for,
)

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")
TINY = ModelGeometry.from_name_or_path("qwen3-tiny")
MODELS = Path(ds_longctx.__file__).parent / "models"
P8 = 8_190_735_360  # Qwen3-8B: 36 x 192,946,432 per layer + 2 x 151,936 x 4096 + 4096


def test_qwen3_8b_param_count():
    assert Q8.layer_params == 192_946_432
    assert Q8.num_params == P8 and abs(Q8.num_params - 8.19e9) < 0.01e9


def test_tiny_param_count_matches_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = json.loads((MODELS / "qwen3-tiny.json").read_text())
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg))
    assert TINY.num_params == sum(p.numel() for p in model.parameters()) == 168_320


def test_checkpoints_cost_288_kib_per_token():
    assert checkpoint_bytes_per_token(Q8) == 36 * 4096 * 2 == 288 * 1024
    plan = plan_memory(Q8, 131_072, 1, 1)
    assert plan.term("checkpoints").gpu_bytes == 131_072 * 288 * 1024 == 36 * GIB
    # sp=8 splits the same 288 KiB per token of the full sequence over 8 ranks
    assert (
        plan_memory(Q8, 1 << 20, 8, 8).term("checkpoints").gpu_bytes == (1 << 20) * 288 * 1024 // 8
    )


def test_zero3_bytes_for_8b_over_8_gpus():
    plan = plan_memory(Q8, 4096, 8, 8)
    got = {
        n: plan.term(n).gpu_bytes
        for n in ("params_bf16", "grads_bf16", "master_fp32", "adam_m_v_fp32")
    }
    assert got == {
        "params_bf16": 2_047_683_840,
        "grads_bf16": 2_047_683_840,
        "master_fp32": 4_095_367_680,
        "adam_m_v_fp32": 8_190_735_360,
    }
    # 2 bf16 params + 2 bf16 grads (DeepSpeed's grad_accum_dtype defaults to the model dtype) + 4
    # master + 8 Adam
    assert sum(got.values()) == 16 * P8 // 8
    assert plan.term("reduce_bucket").gpu_bytes == 100_000_000  # 5e7 bf16 elements
    assert plan.term("gathered_layers").gpu_bytes == 2 * 192_946_432 * 2


def test_host_peak_is_the_larger_of_build_and_step():
    # ZeRO-3 init copies each rank's bf16 partition through a CPU buffer: 2·P bytes over the node,
    # plus 1.5 GiB per rank; the 8B on 2 GPUs without offload peaks there, with 36 layers offloaded
    # in the step
    G = 2
    build = G * 1.5 * GIB + 2 * (-(-P8 // G)) * G
    base = plan_memory(Q8, 65_536, G, G)
    assert base.host_step_bytes == G * 2.25 * GIB + G * 65_536 * 16
    assert base.host_peak_bytes == pytest.approx(build, abs=2)
    off = plan_memory(Q8, 262_144, G, G, Levers(offload_layers=36))
    # 131,072 tokens per rank x 4096 x 2 bytes = 1 GiB per layer checkpoint (a power of two)
    assert (
        off.host_peak_bytes
        == off.host_step_bytes
        == G * 36 * GIB + G * 2.25 * GIB + G * 262_144 * 16
    )


def test_pinned_checkpoints_round_up_to_a_power_of_two():
    # 196,608 tokens over 2 ranks: 98,304 x 4096 x 2 = 768 MiB per checkpoint, pinned in 1 GiB
    # blocks
    off = plan_memory(Q8, 196_608, 2, 2, Levers(offload_layers=36))
    assert off.term("checkpoints").host_bytes == 2 * 36 * GIB


def test_chunked_vs_plain_loss_terms():
    T, V, H = 65_536, Q8.vocab, Q8.hidden
    chunked = plan_memory(Q8, 2 * T, 2, 2, Levers(chunked_loss=True, loss_chunk_rows=4096))
    plain = plan_memory(Q8, 2 * T, 2, 2, Levers(chunked_loss=False))
    assert chunked.term("loss_chunk_logits_fp32").gpu_bytes == 4096 * V * 4
    assert chunked.term("loss_chunk_bf16").gpu_bytes == 4096 * V * 2
    assert chunked.term("lm_head_grad_accum_fp32").gpu_bytes == V * H * 4
    # log_softmax's backward: saved fp32 output + fp32 grad in + fp32 grad out = 12 bytes per logit,
    # and the bf16 logits' freed block (2 bytes per logit) stays reserved
    assert plain.term("logits").gpu_bytes == T * V * 12
    assert plain.term("logits_bf16_block").gpu_bytes == T * V * 2
    assert not any(t.name == "logits" for t in chunked.terms)

    def loss(p):
        return dict(p.phase_bytes)["loss"]

    assert loss(plain) - loss(chunked) == T * V * 14 - 4096 * V * 6 - V * H * 4
    assert plain.peak_phase == "loss" and plain.gpu_peak_bytes > chunked.gpu_peak_bytes
    # chunks never exceed the local rows
    assert plan_memory(Q8, 1000, 1, 1).term("loss_chunk_logits_fp32").gpu_bytes == 1000 * V * 4


def test_layer_offload_moves_bytes_from_gpu_to_host_exactly():
    G, S, k = 2, 262_144, 20
    E = S // G * Q8.hidden * 2
    on = plan_memory(Q8, S, G, G, Levers(offload_layers=0), fragmentation=1.0)
    off = plan_memory(Q8, S, G, G, Levers(offload_layers=k), offload_fragmentation=1.0)
    assert on.term("checkpoints").gpu_bytes - off.term("checkpoints").gpu_bytes == k * E
    # E = 512 MiB is a power of two, so the pinned allocator's rounding adds nothing here
    assert off.term("checkpoints").host_bytes - on.term("checkpoints").host_bytes == G * k * E
    assert off.term("offload_staging").gpu_bytes == 2 * E
    assert on.gpu_peak_bytes - off.gpu_peak_bytes == (k - 2) * E
    assert off.host_step_bytes - on.host_step_bytes == G * k * E
    # with fragmentation the GPU saving scales with it
    f = 1.1
    on_f = plan_memory(Q8, S, G, G, Levers(offload_layers=0), fragmentation=f)
    off_f = plan_memory(Q8, S, G, G, Levers(offload_layers=k), offload_fragmentation=f)
    assert on_f.gpu_peak_bytes - off_f.gpu_peak_bytes == pytest.approx((k - 2) * E * f, abs=2)


def test_optimizer_offload_moves_bytes_from_gpu_to_host_exactly():
    G = 8
    on = plan_memory(Q8, 65_536, G, 8, Levers(optimizer_offload=False), fragmentation=1.0)
    off = plan_memory(Q8, 65_536, G, 8, Levers(optimizer_offload=True), fragmentation=1.0)
    assert (
        on.gpu_peak_bytes - off.gpu_peak_bytes == 14 * P8 // G
    )  # bf16 grads 2 + master 4 + Adam 8
    # on the host, per rank of 1,023,841,920 elements: master 4 + Adam 8 bytes each, exact; the bf16
    # grads (2.05 GB) and the fp32 grads CPU Adam steps on (4.10 GB: one sub-group, the partition
    # reaches DeepSpeed's 1e9 only at lm_head, the last parameter) are pinned, each one block
    # rounded up to a power of two: 2 GiB and 4 GiB
    part = P8 // G
    assert off.host_step_bytes - on.host_step_bytes == G * (12 * part + 2**31 + 2**32)
    assert (
        off.term("grads_bf16").host_bytes == G * 2**31
        and off.term("cpu_adam_grads_fp32").host_bytes == G * 2**32
    )
    assert (
        off.term("params_bf16").gpu_bytes == on.term("params_bf16").gpu_bytes
    )  # bf16 weights stay


def test_every_term_is_named_in_the_table():
    plan = plan_memory(Q8, 1 << 20, 8, 8, Levers(offload_layers=10, tiled_mlp=False))
    text = plan.table()
    for t in plan.terms:
        assert t.name in text and t.formula in text
    assert f"{plan.gpu_peak_bytes / GB:.2f}" in text and plan.peak_phase in text
    # peak = all + peak phase + slack + context
    live = sum(t.gpu_bytes for t in plan.terms if t.phases == ("all",))
    assert plan.gpu_peak_bytes == live + dict(plan.phase_bytes)[plan.peak_phase]


@pytest.mark.parametrize(
    "levers",
    [
        Levers(),
        Levers(chunked_loss=False, tiled_mlp=False),
        Levers(offload_layers=36, optimizer_offload=True, tile_tokens=2048),
    ],
)
def test_monotonic_in_seq_len(levers):
    lengths = [1, 1000, 4096, 30_000, 65_536, 131_072, 262_144, 1 << 20, 3 << 20]
    plans = [plan_memory(Q8, n, 8, 8, levers) for n in lengths]
    for a, b in zip(plans, plans[1:]):
        assert a.gpu_peak_bytes <= b.gpu_peak_bytes and a.host_peak_bytes <= b.host_peak_bytes


def test_seq_len_is_padded_to_sp():
    plan = plan_memory(Q8, 1_000_001, 8, 8)
    assert plan.seq_len == 1_000_008 and plan.local_tokens == 125_001


def test_sp_validity():
    assert sp_sizes_for(Q8, 8) == [1, 2, 4, 8]
    assert sp_sizes_for(Q8, 16) == [
        1,
        2,
        4,
        8,
        16,
    ]  # 16 > 8 KV heads: each KV head replicated twice
    assert sp_sizes_for(TINY, 8) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match=r"sp_size=3 .* try one of \[1\]"):
        plan_memory(Q8, 4096, 3, 3)
    with pytest.raises(ValueError, match="offload_layers=37"):
        plan_memory(Q8, 4096, 1, 1, Levers(offload_layers=37))


def test_sp_beyond_kv_heads_replicates_kv():
    plan = plan_memory(Q8, 1 << 20, 16, 16)  # 32 q heads / 16 = 2, KV 8 / 16 -> 1 replicated head
    assert plan.term("qkv_a2a").gpu_bytes == (1 << 20) * (2 + 2 * 1) * 128 * 2


def test_tiled_terms_replace_the_untiled_mlp():
    T, inter, H = 131_072, Q8.intermediate, Q8.hidden
    tiled = plan_memory(Q8, 1 << 20, 8, 8, Levers(tiled_mlp=True, tile_tokens=4096))
    assert tiled.term("mlp_tile").gpu_bytes == 6 * 4096 * inter * 2
    assert tiled.term("mlp_tile_wgrad_fp32").gpu_bytes == 3 * H * inter * 4
    assert not any(t.name == "mlp_saved" for t in tiled.terms)
    plain = plan_memory(Q8, 1 << 20, 8, 8, Levers())
    assert plain.term("mlp_grads").gpu_bytes == 2 * T * inter * 2 and not any(
        t.name == "mlp_tile" for t in plain.terms
    )


def test_attention_cache_costs_one_kernel_output_and_lse_per_cached_layer():
    G, S, n = 8, 1 << 20, 10
    T = S // G
    base = plan_memory(Q8, S, G, G)
    cached = plan_memory(Q8, S, G, G, Levers(attention_cache_layers=n))
    # Qwen3-8B at SP=8: 4 query heads x 128 over the full 1M sequence: 1 GiB of bf16 output + 16 MiB
    # of fp32 LSE
    per_layer = S * 4 * 128 * 2 + 4 * S * 4
    assert (
        per_layer == T * Q8.hidden * 2 + 16 * 2**20
    )  # the size of one layer checkpoint, plus the LSE
    assert cached.term("attention_cache").gpu_bytes == n * per_layer
    # the top layer's own output and LSE are the cached ones: not counted twice in its backward
    assert (
        cached.term("attn_out_a2a").gpu_bytes == 0
        and cached.term("softmax_lse_fp32").gpu_bytes == 0
    )
    assert base.term("attn_out_a2a").gpu_bytes == S * 4 * 128 * 2
    with pytest.raises(
        ValueError,
        match=r"attention_cache_layers=30 \(the last layers\) overlaps offload_layers=10",
    ):
        plan_memory(Q8, S, G, G, Levers(offload_layers=10, attention_cache_layers=30))


def test_lora_counts_optimizer_states_for_the_adapters_only():
    # Qwen3-8B, rank 16 on the 7 projections; r·(in + out) per Linear (H 4096, 32·128 query and
    # 8·128 KV features, I 12288): q 16·(4096+4096), k and v 16·(4096+1024) each, o 16·(4096+4096),
    # gate/up/down 16·(4096+12288)
    q, kv, o, mlp = 16 * 8192, 16 * 5120, 16 * 8192, 16 * 16384
    per_layer = q + 2 * kv + o + 3 * mlp
    assert per_layer == 1_212_416
    A, G = 36 * per_layer, 8  # 43,646,976 adapter params
    lora = plan_memory(Q8, 4096, G, G, Levers(lora_rank=16))
    part = -(-A // G)
    got = {
        n: lora.term(n).gpu_bytes
        for n in ("params_bf16", "grads_bf16", "master_fp32", "adam_m_v_fp32")
    }
    assert got == {
        "params_bf16": 2 * -(-(P8 + A) // G),
        "grads_bf16": 2 * part,
        "master_fp32": 4 * part,
        "adam_m_v_fp32": 8 * part,
    }
    assert (
        lora.term("grads_bf16").gpu_bytes == 10_911_744
    )  # 2 bytes x 5,455,872 adapter params per GPU
    # the frozen base has no grads: one layer's grads are its adapters' (the MLP's in its backward,
    # q/k/v/o's in the attention's), the embedding's and lm_head's none
    assert (
        lora.term("layer_grads_bf16").gpu_bytes + lora.term("mixer_grads_bf16").gpu_bytes
        == 2 * per_layer
    )
    assert lora.term("layer_grads_bf16").phases == ("mlp_bwd",)
    assert lora.term("mixer_grads_bf16").phases == ("attn_bwd",)
    assert all(
        lora.term(n).gpu_bytes == 0
        for n in ("embedding_grad_bf16", "lm_head_grad_bf16", "lm_head_grad_accum_fp32")
    )
    assert lora.term("gathered_layers").gpu_bytes == 2 * (192_946_432 + per_layer) * 2
    assert (
        lora.term("lora_saved").gpu_bytes == 7 * 512 * 16 * 2
    )  # 7 adapted Linears, T = 4096 / 8 tokens, r = 16
    assert lora.term("zero3_defragment_cpu").host_bytes == 2 * part * G
    full = plan_memory(Q8, 4096, G, G)
    assert lora.gpu_peak_bytes < full.gpu_peak_bytes and "lora_rank=16" in lora.table()
    # optimizer offload moves the adapters' states, not the model's
    off = plan_memory(Q8, 4096, G, G, Levers(lora_rank=16, optimizer_offload=True))
    assert off.term("adam_m_v_fp32").host_bytes == 8 * part * G
    # the pinned grads: 2 x 5,455,872 bytes in a 16 MiB block, 4 x 5,455,872 in a 32 MiB one (one
    # sub-group)
    assert (
        off.term("grads_bf16").host_bytes == G * 2**24
        and off.term("cpu_adam_grads_fp32").host_bytes == G * 2**25
    )
    # other targets: q and v only; all-linear is the 7 (lm_head is never adapted)
    qv = plan_memory(Q8, 4096, G, G, Levers(lora_rank=16, lora_targets=("q_proj", "v_proj")))
    assert qv.term("grads_bf16").gpu_bytes == 2 * -(-36 * (q + kv) // G)
    every = plan_memory(Q8, 4096, G, G, Levers(lora_rank=16, lora_targets="all-linear"))
    assert [t.gpu_bytes for t in every.terms] == [t.gpu_bytes for t in lora.terms]
    # tiled MLP sums the MLP adapters' grads in fp32 (T = 131,072 / 2 > t = 4096)
    tiled = plan_memory(Q8, 131_072, 2, 2, Levers(lora_rank=16, tiled_mlp=True))
    assert tiled.term("mlp_tile_wgrad_fp32").gpu_bytes == 3 * mlp * 4


def test_lora_levers_round_trip_the_run_config():
    from ds_longctx.config import RunConfig

    cfg = RunConfig(model="qwen3-8b", lora_rank=16, lora_target_modules="q_proj,v_proj")
    lv = Levers.from_run_config(cfg)
    assert (lv.lora_rank, lv.lora_targets) == (16, ("q_proj", "v_proj"))
    back = RunConfig(model="qwen3-8b", **lv.run_config_fields())
    assert back.lora == cfg.lora
    assert Levers.from_run_config(
        RunConfig(model="qwen3-8b", lora_rank=8, lora_target_modules="all-linear")
    ) == Levers(lora_rank=8, lora_targets="all-linear")


def test_two_nodes_of_8_partition_over_16_and_count_host_per_node():
    """Qwen3-8B on 2 nodes x 8 GPUs at 1M tokens, sp=8 (an SP group per node, dp=2 across them), by
    hand."""
    two = plan_memory(Q8, 1 << 20, 8, 8, nodes=2, fragmentation=1.0)
    assert (two.world, two.dp_size, two.local_tokens) == (16, 2, 131_072)
    got = {
        n: two.term(n).gpu_bytes
        for n in ("params_bf16", "grads_bf16", "master_fp32", "adam_m_v_fp32")
    }
    assert (
        got
        == {
            "params_bf16": 2 * P8 // 16,
            "grads_bf16": 2 * P8 // 16,
            "master_fp32": 4 * P8 // 16,
            "adam_m_v_fp32": 8 * P8 // 16,
        }
        == {
            "params_bf16": 1_023_841_920,
            "grads_bf16": 1_023_841_920,
            "master_fp32": 2_047_683_840,
            "adam_m_v_fp32": 4_095_367_680,
        }
    )
    # the activations are the same per GPU as on one node of 8 (same sp); only the ZeRO-3 share
    # halves
    one = plan_memory(Q8, 1 << 20, 8, 8, fragmentation=1.0)
    assert one.reserved_bytes - two.reserved_bytes == 16 * P8 // 8 - 16 * P8 // 16 == P8
    # host per node: its 8 ranks' worth
    assert two.term("process_overhead").host_bytes == round(8 * 2.25 * GIB)
    assert two.term("dataset_row").host_bytes == 8 * (1 << 20) * 16
    assert two.term("build_process").host_bytes == round(8 * 1.5 * GIB)
    assert (
        two.term("zero3_defragment_cpu").host_bytes == 2 * (P8 // 16) * 8 == P8
    )  # one node's 8 partitions
    off = plan_memory(Q8, 1 << 20, 8, 8, Levers(optimizer_offload=True, offload_layers=36), nodes=2)
    # per rank of P/16 = 511,920,960 elements: master 4 + Adam 8 bytes each; bf16 grads (1.02 GB)
    # and CPU Adam's fp32 grads (2.05 GB, one sub-group) pinned in power-of-two blocks, 1 GiB and 2
    # GiB; the node holds 8 ranks'
    assert sum(
        off.term(n).host_bytes
        for n in ("grads_bf16", "master_fp32", "adam_m_v_fp32", "cpu_adam_grads_fp32")
    ) == 8 * (12 * (P8 // 16) + 2**30 + 2**31)
    assert (
        off.term("checkpoints").host_bytes == 8 * 36 * GIB
    )  # 131,072 x 4096 x 2 = 1 GiB per layer and rank
    assert "nodes=2 gpus/node=8 world=16 sp=8 dp=2" in two.table() and "2·P/W" in two.table()


def test_n_nodes_of_g_are_one_node_of_n_g_per_gpu_and_one_nth_of_its_host():
    two = plan_memory(Q8, 1 << 20, 8, 8, Levers(offload_layers=20), nodes=2)
    big = plan_memory(Q8, 1 << 20, 16, 8, Levers(offload_layers=20))  # a (hypothetical) 16-GPU node
    assert [(t.name, t.gpu_bytes) for t in two.terms] == [(t.name, t.gpu_bytes) for t in big.terms]
    assert [2 * t.host_bytes for t in two.terms] == [t.host_bytes for t in big.terms]
    assert two.host_peak_bytes * 2 == big.host_peak_bytes


def test_sp_stays_inside_a_node():
    assert sp_sizes_for(Q8, 8, nodes=2) == [
        1,
        2,
        4,
        8,
    ]  # 16 would divide 32 heads and the world of 16
    assert sp_sizes_for(Q8, 16) == [1, 2, 4, 8, 16]
    with pytest.raises(
        ValueError,
        match=r"sp_size=16 does not divide the 8 processes per node.*try one of "
        r"\[1, 2, 4, 8\]",
    ):
        plan_memory(Q8, 1 << 20, 8, 16, nodes=2)
    with pytest.raises(ValueError, match="nodes=0"):
        plan_memory(Q8, 1 << 20, 8, 8, nodes=0)


def test_one_rank_gathers_nothing_and_sp_1_exchanges_nothing():
    """One rank (W = 1): ZeRO-3 has no layer to gather. sp = 1: no all-to-all, so o_proj's saved
    input is the kernel's output and the q/k/v grads are the kernel's; with grouped KV heads
    FlashAttention 4 holds dK / dV in fp32 (2·hkv·S·d·4). At sp > 1 the grads back through the
    exchange, when larger, as before."""
    g17 = ModelGeometry.from_name_or_path("qwen3-1.7b")  # 16 query heads, 8 KV heads, d 128
    S = 262_144
    one = plan_memory(g17, S, 1, 1)
    assert one.term("gathered_layers").gpu_bytes == 0
    assert plan_memory(g17, S, 2, 2).term("gathered_layers").gpu_bytes == 2 * g17.layer_params * 2
    assert one.term("attn_out_local").gpu_bytes == 0
    assert one.term("qkv_local_grad").gpu_bytes == 2 * 8 * S * 128 * 4
    mha = replace(g17, kv_heads=g17.heads)  # no grouping: the kernel writes dK / dV directly
    assert plan_memory(mha, S, 1, 1).term("qkv_local_grad").gpu_bytes == 0
    T = (
        S // 2
        # Qwen3-8B at sp 2: the exchange's grads (48 heads of T) outweigh the 4 KV heads' fp32
        # accumulators
    )
    two = plan_memory(Q8, S, 2, 2)
    assert two.term("qkv_local_grad").gpu_bytes == T * (32 + 2 * 8) * 128 * 2 > 2 * 4 * S * 128 * 4
    assert two.term("attn_out_local").gpu_bytes == T * 32 * 128 * 2


def test_grouped_attention_backward_divides_the_kernels_accumulators():
    """attn_bwd_head_groups G: the fp32 dQ workspace and the GQA dK / dV accumulators of one group
    at a time (/G), one group's q/k/v grads before they are copied (+qkv_a2a/G); everything else as
    G = 1; a G that does not split the rank's KV heads is refused as the run config is."""
    S = 524_288
    one = plan_memory(Q8, S, 1, 1, Levers(tiled_layer=True, tiled_mlp=True, tile_tokens=4096))
    eight = plan_memory(
        Q8,
        S,
        1,
        1,
        Levers(tiled_layer=True, tiled_mlp=True, tile_tokens=4096, attn_bwd_head_groups=8),
    )
    assert eight.term("attn_bwd_workspace").gpu_bytes == 32 * S * 129 * 4 // 8
    assert (
        eight.term("qkv_local_grad").gpu_bytes
        == 2 * 8 * S * 128 * 4 // 8
        == one.term("qkv_local_grad").gpu_bytes // 8
    )
    assert eight.term("attn_bwd_group_grads").gpu_bytes == S * 48 * 128 * 2 // 8
    assert not any(t.name == "attn_bwd_group_grads" for t in one.terms)
    saved = sum(
        one.term(n).gpu_bytes - eight.term(n).gpu_bytes
        for n in ("attn_bwd_workspace", "qkv_local_grad")
    )
    assert (
        dict(one.phase_bytes)["attn_bwd"] - dict(eight.phase_bytes)["attn_bwd"]
        == saved - eight.term("attn_bwd_group_grads").gpu_bytes
    )
    with pytest.raises(ValueError, match=r"attn_bwd_head_groups=3: each rank attends 4 KV head"):
        plan_memory(Q8, S, 2, 2, Levers(attn_bwd_head_groups=3))
    lv = Levers.from_run_config(RunConfig(attn_bwd_head_groups=4))
    assert (
        lv.attn_bwd_head_groups == 4
        and RunConfig(**lv.run_config_fields()).memory.attn_bwd_head_groups == 4
    )


def test_offloaded_params_keep_the_small_ones_on_the_gpu_and_one_flat_pinned_host_buffer():
    """offload_params (DeepSpeed offload_param, stage3.py): the GPU keeps only parameters of at most
    PARAM_PERSISTENCE_ELEMS elements (whole) and, even on one rank, the layers being gathered; the
    host one flat pinned buffer of the rank's partition per rank, power-of-two rounded, and at build
    zero.Init's unpinned partitions beside it. The DeepSpeed config carries it and the same
    persistence threshold; LoRA and a split optimizer refuse it."""
    from ds_longctx.plan.ds_config import build_ds_config
    from ds_longctx.plan.zero_buffers import PARAM_PERSISTENCE_ELEMS

    S = 262_144
    lv = Levers(optimizer_offload=True, tiled_layer=True, tiled_mlp=True, tile_tokens=4096)
    for G in (1, 2):
        on, off = (plan_memory(Q8, S, G, G, replace(lv, offload_params=p)) for p in (False, True))
        small = sum(n for n in Q8.param_numels() if n <= PARAM_PERSISTENCE_ELEMS)
        assert 0 < small < 1e6  # Qwen3-8B: the norms' weights
        assert off.term("params_bf16").gpu_bytes == 2 * small
        part = -(-P8 // G)
        assert off.term("params_bf16").host_bytes == G * 2 ** (2 * part - 1).bit_length()
        assert off.term("gathered_layers").gpu_bytes == 2 * Q8.layer_params * 2
        assert off.term("zero3_offload_param_build").host_bytes == G * (
            2 * part + 2 ** (2 * part - 1).bit_length()
        )
        gained = (
            on.term("params_bf16").gpu_bytes
            - off.term("params_bf16").gpu_bytes
            - off.term("gathered_layers").gpu_bytes
            + on.term("gathered_layers").gpu_bytes
        )
        assert on.reserved_bytes - off.reserved_bytes == pytest.approx(gained * 1.06, rel=0.01)
    cfg = RunConfig(model="qwen3-8b", seq_len=S, optimizer_offload=True, offload_params=True)
    zero = build_ds_config(cfg, 1, on_gpu=True)["zero_optimization"]
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert zero["stage3_param_persistence_threshold"] == PARAM_PERSISTENCE_ELEMS
    assert (
        "offload_param"
        not in build_ds_config(RunConfig(model="qwen3-8b"), 1, on_gpu=True)["zero_optimization"]
    )
    assert Levers.from_run_config(cfg).offload_params
    assert RunConfig(
        **replace(lv, offload_params=True).run_config_fields()
    ).optimizer.offload_params
    for bad in (dict(lora_rank=16), dict(optimizer_offload=True, optimizer_offload_ratio=0.5)):
        with pytest.raises(ValueError, match="offload_params with"):
            RunConfig(offload_params=True, **bad)
    with pytest.raises(ValueError, match="offload_params with lora_rank=16"):
        plan_memory(Q8, S, 2, 2, Levers(offload_params=True, lora_rank=16))


def test_the_tables_columns_stay_apart_at_any_size():
    """At 10^12 tokens a GPU figure of 9+ digits ran into the host one
    (`14446883.25295040186.34`)."""
    plan = plan_memory(Q8, 10**12, 8, 8, Levers(offload_layers=36))
    peak = plan.table().splitlines()[-1].split()
    assert peak[2:4] == [f"{plan.gpu_peak_bytes / GB:.2f}", f"{plan.host_peak_bytes / GB:.2f}"]
