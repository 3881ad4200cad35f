"""Rows that say which of their tokens train (data/formats.py, data/chat.py, data/tokenize.py,
data/rows.py) on CPU: a chat session's labels against a token set written out by hand here, for a
ChatML template with `{% generation %}` markers (and HF's own assistant mask) and one without;
last_assistant, per-message train flags, prompt/completion rows, token rows with their own labels;
every bad input refused naming its file and line; two sessions packed in one row."""

import json

import pytest
import torch

from ds_longctx.config import RunConfig
from ds_longctx.data import DataError, build_data
from ds_longctx.data.tokenize_check import untrained_windows
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.run.model import load_hf_config
from tests.corpus import CHATML, chat_template, make_chat_tokenizer

L = 64
TOOLS = [{"type": "function", "function": {"name": "w50", "parameters": {}}}]
CALL = {"type": "function", "function": {"name": "w50", "arguments": {"x": "w6"}}}
SESSION = [
    {"role": "system", "content": "w1 w2"},
    {"role": "user", "content": "w3 w4"},
    {"role": "assistant", "content": "w5", "tool_calls": [CALL]},
    {"role": "tool", "content": "w7 w8"},
    {"role": "assistant", "content": "w9 w10"},
]
# the rendering of SESSION with TOOLS, token by token; the assistant turns (their content, calls and
# end) train
S, E = "<|im_start|>", "<|im_end|>"
HEAD = [
    S,
    "system",
    "tools",
    "w50",
    E,
    S,
    "system",
    "w1",
    "w2",
    E,
    S,
    "user",
    "w3",
    "w4",
    E,
    S,
    "assistant",
]
TURN1 = ["w5", "<tool_call>", "w50", "w6", "</tool_call>", E]
TOOL = [S, "tool", "w7", "w8", E, S, "assistant"]
TURN2 = ["w9", "w10", E]
RENDERED = HEAD + TURN1 + TOOL + TURN2
# <think> of an assistant turn before the last user message is dropped: a template that rewrites
# earlier turns
REWRITES = (
    "{%- set ns = namespace(last=0) %}{%- for m in messages %}{%- if m.role == 'user' %}{%- set "
    "ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- if m.role == 'assistant' and loop.index0 < ns.last "
    "%}<|im_start|>assistant\n{{ m.content.split('</think>')[-1] }}<|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FAILS = (
    "{%- for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool turns here') "
    "}}{% endif %}"
    "{%- endfor %}" + CHATML.replace("GEN_START", "").replace("GEN_END", "")
)


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat_tok")
    from transformers import AutoTokenizer

    paths = {
        name: str(make_chat_tokenizer(d / name, tpl))
        for name, tpl in (
            ("gen", chat_template(True)),
            ("plain", chat_template(False)),
            ("rewrites", REWRITES),
            ("fails", FAILS),
        )
    }
    return paths, AutoTokenizer.from_pretrained(paths["gen"])


@pytest.fixture(scope="module")
def hf_cfg():
    return load_hf_config("qwen3-tiny")


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def batch_of(path, tok_dir, hf_cfg, tmp_path, **kw):
    cfg = RunConfig(
        **{
            "data": path,
            "tokenizer": tok_dir,
            "seq_len": L,
            "data_layout": "pack",
            "shuffle": False,
            "data_cache_dir": str(tmp_path / "cache"),
            **kw,
        }
    )
    return build_data(cfg, hf_cfg, 1)


def expected(tok, names: list, trains: list) -> tuple[list, list]:
    """(ids, labels) of a document: the tokens `names` (+ EOS), label = id where `trains` (EOS: as
    the last)."""
    ids = tok.convert_tokens_to_ids(names) + [tok.eos_token_id]
    trains = list(trains) + [trains[-1]]
    return ids, [i if t else IGNORE_INDEX for i, t in zip(ids, trains)]


def first_doc(rows) -> tuple[list, list]:
    ids, pos, labels = rows.row(0)
    n = int(torch.nonzero(pos[1:] == 0).flatten()[0]) + 1 if pos is not None else L
    return ids[:n].tolist(), labels[:n].tolist()


def marks(*parts) -> list:
    """Per-token train flags of RENDERED: parts are (tokens, trains) in order."""
    return [t for names, t in parts for _ in names]


