"""data.py on CPU, no network: every source format gives the same token stream, the three layouts
cut it as documented (checked against the tokens written into the files), tokenization is cached,
and the row order depends only on (seed, step)."""

import numpy as np
import pytest
import torch

from ds_longctx.config import RunConfig
from ds_longctx.data import Batch, TokenRows, build_data
from ds_longctx.data.rows import pack_rows
from ds_longctx.data.synthetic import EOS, SyntheticRetrieval
from ds_longctx.parallel.sharding import shard_batch
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.run.model import load_hf_config
from tests.corpus import (
    documents,
    make_tokenizer,
    token_ids,
    write_jsonl,
    write_parquet,
    write_txt_dir,
)

L = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    docs = documents(40, min_words=3, max_words=50)
    return {
        "dir": d,
        "docs": docs,
        "tok": str(make_tokenizer(d / "tok")),
        "jsonl": str(write_jsonl(d / "c.jsonl", docs)),
        "cache": str(d / "cache"),
    }


@pytest.fixture(scope="module")
def hf_cfg():
    return load_hf_config("qwen3-tiny")


def rows_of(corpus, hf_cfg, dp=1, **kw) -> TokenRows:
    args = dict(
        data=corpus["jsonl"], tokenizer=corpus["tok"], seq_len=L, data_cache_dir=corpus["cache"]
    )
    return build_data(RunConfig(**{**args, **kw}), hf_cfg, dp)


def stream(docs) -> np.ndarray:
    return np.concatenate([np.array(ids + [EOS]) for ids in token_ids(docs)])


def test_concat_rows_are_the_document_stream_cut_at_seq_len(corpus, hf_cfg):
    rows = rows_of(corpus, hf_cfg, shuffle=False)
    want = stream(corpus["docs"])
    assert rows.n_tokens == len(want) and rows.n_rows == len(want) // L
    for r in range(rows.n_rows):
        ids, pos, labels = rows.row(r)
        assert pos is None and torch.equal(labels, ids)  # text: every token trains
        assert ids.tolist() == want[r * L : (r + 1) * L].tolist()


@pytest.mark.parametrize("fmt", ["parquet", "txt_dir"])
def test_every_format_gives_the_same_tokens(corpus, hf_cfg, fmt):
    d, docs = corpus["dir"], corpus["docs"]
    path = (
        write_parquet(d / "c.parquet", docs) if fmt == "parquet" else write_txt_dir(d / "txt", docs)
    )
    rows = rows_of(corpus, hf_cfg, data=str(path), shuffle=False)
    ref = rows_of(corpus, hf_cfg, shuffle=False)
    assert rows.n_tokens == ref.n_tokens
    assert all(torch.equal(rows.row(r)[0], ref.row(r)[0]) for r in range(ref.n_rows))


def test_pretokenized_input_ids_are_used_as_they_are(corpus, hf_cfg, tmp_path):
    import json

    path = tmp_path / "ids.jsonl"
    path.write_text(
        "".join(json.dumps({"input_ids": ids}) + "\n" for ids in token_ids(corpus["docs"]))
    )
    rows = rows_of(
        corpus, hf_cfg, data=str(path), tokenizer=None, shuffle=False, data_layout="concat"
    )
    assert rows.row(0)[0].tolist() == stream(corpus["docs"])[:L].tolist()


def test_pack_keeps_documents_whole_and_apart(corpus, hf_cfg):
    rows = rows_of(corpus, hf_cfg, data_layout="pack", shuffle=False)
    docs = [ids + [EOS] for ids in token_ids(corpus["docs"])]
    pieces = [
        d[i : i + L] for d in docs for i in range(0, len(d), L)
    ]  # longer documents: pieces of L
    got = []
    for r in range(rows.n_rows):
        ids, pos, labels = rows.row(r)
        if pos is None:  # one piece filling the row
            got.append(ids.tolist())
            continue
        starts = torch.nonzero(pos == 0).flatten().tolist() + [L]
        segs = [(a, b) for a, b in zip(starts[:-1], starts[1:])]
        real = [(a, b) for a, b in segs if (labels[a:b] != IGNORE_INDEX).any()]
        got += [ids[a:b].tolist() for a, b in real]
        pad_from = real[-1][1]
        assert (labels[pad_from:] == IGNORE_INDEX).all() and torch.equal(
            labels[:pad_from], ids[:pad_from]
        )
        # the attention sees the documents apart: cu_seqlens at every restart
        shard = shard_batch(ids[None], 2, 0, labels=labels[None], position_ids=pos[None])
        assert shard.cu_seqlens.tolist() == starts
    assert got == pieces
    b = rows.get(0, 1, 0, 1)
    assert isinstance(b, Batch) and b.input_ids.shape == (1, L)


def test_pack_rows_next_fit():
    row_ptr, start, n = pack_rows(np.array([10, 30, 5, 70, 2]), 32)
    rows = [
        list(zip(start[a:b].tolist(), n[a:b].tolist())) for a, b in zip(row_ptr[:-1], row_ptr[1:])
    ]
    assert rows == [[(0, 10)], [(10, 30)], [(40, 5)], [(45, 32)], [(77, 32)], [(109, 6), (115, 2)]]


