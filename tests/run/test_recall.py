"""Recall (run/recall.py) on a tiny model and a short session (a prepared session cut after its
first answer): an answer's `exact` from one teacher-forced forward is what HF
`generate(do_sample=False)` from the cut prompt gives back; a model trained to give the answer
recalls it (exact match 1.0), a random one does not (0); the rows carry the schema the notebook
reads; `ds-longctx eval --model DIR --recall true` gives the taught model's directory exact match
1.0 through the engine, and refuses sessions without answers, naming the file."""

import json

import pytest

from tests.helpers import tiny_model

FIELDS = [
    "model",
    "stage",
    "step",
    "seq_len",
    "bucket",
    "answers",
    "loss_with_evidence",
    "loss_without_evidence",
    "recall_exact_match",
    "commit",
    "device",
    "date",
]


FILE = (
    '"""Cache sizes."""\n\n_MAXCACHE = 512 * 1024 + 17\n\n\ndef purge():\n    """Empty the '
    'cache."""\n'
)
VALUE = "512 * 1024 + 17"


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """(sessions directory, its tokenizer, a short session: one read, one question, an answer
    quoting VALUE)."""
    from argparse import Namespace

    from ds_longctx.corpora.agent_sessions import session_tokenizer, stdlib_source
    from ds_longctx.corpora.session_chat import tool_call

    files, _ = stdlib_source({"colorsys", "bisect"})
    tok = session_tokenizer(files, Namespace(tokenizer=None, corpus=None, vocab_size=512))
    answer = f"`_MAXCACHE` is `{VALUE}` in `m.py`."
    msgs = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read `m.py`."},
        tool_call("read_file", "Reading `m.py`.", path="m.py"),
        {"role": "tool", "content": FILE},
        {
            "role": "user",
            "content": "What value does `m.py` assign to `_MAXCACHE` at module level?",
        },
        {"role": "assistant", "content": answer},
    ]
    at, ev = answer.index(VALUE), FILE.index(VALUE)
    fact = {
        "message": 5,
        "evidence_message": 3,
        "distance_tokens": 40,
        "kind": "constant",
        "path": "m.py",
        "subject": "_MAXCACHE",
        "param": None,
        "value": VALUE,
        "evidence_chars": [ev, ev + len(VALUE)],
        "answer_chars": [at, at + len(VALUE)],
    }
    row = {"name": "session-0000", "tools": [], "messages": msgs, "meta": {"answers": [fact]}}
    out = tmp_path_factory.mktemp("recall")
    tok.save_pretrained(str(out / "tokenizer"))
    return out, tok, row


def trained_to_answer(ids: list, span: list, steps: int = 200):
    """The tiny model trained on the loss of the answer's value tokens alone (teacher-forced) until
    each is its position's argmax: a model that was taught this answer."""
    import torch

    model = tiny_model(seed=1)
    x = torch.tensor(ids)[None]
    labels = torch.full_like(x, -100)
    labels[0, span[0] : span[1]] = x[0, span[0] : span[1]]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for _ in range(steps):
        out = model(x, labels=labels)
        logits = out.logits[0, span[0] - 1 : span[1] - 1]
        if bool((logits.argmax(-1) == x[0, span[0] : span[1]]).all()) and out.loss.item() < 0.2:
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def taught(short):
    from ds_longctx.run.answer_loss import session_spans

    _, tok, row = short
    _, ids, spans = session_spans(tok, [row])[0]
    return trained_to_answer(ids, spans[0]["tokens"])


def greedy(model, ids: list, span: list) -> list:
    """HF greedy decoding from the cut prompt (the session up to the value's first token), as many
    tokens as the value has."""
    import torch

    a, b = span
    with torch.no_grad():
        out = model.generate(
            torch.tensor(ids[:a])[None],
            attention_mask=torch.ones(1, a, dtype=torch.long),
            do_sample=False,
            max_new_tokens=b - a,
            min_new_tokens=b - a,
            pad_token_id=0,
        )
    return out[0, a:].tolist()


