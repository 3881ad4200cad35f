"""`ds-longctx data prepare --stdlib` on a few small stdlib documents: the documents are the
stdlib's files as this test reads them, the card's counts are the saved tokenizer's, the held-out
rule holds; then a tiny model trains on it end to end (pack layout, the held-out eval and its
per-position curve)."""

import json
import sysconfig
import tokenize
from pathlib import Path

import pytest

from tests.helpers import read_metrics, run_cli

ONLY = [
    "bisect",
    "colorsys",
    "heapq",
    "json",
    "shlex",
    "textwrap",
]  # in every CPython 3.x, ~150 KB together


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from ds_longctx.corpora.prepare import main

    out = tmp_path_factory.mktemp("stdlib") / "corpus"
    assert (
        main(
            [
                "prepare",
                "--stdlib",
                "--out",
                str(out),
                "--only",
                ",".join(ONLY),
                "--vocab_size",
                "512",
                "--eval_every",
                "2",
                "--eval_min_chars",
                "10000",
            ]
        )
        == 0
    )
    return out


def read(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_documents_are_the_stdlib_files_in_the_stated_order(corpus):
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = {
        d["name"]: d["text"] for d in read(corpus / "train.jsonl") + read(corpus / "eval.jsonl")
    }
    assert sorted(docs) == ONLY
    files = sorted((root / "json").glob("*.py"))
    want_json = "".join(f"# file: json/{f.name}\n" + tokenize.open(f).read() for f in files)
    assert (
        docs["json"] == want_json
    )  # a package: every file, sorted, each opened by its header line
    assert docs["heapq"] == "# file: heapq.py\n" + tokenize.open(root / "heapq.py").read()
    assert [d["name"] for d in read(corpus / "train.jsonl")] == sorted(
        d["name"] for d in read(corpus / "train.jsonl")
    )


def test_card_counts_are_the_tokenizers_and_the_held_out_rule_holds(corpus):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(corpus / "tokenizer"), local_files_only=True)
    assert len(tok) == 512 and (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (0, 1, 2)
    card = json.loads((corpus / "data_card.json").read_text())
    docs = read(corpus / "train.jsonl") + read(corpus / "eval.jsonl")
    tokens = {d["name"]: len(tok(d["text"], add_special_tokens=False)["input_ids"]) for d in docs}
    assert {d["name"]: d["tokens"] for d in card["per_document"]} == tokens
    assert card["tokens"]["train"] + card["tokens"]["eval"] == sum(tokens.values())
    longest = max(tokens, key=tokens.get)
    assert card["longest"]["name"] == longest and card["longest"]["tokens"] == tokens[longest]
    assert sum(card["histogram"]["train"]) + sum(card["histogram"]["eval"]) == len(ONLY)
    long = sorted(
        (d for d in docs if len(d["text"]) >= 10000), key=lambda d: (-len(d["text"]), d["name"])
    )
    assert [d["name"] for d in read(corpus / "eval.jsonl")] == sorted(d["name"] for d in long[1::2])
    assert card["eval_documents"] == [d["name"] for d in long[1::2]]
    assert "| all | 6 |" in (corpus / "data_card.md").read_text()


def test_prepare_refuses_a_used_out_directory_with_exit_2(corpus, capsys):
    from ds_longctx import cli

    before = sorted(p.name for p in corpus.iterdir())
    with pytest.raises(SystemExit) as stopped:
        cli.main(["data", "prepare", "--stdlib", "--out", str(corpus)])
    last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert stopped.value.code == 2 and last.startswith(
        f"refused: --out {str(corpus)!r} exists and is not an empty directory; choose a new one"
    )
    assert sorted(p.name for p in corpus.iterdir()) == before


def test_the_corpus_directory_is_its_train_split_as_data_and_its_eval_split_as_eval_data(corpus):
    """`--data corpus/`: its train.jsonl (not the card, the tokenizer's files nor eval.jsonl);
    `--eval_data corpus/`: its eval.jsonl. A directory of documents without the card is read whole,
    as before."""
    from ds_longctx.config import RunConfig
    from ds_longctx.data import eval_view
    from ds_longctx.data.sources import resolve_source

    assert resolve_source(str(corpus)) == ("json", [str(corpus / "train.jsonl")])
    cfg = RunConfig.model_validate({"data": {"source": str(corpus)}, "eval": {"data": str(corpus)}})
    assert eval_view(cfg).data.source == str(corpus / "eval.jsonl")
    plain = corpus.parent / "plain"
    plain.mkdir()
    for name in ("train.jsonl", "eval.jsonl"):
        (plain / name).write_bytes((corpus / name).read_bytes())
    assert resolve_source(str(plain)) == (
        "json",
        [str(plain / "eval.jsonl"), str(plain / "train.jsonl")],
    )


def test_a_tiny_model_trains_on_it_packed_with_the_long_range_eval(corpus, tmp_path):
    """The corpus directory as --data and as --eval_data (its train and eval splits)."""
    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            "--model",
            "qwen3-tiny",
            "--dtype",
            "fp32",
            "--lr",
            "3e-3",
            "--steps",
            "4",
            "--seq_len",
            "256",
            "--data",
            str(corpus),
            "--tokenizer",
            str(corpus / "tokenizer"),
            "--data_layout",
            "pack",
            "--eval_data",
            str(corpus),
            "--eval_every",
            "2",
            "--eval_rows",
            "2",
            "--eval_buckets",
            "4",
            "--data_cache_dir",
            str(tmp_path / "cache"),
            "--output_dir",
            str(out),
        ],
        timeout=300,
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = read_metrics(out)
    train = [m for m in lines if "loss" in m]
    evals = [m for m in lines if "eval_loss" in m]
    assert [m["step"] for m in train] == [1, 2, 3, 4] and all(m["skipped_rows"] == 0 for m in train)
    assert [m["step"] for m in evals] == [2, 4] and train[-1]["loss"] < train[0]["loss"]
    curve = read_metrics(out, "eval_curve.jsonl")
    assert [c["step"] for c in curve] == [2, 4] and curve[0]["edges"] == [0, 64, 128, 192, 256]
    for c, e in zip(curve, evals):  # the curve's buckets make up the eval loss (token-weighted)
        assert sum(c["tokens"]) == e["eval_tokens"]
        mean = sum(x * n for x, n in zip(c["loss"], c["tokens"]) if n) / sum(c["tokens"])
        assert mean == pytest.approx(e["eval_loss"], rel=1e-5)