def test_document_layout_takes_each_documents_first_tokens(corpus, hf_cfg, tmp_path):
    long_docs = documents(6, min_words=L, max_words=L + 20, seed=3)
    path = write_jsonl(tmp_path / "long.jsonl", long_docs)
    rows = rows_of(corpus, hf_cfg, data=str(path), data_layout="document", shuffle=False)
    assert rows.n_rows == 6
    assert [rows.row(r)[0].tolist() for r in range(6)] == [ids[:L] for ids in token_ids(long_docs)]


def test_tokenization_is_cached(corpus, hf_cfg):
    from pathlib import Path

    rows_of(corpus, hf_cfg)
    files = sorted(Path(corpus["cache"]).rglob("*.arrow"))
    again = rows_of(corpus, hf_cfg)
    assert (
        sorted(Path(corpus["cache"]).rglob("*.arrow")) == files
    )  # nothing re-tokenized or re-converted
    assert again.n_tokens == len(stream(corpus["docs"]))


def test_order_depends_only_on_seed_and_step(corpus, hf_cfg):
    a, b = rows_of(corpus, hf_cfg, dp=2, seed=5), rows_of(corpus, hf_cfg, dp=2, seed=5)
    epoch = a.n_rows // 2
    seen = []
    for step in range(epoch):
        r0, r1 = a.get(step, 1, 0, 2).input_ids, a.get(step, 1, 1, 2).input_ids
        assert not torch.equal(r0, r1)  # dp replicas read different rows
        assert torch.equal(
            r0, b.get(step, 1, 0, 2).input_ids
        )  # another process, same (seed, step): same row
        seen += [a.row_of_sample(2 * step), a.row_of_sample(2 * step + 1)]
    assert len(set(seen)) == len(seen)  # within an epoch no row comes twice
    # a resumed run at step s reads what the straight run read at step s, in any order of calls
    fresh = rows_of(corpus, hf_cfg, dp=2, seed=5)
    assert torch.equal(fresh.get(epoch + 1, 1, 1, 2).input_ids, a.get(epoch + 1, 1, 1, 2).input_ids)
    other = rows_of(corpus, hf_cfg, dp=2, seed=6)
    assert [other.row_of_sample(i) for i in range(8)] != [a.row_of_sample(i) for i in range(8)]
    plain = rows_of(corpus, hf_cfg, dp=2, shuffle=False)
    assert [plain.row_of_sample(i) for i in range(a.n_rows + 2)] == list(range(a.n_rows)) + [0, 1]


@pytest.mark.parametrize("fused", [False, True], ids=["pairs", "fused_pairs"])
def test_synthetic_queries_look_at_least_90_percent_back(fused):
    task = SyntheticRetrieval(
        256,
        512,
        seed=1,
        num_pairs=6 if not fused else 8,
        num_queries=4,
        num_keys=8,
        num_values=16,
        fused_pairs=fused,
        supervise="queries",
    )
    assert task.min_distance >= 0.9 * 256
    keys, values, filler = task.ranges
    for i in range(5):
        tok, value_pos, pair_pos = task.draw(i)
        query_keys, query_values = tok[value_pos - 1], tok[value_pos]
        if fused:  # the pair token encodes (key, value)
            pair = tok[pair_pos] - values.stop
            assert torch.equal(keys.start + pair // len(values), query_keys)
            assert torch.equal(values.start + pair % len(values), query_values)
        else:
            assert torch.equal(tok[pair_pos], query_keys) and torch.equal(
                tok[pair_pos + 1], query_values
            )
        assert ((value_pos - 1) - pair_pos).min() >= task.min_distance
        assert all(int(t) in filler for t in tok[20:240])
    b = task.get(3, 2, 1, 2)
    assert b.labels is not None and int((b.labels != IGNORE_INDEX).sum()) == 2 * 4
    # the default task is what test_ulysses and the demo have always used
    assert torch.equal(
        SyntheticRetrieval(64, 512).batch(0, 1, 0, 1)[0], SyntheticRetrieval(64, 512).sample(0)[0]
    )


def test_a_runs_tokenizer_is_the_given_one_else_its_model_directorys(tmp_path, monkeypatch):
    """tokenizer_of: a given tokenizer first; else a model directory's own (one with a config.json,
    the directory config.model.resolve_model loads); a folder with tokenizer files but no
    config.json is no model directory, and a preset has no tokenizer."""
    from ds_longctx.config.model import resolve_model
    from ds_longctx.data.tokenize import tokenizer_of

    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3-tiny").mkdir()  # a preset's name, tokenizer files, no config.json
    (tmp_path / "qwen3-tiny" / "tokenizer.json").write_text("{}")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "qwen3"}')
    (ckpt / "tokenizer_config.json").write_text("{}")
    assert tokenizer_of("tok/", str(ckpt)) == "tok/"
    assert (
        tokenizer_of(None, str(ckpt)) == str(ckpt) and resolve_model(str(ckpt)).kind == "directory"
    )
    assert (
        tokenizer_of(None, "qwen3-tiny") is None and resolve_model("qwen3-tiny").kind == "shipped"
    )
    assert tokenizer_of(None, str(tmp_path / "gone")) is None
