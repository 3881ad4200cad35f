"""Preference pairs (data/preference.py): conversational pairs train their completion as an SFT
session does, whole conversations share their prompt, and each bad pair is refused naming its file
and line."""

import json

import pytest

from ds_longctx.data.chat import session_tokens
from ds_longctx.data.preference import pack_pairs, read_pairs
from ds_longctx.data.sources import DataError
from ds_longctx.parallel.units import IGNORE_INDEX
from tests.corpus import chat_template, make_chat_tokenizer

PROMPT = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"}]
CHOSEN = [{"role": "assistant", "content": "w6 w7"}]
REJECTED = [{"role": "assistant", "content": "w8"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("tok")
    return AutoTokenizer.from_pretrained(
        str(make_chat_tokenizer(d, chat_template(True), n_words=20))
    )


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return [str(path)]


def test_conversational_pairs_train_as_sft_sessions(tmp_path, tok):
    explicit = {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}
    whole = {"chosen": PROMPT + CHOSEN, "rejected": PROMPT + REJECTED}  # TRL's implicit prompt
    pairs = read_pairs(write(tmp_path / "p.jsonl", [explicit, whole]), tok, tok.eos_token_id)
    for completion, got in zip((CHOSEN, REJECTED), pairs[0]):
        msgs = [dict(m, train=False) for m in PROMPT] + [dict(m, train=True) for m in completion]
        assert got == tuple(session_tokens(tok, msgs, None, "assistant"))
    assert pairs[1] == pairs[0]
    ids, pos, labels, seq = pack_pairs(pairs)
    lens = [len(s[0]) for p in pairs for s in p]
    assert pos.tolist() == [i for n in lens for i in range(n)]
    # each trained token names its sequence: 0, 1 (pair 0's chosen, rejected), then 2, 3
    assert seq[labels != IGNORE_INDEX].tolist() == [
        k for k, p in enumerate(s for p in pairs for s in p) for v in p[1] if v != IGNORE_INDEX
    ]
    assert bool((seq[labels == IGNORE_INDEX] == IGNORE_INDEX).all())


@pytest.mark.parametrize(
    "row, fragment",
    [
        ({"prompt": "w1", "chosen": "w2"}, "no 'rejected' key"),
        ({"prompt": "w1", "chosen": " ", "rejected": "w2"}, "'chosen' is an empty completion"),
        (
            {
                "prompt": PROMPT,
                "chosen": CHOSEN,
                "rejected": [{"role": "assistant", "content": ""}],
            },
            "'rejected' is an empty completion",
        ),
        (
            {"chosen": PROMPT + CHOSEN, "rejected": PROMPT[1:] + REJECTED},
            "differ before their last message (at message 0)",
        ),
        ("{not json", "not JSON"),
        (
            '{"prompt": "w1", "chosen": "w2", "chosen": "w4", "rejected": "w3"}',
            "key chosen appears twice",
        ),
    ],
    ids=[
        "no_rejected",
        "empty_chosen",
        "empty_rejected_message",
        "prompts_differ",
        "not_json",
        "dup",
    ],
)
def test_bad_pair_refused_naming_file_and_line(tmp_path, tok, row, fragment):
    good = {"prompt": "w1", "chosen": "w2", "rejected": "w3"}
    files = write(tmp_path / "pairs.jsonl", [good, row])
    with pytest.raises(DataError) as e:
        read_pairs(files, tok, tok.eos_token_id)
    assert f"data file {files[0]!r} line 2: " in str(e.value) and fragment in str(e.value), str(
        e.value
    )
