"""The real SmolLM2-135M-Instruct (`ds-longctx models get`'s conversion) trained under SP=3, one KV
head per rank: two short chat sessions packed into one row give, at step 1, HF's own loss over
exactly the tokens docs/data.md says train. Its ChatML template has no generation markers, so those
are the delta rule's: what each assistant message adds to the rendering of the messages before it,
from where its generation prompt ends. The reference is written here: the plain HF model on each
session alone, cross-entropy over those tokens of both sessions."""

from __future__ import annotations

import json

import pytest

from tests.helpers import read_metrics, rel_err, run_cli

pytestmark = pytest.mark.slow
SP = 3
TOL = 1e-4  # fp32: ZeRO-3 and the SP all-to-all against one plain forward (measured: 2e-6)
SESSIONS = [
    # no system message: the template adds its own
    [
        {"role": "user", "content": "What does ls -a show?"},
        {"role": "assistant", "content": "Every entry of the directory, hidden ones too."},
        {"role": "user", "content": "And -l?"},
        {"role": "assistant", "content": "One line per entry: permissions, owner, size and date."},
    ],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "The capital of Italy?"},
        {"role": "tool", "content": "geo: Italy -> Rome"},
        {"role": "assistant", "content": "Rome."},
    ],
]


def delta_rule_labels(tok, messages: list) -> tuple:
    """(ids, labels) of one session: assistant message i's characters are the rendering of
    messages[:i + 1] past that of messages[:i] with its generation prompt; a token trains where its
    characters overlap them."""
    full = tok.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            upto = tok.apply_chat_template(messages[: i + 1], tokenize=False)
            assert full.startswith(upto) and upto.startswith(head)
            spans.append((len(head), len(upto)))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        t if any(a < e and b > s for s, e in spans) else -100
        for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
    ]
    return enc["input_ids"], labels


def hf_loss(model_dir) -> tuple:
    """(the plain model's mean cross-entropy over both sessions' trained tokens, their tokens)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    total, count, tokens = 0.0, 0, 0
    for messages in SESSIONS:
        ids, labels = map(torch.tensor, delta_rule_labels(tok, messages))
        assert (labels != -100).any() and (labels == -100).any()
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]
        total += float(F.cross_entropy(logits[:-1], labels[1:], reduction="sum"))
        count, tokens = count + int((labels[1:] != -100).sum()), tokens + len(ids)
    return total / count, tokens


def test_smollm2_packed_sessions_at_sp3_give_hf_loss_on_delta_rule_tokens(smollm2_dir, tmp_path):
    want, tokens = hf_loss(smollm2_dir)
    data = tmp_path / "sessions.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in SESSIONS))
    seq_len = -(-tokens // SP) * SP  # both sessions in one row, padded to a multiple of SP
    out = tmp_path / "run"
    # add_eos false: the sessions end as the template ends them (docs/data.md: an appended EOS
    # trains where the last token does)
    res = run_cli(
        [
            "train",
            "--nproc",
            str(SP),
            "--sp_size",
            str(SP),
            "--model",
            str(smollm2_dir),
            "--data",
            str(data),
            "--data_layout",
            "pack",
            "--seq_len",
            str(seq_len),
            "--add_eos",
            "false",
            "--dtype",
            "fp32",
            "--steps",
            "1",
            "--data_cache_dir",
            str(tmp_path / "cache"),
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [step1] = read_metrics(out)
    assert rel_err(step1["loss"], want) <= TOL, (step1["loss"], want)
