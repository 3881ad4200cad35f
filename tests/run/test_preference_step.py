"""`ds-longctx train --objective dpo` end to end (SP=2, ZeRO-3, shared-prompt rows): the reference
pass over the starting weights stored in output_dir with the log-probs of a plain HF forward of each
sequence alone, step 1 at log 2 (policy = reference), the rewards in metrics.jsonl; a resume reads
the stored pass back (refusing other data or another reference); bad pairs and rollouts refused
with exit 2. The step's loss, gradients and rewards against TRL's DPOTrainer, at SP=2 through the
engine too: tests/levers/test_preference.py."""

import json
import math
import re

import pytest
import torch

from ds_longctx.run.preference_step import REF_FILE, reference_logps
from tests.corpus import make_tokenizer
from tests.helpers import read_metrics, refused, rel_err, run_cli, tiny_model

PAIRS = [
    {"prompt": "w1 w2 w3 w4 w5", "chosen": " w6 w7 w8", "rejected": " w9 w10"},
    {"prompt": "w11 w12 w3", "chosen": " w13 w14 w15 w16 w2", "rejected": " w17"},
    {"prompt": "w20", "chosen": " w21 w22", "rejected": " w23 w24 w25"},
]


def write_pairs(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpo")
    return d, str(make_tokenizer(d / "tok", n_words=30)), write_pairs(d / "pairs.jsonl", PAIRS)


def args(d, tok, data, *more, objective="dpo"):
    return [
        "train",
        "--objective",
        objective,
        "--beta",
        "0.5",
        "--data",
        data,
        "--tokenizer",
        tok,
        "--model",
        "qwen3-tiny",
        "--seq_len",
        "64",
        "--dtype",
        "fp32",
        "--lr",
        "1e-2",
        "--data_cache_dir",
        str(d / "cache"),
        *more,
    ]


def plain_logps(tok_dir: str) -> torch.Tensor:
    """[pairs, 2] summed completion log-probs of each sequence alone under the engine's starting
    weights."""
    from transformers import AutoTokenizer

    from ds_longctx.data.preference import pair_tokens_of

    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = tiny_model(seed=0)
    out = []
    with torch.no_grad():
        for pair in PAIRS:
            for ids, labels in pair_tokens_of(tok, pair, tok.eos_token_id):
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], -1)
                target = torch.tensor(labels[1:])
                keep = target != -100
                out.append(logp[keep].gather(1, target[keep, None]).sum())
    return torch.stack(out).view(-1, 2)