def prepare_cli(out, capsys) -> tuple:
    """`ds-longctx data prepare` of two small documents into `out`, in-process: (exit code, last
    line of stderr)."""
    from ds_longctx import cli

    with pytest.raises(SystemExit) as stopped:
        cli.main(
            [
                "data",
                "prepare",
                "--stdlib",
                "--out",
                str(out),
                "--only",
                "bisect,colorsys",
                "--vocab_size",
                "300",
                "--eval_every",
                "1",
                "--eval_min_chars",
                "0",
            ]
        )
    err = capsys.readouterr().err
    return stopped.value.code, [line for line in err.splitlines() if line.strip()][-1], err


def test_prepare_leaves_a_partial_directory_it_did_not_make_alone(tmp_path, capsys):
    """`--out X` with an `X.partial/` that carries no marker of an earlier prepare (someone's own
    directory): refused, exit 2, untouched (prepare removed it before)."""
    out, partial = tmp_path / "corpus", tmp_path / "corpus.partial"
    partial.mkdir()
    (partial / "notes.txt").write_text("mine")
    code, last, _ = prepare_cli(out, capsys)
    assert code == 2 and last == (
        f"refused: --out {str(out)!r}: {str(partial)!r} exists and was not made by "
        f"ds_longctx (no .ds_longctx-partial marker in it), so it is left alone; move it "
        f"away (or choose another --out)"
    )
    assert [p.name for p in partial.iterdir()] == ["notes.txt"] and not out.exists()


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_full_disk_is_one_line_with_exit_2_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, when
):
    """Free space short of the corpus: refused before the first byte; ENOSPC part-way (train.jsonl
    here): named in one line with the bytes needed and free, the partial directory gone, a stale one
    of a dead prepare removed first."""
    import errno
    import os

    from ds_longctx.corpora import corpus_write
    from ds_longctx.parallel.disk import make_partial, mount_point

    out = tmp_path / "corpus"
    if when == "before":
        monkeypatch.setattr(corpus_write, "free_bytes", lambda path: 900)
    else:
        make_partial(
            tmp_path / "corpus.partial"
        )  # an earlier prepare's, this process's own: removed, said
        write = Path.write_bytes

        def full(self, data):
            if self.name == "train.jsonl":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
            return write(self, data)

        monkeypatch.setattr(Path, "write_bytes", full)
    code, last, err = prepare_cli(out, capsys)
    assert code == 2 and "Traceback" not in err, err
    if when == "before":
        assert last.startswith(
            f"refused: --out {str(out)!r}: the corpus needs ~"
        ) and last.endswith(
            f"and {tmp_path} has 900 bytes free; choose an --out on a filesystem with more space"
        )
    else:
        assert (
            f"removed {str(tmp_path / 'corpus.partial')!r}, left unfinished by pid {os.getpid()}"
            in err
        )
        assert last.startswith(
            f"refused: --out {str(out)!r}: writing the corpus failed: no space left on "
            f"{mount_point(tmp_path)} "
            f"writing {tmp_path / 'corpus.partial' / 'train.jsonl'} (needs ~"
        )
        assert last.endswith("free); nothing was left there; free space or choose another --out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("vocab", ["1000000000", "10"])
def test_a_vocab_size_the_bpe_trainer_cannot_take_is_refused_before_any_work(tmp_path, vocab):
    """Past MAX_VOCAB the tokenizers trainer aborts the process (Rust); under 256 a byte-level BPE
    has no room."""
    from ds_longctx.corpora.prepare import main
    from ds_longctx.data.scan import DataError

    with pytest.raises(DataError, match=rf"^--vocab_size {vocab}: give 256 to 1,048,576 ids"):
        main(["prepare", "--stdlib", "--out", str(tmp_path / "c"), "--vocab_size", vocab])
    assert not list(tmp_path.iterdir())


def test_sigterm_during_prepare_ends_it_within_10_s_with_one_line(tmp_path):
    """`data prepare` has no step to wait for: SIGTERM ends it within seconds, exit 143, its last
    line saying what is on disk (a .partial directory it made carries its marker: the next prepare
    there removes it)."""
    import sys

    from tests.helpers import sigterm_once

    out, log = tmp_path / "corpus", tmp_path / "log"
    code, took, lines = sigterm_once(
        [
            sys.executable,
            "-m",
            "ds_longctx.cli",
            "data",
            "prepare",
            "--stdlib",
            "--out",
            str(out),
            "--vocab_size",
            "512",
        ],
        log,
        "read stdlib",
    )
    last = lines[-1]
    assert code == 143 and took < 10, (code, took, log.read_text()[-2000:])
    assert last == (
        "stopped by SIGTERM while preparing the data: nothing written at --out (a .partial "
        "directory beside it, if any, goes at the next `data prepare` there)"
    )
    assert not out.exists()


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory this process cannot write: one made read-only (not root), else /proc/sys."""
    import os

    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir(mode=0o555)
        yield d
        d.chmod(0o755)
    elif not os.access("/proc/sys", os.W_OK):
        yield Path("/proc/sys")
    else:
        pytest.skip("no directory here that root cannot write")


@pytest.mark.parametrize("source", [["--stdlib"], ["--sessions", "2"]])
def test_an_unwritable_out_is_called_not_writable_before_any_work(unwritable_dir, capsys, source):
    """Not a free-space figure (a read-only filesystem has none worth naming): the nearest existing
    parent named as not writable, exit 2, nothing read or tokenized first. `export --out` asks the
    same rule (disk.unwritable)."""
    from ds_longctx import cli
    from ds_longctx.checkpoint.export import CheckpointError, check_out

    out = unwritable_dir / "new" / "corpus"
    with pytest.raises(SystemExit) as stopped:
        cli.main(["data", "prepare", *source, "--out", str(out)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.strip().splitlines() == [
        f"refused: --out {str(out)!r} cannot be written: {unwritable_dir} is not writable by this "
        f"user; choose a writable --out"
    ], err
    says = (
        rf"^export: --out '{unwritable_dir}/hf' cannot be written "
        rf"\({unwritable_dir} is not writable"
    )
    with pytest.raises(CheckpointError, match=says):
        check_out(str(unwritable_dir / "hf"))
