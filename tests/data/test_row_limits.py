"""A data row cannot hang nor stretch a run: its rendering has a time budget (data/budget.py) and a
refused row is named by file and line; a stop signal during the data work ends the run within
seconds with its line (run/stops.StopRequest.now)."""

import json
import signal
import time

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.data import DataError, budget, build_data
from ds_longctx.run.model import load_hf_config
from tests.corpus import make_chat_tokenizer

# 9e8 turns, no output
NESTED = "{% for i in range(30000) %}{% for j in range(30000) %}{% endfor %}{% endfor %}"
SESSION = {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]}


def test_a_template_with_nested_loops_is_refused_within_the_budget_by_file_and_line(
    tmp_path, monkeypatch
):
    tok = make_chat_tokenizer(tmp_path / "tok", NESTED)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(SESSION) + "\n")
    monkeypatch.setattr(budget, "ROW_BUDGET_S", 1.0)
    cfg = RunConfig(
        data=str(data), tokenizer=str(tok), seq_len=64, data_cache_dir=str(tmp_path / "cache")
    )
    started = time.monotonic()
    with pytest.raises(DataError) as e:
        build_data(cfg, load_hf_config("qwen3-tiny"), 1)
    assert (
        time.monotonic() - started < 6
    )  # the budget and the data's own set-up, not 9e8 loop turns
    assert str(e.value).startswith(
        f"data file {str(data)!r} line 1: rendering and tokenizing this row took over 1 s, "
        f"the budget of one row (data/budget.py)"
    ), str(e.value)
    assert (
        signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    )


def test_sigterm_while_tokenizing_ends_the_process_within_10_s_with_its_line(tmp_path):
    """A template that loops for minutes (under the default budget): SIGTERM once tokenization has
    started ends the process within 10 s, exit 143, its last line saying what it stopped and that
    nothing was trained or saved (what run/train_loop.build_run does around the data; the lock it
    holds is released)."""
    import sys

    from tests.helpers import sigterm_once

    tok = make_chat_tokenizer(tmp_path / "tok", NESTED)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(SESSION) + "\n")
    code = (
        "from ds_longctx.checkpoint.run_lock import RunLock\n"
        "from ds_longctx.config import RunConfig\nfrom ds_longctx.data import build_data\n"
        "from ds_longctx.run.model import load_hf_config\n"
        "from ds_longctx.run.stops import StopRequest\nsignals = StopRequest().install()\n"
        f"RunLock.acquire({str(tmp_path / 'out')!r})\n"
        f"cfg = RunConfig(data={str(data)!r}, tokenizer={str(tok)!r}, seq_len=64, "
        f"data_cache_dir={str(tmp_path / 'cache')!r})\n"
        "with signals.now('reading and tokenizing the data'):\n"
        "    print('tokenizing', flush=True)\n"
        "    build_data(cfg, load_hf_config('qwen3-tiny'), 1)\n"
    )
    log = tmp_path / "log"
    exit_code, took, lines = sigterm_once(
        [sys.executable, "-c", code], log, "tokenizing", settle=0.5
    )
    assert exit_code == 143 and took < 10, (exit_code, took, lines[-5:])
    assert lines[-1] == (
        "stopped by SIGTERM while reading and tokenizing the data: nothing trained, nothing saved"
    )
    assert (
        "stopping at the end of this step" not in log.read_text()
        and not (tmp_path / "out").exists()
    )


TURNS = '[{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]'


DEEP = (
    "nested deeper than the JSON reader goes (Python's recursion limit, about 1,000 levels); "
    "flatten it"
)


@pytest.mark.parametrize(
    "row, what",
    [
        (
            '{"messages": ' + TURNS + ', "train": true, "train": false}',
            "key train appears twice; keep one",
        ),
        ('{"messages": [], "messages": ' + TURNS + "}", "key messages appears twice; keep one"),
        (
            '{"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "role": '
            '"system", "content": "w2"}]}',
            "key messages[1].role appears twice; keep one",
        ),
        ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", DEEP),
    ],
)
def test_a_data_row_giving_a_key_twice_or_nested_past_the_reader_is_refused_by_file_and_line(
    tmp_path, row, what
):
    """JSON keeps the last of a doubled key silently; a data row, like a run config
    (parallel/json_keys.py), is refused naming the key's path, the file and the line (in a JSON
    lines file and in a .json array). A row nested past Python's JSON reader (a RecursionError) is
    refused the same way."""
    from ds_longctx.data.scan_source import scan_files

    good = json.dumps(SESSION)
    lines = tmp_path / "rows.jsonl"
    lines.write_text(f"{good}\n{row}\n")
    scan = scan_files("json", [str(lines)], "text")
    with pytest.raises(DataError) as e:
        scan.refuse_bad(skip=False, source=str(lines))
    assert str(e.value).startswith(
        f"data file {str(lines)!r} line 2 (byte {len(good) + 1}): {what}; fix that line in the file"
    ), str(e.value)
    array = tmp_path / "rows.json"
    array.write_text(f"[\n{good},\n{row}\n]\n")
    with pytest.raises(DataError) as e:
        scan_files("json", [str(array)], "text")
    assert str(e.value) == f"data file {str(array)!r} line 3: element 2 of the array: {what}"