@pytest.mark.parametrize("template", ["gen", "plain"])
def test_session_trains_exactly_its_assistant_turns(toks, hf_cfg, tmp_path, template, caplog):
    paths, tok = toks
    path = write(tmp_path / "s.jsonl", [{"messages": SESSION, "tools": TOOLS}])
    with caplog.at_level("INFO", logger="ds_longctx"):
        rows = batch_of(path, paths[template], hf_cfg, tmp_path)
    want = expected(tok, RENDERED, marks((HEAD, 0), (TURN1, 1), (TOOL, 0), (TURN2, 1)))
    assert first_doc(rows) == want
    assert (
        rows.get(0, 1, 0, 1).labels[0, : len(want[1])].tolist() == want[1]
    )  # Batch.labels carries them
    assert "rows are messages (detected from the first row)" in caplog.text
    assert "trained tokens per document min 10, median 10, max 10" in caplog.text
    if template == "gen":  # HF's own mask marks the same tokens
        hf = tok.apply_chat_template(
            SESSION, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert [j for j, m in enumerate(hf["assistant_masks"]) if m] == [
            j for j, v in enumerate(want[1][:-1]) if v != IGNORE_INDEX
        ]


@pytest.mark.parametrize("template", ["gen", "plain"])
def test_last_assistant_and_per_message_train_flags(toks, hf_cfg, tmp_path, template):
    paths, tok = toks
    path = write(tmp_path / "s.jsonl", [{"messages": SESSION, "tools": TOOLS}])
    rows = batch_of(path, paths[template], hf_cfg, tmp_path, train_on="last_assistant")
    assert first_doc(rows) == expected(tok, RENDERED, marks((HEAD + TURN1 + TOOL, 0), (TURN2, 1)))
    flagged = [dict(m) for m in SESSION]
    flagged[1]["train"], flagged[2]["train"] = (
        True,
        False,
    )  # the user turn (all of it) trains, the first answer not
    path = write(tmp_path / "f.jsonl", [{"messages": flagged, "tools": TOOLS}])
    user = HEAD[10:15]
    want = marks((HEAD[:10], 0), (user, 1), (HEAD[15:] + TURN1 + TOOL, 0), (TURN2, 1))
    assert first_doc(batch_of(path, paths[template], hf_cfg, tmp_path)) == expected(
        tok, RENDERED, want
    )


def test_prompt_completion_trains_the_completion(toks, hf_cfg, tmp_path):
    paths, tok = toks
    path = write(tmp_path / "pc.jsonl", [{"prompt": "w1 w2 w3", "completion": "w4 w5"}])
    names = ["w1", "w2", "w3", "w4", "w5"]
    assert first_doc(batch_of(path, paths["plain"], hf_cfg, tmp_path)) == expected(
        tok, names, [0, 0, 0, 1, 1]
    )
    everything = batch_of(path, paths["plain"], hf_cfg, tmp_path, train_on="all")
    assert first_doc(everything) == expected(tok, names, [1] * 5)


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_conversational_prompt_completion_is_a_session_whose_completion_trains(
    toks, hf_cfg, tmp_path, source
):
    """TRL's conversational form (prompt and completion as lists of messages): the completion's
    assistant turn trains, the prompt's does not; its tool output never."""
    paths, tok = toks
    prompt = [
        {"role": "user", "content": "w3 w4"},
        {"role": "assistant", "content": "w1"},
        {"role": "user", "content": "w2"},
    ]
    completion = [
        {"role": "assistant", "content": "w5", "tool_calls": [CALL]},
        {"role": "tool", "content": "w7"},
        {"role": "assistant", "content": "w9 w10"},
    ]
    row = {"prompt": prompt, "completion": completion}
    if source == "jsonl":
        path = write(tmp_path / "pc.jsonl", [row])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = str(tmp_path / "pc.parquet")
        pq.write_table(pa.Table.from_pylist([row]), path)
    names = (
        [S, "user", "w3", "w4", E, S, "assistant", "w1", E, S, "user", "w2", E, S, "assistant"]
        + TURN1
        + [S, "tool", "w7", E, S, "assistant"]
        + TURN2
    )
    assert first_doc(batch_of(path, paths["gen"], hf_cfg, tmp_path)) == expected(
        tok,
        names,
        marks((names[:15], 0), (TURN1, 1), (TOOL[:1] + ["tool", "w7"] + TOOL[4:], 0), (TURN2, 1)),
    )


@pytest.mark.parametrize("key", ["labels", "completion_mask"])
def test_token_rows_train_where_their_labels_say(toks, hf_cfg, tmp_path, key):
    paths, _ = toks
    ids = [[10, 11, 12, 13], [20, 21, 22]]
    given = {
        "labels": [[-100, -100, 12, 13], [20, 21, -100]],
        "completion_mask": [[0, 0, 1, 1], [1, 1, 0]],
    }[key]
    path = write(tmp_path / "ids.jsonl", [{"input_ids": i, key: g} for i, g in zip(ids, given)])
    batch = batch_of(path, None, hf_cfg, tmp_path).get(0, 1, 0, 1)
    # EOS (2) appended: it trains after a trained last token only; then padding
    want = [-100, -100, 12, 13, 2] + [20, 21, -100, -100] + [-100] * (L - 9)
    assert batch.labels[0].tolist() == want
    assert batch.input_ids[0, :9].tolist() == [10, 11, 12, 13, 2, 20, 21, 22, 2]


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_token_rows_honour_labels_and_masks_together_and_leave_padding_out(
    hf_cfg, tmp_path, source
):
    """A token trains where its label is not -100 and every 0/1 mask holds 1 (none is dropped);
    attention_mask 0 is padding: not in the document at all."""
    rows = [
        {
            "input_ids": [10, 11, 12, 13, 0, 0],
            "labels": [10, 11, -100, 13, 0, 0],
            "completion_mask": [0, 1, 1, 1, 1, 1],
            "attention_mask": [1, 1, 1, 1, 0, 0],
        }
    ]
    if source == "jsonl":
        path = write(tmp_path / "ids.jsonl", rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = str(tmp_path / "ids.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    batch = batch_of(path, None, hf_cfg, tmp_path).get(0, 1, 0, 1)
    assert batch.input_ids[0, :5].tolist() == [
        10,
        11,
        12,
        13,
        2,
    ]  # EOS (2) after the last real token
    assert (
        batch.labels[0, :5].tolist() == [-100, 11, -100, 13, 2]
        and (batch.labels[0, 5:] == IGNORE_INDEX).all()
    )


def test_a_row_that_ends_with_eos_gets_no_second_one(hf_cfg, tmp_path, caplog):
    path = write(
        tmp_path / "ids.jsonl",
        [
            {"input_ids": [10, 11, 2], "labels": [-100, 11, 2]},
            {"input_ids": [20, 21], "labels": [-100, 21]},
        ],
    )
    with caplog.at_level("INFO", logger="ds_longctx"):
        batch = batch_of(path, None, hf_cfg, tmp_path, truncate="head").get(0, 1, 0, 1)
    assert "cut to their first" not in caplog.text  # no token was cut
    assert batch.input_ids[0, :6].tolist() == [10, 11, 2, 20, 21, 2]
    assert batch.labels[0, :7].tolist() == [-100, 11, 2, -100, 21, 2, -100]


def test_two_sessions_packed_in_one_row_keep_their_masks_and_boundaries(toks, hf_cfg, tmp_path):
    paths, tok = toks
    short = [{"role": "user", "content": "w3"}, {"role": "assistant", "content": "w4 w5"}]
    path = write(
        tmp_path / "two.jsonl", [{"messages": SESSION, "tools": TOOLS}, {"messages": short}]
    )
    rows = batch_of(path, paths["gen"], hf_cfg, tmp_path)
    assert rows.n_rows == 1
    a = expected(tok, RENDERED, marks((HEAD, 0), (TURN1, 1), (TOOL, 0), (TURN2, 1)))
    b = expected(
        tok, [S, "user", "w3", E, S, "assistant", "w4", "w5", E], [0, 0, 0, 0, 0, 0, 1, 1, 1]
    )
    n = len(a[0]) + len(b[0])
    batch = rows.get(0, 1, 0, 1)
    assert (
        batch.input_ids[0, :n].tolist() == a[0] + b[0]
        and batch.labels[0, :n].tolist() == a[1] + b[1]
    )
    assert batch.position_ids[0, :n].tolist() == list(range(len(a[0]))) + list(range(len(b[0])))
    assert (batch.labels[0, n:] == IGNORE_INDEX).all()


def test_windows_of_a_split_session_that_train_nothing_are_counted(toks, hf_cfg, tmp_path, caplog):
    """A session of 166 tokens (a long tool result in the middle) split into windows of 64: the log
    counts the windows whose labels (less their first, no target) are all ignored, as the reference
    labels written here say, and as many documents of the packed rows train nothing."""
    paths, tok = toks
    session = [
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": "w2"},
        {"role": "tool", "content": " ".join(["w7"] * 150)},
        {"role": "assistant", "content": "w3"},
    ]
    short = [{"role": "user", "content": "w4"}, {"role": "assistant", "content": "w5"}]
    path = write(tmp_path / "long.jsonl", [{"messages": session}, {"messages": short}])
    with caplog.at_level("INFO", logger="ds_longctx"):
        rows = batch_of(path, paths["gen"], hf_cfg, tmp_path)
    names = (
        [S, "user", "w1", E, S, "assistant", "w2", E, S, "tool"]
        + ["w7"] * 150
        + [E, S, "assistant", "w3", E]
    )
    _, labels = expected(
        tok, names, marks((names[:6], 0), (names[6:8], 1), (names[8:-2], 0), (names[-2:], 1))
    )
    windows = [labels[k : k + L] for k in range(0, len(labels), L)]
    empty = sum(all(v == IGNORE_INDEX for v in w[1:]) for w in windows)
    assert (len(labels), len(windows), empty) == (166, 3, 1)
    assert untrained_windows(130, [64], L) == (3, 3) and untrained_windows(130, [65], L) == (
        3,
        2,
    )  # a first: no target
    assert (
        f"; {empty} of the {len(windows)} windows of the 1 documents longer than seq_len={L} "
        "(data.truncate: "
        f"split) hold no trained token and train nothing" in caplog.text
    )
    untrained = 0
    for r in range(rows.n_rows):
        ids, pos, lab = rows.row(r)
        starts = [0] if pos is None else (pos == 0).nonzero().flatten().tolist()
        for a, b in zip(starts, starts[1:] + [L]):
            real = (ids[a:b] != rows.pad_id).any()
            untrained += bool(real and (lab[a + 1 : b] == IGNORE_INDEX).all())
    assert untrained == empty
    with caplog.at_level("INFO", logger="ds_longctx"):
        caplog.clear()
        batch_of(path, paths["gen"], hf_cfg, tmp_path, truncate="head")
    assert (
        "trained tokens per document" in caplog.text and "hold no trained token" not in caplog.text
    )


BAD = {  # name: (the bad second row, its tokenizer, extra config, what the refusal says)
    "no role": ({"messages": [{"content": "w1"}]}, "gen", {}, "message 0 has no 'role'"),
    "unknown role": (
        {"messages": [{"role": "robot", "content": "w1"}]},
        "gen",
        {},
        "has role 'robot'; use one of",
    ),
    "tool_calls not a list": (
        {"messages": [{"role": "assistant", "content": "w1", "tool_calls": CALL}]},
        "gen",
        {},
        "'tool_calls' is not a list",
    ),
    "image part": (
        {"messages": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]}]},
        "gen",
        {},
        "message 0: content part 0 is not text ('image'): a text model reads only",
    ),
    "arguments not JSON": (
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "w1",
                    "tool_calls": [{"function": {"name": "w50", "arguments": "{x: 1"}}],
                }
            ]
        },
        "gen",
        {},
        "message 0, tool call 0: 'arguments' is a string that is not a JSON object ('{x: 1')",
    ),
    "template fails": (
        {"messages": SESSION},
        "fails",
        {},
        "failed to render this session (TemplateError: no tool",
    ),
    "rewrites turns": (
        {
            "messages": [
                {"role": "user", "content": "w1"},
                {"role": "assistant", "content": "<think> w2 </think> w3"},
                {"role": "user", "content": "w4"},
                {"role": "assistant", "content": "w5"},
            ]
        },
        "rewrites",
        {},
        "rewrites earlier turns",
    ),
    "nothing trains after cutting": (
        {
            "messages": [
                {"role": "system", "content": " ".join(["w1"] * 70)},
                {"role": "user", "content": "w2"},
                {"role": "assistant", "content": "w3"},
            ]
        },
        "gen",
        {"truncate": "head"},
        "no token trains after cutting to seq_len=64 (head)",
    ),
    "longer than seq_len": (
        {
            "messages": [
                {"role": "user", "content": " ".join(["w1"] * 70)},
                {"role": "assistant", "content": "w3"},
            ]
        },
        "gen",
        {"truncate": "refuse"},
        "a document of 78 tokens is longer than seq_len=64 and data.truncate is refuse",
    ),  # 77+EOS
    "label out of vocabulary": (
        {"input_ids": [5, 6], "labels": [5, 9999]},
        None,
        {},
        "'labels' holds 9999",
    ),
    "a text row among chat rows": (
        {"text": "w1 w2"},
        "gen",
        {},
        "a text row (its keys: ['text']) among messages rows (the first row's format",
    ),
    "id out of vocabulary": (
        {"input_ids": [5, 9999], "labels": [5, 6]},
        None,
        {},
        "'input_ids' holds token id 9999 at position 1, >= the model's vocab_size=512",
    ),
    "no tokens": (
        {"input_ids": [], "labels": []},
        None,
        {},
        "the row holds no tokens: nothing to learn from",
    ),
    "negative id": (
        {"input_ids": [5, -1], "labels": [5, 6]},
        None,
        {},
        "'input_ids' holds token id -1 at position 1, < 0",
    ),
    "a mask the first row has not": (
        {"input_ids": [5, 6], "labels": [5, 6], "completion_mask": [0, 1]},
        None,
        {},
        "'completion_mask' here but not in the first row (its labels and masks: labels)",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_rows_are_refused_naming_file_and_line(toks, hf_cfg, tmp_path, name):
    paths, _ = toks
    row, tok, extra, says = BAD[name]
    good = (
        {"input_ids": [5, 6, 7], "labels": [5, 6, 7]}
        if "input_ids" in row
        else {
            "messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
        }
    )
    path = write(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(DataError) as e:
        batch_of(path, paths[tok] if tok else None, hf_cfg, tmp_path, **extra)
    assert str(e.value).startswith(f"data file {path!r} line 2") and says in str(e.value), str(
        e.value
    )
    if name in ("template fails", "rewrites turns"):  # skipped and counted instead
        rows = batch_of(path, paths[tok], hf_cfg, tmp_path, skip_bad_rows=True, **extra)
        assert rows.skipped_rows == 1
    if name == "rewrites turns":  # nothing to tell apart: train_on all renders it as it is
        assert batch_of(path, paths[tok], hf_cfg, tmp_path, train_on="all").n_tokens > 0


def test_train_on_that_does_not_fit_the_rows_is_refused(toks, hf_cfg, tmp_path):
    paths, _ = toks
    path = write(tmp_path / "pc.jsonl", [{"prompt": "w1", "completion": "w2"}])
    with pytest.raises(
        DataError, match="train_on='last_assistant' does not apply to prompt_completion rows"
    ):
        batch_of(path, paths["gen"], hf_cfg, tmp_path, train_on="last_assistant")
    with pytest.raises(DataError, match="truncate='head' with data_layout='concat'"):
        batch_of(path, paths["gen"], hf_cfg, tmp_path, data_layout="concat", truncate="head")


@pytest.mark.slow
def test_sessions_train_end_to_end_on_their_trained_targets_only(toks, hf_cfg, tmp_path):
    """`ds-longctx train` on 2 processes (SP=2), sessions packed by default: exit 0, and each step's
    trained_tokens is the count of targets whose label trains inside one session, counted here from
    the rows."""
    from tests.helpers import read_metrics, run_cli

    paths, _ = toks
    short = [{"role": "user", "content": "w3"}, {"role": "assistant", "content": "w4 w5"}]
    s, t = {"messages": SESSION, "tools": TOOLS}, {"messages": short}
    sessions = [s, t, t, s, t]  # packed: rows of (s, t, t) and (s, t): unequal trained tokens
    path = write(tmp_path / "sessions.jsonl", sessions)
    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--model",
            "qwen3-tiny",
            "--seq_len",
            str(L),
            "--dtype",
            "fp32",
            "--data",
            path,
            "--tokenizer",
            paths["gen"],
            "--steps",
            "2",
            "--data_cache_dir",
            str(tmp_path / "cache"),
            "--report_to",
            "none",
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "data layout: pack (the default for messages rows" in res.stderr
    )  # data_layout left at its default
    rows = batch_of(path, paths["gen"], hf_cfg, tmp_path, shuffle=True)
    want = []
    for step in range(2):
        b = rows.get(step, 1, 0, 1)
        labels, pos = (
            b.labels[0].tolist(),
            (b.position_ids[0] if b.position_ids is not None else torch.arange(L)),
        )
        want.append(
            sum(1 for i in range(L - 1) if labels[i + 1] != IGNORE_INDEX and pos[i + 1] != 0)
        )
    # a session trains 10 targets (its two turns and EOS), a short one 4
    assert [m["trained_tokens"] for m in read_metrics(out)] == want and sorted(want) == [14, 18], (
        want
    )


def test_a_parquet_session_gives_the_labels_of_its_jsonl_twin(toks, hf_cfg, tmp_path):
    """Arrow gives every message every key, and one call's arguments another's (null where absent):
    the same labels
    as the JSON lines, no null argument written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths, tok = toks
    tools = [{"type": "function", "function": {"name": "w50", "parameters": {"type": "object"}}}]
    other = [
        {"role": "user", "content": "w3"},
        {
            "role": "assistant",
            "content": "w4",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "w51", "arguments": {"y": "w8", "z": "w9"}},
                }
            ],
        },
    ]
    sessions = [{"messages": SESSION, "tools": tools}, {"messages": other, "tools": tools}]
    pq.write_table(pa.Table.from_pylist(sessions), str(tmp_path / "s.parquet"))
    rows = batch_of(str(tmp_path / "s.parquet"), paths["plain"], hf_cfg, tmp_path)
    assert first_doc(rows) == expected(
        tok, RENDERED, marks((HEAD, 0), (TURN1, 1), (TOOL, 0), (TURN2, 1))
    )
    twin = batch_of(write(tmp_path / "s.jsonl", sessions), paths["plain"], hf_cfg, tmp_path)
    assert torch.equal(rows.get(0, 1, 0, 1).labels, twin.get(0, 1, 0, 1).labels)


def test_a_chat_file_shorter_than_seq_len_is_packed_by_default_and_falls_back_where_pack_cannot_run(
    toks, hf_cfg, tmp_path, caplog
):
    """data_layout auto: messages rows are packed (concat refused one session shorter than seq_len:
    "fewer than one
    row"), said in the log; where pack cannot run (micro_batch 2, the CPU mask's limit) concat, said
    in one line."""
    from ds_longctx.parallel.attention import MAX_MASKED_TOKENS

    paths, tok = toks
    path = write(tmp_path / "one.jsonl", [{"messages": SESSION, "tools": TOOLS}])
    caplog.set_level("INFO", logger="ds_longctx")
    rows = batch_of(path, paths["gen"], hf_cfg, tmp_path, data_layout="auto")
    assert rows.layout == "pack" and rows.n_rows == 1
    assert first_doc(rows) == expected(
        tok, RENDERED, marks((HEAD, 0), (TURN1, 1), (TOOL, 0), (TURN2, 1))
    )
    assert "data layout: pack (the default for messages rows" in caplog.text
    for kw, why in (
        ({"micro_batch": 2}, "pack takes micro_batch=1, this run has 2"),
        ({"seq_len": 2 * MAX_MASKED_TOKENS}, "needs a varlen attention kernel (CUDA)"),
    ):
        caplog.clear()
        cfg = RunConfig(**{"data": path, "tokenizer": paths["gen"], "seq_len": L, **kw})
        with pytest.raises(DataError, match="fewer than one row|one step needs"):
            build_data(cfg, hf_cfg, 1)
        assert cfg.data.layout == "concat"
        (line,) = [r.getMessage() for r in caplog.records if "data layout" in r.getMessage()]
        assert (
            line.startswith("data layout: concat (not pack, the default for messages rows: ")
            and why in line
        )
