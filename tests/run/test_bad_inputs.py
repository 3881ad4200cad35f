"""Every bad input is refused before anything expensive starts, with a message that names the value
and the fix, and leaves output_dir exactly as it was (absent stays absent).

In-process: each case goes through what `train.main` runs before it builds the engine (RunConfig,
`preflight.preflight`, `data.build_data`: tests.helpers.refused). Two cases also run the real
`python -m ds_longctx.train` entry point. A resume or an export that cannot go on:
tests/run/test_bad_checkpoints.py.
"""

import json
from pathlib import Path

import pytest

from ds_longctx.checkpoint.layout import CheckpointError
from ds_longctx.checkpoint.resume import check_output_dir
from tests.corpus import documents, make_tokenizer, token_ids, write_jsonl, write_parquet
from tests.helpers import ROOT, free_port, refused, run_cli, run_module


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    docs = documents(30)
    f = {
        "dir": d,
        "tok": str(make_tokenizer(d / "tok")),
        "jsonl": str(write_jsonl(d / "ok.jsonl", docs)),
        "cache": str(d / "cache"),
        "big_tok": str(make_tokenizer(d / "big_tok", n_words=600)),
    }
    (d / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 10)
    (d / "data.bin").write_bytes(b"0123")
    (d / "fake.parquet").write_text("not parquet")
    (d / "broken.jsonl").write_text('{"text": "w1 w2"\n')
    (d / "list.jsonl").write_text('["w1", "w2"]\n')
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    (d / "body.jsonl").write_text('{"body": "w1 w2"}\n')
    (d / "ids_high.jsonl").write_text(json.dumps({"input_ids": [5, 6, 700]}) + "\n")
    (d / "ids_negative.jsonl").write_text(json.dumps({"input_ids": [5, -1, 6]}) + "\n")
    (d / "tiny.jsonl").write_text('{"text": "w1 w2 w3"}\n')
    write_jsonl(d / "short_docs.jsonl", documents(5, min_words=3, max_words=8))
    mixed = d / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "a.jsonl", docs[:3])
    write_parquet(mixed / "b.parquet", docs[3:6])
    (d / "empty_dir").mkdir()
    (d / "a_file").write_text("x")
    return f


def data_kw(files, name, **kw):
    return {
        "data": str(files["dir"] / name) if not name.startswith("/") else name,
        "tokenizer": files["tok"],
        "seq_len": 32,
        "data_cache_dir": files["cache"],
        **kw,
    }


