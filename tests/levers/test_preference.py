"""DPO on per-sequence log-probs (levers/preference.py) against TRL's own DPOTrainer with
precompute_ref_log_probs, driven end to end on the tiny model (its loss and every gradient), at SP=1
here and SP=2 over gloo, packed, with a reference model different from the policy (fp32, rel
1e-5)."""

import json

import pytest
import torch

from ds_longctx.data.preference import pack_pairs, pack_shared_pairs, read_pairs
from ds_longctx.parallel.parallel_state import ParallelState
from tests.corpus import make_tokenizer
from tests.distributed.dpo_worker import dpo_side
from tests.helpers import rel_err, tiny_model, torchrun

TOL = 1e-5
PAIRS = [
    {"prompt": "w1 w2 w3 w4 w5", "chosen": " w6 w7 w8", "rejected": " w9 w10"},
    {"prompt": "w11 w12 w3", "chosen": " w13 w14 w15 w16 w2", "rejected": " w17"},
    {"prompt": "w20", "chosen": " w21 w22 w26", "rejected": " w23 w24 w25"},
]
CASES = [(0.1, "sigmoid"), (0.5, "ipo"), (0.2, "hinge")]
SP2_CASES = CASES[:2]  # the worker's (each case costs the 2-process run a step)


def trl_reference(tok, chosen_rows: list, beta: float, loss_type: str) -> dict:
    """TRL's DPOTrainer on the pairs, one batch: its loss, gradients, input rows and stored
    reference log-probs in the pairs' order (`chosen_rows`: each pair's chosen ids; TRL's sampler
    shuffles)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    policy, ref = tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager")
    args = DPOConfig(
        output_dir="/tmp/unused",
        per_device_train_batch_size=len(PAIRS),
        precompute_ref_log_probs=True,
        report_to=[],
        use_cpu=True,
        bf16=False,
        beta=beta,
        loss_type=[loss_type],
        save_strategy="no",
        dataloader_num_workers=0,
        max_length=None,
    )
    trainer = DPOTrainer(
        model=policy,
        ref_model=ref,
        args=args,
        train_dataset=Dataset.from_list(PAIRS),
        processing_class=tok,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    rows = [ids[m.bool()].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    at = [rows.index(c) for c in chosen_rows]  # TRL's batch: every chosen, then every rejected
    ref = torch.stack([batch["ref_chosen_logps"], batch["ref_rejected_logps"]], dim=1)[at]
    rows = [rows[i] for i in at] + [rows[len(at) + i] for i in at]
    metrics = {
        k: trainer._metrics["train"][k][-1]
        for k in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
    }
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad for n, p in policy.named_parameters()},
        "ref": ref,
        "rows": rows,
        "metrics": metrics,
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("dpo")
    tok = AutoTokenizer.from_pretrained(str(make_tokenizer(d / "tok", n_words=30)))
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    pairs = read_pairs([str(d / "pairs.jsonl")], tok, tok.eos_token_id)
    ids, pos, labels, seq = pack_pairs(pairs)
    refs = {case: trl_reference(tok, [c[0] for c, _ in pairs], *case) for case in CASES}
    shared = dict(
        zip(("input_ids", "position_ids", "labels", "seq", "branch"), pack_shared_pairs(pairs))
    )
    return (
        d,
        pairs,
        {"input_ids": ids, "position_ids": pos, "labels": labels, "seq": seq},
        refs,
        shared,
    )


def check(loss, ref_logps, grads, want):
    assert rel_err(ref_logps, want["ref"]) <= TOL, (ref_logps, want["ref"])
    assert rel_err(loss, want["loss"]) <= TOL, (float(loss), float(want["loss"]))
    worst = max((rel_err(grads[n], g), n) for n, g in want["grads"].items())
    assert worst[0] <= TOL, f"grad of {worst[1]} off by rel {worst[0]:.2e}"


def test_pairs_tokenize_as_trl_does(setup):
    _, pairs, _, refs, _ = setup
    want = refs[CASES[0]]["rows"]
    got = [c[0] for c, _ in pairs] + [r[0] for _, r in pairs]
    assert got == want


@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
def test_dpo_sp1_packed_matches_trl(setup, case):
    _, _, row, refs, _ = setup
    loss, ref, grads = dpo_side(
        tiny_model(seed=0, attn="eager"),
        tiny_model(seed=1, attn="eager"),
        row,
        ParallelState.single(),
        *case,
    )
    check(loss, ref, grads, refs[case])


def grpo_task(d, tok) -> tuple:
    """The GRPO part of the SP=2 worker's task (tests/levers/test_policy_loss.py's rollouts) and its
    references."""
    from ds_longctx.data.rl_rows import RolloutRows, read_rollouts
    from tests.levers import test_policy_loss as grpo

    seqs = read_rollouts(
        [grpo.write(d / "r.jsonl", grpo.ROLLOUTS)], tok, tok.eos_token_id, 64, "group"
    )
    task = {
        "grpo": grpo.grpo_row(RolloutRows(seqs, 64, 0, False, 0, grpo.MAX_LEN)),
        "rollouts": seqs,
        "grpo_cases": grpo.CASES[:2],
        "grpo_engine": grpo.CASES[0],
    }
    refs = {
        case: grpo.trl_grpo(
            seqs, tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager"), *case
        )
        for case in grpo.CASES[:2]
    }
    return task, refs


@pytest.mark.slow
def test_dpo_and_grpo_sp2_packed_match_trl_and_the_hand_reference(setup):
    """At SP=2: DPO against TRL's DPOTrainer (its ref_model, saved as a directory for the engine's
    --ref_model), GRPO dapo (with the KL to that model) and grpo against
    tests/levers/test_policy_loss.py's reference, on plain HF models and through the engine
    (ZeRO-3)."""
    from transformers import AutoTokenizer

    d, pairs, row, refs, shared = setup
    tok = AutoTokenizer.from_pretrained(str(d / "tok"))
    tiny_model(seed=1).save_pretrained(d / "ref")  # TRL's ref_model above, as a HF directory
    tok.save_pretrained(d / "ref")
    grpo, grpo_refs = grpo_task(d, tok)
    task = {
        "row": row,
        "cases": SP2_CASES,
        "shared": shared,
        "pairs": pairs,
        "ref_dir": str(d / "ref"),
    }
    torch.save({**task, **grpo}, d / "row.pt")
    torchrun(
        2,
        ["tests/distributed/dpo_worker.py", "--row", str(d / "row.pt"), "--out", str(d / "got.pt")],
    )
    got = torch.load(d / "got.pt", weights_only=False)
    for case in SP2_CASES:
        check(got[case]["loss"], got[case]["ref"], got[case]["grads"], refs[case])
    one = got["shared"]  # the shared-prompt row at SP=2 (35 tokens: one of SP padding)
    check(one["loss"], one["ref"], one["grads"], refs[CASES[0]])
    engine, want = got["engine"], refs[CASES[0]]  # ZeRO-3, objective dpo, --ref_model DIR
    check(engine["loss"], want["ref"], engine["grads"], want)
    for k, v in want["metrics"].items():
        assert abs(engine["metrics"][k] - v) <= TOL * max(1.0, abs(v)), (k, engine["metrics"][k], v)
    for case in grpo["grpo_cases"]:
        want = {"loss": grpo_refs[case][0], "grads": grpo_refs[case][1], "ref": torch.zeros(1)}
        check(got[("grpo", *case)]["loss"], torch.zeros(1), got[("grpo", *case)]["grads"], want)
    engine = got["grpo_engine"]  # ZeRO-3, objective grpo dapo, beta 0.04 to --ref_model DIR
    want = grpo_refs[grpo["grpo_engine"]]
    check(
        engine["loss"],
        torch.zeros(1),
        engine["grads"],
        {"loss": want[0], "grads": want[1], "ref": torch.zeros(1)},
    )
    assert engine["metrics"]["kl"] > 0 and engine["metrics"]["clip_ratio/region_mean"] == 2 / 16


def test_shared_prompt_row_equals_the_two_pass_row(setup):
    """Each pair's prompt once, then both completions: the loss, the reference log-probs and every
    gradient of the two-pass packed row (each completion after its own copy of the prompt; TRL's
    numbers above)."""
    _, pairs, row, refs, shared = setup
    # prompts of 5, 3 and 1 tokens: each but its last token written once (the 1-token one: two plain
    # documents)
    assert len(shared["input_ids"]) == len(row["input_ids"]) - (4 + 2 + 0)
    assert shared["branch"].unique().tolist() == [0, 1, 2]
    for case in SP2_CASES:
        two = dpo_side(
            tiny_model(seed=0, attn="eager"),
            tiny_model(seed=1, attn="eager"),
            row,
            ParallelState.single(),
            *case,
        )
        one = dpo_side(
            tiny_model(seed=0, attn="eager"),
            tiny_model(seed=1, attn="eager"),
            shared,
            ParallelState.single(),
            *case,
        )
        check(one[0], one[1], one[2], {"loss": two[0], "ref": two[1], "grads": two[2]})
        check(one[0], one[1], one[2], refs[case])
