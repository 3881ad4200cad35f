"""Reading local files through (data/scan.py): a book-length first line is read whole; every bad row
and every bad file is refused naming the file, the line and the byte offset (computed here from the
bytes written), or, with data.skip_bad_rows, left out and counted; the rows read are exactly the
good documents' tokens."""

import json

import numpy as np
import pytest

from ds_longctx.config import RunConfig
from ds_longctx.data import build_data, check_data_source
from ds_longctx.data.scan import json_documents
from ds_longctx.data.synthetic import EOS
from ds_longctx.run.model import load_hf_config
from tests.corpus import SPECIALS, documents, make_tokenizer, token_ids, write_parquet
from tests.helpers import read_metrics, run_cli

L = 32
BOOK_WORD = (
    "w" + "x" * 99
)  # one vocabulary word of 100 characters: an 11 MB line of ~110k tokens tokenizes fast
BOOK_ID = len(SPECIALS) + 60


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("scan")
    return {
        "dir": d,
        "tok": str(make_tokenizer(d / "tok", extra=(BOOK_WORD,))),
        "cache": str(d / "cache"),
        "hf": load_hf_config("qwen3-tiny"),
    }


def write_lines(path, lines: list[str]) -> list[int]:
    """Write `lines` (each + newline) to `path`; the byte offset where each starts."""
    data = [line.encode() + b"\n" for line in lines]
    path.write_bytes(b"".join(data))
    return np.concatenate([[0], np.cumsum([len(x) for x in data])]).tolist()


def cfg_for(setup, path, **kw) -> RunConfig:
    return RunConfig(
        **{
            "data": str(path),
            "tokenizer": setup["tok"],
            "seq_len": L,
            "data_cache_dir": setup["cache"],
            "shuffle": False,
            **kw,
        }
    )


def refusal(setup, path, **kw) -> str:
    cfg = cfg_for(setup, path, **kw)
    with pytest.raises(ValueError) as e:
        check_data_source(cfg, 512)
        build_data(cfg, setup["hf"], 1)
    return str(e.value)


def stream_of(docs: list[list[int]]) -> list[int]:
    return [t for ids in docs for t in ids + [EOS]]


@pytest.fixture(scope="module")
def book(setup):
    """A JSONL whose line 1 is an 11 MB book (~110k tokens) and whose line 31 has no text field."""
    text = "w1 w2 " + " ".join([BOOK_WORD] * 110_000) + " w3"
    docs = [text] + documents(39, seed=5)
    lines = [json.dumps({"text": t}) for t in docs]
    lines[30] = json.dumps({"body": docs[30]})
    path = setup["dir"] / "book.jsonl"
    offsets = write_lines(path, lines)
    assert offsets[1] > 11_000_000
    good = [[5, 6] + [BOOK_ID] * 110_000 + [7]] + token_ids(docs[1:30] + docs[31:])
    return {"path": path, "offsets": offsets, "stream": stream_of(good)}


def test_a_row_without_the_field_is_refused_naming_its_line_and_byte(setup, book):
    """The old check parsed a 64 KiB prefix of line 1 as JSON and refused this file as 'line 1 is
    not JSON'."""
    msg = refusal(setup, book["path"])
    assert msg.startswith(
        f"data file {str(book['path'])!r} line 31 (byte {book['offsets'][30]}): no "
        f"text_field='text' key (its keys: ['body']): set text_field"
    ), msg
    assert "set data.skip_bad_rows: true" in msg


def test_skip_bad_rows_reads_the_11_mb_line_whole_and_leaves_the_bad_row_out(setup, book):
    rows = build_data(cfg_for(setup, book["path"], skip_bad_rows=True), setup["hf"], 1)
    want = book["stream"]
    assert rows.skipped_rows == 1 and rows.n_tokens == len(want) and rows.n_rows == len(want) // L
    for r in (
        0,
        3437,
        rows.n_rows - 1,
    ):  # the book's start, its end with the next documents, the last row
        assert rows.row(r)[0].tolist() == want[r * L : (r + 1) * L]