# ----------------------------------------------------------------------------- data
@pytest.mark.parametrize(
    "name, fragments",
    [
        ("missing.jsonl", ["missing.jsonl", "does not exist", "pass an existing"]),
        ("binary.txt", ["binary.txt", "is not text", "NUL byte", "UTF-8 text"]),
        ("latin1.txt", ["latin1.txt", "not UTF-8", "0xe9", "convert it to UTF-8"]),
        ("data.bin", ["data.bin", "'.bin'", "supported"]),
        ("fake.parquet", ["fake.parquet", "not a Parquet file", "to_parquet"]),
        (
            "broken.jsonl",
            [
                "broken.jsonl",
                "line 1 (byte 16): not JSON",
                "cut short?",
                "fix that line in the file",
            ],
        ),
        ("list.jsonl", ["list.jsonl", "JSON list, not an object", "one"]),
        ("mixed", ["mixed", "mixes formats", "['json', 'parquet']", "split the"]),
        ("empty_dir", ["empty_dir", "empty directory", "put .txt"]),
        (
            "/dev/zero",
            ["'/dev/zero' is neither a regular file nor a directory"],
        ),  # endless: never read
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_data_files(files, tmp_path, name, fragments):
    refused(tmp_path / "out", fragments, **data_kw(files, name))


def test_empty_dataset(files, tmp_path):
    refused(
        tmp_path / "out",
        ["empty.jsonl", "is empty (0 documents", "give it documents"],
        **data_kw(files, "empty.jsonl"),
    )


def test_dataset_of_empty_documents(files, tmp_path):
    refused(
        tmp_path / "out",
        ["blank.jsonl", "tokenized to 0 tokens", "2 documents, all empty"],
        **data_kw(files, "blank.jsonl"),
    )


def test_text_field_missing(files, tmp_path):
    refused(
        tmp_path / "out",
        ["text_field='text'", "['body']", "set text_field"],
        **data_kw(files, "body.jsonl"),
    )


def test_text_without_tokenizer(files, tmp_path):
    refused(
        tmp_path / "out",
        ["ok.jsonl", "needs a tokenizer", "set tokenizer"],
        **data_kw(files, "ok.jsonl", tokenizer=None),
    )


def test_tokenizer_missing(files, tmp_path):
    refused(
        tmp_path / "out",
        ["tokenizer=", "nope", "is not a directory", "local tokenizer directory"],
        **data_kw(files, "ok.jsonl", tokenizer=str(tmp_path / "nope")),
    )


def test_tokenizer_larger_than_model_vocab(files, tmp_path):
    refused(
        tmp_path / "out",
        ["big_tok", "has 604 tokens", "vocab_size=512", "use the model's own tokenizer"],
        **data_kw(files, "ok.jsonl", tokenizer=files["big_tok"]),
    )


def test_token_ids_out_of_range(files, tmp_path):
    refused(
        tmp_path / "out",
        ["ids_high.jsonl", "token id 700", "vocab_size=512", "re-tokenize"],
        **data_kw(files, "ids_high.jsonl", tokenizer=None),
    )


def test_negative_token_ids(files, tmp_path):
    refused(
        tmp_path / "out",
        ["ids_negative.jsonl", "token id -1", "re-tokenize"],
        **data_kw(files, "ids_negative.jsonl", tokenizer=None),
    )


def test_documents_shorter_than_seq_len_without_concatenation(files, tmp_path):
    shortest = (
        min(len(ids) for ids in token_ids(documents(5, min_words=3, max_words=8))) + 1
    )  # + EOS
    refused(
        tmp_path / "out",
        [
            "5 of 5 documents",
            "shorter than seq_len=32",
            f"shortest {shortest} tokens",
            "data_layout: concat",
            f"seq_len <= {shortest}",
        ],
        **data_kw(files, "short_docs.jsonl", data_layout="document"),
    )


def test_fewer_tokens_than_one_row(files, tmp_path):
    refused(
        tmp_path / "out",
        ["tiny.jsonl", "has 4 tokens", "seq_len=32", "lower seq_len to at most 4"],
        **data_kw(files, "tiny.jsonl"),
    )


def test_fewer_rows_than_one_step_needs(files, tmp_path):
    refused(
        tmp_path / "out",
        ["rows of seq_len=512", "one step needs 4", "micro_batch=4", "add data"],
        **data_kw(files, "ok.jsonl", seq_len=512, micro_batch=4),
    )


def test_hub_name_without_a_hub(files, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refused(
        tmp_path / "out",
        ["no_such_org_xyz/corpus", "could not be loaded from the hub", "pass a local"],
        **{**data_kw(files, "ok.jsonl"), "data": "no_such_org_xyz/corpus"},
    )


# ----------------------------------------------------------------------------- layout, attention,
# RoPE
def test_packing_beyond_the_cpu_masked_fallback(files, tmp_path):
    refused(
        tmp_path / "out",
        ["data_layout='pack'", "seq_len=32768", "16384", "data_layout: concat"],
        **data_kw(files, "ok.jsonl", seq_len=32768, data_layout="pack"),
    )


def test_packing_with_micro_batch_above_one(files, tmp_path):
    refused(
        tmp_path / "out",
        ["data_layout='pack'", "micro_batch=2", "set micro_batch: 1"],
        **data_kw(files, "ok.jsonl", data_layout="pack", micro_batch=2),
    )


def test_seq_len_beyond_yarn(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048}
    refused(
        tmp_path / "out",
        [
            "seq_len=8192",
            "beyond what YaRN is set for",
            "factor 2.0",
            "4096 positions",
            "factor >= 4",
            "rope_scaling: auto",
        ],
        seq_len=8192,
        rope_scaling=yarn,
    )


# ----------------------------------------------------------------------------- output_dir
def test_output_dir_is_a_file(files):
    refused(files["dir"] / "a_file", ["a_file", "is a file", "choose a directory"])


def test_output_dir_under_a_file(files):
    refused(
        files["dir"] / "a_file" / "run",
        ["a_file", "cannot be created", "is a file", "another output_dir"],
    )


@pytest.mark.parametrize(
    "out, says", [("/", "is the filesystem root"), ("~", "is your home directory")]
)
def test_output_dir_that_is_the_root_or_home_is_refused(out, says):
    """The check `refused`'s preflight runs (test_output_dir_not_writable), asked alone: a snapshot
    of / is no test."""
    with pytest.raises(
        CheckpointError, match=f"output_dir={out!r} {says}; give the run a directory of its own"
    ):
        check_output_dir(out)


def test_output_dir_not_writable(tmp_path):
    out = Path("/proc/ds_longctx_run")  # read-only for every user, root included
    refused(out, ["/proc/ds_longctx_run", "is not writable", "choose a writable output_dir"])


def test_eval_data_missing(files, tmp_path):
    refused(
        tmp_path / "out",
        ["missing.jsonl", "does not exist"],
        **data_kw(files, "ok.jsonl"),
        eval_data=str(files["dir"] / "missing.jsonl"),
    )


def test_eval_data_with_fewer_rows_than_eval_rows(files, tmp_path):
    refused(
        tmp_path / "out",
        ["short_docs.jsonl", "fewer than eval_rows=50", "lower eval_rows to"],
        **data_kw(files, "ok.jsonl"),
        eval_data=str(files["dir"] / "short_docs.jsonl"),
        eval_rows=50,
    )


# ----------------------------------------------------------------------------- the real entry point
@pytest.mark.parametrize("case", ["empty_dataset", "tokenizer_mismatch"])
def test_train_entry_point_refuses_and_writes_nothing(files, tmp_path, case):
    out = tmp_path / "out"
    data = files["dir"] / "empty.jsonl" if case == "empty_dataset" else files["jsonl"]
    tok = files["tok"] if case == "empty_dataset" else files["big_tok"]
    res = run_module(
        [
            "ds_longctx.train",
            "--data",
            str(data),
            "--tokenizer",
            tok,
            "--seq_len",
            "32",
            "--data_cache_dir",
            files["cache"],
            "--output_dir",
            str(out),
        ],
        {"MASTER_PORT": str(free_port())},
    )
    assert res.returncode != 0
    assert (
        "is empty (0 documents" if case == "empty_dataset" else "has 604 tokens"
    ) in res.stderr, res.stderr[-2000:]
    assert not out.exists()


def test_a_refusal_inside_the_workers_ends_ds_longctx_train_with_exit_2_and_the_line_last(
    files, tmp_path
):
    """Out-of-vocabulary token ids are found by the workers (rank 0 reads the data): `ds-longctx
    train` still exits 2 with the one refusal line as the last thing printed, no traceback, nothing
    written."""
    out = tmp_path / "out"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--data",
            str(files["dir"] / "ids_high.jsonl"),
            "--seq_len",
            "32",
            "--data_cache_dir",
            files["cache"],
            "--output_dir",
            str(out),
        ],
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    path = str(files["dir"] / "ids_high.jsonl")  # named by file and line, as a bad row is
    assert (
        last.startswith(f"refused before start: data file {path!r} line 1: ")
        and "token id 700" in last
        and "re-tokenize" in last
    )
    assert "Traceback" not in res.stderr + res.stdout and "ChildFailedError" not in res.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- logging
def test_memory_snapshot_without_cuda(tmp_path):
    refused(
        tmp_path / "out",
        ["memory_snapshot_steps=2", "needs a CUDA GPU", "memory_snapshot_steps: 0"],
        memory_snapshot_steps=2,
    )


def test_kv_heads_that_do_not_split_the_query_heads_are_refused_before_the_engine(tmp_path):
    """8 query heads over 3 KV heads: HF's attention cannot group them (the run went on to a NaN
    loss and advice about the learning rate); preflight refuses it at any sp_size, with the
    planner's rule (kernel_rules.check_attention_heads)."""
    cfg = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text())
    cfg.update(num_attention_heads=8, num_key_value_heads=3)
    path = tmp_path / "bad_heads.json"
    path.write_text(json.dumps(cfg))
    refused(
        tmp_path / "out",
        ["num_attention_heads=8 with num_key_value_heads=3", "num_key_value_heads one of"],
        model=str(path),
        seq_len=64,
        sp_size=1,
    )


@pytest.mark.parametrize(
    "nproc,says",
    [(0, "--nproc 0: need at least 1 process"), (10_000, "--nproc 10000: no GPU here")],
)
def test_a_process_count_past_the_machine_is_refused_before_any_worker_starts(nproc, says):
    """`ds-longctx train --nproc N` past what the machine runs (on CPU: CPU_PROCESSES_PER_CORE per
    core; on GPUs: one per GPU) exits 2 at once: torchrun forked hundreds of workers for --nproc
    1000 and did not stop on SIGTERM."""
    import time

    t0 = time.perf_counter()
    res = run_cli(["train", "--nproc", str(nproc), "--steps", "1"], timeout=120)
    assert res.returncode == 2 and says in res.stderr, res.stderr[-2000:]
    assert time.perf_counter() - t0 < 60