@pytest.mark.slow
def test_dpo_train_stores_the_reference_and_logs_rewards(files):
    d, tok, data = files
    out = d / "run"
    res = run_cli(
        args(
            d, tok, data, "--nproc", "2", "--sp_size", "2", "--steps", "2", "--output_dir", str(out)
        ),
        timeout=300,
        output_dir=out,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert (
        "reference log-probs: 3 pairs in a first pass over the starting weights"
        in res.stderr + res.stdout
    )
    stored = torch.load(out / REF_FILE, weights_only=True)["logps"]
    assert rel_err(stored, plain_logps(tok)) <= 1e-5
    rows = read_metrics(out)
    assert abs(rows[0]["loss"] - math.log(2)) <= 1e-6 and rows[0]["rewards/margins"] == 0.0
    assert rows[1]["rewards/margins"] > 0 and rows[1]["loss"] < math.log(
        2
    )  # one step towards the chosen
    assert rows[0]["trained_tokens"] == 22  # completions and their EOS: 4 + 3, 6 + 2, 3 + 4


class Rows:
    def __init__(self, n):
        self.pairs, self.ref = [None] * n, None

    def signature(self):
        return {"kind": "pairs", "n_pairs": len(self.pairs)}


def test_resume_reads_the_stored_reference_and_refuses_another(tmp_path):
    from ds_longctx.run.ref_weights import signature_json

    with pytest.raises(ValueError, match=f"{REF_FILE} is missing"):
        reference_logps(None, Rows(2), tmp_path, fresh=False)
    logps = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    torch.save(  # as stored before ref_model existed: no reference named
        {"logps": logps, "signature": json.dumps(Rows(2).signature(), sort_keys=True)},
        tmp_path / REF_FILE,
    )
    rows = Rows(2)
    reference_logps(None, rows, tmp_path, fresh=False)
    assert torch.equal(rows.ref, logps)
    with pytest.raises(ValueError, match="reference log-probs of other data"):
        reference_logps(None, Rows(3), tmp_path, fresh=False)
    ref = tmp_path / "ref"
    tiny_model(seed=1).save_pretrained(ref)
    with pytest.raises(ValueError, match="of another reference"):
        reference_logps(None, Rows(2), tmp_path, fresh=False, ref_model=str(ref))
    torch.save(
        {"logps": logps, "signature": signature_json(Rows(2).signature(), str(ref))},
        tmp_path / REF_FILE,
    )
    reference_logps(None, Rows(2), tmp_path, fresh=False, ref_model=str(ref))
    with pytest.raises(ValueError, match="of another reference"):
        reference_logps(None, Rows(2), tmp_path, fresh=False)
    tiny_model(seed=2).save_pretrained(ref)  # same path and shapes, other weights
    with pytest.raises(ValueError, match="of another reference"):
        reference_logps(None, Rows(2), tmp_path, fresh=False, ref_model=str(ref))


@pytest.mark.parametrize("case", ["no_rejected", "grpo_advantage"])
def test_bad_dpo_and_grpo_input_exits_2_naming_file_and_line(files, case):
    d, tok, _ = files
    if case == "grpo_advantage":
        row = {"prompt": "w1", "completion": " w2", "advantage": "high"}
        data = write_pairs(d / "bad_rollouts.jsonl", [{**row, "advantage": 1.0}, row])
        says = f"data file {data!r} line 2: advantage='high' is not a finite number"
    else:
        data = write_pairs(d / "bad.jsonl", PAIRS[:1] + [{"prompt": "w1", "chosen": "w2"}])
        says = f"data file {data!r} line 2: no 'rejected' key"
    res = run_cli(
        args(
            d,
            tok,
            data,
            "--nproc",
            "1",
            "--output_dir",
            str(d / f"out_{case}"),
            objective="grpo" if case.startswith("grpo") else "dpo",
        ),
        timeout=120,
    )
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert says in res.stderr, res.stderr[-2000:]
    assert not (d / f"out_{case}").exists()


@pytest.mark.parametrize(
    "model, says",
    [
        ("qwen3-moe-tiny", "objective=dpo on a mixture of experts is not built yet"),
        ("qwen3.5-tiny", "shared_prompt: true on a model with linear-attention layers"),
    ],
    ids=["moe", "linear_attention_shared_prompt"],
)
def test_dpo_models_not_built_are_refused_before_the_engine(files, model, says):
    d, tok, data = files
    refused(
        d / f"out_{model}",
        [says],
        model=model,
        objective="dpo",
        data=data,
        tokenizer=tok,
        seq_len=64,
        dtype="fp32",
        data_cache_dir=str(d / "cache"),
    )


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"loss_type": "dapo"}, "loss_type='dapo' is not a dpo loss"),
        ({"objective": "grpo", "loss_type": "ipo"}, "loss_type='ipo' is not a grpo loss"),
        ({"objective": "grpo", "ref_model": "ref/"}, "with beta 0: grpo reads a reference only"),
        (
            {"objective": "sft", "ref_model": "r/", "data": "synthetic"},
            "ref_model applies to objective dpo or grpo",
        ),
        ({"beta": 0}, "objective=dpo takes beta > 0"),
        ({"eval_data": "synthetic"}, "a held-out evaluation is not built for it yet"),
        ({"micro_batch": 2}, "takes micro_batch=1"),
        (
            {"data": "synthetic"},
            "objective=dpo trains on a .jsonl file of prompt, chosen and rejected",
        ),
    ],
    ids=[
        "dpo_loss",
        "grpo_loss",
        "grpo_ref_beta0",
        "sft_ref_model",
        "dpo_beta0",
        "eval",
        "micro",
        "synth",
    ],
)
def test_objective_keys_refused_with_the_rest_of_the_config(kw, says):
    from pydantic import ValidationError

    from ds_longctx.config import RunConfig

    with pytest.raises(ValidationError, match=re.escape(says)):
        RunConfig(**{"objective": "dpo", "data": "pairs.jsonl", **kw})


