"""Answer loss by distance (run/answer_loss.py) on two tiny sessions: each answer's span covers
exactly its quoted value's tokens, its loss is a plain HF forward's F.cross_entropy over those
tokens, and the buckets count the meta's distances as the data card buckets them; the control scores
the same answers with their evidence blanked."""

import json

import pytest

from tests.corpora.test_agent_sessions import ONLY
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    from transformers import AutoTokenizer

    from ds_longctx.corpora.prepare import main

    out = tmp_path_factory.mktemp("answers") / "s"
    assert (
        main(
            [
                "prepare",
                "--out",
                str(out),
                "--sessions",
                "2",
                "--only",
                ONLY,
                "--min_tokens",
                "4096",
                "--max_tokens",
                "8192",
                "--vocab_size",
                "512",
            ]
        )
        == 0
    )
    return out, AutoTokenizer.from_pretrained(str(out / "tokenizer"), local_files_only=True)


@pytest.fixture(scope="module")
def model(sessions):
    import torch

    from ds_longctx.run.model import model_class

    cfg = tiny_config()
    cfg.vocab_size = len(sessions[1])
    torch.manual_seed(0)
    return model_class(cfg)(cfg).eval()


def test_spans_cover_the_quoted_values_and_losses_match_plain_cross_entropy(sessions, model):
    import torch
    import torch.nn.functional as F

    from ds_longctx.run.answer_loss import hf_losses, per_answer, read_sessions, session_spans

    d, tok = sessions
    rows = read_sessions(d)
    got = per_answer(hf_losses(model), session_spans(tok, rows))
    assert len(got) == sum(len(r["meta"]["answers"]) for r in rows) > 0
    i = 0
    for row in rows:
        ids = tok.apply_chat_template(
            row["messages"], tools=row["tools"], tokenize=True, return_dict=True
        )["input_ids"]
        assert len(ids) == row["meta"]["tokens"]
        x = torch.tensor(ids)
        with torch.no_grad():
            logits = model(x[None]).logits[0]
        for f in row["meta"]["answers"]:
            a, b = got[i]["tokens"]
            assert f["value"] in tok.decode(ids[a:b]), (f, tok.decode(ids[a:b]))
            assert f["value"] not in tok.decode(ids[a + 1 : b]) and f["value"] not in tok.decode(
                ids[a : b - 1]
            )
            ref = F.cross_entropy(logits[a - 1 : b - 1], x[a:b]).item()
            assert got[i]["loss"] == pytest.approx(ref, rel=1e-5, abs=1e-5)
            assert got[i]["distance_tokens"] == f["distance_tokens"]
            i += 1


def test_bucket_lines_count_the_meta_distances(sessions, model, tmp_path):
    from ds_longctx.corpora.answer_spans import BUCKETS
    from ds_longctx.corpora.session_card import bucket_counts
    from ds_longctx.run.answer_loss import answer_loss, hf_losses, read_sessions, session_spans

    d, tok = sessions
    rows = read_sessions(d)
    lines = answer_loss(hf_losses(model), session_spans(tok, rows), step=7)
    counts = bucket_counts([f["distance_tokens"] for r in rows for f in r["meta"]["answers"]])
    assert {x["bucket"]: x["answers"] for x in lines} == {
        b: n for b, n in zip(BUCKETS, counts) if n
    }
    assert all(x["step"] == 7 and x["tokens"] >= x["answers"] and x["mean_loss"] > 0 for x in lines)
    json.dumps(lines)


def test_answer_lines_are_the_answers_the_bucket_lines_average(sessions, model):
    """answer_loss_both: one line per answer (its span's start and length, kind, loss), whose
    per-bucket means and counts are the bucket lines."""
    from ds_longctx.run.answer_loss import (
        answer_loss_both,
        hf_losses,
        per_answer,
        read_sessions,
        session_spans,
    )

    d, tok = sessions
    spans = session_spans(tok, read_sessions(d))
    buckets, each = answer_loss_both(hf_losses(model), spans, step=3)
    ref = per_answer(hf_losses(model), spans)
    assert [(x["session"], x["message"], x["kind"], x["position"], x["tokens"]) for x in each] == [
        (r["session"], r["message"], r["kind"], r["tokens"][0], r["tokens"][1] - r["tokens"][0])
        for r in ref
    ]
    assert [x["loss"] for x in each] == pytest.approx([r["loss"] for r in ref], rel=1e-6)
    for b in buckets:
        mine = [x for x in each if x["bucket"] == b["bucket"]]
        assert len(mine) == b["answers"] and sum(x["tokens"] for x in mine) == b["tokens"]
        assert sum(x["loss"] for x in mine) / len(mine) == pytest.approx(b["mean_loss"], rel=1e-9)
    assert all(x["step"] == 3 for x in each) and len({x["kind"] for x in each}) > 1
    json.dumps(each)


def test_without_evidence_blanks_exactly_each_answers_evidence(sessions):
    """The control's sessions: every answer's evidence characters turned to spaces (newlines kept),
    nothing else."""
    from ds_longctx.corpora.answer_spans import without_evidence
    from ds_longctx.run.answer_loss import read_sessions

    d, _ = sessions
    for row in read_sessions(d):
        before = json.dumps(row)
        blank = without_evidence(row)
        assert json.dumps(row) == before  # the row itself untouched
        spans = {}
        for f in row["meta"]["answers"]:
            spans.setdefault(f["evidence_message"], []).append(f["evidence_chars"])
        assert spans and all(row["messages"][k]["role"] == "tool" for k in spans)
        for k, (m, n) in enumerate(zip(row["messages"], blank["messages"], strict=True)):
            if k not in spans:
                assert n == m
                continue
            inside = [any(a <= i < b for a, b in spans[k]) for i in range(len(m["content"]))]
            assert n["content"] == "".join(
                " " if x and c != "\n" else c for c, x in zip(m["content"], inside)
            )
            assert all(not n["content"][a:b].strip() for a, b in spans[k])


def test_the_control_scores_each_answer_on_its_session_without_evidence(sessions, model):
    """loss_without_evidence: plain CE over the answer's value tokens of the blanked session as the
    chat template renders it; the bucket line's mean is its answers' mean."""
    import torch
    import torch.nn.functional as F

    from ds_longctx.corpora.answer_spans import without_evidence
    from ds_longctx.run.answer_loss import (
        answer_loss_both,
        control_spans,
        hf_losses,
        read_sessions,
        session_spans,
    )

    d, tok = sessions
    rows = read_sessions(d)
    control = control_spans(tok, rows)
    buckets, each = answer_loss_both(hf_losses(model), session_spans(tok, rows), 0, control)
    i = 0
    for row, (_, ids, spans) in zip(rows, control, strict=True):
        blank = without_evidence(row)
        want = tok.apply_chat_template(
            blank["messages"], tools=row["tools"], tokenize=True, return_dict=True
        )["input_ids"]
        assert ids == list(want) and ids != session_spans(tok, [row])[0][1]
        with torch.no_grad():
            logits = model(torch.tensor(ids)[None]).logits[0]
        for s in spans:
            a, b = s["tokens"]
            ref = F.cross_entropy(logits[a - 1 : b - 1], torch.tensor(ids[a:b])).item()
            assert each[i]["loss_without_evidence"] == pytest.approx(ref, rel=1e-5, abs=1e-5)
            i += 1
    assert i == len(each)
    for b in buckets:
        mine = [x["loss_without_evidence"] for x in each if x["bucket"] == b["bucket"]]
        assert b["mean_loss_without_evidence"] == pytest.approx(sum(mine) / len(mine), rel=1e-9)
