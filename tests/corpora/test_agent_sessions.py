"""`ds-longctx data prepare --sessions` on a few small stdlib modules: the same seed gives the same
bytes; every tool result is the file (listing, search) it says; every answer quotes a fact of its
evidence message, at the distance recorded, recomputed here from the whole session's tokens;
ds_longctx's own data pipeline trains exactly the tokens HF's assistant mask marks (never tool
output); the card's windows that train nothing are the mask's; bad options are refused with exit 2;
a tiny model trains on them."""

import ast
import json
import sysconfig
import tokenize
from pathlib import Path

import pytest

from tests.helpers import read_metrics, run_cli

# small modules in every CPython 3.x: ~200 KB of code, ~80k tokens with a 512-id BPE
ONLY = (
    "abc,bisect,colorsys,copy,dbm,fnmatch,getopt,glob,heapq,hmac,json,keyword,reprlib,sched,shlex,sqlite3,stat,"
    "textwrap"
)
SMALL = ["--only", ONLY, "--min_tokens", "4096", "--max_tokens", "12000", "--sessions", "3"]
ROOT = Path(sysconfig.get_paths()["stdlib"])


def prepare(out: Path, *extra) -> Path:
    """Sessions of SMALL (a 512-id BPE, or a corpus's tokenizer) into `out`."""
    from ds_longctx.corpora.prepare import main

    vocab = [] if "--corpus" in extra or "--tokenizer" in extra else ["--vocab_size", "512"]
    assert main(["prepare", "--out", str(out), *SMALL, *vocab, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("sessions") / "s")


@pytest.fixture(scope="module")
def tok(sessions):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sessions / "tokenizer"), local_files_only=True)


def rows_of(d: Path) -> list:
    return [json.loads(line) for line in (d / "train.jsonl").read_text().splitlines()]


def files_of(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def calls(row) -> list:
    """(tool message index, tool name, arguments) of every tool result of a session."""
    out = []
    for i, m in enumerate(row["messages"]):
        if m["role"] == "tool":
            fn = row["messages"][i - 1]["tool_calls"][0]["function"]
            out.append((i, fn["name"], fn["arguments"]))
    return out


def test_the_same_seed_gives_the_same_bytes_another_seed_other_sessions(sessions, tmp_path):
    again = prepare(tmp_path / "again")
    assert files_of(again) == files_of(sessions)
    other = prepare(tmp_path / "other", "--seed", "1")
    assert rows_of(other) != rows_of(sessions)


def test_tool_results_are_the_corpus_files(sessions):
    for row in rows_of(sessions):
        reads = [a["path"] for _, name, a in calls(row) if name == "read_file"]
        assert len(reads) == len(set(reads)) and reads, reads  # each file read once
        for i, name, args in calls(row):
            got = row["messages"][i]["content"]
            if name == "read_file":
                assert got == tokenize.open(ROOT / args["path"]).read()
            elif name == "list_files":
                assert got.splitlines() and all(
                    p.startswith(args["path"] + "/") and (ROOT / p).is_file()
                    for p in got.splitlines()
                )
            else:
                for line in got.splitlines():
                    if line.startswith("... "):
                        continue
                    path, n, text = line.split(":", 2)
                    assert (
                        tokenize.open(ROOT / path).read().split("\n")[int(n) - 1].strip()
                        == text.strip()
                    )
                    assert args["pattern"] in text


def content_starts(tok, row) -> tuple:
    """(the whole rendering, [the character where message k's content starts in it])."""
    msgs, tools = row["messages"], row["tools"]
    whole = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    starts = [None]
    for k, m in enumerate(msgs[1:], 1):
        at = len(tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False)) + len(
            f"<|im_start|>{m['role']}\n"
        )
        assert whole[at : at + len(m["content"])] == m["content"]
        starts.append(at)
    return whole, starts