@pytest.mark.parametrize(
    "row",
    [
        {**SESSION, "labels": [1, 2]},
        {"prompt": "w1", "completion": "w2", "completion_mask": [0, 1]},
    ],
)
def test_a_label_or_mask_column_beside_a_chat_or_prompt_row_is_refused_not_dropped(tmp_path, row):
    from ds_longctx.data.scan_source import scan_files

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError) as e:
        scan_files("json", [str(path)], "text").refuse_bad(skip=False, source=str(path))
    key = "labels" if "labels" in row else "completion_mask"
    assert str(e.value).startswith(
        f"data file {str(path)!r} line 1 (byte 0): {key!r} beside the "
    ), str(e.value)
    assert (
        "so it would be dropped; drop the key, or give token rows (input_ids with labels)"
        in str(e.value)
    )


def test_a_chat_row_too_large_for_seq_len_or_the_budget_is_refused_by_its_size_before_rendering(
    tmp_path, monkeypatch
):
    """A 60 kB chat row at line 2 (issue 61's 60 MB, scaled down): under truncate refuse with
    seq_len=64 it cannot fit (no token of the tokenizer stands for more than its longest, each byte
    of text at most 6 JSON bytes), so it is refused by file and line without being rendered; one
    just inside that bound is rendered (and then refused by its tokens). Under split, a row over
    ROW_BYTES_MAX is refused the same way."""
    from ds_longctx.data import chat
    from tests.corpus import chat_template

    tok_dir = make_chat_tokenizer(tmp_path / "tok", chat_template(True))
    longest = budget.token_bytes(__import__("transformers").AutoTokenizer.from_pretrained(tok_dir))
    rendered = []
    real = chat.session_tokens
    monkeypatch.setattr(
        chat,
        "session_tokens",
        lambda tok, msgs, *a: rendered.append(len(msgs)) or real(tok, msgs, *a),
    )

    def refusal(words: int, **kw) -> str:
        big = {
            "messages": [
                {"role": "user", "content": " ".join(["w1"] * words)},
                SESSION["messages"][1],
            ]
        }
        data = tmp_path / f"rows{words}.jsonl"
        data.write_text(json.dumps(SESSION) + "\n" + json.dumps(big, ensure_ascii=False) + "\n")
        rendered.clear()
        cfg = RunConfig(
            data=str(data),
            tokenizer=str(tok_dir),
            seq_len=64,
            data_layout="pack",
            data_cache_dir=str(tmp_path / f"cache{words}{kw}"),
            **kw,
        )
        with pytest.raises(DataError) as e:
            build_data(cfg, load_hf_config("qwen3-tiny"), 1)
        return str(e.value).removeprefix(f"data file {str(data)!r} line 2: ")

    bound = 64 * 6 * longest
    over = refusal(20_000, truncate="refuse")  # 60 kB of JSON, over the bound
    assert (
        bound < 60_000
        and over.startswith("this chat row is 60.1 kB, so at least ")
        and over.endswith(
            "over seq_len=64, which data.truncate: refuse refuses; refused before rendering; split "
            "it into sessions of at most 64 tokens, or set data.truncate: split; or set "
            "data.skip_bad_rows: true to skip such rows"
        )
    ), over
    assert rendered == [2]  # line 1 only
    inside = (bound - 150) // 3  # " w1" a word: the row's JSON just under the bound
    assert "refused before rendering" not in refusal(inside, truncate="refuse")
    assert rendered == [2, 2]
    monkeypatch.setattr(budget, "ROW_BYTES_MAX", 50_000)
    assert refusal(20_000).startswith(
        "this chat row is 60.1 kB, over the 50.0 kB one row may be (what its 120 s budget renders: "
        "data/budget.py), so it is refused before rendering; split it into shorter sessions"
    ) and rendered == [2]
