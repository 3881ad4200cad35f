"""The memory model: hand-computed values, exact offload accounting, monotonicity, and `choose` decisions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import ds_longctx

from ds_longctx.planner import (GB, GIB, Levers, ModelGeometry, NoFit, checkpoint_bytes_per_token, choose,
                                find_max_len, plan_memory, valid_sp_sizes)

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")
TINY = ModelGeometry.from_name_or_path("qwen3-tiny")
MODELS = Path(ds_longctx.__file__).parent / "models"
P8 = 8_190_735_360  # Qwen3-8B: 36 x 192,946,432 per layer + 2 x 151,936 x 4096 + 4096


def test_geometry_reads_the_shipped_json():
    assert (Q8.hidden, Q8.intermediate, Q8.layers, Q8.heads, Q8.kv_heads, Q8.head_dim, Q8.vocab) == \
        (4096, 12288, 36, 32, 8, 128, 151936)
    assert not Q8.tied_embeddings and Q8.max_position_embeddings == 40960
    assert ModelGeometry.from_name_or_path("Qwen/Qwen3-8B") == Q8
    assert ModelGeometry.from_name_or_path("qwen3-0.6b").tied_embeddings


def test_geometry_from_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text((MODELS / "qwen3-tiny.json").read_text())
    assert replace(ModelGeometry.from_name_or_path(tmp_path), name="qwen3-tiny") == TINY


def test_unknown_model_names_the_shipped_ones():
    with pytest.raises(ValueError, match="qwen3-8b"):
        ModelGeometry.from_name_or_path("no-such-model")


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
    assert plan_memory(Q8, 1 << 20, 8, 8).term("checkpoints").gpu_bytes == (1 << 20) * 288 * 1024 // 8


def test_zero3_bytes_for_8b_over_8_gpus():
    plan = plan_memory(Q8, 4096, 8, 8)
    got = {n: plan.term(n).gpu_bytes for n in ("params_bf16", "grads_bf16", "master_fp32", "adam_m_v_fp32")}
    assert got == {"params_bf16": 2_047_683_840, "grads_bf16": 2_047_683_840, "master_fp32": 4_095_367_680,
                   "adam_m_v_fp32": 8_190_735_360}
    # 2 bf16 params + 2 bf16 grads (DeepSpeed's grad_accum_dtype defaults to the model dtype) + 4 master + 8 Adam
    assert sum(got.values()) == 16 * P8 // 8
    assert plan.term("reduce_bucket").gpu_bytes == 100_000_000  # 5e7 bf16 elements
    assert plan.term("gathered_layers").gpu_bytes == 2 * 192_946_432 * 2


def test_host_peak_is_the_larger_of_build_and_step():
    # ZeRO-3 init copies each rank's bf16 partition through a CPU buffer: 2·P bytes over the node, plus
    # 1.5 GiB per rank; the 8B on 2 GPUs without offload peaks there, with 36 layers offloaded in the step
    G = 2
    build = G * 1.5 * GIB + 2 * (-(-P8 // G)) * G
    base = plan_memory(Q8, 65_536, G, G)
    assert base.host_step_bytes == G * 2.25 * GIB + G * 65_536 * 16
    assert base.host_peak_bytes == pytest.approx(build, abs=2)
    off = plan_memory(Q8, 262_144, G, G, Levers(offload_layers=36))
    # 131,072 tokens per rank x 4096 x 2 bytes = 1 GiB per layer checkpoint (a power of two)
    assert off.host_peak_bytes == off.host_step_bytes == G * 36 * GIB + G * 2.25 * GIB + G * 262_144 * 16


def test_pinned_checkpoints_round_up_to_a_power_of_two():
    # 196,608 tokens over 2 ranks: 98,304 x 4096 x 2 = 768 MiB per checkpoint, pinned in 1 GiB blocks
    off = plan_memory(Q8, 196_608, 2, 2, Levers(offload_layers=36))
    assert off.term("checkpoints").host_bytes == 2 * 36 * GIB


def test_chunked_vs_plain_loss_terms():
    T, V, H = 65_536, Q8.vocab, Q8.hidden
    chunked = plan_memory(Q8, 2 * T, 2, 2, Levers(chunked_loss=True, chunk_rows=4096))
    plain = plan_memory(Q8, 2 * T, 2, 2, Levers(chunked_loss=False))
    assert chunked.term("loss_chunk_logits_fp32").gpu_bytes == 4096 * V * 4
    assert chunked.term("loss_chunk_bf16").gpu_bytes == 4096 * V * 2
    assert chunked.term("lm_head_grad_accum_fp32").gpu_bytes == V * H * 4
    # log_softmax's backward: saved fp32 output + fp32 grad in + fp32 grad out = 12 bytes per logit, and the
    # bf16 logits' freed block (2 bytes per logit) stays reserved
    assert plain.term("logits").gpu_bytes == T * V * 12
    assert plain.term("logits_bf16_block").gpu_bytes == T * V * 2
    assert not any(t.name == "logits" for t in chunked.terms)
    loss = lambda p: dict(p.phase_bytes)["loss"]
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
    assert on.gpu_peak_bytes - off.gpu_peak_bytes == 14 * P8 // G  # bf16 grads 2 + master 4 + Adam 8
    # on the host: bf16 grads 2 + master 4 + Adam 8 + the fp32 grads CPU Adam steps on 4
    assert off.host_step_bytes - on.host_step_bytes == 18 * P8
    assert off.term("params_bf16").gpu_bytes == on.term("params_bf16").gpu_bytes  # bf16 weights stay


def test_every_term_is_named_in_the_table():
    plan = plan_memory(Q8, 1 << 20, 8, 8, Levers(offload_layers=10, tiled_mlp=False))
    text = plan.table()
    for t in plan.terms:
        assert t.name in text and t.formula in text
    assert f"{plan.gpu_peak_bytes / GB:.2f}" in text and plan.peak_phase in text
    # peak = all + peak phase + slack + context
    live = sum(t.gpu_bytes for t in plan.terms if t.phases == ("all",))
    assert plan.gpu_peak_bytes == live + dict(plan.phase_bytes)[plan.peak_phase]


@pytest.mark.parametrize("levers", [Levers(), Levers(chunked_loss=False, tiled_mlp=False),
                                    Levers(offload_layers=36, optimizer_offload=True, tile_tokens=2048)])
def test_monotonic_in_seq_len(levers):
    lengths = [1, 1000, 4096, 30_000, 65_536, 131_072, 262_144, 1 << 20, 3 << 20]
    plans = [plan_memory(Q8, n, 8, 8, levers) for n in lengths]
    for a, b in zip(plans, plans[1:]):
        assert a.gpu_peak_bytes <= b.gpu_peak_bytes and a.host_peak_bytes <= b.host_peak_bytes


def test_seq_len_is_padded_to_sp():
    plan = plan_memory(Q8, 1_000_001, 8, 8)
    assert plan.seq_len == 1_000_008 and plan.local_tokens == 125_001


def test_sp_validity():
    assert valid_sp_sizes(Q8, 8) == [1, 2, 4, 8]
    assert valid_sp_sizes(Q8, 16) == [1, 2, 4, 8, 16]  # 16 > 8 KV heads: each KV head replicated twice
    assert valid_sp_sizes(TINY, 8) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match=r"sp_size=3 .* try one of \[1\]"):
        plan_memory(Q8, 4096, 3, 3)
    with pytest.raises(ValueError, match="offload_layers=37"):
        plan_memory(Q8, 4096, 1, 1, Levers(offload_layers=37))


def test_sp_beyond_kv_heads_replicates_kv():
    plan = plan_memory(Q8, 1 << 20, 16, 16)  # 32 q heads / 16 = 2, KV 8 / 16 -> 1 replicated head
    assert plan.term("qkv_a2a").gpu_bytes == (1 << 20) * (2 + 2 * 1) * 128 * 2


def test_choose_8b_1m_on_8x80_fits_with_sp8():
    c = choose(Q8, 1 << 20, 8, 80, 560)  # host as on the 8-GPU machines here (560 GiB)
    budget = 0.9 * 80 * GB
    assert c.sp_size == 8 and c.plan.gpu_peak_bytes <= budget and c.plan.host_peak_bytes <= 0.9 * 560 * GB
    assert not c.levers.optimizer_offload and not c.levers.tiled_mlp and c.levers.chunked_loss
    k = c.levers.offload_layers
    assert 0 < k < Q8.layers  # only the layers that must leave the GPU
    assert plan_memory(Q8, 1 << 20, 8, 8, replace(c.levers, offload_layers=k - 1)).gpu_peak_bytes > budget
    for sp in (1, 2, 4):  # no smaller sp fits at all, whatever is offloaded
        lv = Levers(chunk_rows=256, tiled_mlp=True, tile_tokens=4096, offload_layers=Q8.layers, optimizer_offload=True)
        assert not plan_memory(Q8, 1 << 20, 8, sp, lv).fits(budget, 0.9 * 560 * GB)
    assert any("YaRN" in n for n in c.notes)


def test_8b_1m_on_8x80_by_hand():
    """At 1,048,576 tokens over sp=8 one checkpointed layer input is T·H·2 = 131,072·4096·2 bytes = 1 GiB."""
    c = choose(Q8, 1 << 20, 8, 80, 560)
    assert c.levers == Levers(chunked_loss=True, chunk_rows=4096, tiled_mlp=False, tile_tokens=None,
                              offload_layers=32, optimizer_offload=False)
    ck = c.plan.term("checkpoints")
    assert ck.gpu_bytes == (36 - 32) * GIB and ck.host_bytes == 8 * 32 * GIB  # 256 GiB pinned on the node
    assert c.plan.term("offload_staging").gpu_bytes == 2 * GIB
    assert c.plan.term("mlp_saved").gpu_bytes == 4 * 131_072 * 12_288 * 2  # 12.9 GB: untiled gate/up/act/act·up
    assert c.plan.peak_phase == "mlp_bwd"


def test_default_sp_is_the_largest_valid():
    for gpus in (1, 2, 4, 8):
        assert choose(Q8, 65_536, gpus, 141, 560).sp_size == gpus  # every power of two up to 8 divides 32 and 8
    assert choose(TINY, 64, 8, 24, 560).sp_size == 8


def test_tiled_mlp_only_when_needed():
    easy = choose(Q8, 1 << 20, 8, 141, 560)
    assert not easy.levers.tiled_mlp and easy.levers.tile_tokens is None and easy.levers.offload_layers == 0
    n = find_max_len(Q8, 2, 141, 256)
    hard = choose(Q8, n, 2, 141, 256)
    assert hard.levers.tiled_mlp and hard.levers.tile_tokens == 4096 and hard.levers.optimizer_offload
    untiled = replace(hard.levers, tiled_mlp=False, tile_tokens=None)
    for k in range(Q8.layers + 1):  # without the tiles nothing fits at that length, whatever is offloaded
        assert not plan_memory(Q8, n, 2, 2, replace(untiled, offload_layers=k)).fits(0.9 * 141 * GB, 0.9 * 256 * GB)
    assert any(n.startswith("tiled_mlp=True: needed") for n in hard.notes)


def test_tiled_terms_replace_the_untiled_mlp():
    T, I, H = 131_072, Q8.intermediate, Q8.hidden
    tiled = plan_memory(Q8, 1 << 20, 8, 8, Levers(tiled_mlp=True, tile_tokens=4096))
    assert tiled.term("mlp_tile").gpu_bytes == 6 * 4096 * I * 2
    assert tiled.term("mlp_tile_wgrad_fp32").gpu_bytes == 3 * H * I * 4
    assert not any(t.name == "mlp_saved" for t in tiled.terms)
    plain = plan_memory(Q8, 1 << 20, 8, 8, Levers())
    assert plain.term("mlp_grads").gpu_bytes == 2 * T * I * 2 and not any(t.name == "mlp_tile" for t in plain.terms)


def test_choose_8b_1m_on_1x24_does_not_fit():
    with pytest.raises(NoFit) as info:
        choose(Q8, 1 << 20, 1, 24, 128)
    e = info.value
    assert e.max_len == 0 and "Longest length that fits: 0" in str(e)  # 16 GB of bf16 weights + the loss head
    assert e.best.gpu_peak_bytes > 24 * GB


def test_choose_8b_1m_on_1x80_reports_the_longest_length():
    with pytest.raises(NoFit) as info:
        choose(Q8, 1 << 20, 1, 80, 256)
    e = info.value
    assert 65_536 < e.max_len < 1 << 20 and f"{e.max_len:,}" in str(e) and "GPUs" in str(e)
    assert choose(Q8, e.max_len, 1, 80, 256).levers.optimizer_offload  # 8B's Adam state alone is 131 GB


@pytest.mark.parametrize("model,gpus,gpu_gb,host_gb", [("qwen3-8b", 2, 141, 256), ("qwen3-0.6b", 1, 24, 64),
                                                       ("qwen3-8b", 8, 80, 560)])
def test_find_max_len_agrees_with_choose(model, gpus, gpu_gb, host_gb):
    n = find_max_len(model, gpus, gpu_gb, host_gb)
    assert n > 0 and n % 1024 == 0
    choose(model, n, gpus, gpu_gb, host_gb)
    with pytest.raises(NoFit):
        choose(model, n + 1024, gpus, gpu_gb, host_gb)


def test_choose_prefers_no_offload_when_it_fits():
    c = choose(Q8, 8192, 8, 141, 1000)
    assert c.sp_size == 8 and c.levers.offload_layers == 0 and not c.levers.optimizer_offload
    assert not c.levers.tiled_mlp


def test_pinned_sp_size():
    free = choose(Q8, 131_072, 2, 141, 256)  # largest sp: one sequence over both GPUs, nothing needs to move
    pinned = choose(Q8, 131_072, 2, 141, 256, sp_size=1)  # dp=2: each GPU holds a whole 131k sequence
    assert free.sp_size == 2 and free.levers.offload_layers == 0 and not free.levers.optimizer_offload
    assert pinned.sp_size == 1 and pinned.levers.offload_layers > 0
    assert pinned.notes[0] == "sp_size=1: pinned"
    assert find_max_len(Q8, 2, 141, 256, sp_size=1) <= find_max_len(Q8, 2, 141, 256)
    with pytest.raises(ValueError, match="try one of"):
        choose(Q8, 4096, 8, 80, 560, sp_size=3)


def test_reduce_bucket_matches_the_generated_deepspeed_config():
    from ds_longctx.config import RunConfig
    from ds_longctx.ds_config import build_ds_config
    from ds_longctx.planner import REDUCE_BUCKET_ELEMS

    ds = build_ds_config(RunConfig(model="qwen3-tiny", seq_len=256), 2, on_gpu=False)
    assert ds["zero_optimization"]["reduce_bucket_size"] == REDUCE_BUCKET_ELEMS
