"""GRPO (levers/policy_loss.py) on a packed row of rollouts against a reference written here: each
rollout alone through the plain HF model, padded to [B, T], and TRL's GRPOTrainer._compute_loss
formulas (clipped ratio to given old log-probs, k3 KL to another model, loss_type grpo / dapo /
dr_grpo): loss and every gradient at SP=1 here and at SP=2 in tests/levers/test_preference.py's
2-process run (fp32, rel 1e-5). Rows with bad scores: refused by file and line."""

import json

import pytest
import torch

from ds_longctx.data.rl_rows import RolloutRows, read_rollouts
from ds_longctx.data.sources import DataError
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.units import IGNORE_INDEX
from tests.corpus import make_tokenizer
from tests.distributed.dpo_worker import policy_side
from tests.helpers import rel_err, tiny_model

TOL = 1e-5
EPS, EPS_HIGH, MAX_LEN = 0.2, 0.28, 9
# two groups of two, one ready advantage; old log-probs near the tiny model's (~ -6.2) on two
ROLLOUTS = [
    {"prompt": "w1 w2 w3 w4", "completion": " w5 w6 w7", "reward": 1.0, "group": "a"},
    {
        "prompt": "w1 w2 w3 w4",
        "completion": " w8",
        "reward": 0.0,
        "group": "a",
        "old_logps": [-6.0, -6.5],
    },
    {"prompt": "w9", "completion": " w10 w11 w12 w13", "reward": 0.5, "group": 7},
    {
        "prompt": "w9",
        "completion": " w14 w2",
        "reward": 2.0,
        "group": 7,
        "old_logps": [-5.9, -6.6, -6.1],
    },
    {"prompt": "w20 w21", "completion": " w22", "advantage": -0.7},
]
CASES = [("dapo", 0.04), ("grpo", 0.0), ("dr_grpo", 0.0)]  # (loss_type, beta)


def trl_grpo(rollouts, policy, ref_model, loss_type: str, beta: float):
    """TRL's GRPO loss (importance_sampling_level token, one process, no accumulation) on each
    rollout run alone; returns (loss, gradients)."""
    T = max(sum(v != IGNORE_INDEX for v in r.labels) for r in rollouts)
    logps, ref, old, mask = (torch.zeros(len(rollouts), T) for _ in range(4))
    logps = logps.tolist()
    for b, r in enumerate(rollouts):
        ids, target = torch.tensor([r.ids]), torch.tensor(r.labels[1:])
        keep = target != IGNORE_INDEX
        per = []
        for m in (policy, ref_model):
            with torch.set_grad_enabled(m is policy):
                lp = torch.log_softmax(m(input_ids=ids).logits[0, :-1].float(), -1)
            per.append(lp[keep].gather(1, target[keep, None])[:, 0])
        n = len(per[0])
        logps[b] = torch.cat([per[0], per[0].new_zeros(T - n)])
        ref[b, :n], mask[b, :n] = per[1].detach(), 1.0
        old[b, :n] = torch.tensor(r.old) if r.old is not None else per[0].detach()
    logps = torch.stack(logps)
    adv = torch.tensor([r.advantage for r in rollouts]).unsqueeze(1)
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - EPS, 1 + EPS_HIGH)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * (torch.exp(ref - logps) - (ref - logps) - 1)
    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dapo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_LEN)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in policy.named_parameters()}


def grpo_row(rows: RolloutRows) -> dict:
    """Row 0 as the worker takes it."""
    b = rows.row(0)
    return {
        "input_ids": b.input_ids[0],
        "position_ids": b.position_ids[0],
        "labels": b.labels[0],
        "seq": b.seq[0],
        "token_seq": b.token_seq,
        "advantages": b.advantages,
        "old": b.old,
        "eps": EPS,
        "eps_high": EPS_HIGH,
        "max_len": MAX_LEN,
    }


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("grpo")
    tok = AutoTokenizer.from_pretrained(str(make_tokenizer(d / "tok", n_words=30)))
    seqs = read_rollouts([write(d / "r.jsonl", ROLLOUTS)], tok, tok.eos_token_id, 64, "group")
    rows = RolloutRows(seqs, 64, 0, False, 0)
    assert rows.n_rows == 1
    refs = {
        case: trl_grpo(
            seqs, tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager"), *case
        )
        for case in CASES
    }
    return d, tok, seqs, grpo_row(rows), refs


def check(loss, grads, want):
    assert rel_err(loss, want[0]) <= TOL, (float(loss), float(want[0]))
    worst = max((rel_err(grads[n], g), n) for n, g in want[1].items())
    assert worst[0] <= TOL, f"grad of {worst[1]} off by rel {worst[0]:.2e}"


def test_advantages_are_trls_group_normalized_rewards(setup):
    _, _, seqs, row, _ = setup
    a = torch.tensor([1.0, 0.0])
    want = (a - a.mean()) / (a.std() + 1e-4)
    assert [s.advantage for s in seqs[:2]] == pytest.approx(want.tolist())
    assert seqs[4].advantage == -0.7
    assert len(row["token_seq"]) == (3 + 1) + (1 + 1) + (4 + 1) + (2 + 1) + (1 + 1)  # and EOS each
    assert row["old"][4:6].tolist() == [-6.0, -6.5] and row["old"][:4].isnan().all()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_grpo_sp1_packed_matches_the_trl_formula(setup, case):
    *_, row, refs = setup
    loss, grads, clipped = policy_side(
        tiny_model(seed=0, attn="eager"),
        tiny_model(seed=1, attn="eager"),
        row,
        ParallelState.single(),
        *case,
    )
    check(loss, grads, refs[case])
    assert clipped == (
        1,
        1,
    )  # the given old log-probs clip one token each way (ratios 0.79 at A < 0, 1.49 at A > 0)


BAD = [
    (
        {"prompt": "w1", "completion": " w2", "advantage": "NaN"},
        "advantage='NaN' is not a finite number",
    ),
    (
        '{"prompt": "w1", "completion": " w2", "advantage": NaN}',
        "advantage=nan is not a finite number",
    ),
    (
        {"prompt": "w1", "completion": " w2", "advantage": 1.0, "old_logps": [-1.0]},
        "old_logps holds 1 values, the completion 2 tokens",
    ),
    ({"prompt": "w1", "completion": " w2"}, "no 'reward' (with its 'group') nor 'advantage'"),
    ({"prompt": "w1", "completion": " ", "advantage": 1.0}, "an empty completion"),
    ('{"prompt": "w1", "completion": " w2", "advantage": 1, "advantage": 2}', "appears twice"),
    ({"prompt": "w1", "completion": " w2", "reward": 1.0}, "a 'reward' needs its 'group' id"),
]


@pytest.mark.parametrize(
    "row, says", BAD, ids=["adv_str", "adv_nan", "old_len", "no_score", "empty", "dup", "group"]
)
def test_bad_rollouts_are_refused_naming_file_and_line(setup, row, says):
    d, tok, *_ = setup
    f = write(d / "bad.jsonl", [ROLLOUTS[4], row])
    with pytest.raises(DataError) as e:
        read_rollouts([f], tok, tok.eos_token_id, 64, "group")
    assert f"data file {f!r} line 2: " in str(e.value) and says in str(e.value), str(e.value)