def holds(fact: dict, evidence: str) -> bool:
    """Whether `evidence` (the tool message's text at the recorded characters) is the fact's."""
    if fact["kind"] != "params":
        return evidence == fact["value"]
    fn = ast.parse(evidence + "): pass").body[0]  # the signature, from `def` to its last parameter
    a = fn.args
    n = len(a.posonlyargs + a.args + a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return fn.name == fact["subject"].rsplit(".", 1)[-1] and str(n) == fact["value"]


def test_answers_quote_their_evidence_at_the_recorded_distance(sessions, tok):
    card = json.loads((sessions / "data_card.json").read_text())
    answers = 0
    for row in rows_of(sessions):
        msgs, meta = row["messages"], row["meta"]
        whole, starts = content_starts(tok, row)
        enc = tok(whole, add_special_tokens=False, return_offsets_mapping=True)
        assert len(enc["input_ids"]) == meta["tokens"] and 4096 <= meta["tokens"] <= 12000

        def token_of(char: int) -> int:
            return next(t for t, (s, e) in enumerate(enc["offset_mapping"]) if s <= char < e)

        read_at = {a["path"]: i for i, name, a in calls(row) if name == "read_file"}
        for f in meta["answers"]:
            answer, evidence = msgs[f["message"]], msgs[f["evidence_message"]]
            assert answer["role"] == "assistant" and "tool_calls" not in answer
            assert read_at[f["path"]] == f["evidence_message"] and evidence["role"] == "tool"
            a, b = f["evidence_chars"]
            assert holds(f, evidence["content"][a:b]), (f, evidence["content"][a:b])
            question = msgs[f["message"] - 1]["content"]
            assert f["path"] in question and f["subject"] in question
            assert f["kind"] == "params" or f["value"] not in question
            assert answer["content"][slice(*f["answer_chars"])] == f["value"]
            distance = token_of(starts[f["message"]]) - token_of(
                starts[f["evidence_message"]] + b - 1
            )
            assert f["distance_tokens"] == distance >= 512, f
            answers += 1
    assert answers == card["answers"]["count"] > 0


def documents(rows) -> list:
    """Each document of packed rows (positions restart at 0), the padding tail left out: [(ids,
    labels)]."""
    docs = []
    for r in range(rows.n_rows):
        ids, pos, labels = rows.row(r)
        starts = [0] if pos is None else [int(i) for i in (pos == 0).nonzero().flatten()]
        for a, b in zip(starts, starts[1:] + [len(ids)]):
            if not (labels[a:b] == -100).all() or (ids[a:b] != rows.pad_id).any():
                docs.append((ids[a:b].tolist(), labels[a:b].tolist()))
    return docs


def test_the_pipeline_trains_exactly_the_assistant_turns(sessions, tok, tmp_path):
    """build_data (train_on assistant) against HF's assistant mask on the same row: the reference.
    Tool output never trains; the card's trained tokens are the mask's."""
    from ds_longctx.config import RunConfig
    from ds_longctx.data import build_data
    from ds_longctx.run.model import load_hf_config

    cfg = RunConfig(
        **{
            "data": str(sessions),
            "tokenizer": str(sessions / "tokenizer"),
            "seq_len": 16384,
            "data_layout": "pack",
            "shuffle": False,
            "train_on": "assistant",
            "data_cache_dir": str(tmp_path / "cache"),
        }
    )
    docs = documents(build_data(cfg, load_hf_config("qwen3-tiny"), 1))
    rows = rows_of(sessions)
    assert len(docs) == len(rows)
    for (ids, labels), row in zip(docs, rows):
        hf = tok.apply_chat_template(
            row["messages"],
            tools=row["tools"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids == list(hf["input_ids"]) + [tok.eos_token_id]
        assert labels == [
            t if m else -100 for t, m in zip(hf["input_ids"], hf["assistant_masks"])
        ] + [-100]
        assert sum(hf["assistant_masks"]) == row["meta"]["trained_tokens"]
        whole, starts = content_starts(tok, row)
        enc = tok(whole, add_special_tokens=False, return_offsets_mapping=True)
        for k, m in enumerate(row["messages"]):
            if m["role"] == "tool":
                a, b = starts[k], starts[k] + len(m["content"])
                assert all(
                    labels[t] == -100
                    for t, (s, e) in enumerate(enc["offset_mapping"])
                    if e > a and s < b
                )


def test_the_card_counts_the_windows_that_train_nothing(sessions, tok, tmp_path, caplog):
    """Each session's trained_runs are the runs of HF's assistant mask; the card's windows of a
    split session with no trained token, per seq_len, are those of the reference labels (HF's mask,
    + EOS) cut here; the training log at seq_len 1024 says the card's count."""
    from ds_longctx.config import RunConfig
    from ds_longctx.data import build_data
    from ds_longctx.run.model import load_hf_config

    labels = []
    for row in rows_of(sessions):
        hf = tok.apply_chat_template(
            row["messages"],
            tools=row["tools"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        mask = list(hf["assistant_masks"]) + [0]  # the EOS training appends does not train here
        starts = [j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1])]
        ends = [j for j in range(1, len(mask)) if mask[j - 1] and not mask[j]]
        assert row["meta"]["trained_runs"] == [list(r) for r in zip(starts, ends)]
        labels.append(mask)
    card = json.loads((sessions / "data_card.json").read_text())["split_windows"]["by_seq_len"]
    assert [x["seq_len"] for x in card] == [1024, 2048, 4096, 8192]
    for x in card:
        n = x["seq_len"]
        cut = [[m[k : k + n] for k in range(0, len(m), n)] for m in labels if len(m) > n]
        assert x == {
            "seq_len": n,
            "sessions": len(cut),
            "windows": sum(map(len, cut)),
            "untrained": sum(not any(w[1:]) for c in cut for w in c),
        }
    assert 0 < card[0]["untrained"] < card[0]["windows"]
    assert (
        f"| 1,024 | 3 | {card[0]['windows']} | {card[0]['untrained']} |"
        in (sessions / "data_card.md").read_text()
    )
    cfg = RunConfig(
        **{
            "data": str(sessions),
            "tokenizer": str(sessions / "tokenizer"),
            "seq_len": 1024,
            "data_layout": "pack",
            "data_cache_dir": str(tmp_path / "cache"),
        }
    )
    with caplog.at_level("INFO", logger="ds_longctx"):
        build_data(cfg, load_hf_config("qwen3-tiny"), 1)
    assert (
        f"; {card[0]['untrained']} of the {card[0]['windows']} windows of the 3 documents longer "
        "than "
        f"seq_len=1024" in caplog.text
    )


def test_sessions_of_a_prepared_corpus_read_its_files_with_its_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from ds_longctx.corpora.prepare import main

    corpus = tmp_path / "corpus"
    assert (
        main(
            [
                "prepare",
                "--stdlib",
                "--out",
                str(corpus),
                "--only",
                ONLY,
                "--vocab_size",
                "400",
                "--eval_every",
                "2",
                "--eval_min_chars",
                "20000",
            ]
        )
        == 0
    )
    out = prepare(tmp_path / "s", "--corpus", str(corpus))
    docs = [
        json.loads(x)["text"]
        for split in ("train", "eval")
        for x in (corpus / f"{split}.jsonl").open()
    ]
    for row in rows_of(out):
        for i, name, args in calls(row):
            if (
                name == "read_file"
            ):  # the file as the corpus holds it: after its header, up to the next
                doc = next(t for t in docs if f"# file: {args['path']}\n" in t)
                body = doc.split(f"# file: {args['path']}\n")[1].split("\n# file: ")[0]
                assert row["messages"][i]["content"] in (body, body + "\n")
    assert (
        len(AutoTokenizer.from_pretrained(str(out / "tokenizer"))) == 400 + 4
    )  # the chat's specials added


@pytest.mark.parametrize(
    "bad,says",
    [
        (["--min_tokens", "100"], "--min_tokens 100 must be in [2048, "),
        (["--max_tokens", "4500"], "--max_tokens 4500 must be in [5120, "),
        (["--sessions", "0"], "--sessions 0: write at least 1 session"),
        (["--eval_every", "3"], "--eval_every 3 does not apply to --sessions; drop it"),
        (
            ["--vocab_size", "512", "--corpus", "nowhere"],
            "--vocab_size 512 with --corpus 'nowhere'",
        ),
        (
            ["--corpus", "nowhere"],
            "--corpus 'nowhere' is not a directory `ds-longctx data prepare --stdlib` wrote",
        ),
        (
            ["--vocab_size", "260"],
            "--vocab_size 260 must be > 263 (the bytes and the 7 special tokens)",
        ),
        (
            ["--vocab_size", "512", "--tokenizer", "x"],
            "--vocab_size 512 with --tokenizer 'x': the sessions use that",
        ),
        (
            ["--tokenizer", "nowhere"],
            "--tokenizer 'nowhere' holds no tokenizer transformers can load",
        ),
        (["--stdlib"], "data prepare needs one source"),
        (["--sessions", "x"], "argument --sessions: invalid int value: 'x'"),
        (
            ["--sessions", "1000000000"],
            "--sessions 1,000,000,000 of ~",
        ),  # then the memory it needs and has
    ],
)
def test_a_bad_option_is_refused_with_exit_2_before_anything_is_read(tmp_path, capsys, bad, says):
    from ds_longctx import cli

    with pytest.raises(SystemExit) as stopped:
        cli.main(["data", "prepare", "--out", str(tmp_path / "s"), *SMALL, *bad])
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2 and last.startswith(
        ("refused: ", "ds-longctx data prepare: error: ")
    ), last
    assert says in last, last
    assert list(tmp_path.iterdir()) == []


def test_sessions_in_a_given_tokenizer_are_the_sessions_of_its_ids(sessions, tmp_path, capsys):
    """--tokenizer DIR (a ChatML tokenizer: here the sessions' own) writes the sessions in its ids,
    no BPE trained: the same sessions byte for byte, and tokenizer/ is it with CHAT_TEMPLATE. A
    tokenizer without <|im_start|> and <|im_end|> as special tokens is refused in one line, nothing
    written."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from ds_longctx import cli
    from ds_longctx.corpora.session_chat import CHAT_TEMPLATE
    from ds_longctx.corpora.stdlib_corpus import train_tokenizer

    out = prepare(tmp_path / "again", "--tokenizer", str(sessions / "tokenizer"))
    assert (out / "train.jsonl").read_bytes() == (sessions / "train.jsonl").read_bytes()
    tokens = [(d / "tokenizer" / "tokenizer.json").read_bytes() for d in (out, sessions)]
    assert tokens[0] == tokens[1]
    assert json.loads((out / "data_card.json").read_text())["options"]["tokenizer"] == str(
        sessions / "tokenizer"
    )
    assert AutoTokenizer.from_pretrained(str(out / "tokenizer")).chat_template == CHAT_TEMPLATE
    plain = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(["def f(x):\n    return x\n"] * 4, 300)
    )
    plain.save_pretrained(str(tmp_path / "plain"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "data",
                "prepare",
                "--out",
                str(tmp_path / "s"),
                *SMALL,
                "--tokenizer",
                str(tmp_path / "plain"),
            ]
        )
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert (
        stopped.value.code == 2
        and "lacks the ChatML special tokens ['<|im_start|>', '<|im_end|>']" in last
    ), last
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def trained(sessions, tmp_path_factory):
    """`ds-longctx train` on the prepared directory as --data (its train.jsonl), 2 processes, SP=2,
    sessions cut into packed windows, 2 steps; the answer loss and recall of the first session
    before step 1 and after step 2, saved at step 2."""
    out = tmp_path_factory.mktemp("trained") / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--model",
            "qwen3-tiny",
            "--dtype",
            "fp32",
            "--steps",
            "2",
            "--seq_len",
            "2048",
            "--data",
            str(sessions),
            "--tokenizer",
            str(sessions / "tokenizer"),
            "--data_layout",
            "pack",
            "--data_cache_dir",
            str(out.parent / "cache"),
            "--report_to",
            "none",
            "--output_dir",
            str(out),
            "--eval_data",
            str(sessions),
            "--eval_rows",
            "1",
            "--eval_answer_loss",
            "true",
            "--eval_recall",
            "true",
            "--save_every",
            "2",
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_a_tiny_model_trains_on_the_sessions(sessions, tok, trained):
    """The run of `trained`; its answer loss by distance (whole sessions under SP=2) at step 0
    equals a plain HF model's (the same initial weights), and so do its recall rows (each answer's
    exact match from the argmax hits of the chunked loss under SP=2, the HF reference's from its
    full logits)."""
    out = trained
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [1, 2]
    lines = read_metrics(out, "answer_loss.jsonl")
    assert sorted({x["step"] for x in lines}) == [0, 2] and all(x["answers"] > 0 for x in lines)
    from ds_longctx.run.answer_loss import (
        answer_loss_both,
        control_spans,
        hf_losses,
        read_sessions,
        session_spans,
    )
    from tests.helpers import tiny_model

    rows = read_sessions(sessions)[:1]
    ref, _ = answer_loss_both(
        hf_losses(tiny_model().eval()), session_spans(tok, rows), 0, control_spans(tok, rows)
    )
    got = [x for x in lines if x["step"] == 0]
    for key in ("mean_loss", "mean_loss_without_evidence"):
        assert [x[key] for x in got] == pytest.approx([x[key] for x in ref], rel=1e-5)
    assert [(x["bucket"], x["answers"], x["tokens"]) for x in got] == [
        (x["bucket"], x["answers"], x["tokens"]) for x in ref
    ]
    each = read_metrics(
        out, "answer_loss_answers.jsonl"
    )  # the answers the bucket lines average, at both steps
    assert [x["step"] for x in each] == [0] * (n := sum(x["answers"] for x in got)) + [2] * n
    from ds_longctx.run.recall import recall_rows

    _, ref_each = answer_loss_both(
        hf_losses(tiny_model().eval()), session_spans(tok, rows), 0, control_spans(tok, rows)
    )
    want, _ = recall_rows(ref_each, model="qwen3-tiny", stage="trained", step=0, seq_len=2048)
    recall = read_metrics(out, "recall.jsonl")
    assert sorted({x["step"] for x in recall}) == [0, 2] and {x["stage"] for x in recall} == {
        "trained"
    }
    got = [x for x in recall if x["step"] == 0]
    assert [(x["bucket"], x["answers"], x["recall_exact_match"], x["seq_len"]) for x in got] == [
        (x["bucket"], x["answers"], x["recall_exact_match"], x["seq_len"]) for x in want
    ]
    for key in ("loss_with_evidence", "loss_without_evidence"):
        assert [x[key] for x in got] == pytest.approx([x[key] for x in want], rel=1e-5)
    assert [x["exact"] for x in read_metrics(out, "recall_answers.jsonl")[:n]] == [
        x["exact"] for x in ref_each
    ]


def test_ds_longctx_eval_of_the_checkpoint_gives_the_trainings_answer_loss(
    sessions, trained, tmp_path
):
    """`ds-longctx eval --answer_loss true --recall true` of the step-2 checkpoint writes training's
    step-2 answer_loss lines and recall rows (the same session, the same weights), beside its eval
    line."""
    res = run_cli(
        [
            "eval",
            "--checkpoint",
            str(trained),
            "--data",
            str(sessions),
            "--rows",
            "1",
            "--answer_loss",
            "true",
            "--recall",
            "true",
            "--out",
            str(tmp_path),
        ],
        timeout=300,
        output_dir=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = read_metrics(trained, "answer_loss.jsonl")
    want, untrained = (
        [x for x in lines if x["step"] == 2],
        [x["mean_loss"] for x in lines if x["step"] == 0],
    )
    got = read_metrics(tmp_path, "answer_loss.jsonl")
    assert [(x["step"], x["bucket"], x["answers"], x["tokens"]) for x in got] == [
        (x["step"], x["bucket"], x["answers"], x["tokens"]) for x in want
    ]
    for key in ("mean_loss", "mean_loss_without_evidence"):
        assert [x[key] for x in got] == pytest.approx([x[key] for x in want], rel=1e-6)
    assert [x["mean_loss"] for x in got] != pytest.approx(
        untrained, rel=1e-3
    )  # the step-2 weights were loaded
    assert all(x["checkpoint"].endswith("step2") and x["eval_data"] == str(sessions) for x in got)
    want_each = [x for x in read_metrics(trained, "answer_loss_answers.jsonl") if x["step"] == 2]
    got_each = read_metrics(tmp_path, "answer_loss_answers.jsonl")
    assert [(x["session"], x["message"], x["position"]) for x in got_each] == [
        (x["session"], x["message"], x["position"]) for x in want_each
    ]
    assert [x["loss"] for x in got_each] == pytest.approx([x["loss"] for x in want_each], rel=1e-6)
    assert [m["step"] for m in read_metrics(tmp_path)] == [2] and "answer loss of " in res.stdout
    want = [
        x for x in read_metrics(trained, "recall.jsonl") if x["step"] == 2
    ]  # --recall: training's rows
    got = read_metrics(tmp_path, "recall.jsonl")
    assert [
        (x["stage"], x["step"], x["bucket"], x["answers"], x["recall_exact_match"]) for x in got
    ] == [(x["stage"], x["step"], x["bucket"], x["answers"], x["recall_exact_match"]) for x in want]
    assert [x["loss_with_evidence"] for x in got] == pytest.approx(
        [x["loss_with_evidence"] for x in want], rel=1e-6
    )


def test_ds_longctx_eval_refuses_the_answer_loss_on_data_without_answers(
    sessions, trained, tmp_path, capsys, monkeypatch
):
    """Chat rows without meta.answers (the sessions, meta dropped): exit 2 before any worker, naming
    the data and the fix; train refuses synthetic eval data for it alike; without --answer_loss,
    eval does not inherit the run's eval_answer_loss (the launch, faked here, is reached)."""
    from ds_longctx import cli

    plain = tmp_path / "chat.jsonl"
    plain.write_text(
        "".join(
            json.dumps({k: v for k, v in r.items() if k != "meta"}) + "\n"
            for r in rows_of(sessions)
        )
    )
    with pytest.raises(SystemExit) as stopped:
        cli.main(
            ["eval", "--checkpoint", str(trained), "--data", str(plain), "--answer_loss", "true"]
        )
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2, last
    assert last == (
        f"refused before start: --answer_loss true: --data={str(plain)!r} holds no session with "
        f"meta.answers (the loss on answers needs them); give --data a `ds-longctx data prepare "
        f"--sessions` directory (or its train.jsonl), or drop --answer_loss true"
    )
    assert not (tmp_path / "answer_loss.jsonl").exists()
    with pytest.raises(
        SystemExit
    ) as stopped:  # train: the same check, in its own words, before any worker
        cli.main(
            [
                "train",
                "--nproc",
                "1",
                "--model",
                "qwen3-tiny",
                "--eval_data",
                "synthetic",
                "--eval_answer_loss",
                "true",
                "--output_dir",
                str(tmp_path / "run"),
            ]
        )
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert (
        stopped.value.code == 2
        and "eval_answer_loss: eval_data='synthetic' holds no session with " in last
    ), last
    assert not (tmp_path / "run").exists()
    started = []
    monkeypatch.setattr(
        "ds_longctx.run.launch.launch",
        lambda n, args, module, output_dir=None: started.append(args) or 0,
    )
    with pytest.raises(SystemExit) as done:
        cli.main(
            [
                "eval",
                "--checkpoint",
                str(trained),
                "--data",
                str(plain),
                "--out",
                str(tmp_path / "ev"),
            ]
        )
    assert done.value.code == 0 and len(started) == 1