def test_exact_is_what_greedy_generation_gives_back(short, taught):
    """Per answer, exact (every value token its position's argmax, one forward) == (greedy decoding
    from the cut prompt reproduces the value's tokens): true for the model taught the answer, false
    for a random one; recall's bucket rows say exact match 1.0 and 0.0 with the module doc's
    fields."""
    from ds_longctx.run.answer_loss import answer_loss_both, control_spans, hf_losses, session_spans
    from ds_longctx.run.recall import recall_rows

    _, tok, row = short
    sessions = session_spans(tok, [row])
    _, ids, spans = sessions[0]
    span = spans[0]["tokens"]
    assert (
        span[1] - span[0] >= 2
    )  # a value of several tokens: each must be the argmax, not only the first
    seen = {}
    for name, model in (("random", tiny_model(seed=0).eval()), ("taught", taught)):
        _, each = answer_loss_both(hf_losses(model), sessions, 0, control_spans(tok, [row]))
        got = greedy(model, ids, span)
        assert each[0]["exact"] == (got == ids[span[0] : span[1]]), (
            name,
            got,
            ids[span[0] : span[1]],
        )
        rows, answers = recall_rows(each, model=name, stage="base", step=0, seq_len=4096)
        assert [list(r) for r in rows] == [FIELDS] and answers[0]["exact"] == each[0]["exact"]
        seen[name] = rows[0]["recall_exact_match"]
        json.dumps(rows)
    assert seen == {"random": 0.0, "taught": 1.0}


def test_eval_of_a_model_directory_recalls_what_it_was_taught(short, taught, tmp_path):
    """`ds-longctx eval --model DIR --recall true` (the engine: its chunked loss's argmax flags) on
    the taught model's directory: stage base, step 0, exact match 1.0, the losses of a plain HF
    forward."""
    from ds_longctx.run.answer_loss import answer_loss_both, control_spans, hf_losses, session_spans
    from tests.helpers import read_metrics, run_cli

    d, tok, row = short
    taught.save_pretrained(str(tmp_path / "taught"))
    (tmp_path / "s.jsonl").write_text(json.dumps(row) + "\n")
    out = tmp_path / "out"
    res = run_cli(
        [
            "eval",
            "--model",
            str(tmp_path / "taught"),
            "--data",
            str(tmp_path / "s.jsonl"),
            "--tokenizer",
            str(d / "tokenizer"),
            "--recall",
            "true",
            "--seq_len",
            "512",
            "--rows",
            "1",
            "--data_layout",
            "pack",
            "--dtype",
            "fp32",
            "--out",
            str(out),
        ],
        timeout=300,
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (got,) = read_metrics(out, "recall.jsonl")
    _, each = answer_loss_both(
        hf_losses(taught), session_spans(tok, [row]), 0, control_spans(tok, [row])
    )
    assert (
        got["stage"],
        got["step"],
        got["seq_len"],
        got["answers"],
        got["recall_exact_match"],
    ) == ("base", 0, 512, 1, 1.0)
    assert got["loss_with_evidence"] == pytest.approx(each[0]["loss"], rel=1e-4)
    assert got["loss_without_evidence"] == pytest.approx(each[0]["loss_without_evidence"], rel=1e-4)
    assert read_metrics(out, "recall_answers.jsonl")[0]["exact"] is True


def test_recall_is_refused_on_sessions_without_answers(short, tmp_path, capsys):
    """`ds-longctx eval --model ... --recall true` on chat rows without meta.answers: exit 2 before
    any worker, one line naming the file and the fix; nothing written."""
    from ds_longctx import cli

    d, _, row = short
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({k: v for k, v in row.items() if k != "meta"}) + "\n")
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "eval",
                "--model",
                "qwen3-tiny",
                "--data",
                str(bare),
                "--recall",
                "true",
                "--seq_len",
                "2048",
                "--tokenizer",
                str(d / "tokenizer"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2 and "--recall true" in last and str(bare) in last, last
    assert not (tmp_path / "out").exists()