def test_ds_longctx_train_refuses_line_31_last_and_trains_with_skip_bad_rows(
    setup, book, tmp_path, capsys
):
    """The command: without skip_bad_rows it exits 2 before any worker (its precheck, run here
    in-process), the line printed last naming the file and line 31; with it the run trains (a real
    `ds-longctx train`, whose tokens come from the cache the test above filled) and metrics.jsonl
    reports the one skipped row."""
    from ds_longctx import cli

    out = tmp_path / "run"
    args = [
        "train",
        "--nproc",
        "1",
        "--model",
        "qwen3-tiny",
        "--dtype",
        "fp32",
        "--seq_len",
        str(L),
        "--steps",
        "2",
        "--shuffle",
        "false",
        "--data",
        str(book["path"]),
        "--tokenizer",
        setup["tok"],
        "--data_cache_dir",
        setup["cache"],
        "--output_dir",
        str(out),
    ]
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2 and last.startswith(
        f"refused before start: data file {str(book['path'])!r} line "
        f"31 (byte {book['offsets'][30]}): no text_field='text' key"
    )
    assert not out.exists()
    res = run_cli(args + ["--skip_bad_rows", "true"], timeout=300, output_dir=out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "skipping 1 bad row(s) of 40 (data.skip_bad_rows): book.jsonl:31: no text_field='text' key"
        in res.stderr
    )
    assert "tokenize:" not in res.stderr  # read from the cache: no tokenize progress bar
    lines = read_metrics(out)
    assert [m["step"] for m in lines] == [1, 2] and all(m["skipped_rows"] == 1 for m in lines)
    assert all(np.isfinite(m["loss"]) for m in lines)


def test_a_malformed_line_at_row_200_is_refused_naming_its_byte(setup):
    lines = [json.dumps({"text": t}) for t in documents(250, seed=6)]
    lines[199] = lines[199][:-9]  # cut short
    path = setup["dir"] / "malformed.jsonl"
    offsets = write_lines(path, lines)
    msg = refusal(setup, path)
    opens = lines[199].index(': "') + 2  # the string that never ends (ASCII: characters are bytes)
    assert msg.startswith(
        f"data file {str(path)!r} line 200 (byte {offsets[199] + opens}): not JSON (Unterminated "
        f"string starting at character {opens + 1}; cut short?)"
    ), msg
    assert "cut short?" in msg and "fix that line in the file" in msg


def test_a_non_utf8_byte_past_64_kib_is_refused_naming_its_offset(setup):
    docs = documents(2000, seed=7)
    lines = [json.dumps({"text": t}) for t in docs]
    offsets = write_lines(setup["dir"] / "ok.jsonl", lines)
    k = next(i for i, o in enumerate(offsets) if o > 70_000)
    data = bytearray((setup["dir"] / "ok.jsonl").read_bytes())
    at = offsets[k] + 12  # inside the text of line k + 1
    data[at] = 0xE9
    jsonl, txt = setup["dir"] / "latin1.jsonl", setup["dir"] / "latin1.txt"
    jsonl.write_bytes(bytes(data))
    txt.write_bytes(bytes(data))
    assert at > 65_536
    msg = refusal(setup, jsonl)
    assert msg.startswith(
        f"data file {str(jsonl)!r} line {k + 1} (byte {at}): byte 0xe9 is not UTF-8"
    ), msg
    msg = refusal(setup, txt)
    assert msg.startswith(
        f"data file {str(txt)!r} line {k + 1} (byte {at}): byte 0xe9 is not UTF-8 text; convert it "
        f"to UTF-8"
    ), msg


def test_integer_text_values_are_refused_in_their_own_words(setup):
    path = setup["dir"] / "ints.jsonl"
    write_lines(path, [json.dumps({"text": i}) for i in range(5)])
    msg = refusal(setup, path)
    assert msg.startswith(
        f"data file {str(path)!r} line 1 (byte 0): 'text' is a JSON number (0), not a string: "
        f"write the text as a JSON string"
    ), msg
    assert msg.endswith(
        "(5 of 5 rows are bad, also ints.jsonl:2, ints.jsonl:3, ints.jsonl:4, ints.jsonl:5)"
    )
    msg = refusal(setup, path, skip_bad_rows=True)
    assert "all 5 rows are bad, nothing is left to train on" in msg


def test_a_bom_and_crlf_lines_read_as_plain_lines_and_a_lone_surrogate_is_refused_by_line(setup):
    """A UTF-8 BOM and Windows line ends give the same rows; JSON's \\ud800 without its pair is no
    text (Arrow and the tokenizer failed on it, naming no line), its pair (an emoji) is."""
    docs = documents(6, seed=8)
    windows = setup["dir"] / "windows.jsonl"
    windows.write_bytes(
        b"\xef\xbb\xbf" + b"".join(json.dumps({"text": t}).encode() + b"\r\n" for t in docs)
    )
    assert list(json_documents([str(windows)], "text", "text")) == [{"text": t} for t in docs]
    assert check_data_source(cfg_for(setup, windows), 512) is None
    path = setup["dir"] / "surrogate.jsonl"
    offsets = write_lines(path, ['{"text": "w1 \\ud83d\\ude00 w2"}', '{"text": "w1 \\ud800 w2"}'])
    assert refusal(setup, path).startswith(
        f"data file {str(path)!r} line 2 (byte {offsets[1]}): 'text' holds a lone "
        f"UTF-16 surrogate (\\ud800, an escape without its pair)"
    )


