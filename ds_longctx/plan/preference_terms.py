"""The training objective's planner terms (`Levers.objective`); sft adds none.

dpo: a row of S tokens is one shared prompt P, then chosen C and rejected R (C = R =
`completion_len`), the prompt once (parallel/shared_prefix.py): token-wise work over S once;
attention's queries once, its keys and values over [P, C, P, R]; the reference log-probs computed by
one forward pass over the data before the first step. grpo: as sft, plus the per-token old and
reference log-probs of the rank's tokens.

    P, C, R = dpo_row(seq_len, lv)        # ValueError where the completions leave no prompt
    attention_span(seq_len, lv)           # 2 x causal (query, key) pairs per head (step_time.py)
    objective_memory_terms(terms, z, lv)  # the memory terms (planner.plan_memory)
"""

from __future__ import annotations

from ds_longctx.plan.levers import Levers
from ds_longctx.plan.memory_terms import ALL, LAYER, Sizes, Terms

OBJECTIVES = ("sft", "dpo", "grpo")


def dpo_row(seq_len: int, lv: Levers) -> tuple:
    """(P, C, R) tokens of a dpo row of `seq_len`: two completions of `completion_len`, the prompt
    the rest."""
    c = lv.completion_len
    if c < 1 or seq_len - 2 * c < 1:
        raise ValueError(
            f"--completion_len {c}: a dpo row of {seq_len:,} tokens holds a prompt and two "
            f"completions of 1 to {(seq_len - 1) // 2:,} tokens each; give one in that range"
        )
    return seq_len - 2 * c, c, c


def attention_span(seq_len: int, lv: Levers) -> int:
    """Twice the causal (query, key) pairs per head of a row: S^2; dpo's shared row (P+C)^2 + 2·P·R
    + R^2 (queries once: P+C over themselves, R over P and itself), which is S^2 - 2·C·R."""
    if lv.objective != "dpo":
        return seq_len**2
    p, c, r = dpo_row(seq_len, lv)
    return (p + c) ** 2 + 2 * p * r + r**2


def objective_memory_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """dpo: the prompt's keys and values gathered a second time at the top layer's attention, their
    grads and the gather index, and a row's reference log-probs; grpo: the rank's per-token
    log-probs."""
    d = z.g.head_dim
    if lv.objective == "grpo":
        t.add("rollout_logps", 2 * z.T * 4, 0, "2·T·4 (old and reference log-probs per token)", ALL)
    if lv.objective != "dpo":
        return
    p = dpo_row(z.S, lv)[0]
    kv = 2 * p * z.kv_l * d * 2
    t.add("shared_prompt_kv", kv, 0, f"2·P·kv'·d·2 (P={p:,}: its K/V gathered twice)", LAYER)
    # the kernel's fp32 dK / dV accumulators grow with the keys too, where query heads share a KV
    # head
    accum = 2 * p * z.kv_l * d * 4 if z.hq_l > z.kv_l else 0
    t.add(
        "shared_prompt_kv_grad",
        kv + accum,
        0,
        "2·P·kv'·d·2 (+ 2·P·kv'·d·4 if hq/sp > kv')",
        ("attn_bwd",),
    )
    t.add("shared_prompt_index", (z.S + p) * 8, 0, "(S+P)·8 (the K/V gather index)", ALL)
    t.add("reference_logps", 2 * 4, 0, "2·4 (a row's pair: chosen, rejected)", ALL)