def test_a_reference_of_another_vocabulary_or_shape_is_refused_naming_both(tmp_path, files):
    from ds_longctx.config import RunConfig
    from ds_longctx.run.ref_weights import ref_model_problem
    from tests.helpers import tiny_config

    _, tok, data = files
    policy = tiny_config()
    ref = tmp_path / "ref"
    other = tiny_config()
    other.vocab_size = 256
    other.save_pretrained(ref)
    (ref / "model.safetensors").write_bytes(b"")  # present: the check reads configs, never weights
    cfg = RunConfig(objective="dpo", data=data, tokenizer=tok, ref_model=str(ref))
    why = ref_model_problem(cfg, policy)
    assert (
        f"ref_model={str(ref)!r} differs from model='qwen3-tiny': vocab_size 256 (the policy's 512)"
        in why
    )
    policy.save_pretrained(ref)
    make_tokenizer(ref, n_words=31)  # one more word than the run's tokenizer
    why = ref_model_problem(cfg, policy)
    assert why == (
        f"ref_model={str(ref)!r} holds a tokenizer whose vocabulary differs from "
        f"tokenizer={tok!r}; give a reference trained with the policy's tokenizer"
    )
    make_tokenizer(ref, n_words=30)
    assert ref_model_problem(cfg, policy) is None


def test_a_resume_with_another_reference_is_refused_before_the_engine(tmp_path, files):
    from ds_longctx.config import RunConfig
    from ds_longctx.run.preference_step import stored_reference_problem
    from ds_longctx.run.ref_weights import signature_json

    _, tok, data = files
    out, ref = tmp_path / "run", tmp_path / "ref"
    out.mkdir()
    tiny_model(seed=1).save_pretrained(ref)
    kw = {"objective": "dpo", "data": data, "tokenizer": tok, "output_dir": str(out)}
    assert stored_reference_problem(RunConfig(**kw).train) is None  # nothing stored yet
    saved = {"logps": torch.zeros(2, 2), "signature": signature_json(Rows(2).signature(), None)}
    torch.save(saved, out / REF_FILE)
    assert stored_reference_problem(RunConfig(**kw).train) is None
    why = stored_reference_problem(RunConfig(**kw, ref_model=str(ref)).train)
    with pytest.raises(ValueError) as e:  # what the build said: the same line
        reference_logps(None, Rows(2), out, fresh=False, ref_model=str(ref))
    assert why == str(e.value) and "of another reference" in why


def test_grpo_rollouts_read_by_the_check_and_the_build_are_summed_up_once(files, caplog):
    from ds_longctx.config import RunConfig
    from ds_longctx.data.build import build_pairs, check_data_source

    d, tok, _ = files
    rows = [{"prompt": "w1 w2", "completion": f" w{i}", "reward": i, "group": 0} for i in (3, 4)]
    data = write_pairs(d / "rollouts.jsonl", rows)
    cfg = RunConfig(objective="grpo", data=data, tokenizer=tok, seq_len=64)
    with caplog.at_level("INFO", logger="ds_longctx"):
        check_data_source(cfg, 512)
        assert build_pairs(cfg, 512).n_rows == 1
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("grpo:")]
    assert len(said) == 1 and said[0].startswith("grpo: 2 rollouts in 1 row(s)"), said
