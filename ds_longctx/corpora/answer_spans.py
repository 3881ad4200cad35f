"""Where each answer of a long agent session sits in its tokens, and its answer-to-evidence distance
bucket (run/answer_loss.py measures the loss there).

    # ids: the rendered session's tokens (what training reads, less its EOS)
    ids, spans = answer_spans(tok, row)
    spans[k] = {"message", "kind", "distance_tokens", "bucket", "tokens": [a, b]}
    # the same session, every answer's evidence blanked (the control)
    row = without_evidence(row)

Span and bucket rules: docs/design/corpora.md."""

from __future__ import annotations

import re

from ds_longctx.corpora.session_card import DISTANCE_EDGES, bucket_index, size_name
from ds_longctx.corpora.session_chat import Renderer, token_at

BUCKETS = [f"{size_name(a)}-{size_name(b)}" for a, b in zip(DISTANCE_EDGES, DISTANCE_EDGES[1:])] + [
    f"{size_name(DISTANCE_EDGES[-1])}+"
]


def answer_spans(tok, row: dict) -> tuple:
    """(the session's token ids, one span per answer of `row["meta"]["answers"]`) (module doc). A
    row whose recorded value is not at its recorded characters is refused: its meta is not this
    rendering's."""
    ren, msgs, tools = Renderer(tok), row["messages"], row["tools"]
    whole = ren.session(msgs, tools)
    starts, at = (
        [],
        0,
    )  # the session's rendering is its messages' pieces end to end (session_chat.py)
    for k, m in enumerate(msgs):
        starts.append(at + len(f"<|im_start|>{m['role']}\n"))
        at += len(ren.piece(m, tools if k == 0 else None))
    enc = ren.encode(whole)
    ends = [e for _, e in enc.offsets]
    spans = []
    for f in row["meta"]["answers"]:
        a, b = (starts[f["message"]] + c for c in f["answer_chars"])
        if whole[a:b] != f["value"]:
            raise ValueError(
                f"{row.get('name')}: answer in message {f['message']} does not hold {f['value']!r} "
                f"at characters {f['answer_chars']}; prepare the sessions again with this tokenizer"
            )
        span = [token_at(ends, a), token_at(ends, b - 1) + 1]  # the tokens of characters a .. b - 1
        spans.append(
            {
                "message": f["message"],
                "kind": f["kind"],
                "distance_tokens": f["distance_tokens"],
                "bucket": BUCKETS[bucket_index(f["distance_tokens"])],
                "tokens": span,
            }
        )
    return list(enc.ids), spans


def without_evidence(row: dict) -> dict:
    """`row` with every answer's evidence (its `evidence_chars` in its tool message's content)
    blanked to spaces, newlines kept: the session in which the answers must be given without their
    facts. Every other message, and so every answer's value and characters, is unchanged."""
    msgs = [dict(m) for m in row["messages"]]
    for f in row["meta"]["answers"]:
        m, (a, b) = msgs[f["evidence_message"]], f["evidence_chars"]
        if not isinstance(m.get("content"), str) or not 0 <= a <= b <= len(m["content"]):
            raise ValueError(
                f"{row.get('name')}: the evidence of the answer in message {f['message']} is not "
                f"characters {f['evidence_chars']} of message {f['evidence_message']}'s text; "
                f"prepare the sessions again"
            )
        m["content"] = (
            m["content"][:a] + re.sub(r"[^\n]", " ", m["content"][a:b]) + m["content"][b:]
        )
    return {**row, "messages": msgs}
