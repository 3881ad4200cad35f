"""plan/preference_terms.py and the objective's lines: dpo's shared-prompt row (attention work, the
gathered K/V, the reference pass) and grpo's per-token log-probs against numbers worked out by hand
here; `plan --objective`'s refusals; the committed 1M DPO config's step against the SFT config's
(issue 57: at most 1.25x). Torch-free."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ds_longctx.levers.placement import Place, PlacementPlan
from ds_longctx.plan import write
from ds_longctx.plan.committed import COMMITTED
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.options import parser
from ds_longctx.plan.plan_args import check_args
from ds_longctx.plan.planner import FRAGMENTATION, plan_memory
from ds_longctx.plan.preference_terms import attention_span
from ds_longctx.plan.step_time import GPU_RATES, predict_step, reference_seconds

S, C = 1 << 20, 4096
P = S - 2 * C  # 1,040,384
DPO = Levers(objective="dpo", completion_len=C)


def test_the_shared_rows_attention_is_the_sft_rows_less_the_two_completions_cross_pairs():
    """(P+C)^2 + 2PR + R^2 = S^2 - 2CR, by hand at S=1000, C=R=100; the step's attention scales by
    it exactly."""
    lv = Levers(objective="dpo", completion_len=100)
    assert attention_span(1000, lv) == 900**2 + 2 * 800 * 100 + 100**2 == 1000**2 - 2 * 100 * 100
    assert attention_span(1000, Levers()) == attention_span(1000, Levers(objective="grpo")) == 10**6
    g = ModelGeometry.from_name_or_path("qwen3-8b")
    keep = Levers(placement=PlacementPlan((Place.KEEP,) * g.layers))
    sft, dpo = (
        predict_step(plan_memory(g, S, 8, 8, lv), 80, "h100")
        for lv in (keep, replace(keep, objective="dpo", completion_len=C))
    )
    assert dpo.attention / sft.attention == pytest.approx(1 - 2 * C * C / S**2, rel=1e-12)
    assert (dpo.tokenwise, dpo.loss) == (sft.tokenwise, sft.loss)  # S tokens once


def test_dpo_memory_terms_are_the_prompts_second_keys_and_values_by_hand():
    """Qwen3-8B at 1M on 8 GPUs (sp 8: 4 query heads and 1 KV head per rank, d 128): K and V of the
    1,040,384-token prompt again (2·P·1·128·2 bytes), their grads (+ FA4's fp32 dK/dV: 2·P·128·4),
    the int64 gather index over S + P; the GPU peak grows by those live in the peak phase, times the
    fragmentation."""
    g = ModelGeometry.from_name_or_path("qwen3-8b")
    sft, dpo = (plan_memory(g, S, 8, 8, lv) for lv in (Levers(), DPO))
    assert dpo.term("shared_prompt_kv").gpu_bytes == 2 * 1_040_384 * 128 * 2 == 532_676_608
    assert dpo.term("shared_prompt_kv_grad").gpu_bytes == 532_676_608 + 2 * 1_040_384 * 128 * 4
    assert dpo.term("shared_prompt_index").gpu_bytes == (S + P) * 8
    assert dpo.term("reference_logps").gpu_bytes == 8
    added = {t.name for t in dpo.terms} - {t.name for t in sft.terms}
    assert added == {
        "shared_prompt_kv",
        "shared_prompt_kv_grad",
        "shared_prompt_index",
        "reference_logps",
    }
    assert (
        sft.peak_phase == dpo.peak_phase == "mlp_bwd"
    )  # the MLP's backward: the grads not yet made
    extra = 532_676_608 + (S + P) * 8 + 8
    attn = {p: dict(x.phase_bytes)["attn_bwd"] for p, x in (("sft", sft), ("dpo", dpo))}
    assert attn["dpo"] - attn["sft"] == 2 * 532_676_608 + 2 * 1_040_384 * 128 * 4
    assert dpo.gpu_peak_bytes - sft.gpu_peak_bytes == pytest.approx(FRAGMENTATION * extra, abs=2)


def test_the_reference_pass_is_one_forward_by_hand_and_grpo_adds_only_its_log_probs():
    """At one GPU (no exchange): L·(2·span·h·d / fwd + T·(proj+mlp) / tok) + 2·T·H·V / tok at h100's
    rates."""
    g = ModelGeometry.from_name_or_path("qwen3-8b")
    s, lv = 65536, Levers(objective="dpo", completion_len=1024)
    plan = plan_memory(g, s, 1, 1, lv)
    proj = 2 * 2 * g.hidden * (g.heads + g.kv_heads) * g.head_dim
    mlp = 2 * 3 * g.hidden * g.intermediate
    span = (s - 1024) ** 2 + 2 * (s - 2048) * 1024 + 1024**2
    fwd, tok = GPU_RATES["h100"].attention[0], GPU_RATES["h100"].dense_tokenwise
    want = g.layers * (2 * span * g.heads * g.head_dim / fwd + s * (proj + mlp) / tok)
    want += 2 * s * g.hidden * g.vocab / tok
    assert reference_seconds(plan, 80, "h100") == pytest.approx(want, rel=1e-12)
    sft, grpo = (plan_memory(g, s, 1, 1, x) for x in (Levers(), Levers(objective="grpo")))
    assert grpo.term("rollout_logps").gpu_bytes == 2 * s * 4
    assert predict_step(grpo, 80, "h100").seconds == predict_step(sft, 80, "h100").seconds


def test_the_committed_1m_dpo_config_steps_within_1_25x_of_the_sft_config():
    """Both committed 8 x 80 GB plans, as `plan` makes them (the DPO one's placement fits its extra
    K/V)."""
    seconds = {}
    for name in ("qwen3-8b_1m_8x80gb", "qwen3-8b-dpo_1m_8x80gb"):
        a = parser().parse_args(COMMITTED[name].split())
        geom, host = check_args(a)
        plan = write.plan_choice(a, geom, host, a.seq_len).plan
        assert plan.gpu_peak_bytes <= 0.9 * 80e9
        seconds[name] = predict_step(plan, 80, "h100").seconds
    ratio = seconds["qwen3-8b-dpo_1m_8x80gb"] / seconds["qwen3-8b_1m_8x80gb"]
    assert 1 <= ratio <= 1.25, seconds


@pytest.mark.parametrize(
    "args,says",
    [
        (["--completion_len", "100"], "applies to --objective dpo"),
        (["--objective", "dpo", "--completion_len", "600000"], "--completion_len 600000"),
        (["--objective", "dpo", "--model", "qwen3-30b-a3b"], "mixture of experts"),
        (["--objective", "dpo", "--model", "qwen3.5-4b"], "linear-attention layers"),
    ],
    ids=["completion_without_dpo", "no_prompt_left", "moe", "hybrid"],
)
def test_plan_refuses_what_a_dpo_run_would_before_planning(args, says, capsys):
    base = ["--model", "qwen3-8b", "--seq_len", str(S), "--gpus", "8", "--gpu_mem_gb", "80"]
    if "--model" in args:
        at = args.index("--model")
        base[1], args = args[at + 1], args[:at] + args[at + 2 :]
    assert write.main(base + args) == 2
    assert says in capsys.readouterr().err