def test_a_tokenizer_directory_as_data_is_refused_in_its_own_words(setup):
    from pathlib import Path

    saved = sorted(
        f.name for f in Path(setup["tok"]).iterdir() if f.name.startswith(("tokenizer", "special"))
    )
    msg = refusal(setup, setup["tok"])
    assert msg.startswith(
        f"data={setup['tok']!r} is a tokenizer ({', '.join(saved)}), not documents; pass it as "
        f"tokenizer: and point data at your .jsonl/.txt/.parquet corpus"
    ), msg
    msg = refusal(setup, str(Path(setup["tok"]) / "tokenizer.json"))
    assert "is a tokenizer (tokenizer.json), not documents" in msg


def test_a_json_array_names_its_bad_element(setup):
    docs = documents(6, seed=8)
    items = [{"text": t} for t in docs]
    items[3] = {"text": None}
    path = setup["dir"] / "array.json"
    body = "[\n" + ",\n".join(json.dumps(x) for x in items) + "\n]\n"
    path.write_text(body)
    msg = refusal(setup, path)
    at = len(body[: body.index('{"text": null}')].encode())
    assert msg.startswith(
        f"data file {str(path)!r} element 4 (byte {at}): 'text' is a JSON null (null), not a string"
    ), msg
    rows = build_data(cfg_for(setup, path, skip_bad_rows=True), setup["hf"], 1)
    assert rows.skipped_rows == 1 and rows.n_tokens == len(
        stream_of(token_ids(docs[:3] + docs[4:]))
    )


def test_parquet_null_text_is_refused_or_left_out(setup):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents(8, seed=9)
    path = setup["dir"] / "nulls.parquet"
    pq.write_table(pa.table({"text": docs[:2] + [None] + docs[3:]}), str(path))
    msg = refusal(setup, path)
    assert msg.startswith(
        f"data file {str(path)!r} row 3: 'text' is null: no text; fix that row in the file"
    ), msg
    rows = build_data(cfg_for(setup, path, skip_bad_rows=True), setup["hf"], 1)
    assert rows.skipped_rows == 1 and rows.n_tokens == len(
        stream_of(token_ids(docs[:2] + docs[3:]))
    )
    ints = setup["dir"] / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), str(ints))
    assert "column 'text' is int64, not text" in refusal(setup, ints)
    write_parquet(
        setup["dir"] / "fine.parquet", docs
    )  # the same documents without the null: no refusal
    check_data_source(cfg_for(setup, setup["dir"] / "fine.parquet"), 512)


def test_token_id_rows_need_lists_of_ints(setup):
    path = setup["dir"] / "ids.jsonl"
    offsets = write_lines(
        path,
        [
            json.dumps({"input_ids": [5, 6, 7]}),
            json.dumps({"input_ids": "5 6"}),
            json.dumps({"input_ids": [8, 9]}),
        ],
    )
    msg = refusal(setup, path, tokenizer=None)
    assert msg.startswith(
        f"data file {str(path)!r} line 2 (byte {offsets[1]}): 'input_ids' is not a list of ints"
    ), msg
    rows = build_data(
        cfg_for(setup, path, tokenizer=None, skip_bad_rows=True, seq_len=4), setup["hf"], 1
    )
    assert rows.skipped_rows == 1 and rows.n_tokens == len([5, 6, 7, EOS, 8, 9, EOS])


def test_a_hub_splits_null_or_non_text_column_is_refused_or_left_out(setup):
    """Hub data is checked once loaded (no file to read through first): the same rules on its
    column."""
    import datasets

    from ds_longctx.data.sources import _drop_null_rows

    cfg = cfg_for(setup, setup["dir"] / "x.jsonl")  # not read: only data's settings are used
    ds = datasets.Dataset.from_dict({"text": ["w1 w2", None, "w3", None]})
    with pytest.raises(
        ValueError, match=r"2 of 4 rows have no text \(null 'text'\): row 2; row 4; drop those rows"
    ):
        _drop_null_rows(ds, cfg, None)
    kept = _drop_null_rows(
        ds,
        cfg.model_copy(update={"data": cfg.data.model_copy(update={"skip_bad_rows": True})}),
        None,
    )
    assert kept.skipped_rows == 2 and kept.ds["text"] == ["w1 w2", "w3"]
    with pytest.raises(ValueError, match="column 'text' holds int64, not text"):
        _drop_null_rows(datasets.Dataset.from_dict({"text": [1, 2]}), cfg, None)
