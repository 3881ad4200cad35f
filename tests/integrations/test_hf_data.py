"""hf_data.py on CPU, one process: the HF Trainer's loaders read, step by step, the rows `ds-longctx
train` reads (`TokenRows.get`, and `step_batches` under grad_accum: the references), the same rows
on every SP rank of a replica and different rows on the dp replicas, across epochs too; eval reads
every row once per replica group; `token_rows_dataset` holds `TokenRows.row`; mask columns fold into
labels (`fold_masks`), a bad mask is refused; the same token rows get the same labels here as
through `ds-longctx train`'s data path."""

import pytest
import torch

from ds_longctx.config import RunConfig
from ds_longctx.data import build_data
from ds_longctx.data.rows import step_batches
from ds_longctx.integrations.hf_data import (
    applied_masks,
    collate_rows,
    eval_loader,
    fold_masks,
    is_rows_dataset,
    masked_collate,
    token_rows_dataset,
    train_loader,
)
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.run.model import load_hf_config
from tests.corpus import documents, make_tokenizer, write_jsonl

L = 32


@pytest.fixture(scope="module", params=["concat", "pack"])
def rows(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_data")
    cfg = RunConfig(
        data=str(write_jsonl(d / "c.jsonl", documents(40, min_words=3, max_words=50))),
        tokenizer=str(make_tokenizer(d / "tok")),
        seq_len=L,
        data_cache_dir=str(d / "cache"),
        seed=3,
        data_layout=request.param,
    )
    return build_data(cfg, load_hf_config("qwen3-tiny"), 2)


def rank(sp_rank: int, dp_rank: int, sp: int = 2, dp: int = 2) -> ParallelState:
    """The ParallelState of one rank of a world sp x dp (no process groups: the loaders read only
    the ranks)."""
    return ParallelState(
        world_size=sp * dp,
        rank=dp_rank * sp + sp_rank,
        sp_size=sp,
        sp_rank=sp_rank,
        dp_size=dp,
        dp_rank=dp_rank,
    )


def batches(loader, n: int) -> list:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_token_rows_dataset_holds_the_rows(rows):
    ds = token_rows_dataset(rows)
    assert is_rows_dataset(ds) and is_rows_dataset(ds.select([0, 1])) and len(ds) == rows.n_rows
    batch = collate_rows([ds[0], ds[1]])
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (2, L)
    ref = rows.get(0, 2, 0, 1)  # samples 0 and 1, in the run's order
    order = [rows.row_of_sample(0), rows.row_of_sample(1)]
    got = collate_rows([ds[j] for j in order])
    assert torch.equal(got["input_ids"], ref.input_ids)
    assert torch.equal(got["labels"], ref.labels)  # every layout carries its labels
    if rows.layout == "pack":
        assert torch.equal(got["position_ids"], ref.position_ids)
    else:
        assert set(got) == {"input_ids", "labels"}


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_train_loader_reads_ds_longctx_trains_rows(rows, micro_batch):
    ds = token_rows_dataset(rows)
    per_epoch = rows.n_rows // (2 * micro_batch)

    def loader(sp_rank, dp_rank):
        return train_loader(
            ds, collate_rows, rank(sp_rank, dp_rank), micro_batch, seed=3, shuffle=True
        )

    for dp_rank in (0, 1):
        first, peer = loader(0, dp_rank), loader(1, dp_rank)
        assert (
            len(first) == per_epoch
        )  # steps of one replica in an epoch: rows / (dp x micro_batch), never x sp
        got, got_peer = batches(first, per_epoch), batches(peer, per_epoch)
        for step in range(per_epoch):
            ref = rows.get(step, micro_batch, dp_rank, 2)
            assert torch.equal(got[step]["input_ids"], ref.input_ids)
            assert torch.equal(
                got_peer[step]["input_ids"], got[step]["input_ids"]
            )  # SP peers: the same rows
        other = batches(loader(0, 1 - dp_rank), per_epoch)
        assert all(
            not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, other)
        )  # replicas differ
    # the next Trainer epoch continues the same sample stream (across the data's own epoch boundary)
    nxt = loader(0, 1)
    nxt.set_epoch(1)
    for step, batch in enumerate(batches(nxt, per_epoch), start=per_epoch):
        assert torch.equal(batch["input_ids"], rows.get(step, micro_batch, 1, 2).input_ids)


def test_eval_loader_reads_every_row_once_per_replica_group(rows):
    ds = token_rows_dataset(rows).select(range(5))
    seen = []
    for dp_rank in (0, 1):
        a = [b["input_ids"] for b in eval_loader(ds, collate_rows, rank(0, dp_rank), 1)]
        b = [b["input_ids"] for b in eval_loader(ds, collate_rows, rank(1, dp_rank), 1)]
        assert len(a) == 3 and all(
            torch.equal(x, y) for x, y in zip(a, b)
        )  # SP peers: the same rows
        seen += a
    want = [ds[j]["input_ids"].long() for j in range(5)]
    assert all(
        any(torch.equal(w, s[0]) for s in seen) for w in want
    )  # 5 rows over 2 replicas, one repeated


def test_train_loader_under_grad_accum_reads_the_rows_of_ds_longctx_trains_steps(rows):
    """grad_accum 2: the k-th micro-batch of optimizer step s on replica r is `step_batches(s, b, 2,
    r, dp)[k]`."""
    ds = token_rows_dataset(rows)
    per_epoch = rows.n_rows // (2 * 2)
    for dp_rank in (0, 1):
        loader = train_loader(
            ds, collate_rows, rank(0, dp_rank), 1, seed=3, shuffle=True, grad_accum=2
        )
        assert (
            len(loader) == per_epoch * 2
        )  # micro-batches: the Trainer counts len // grad_accum optimizer steps
        got = batches(loader, per_epoch * 2)
        for step in range(per_epoch):
            for k, ref in enumerate(step_batches(rows, step, 1, 2, dp_rank, 2)):
                assert torch.equal(got[2 * step + k]["input_ids"], ref.input_ids)


def test_masks_fold_into_labels_and_a_bad_mask_is_refused():
    """A token trains where its label (else the token) and every applied mask say so;
    completion_mask is left alone under completion_only_loss=False; the mask columns are gone; a
    list comes back a list, a tensor a tensor."""
    from types import SimpleNamespace

    masks = applied_masks(SimpleNamespace())
    assert masks == ("completion_mask", "assistant_masks")
    assert applied_masks(SimpleNamespace(completion_only_loss=False)) == ("assistant_masks",)
    row = {
        "input_ids": [5, 6, 7, 8],
        "completion_mask": [0, 1, 1, 1],
        "assistant_masks": [1, 1, 0, 1],
    }
    assert fold_masks(row, masks) == {"input_ids": [5, 6, 7, 8], "labels": [-100, 6, -100, 8]}
    both = fold_masks({**row, "labels": [5, 6, 7, -100]}, masks)
    assert both["labels"] == [-100, 6, -100, -100]
    kept = fold_masks(row, ("assistant_masks",))
    assert kept["labels"] == [5, 6, -100, 8] and kept["completion_mask"] == [0, 1, 1, 1]
    as_tensors = fold_masks({k: torch.tensor(v) for k, v in row.items()}, masks)
    assert torch.equal(as_tensors["labels"], torch.tensor([-100, 6, -100, 8]))
    assert fold_masks({"input_ids": [1, 2]}, masks) == {"input_ids": [1, 2]}  # nothing to fold
    seen = []
    masked_collate(seen.append, masks, [row])
    assert seen == [[{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, -100, 8]}]]
    for bad in ([0, 2, 1, 1], [1, 1, 1]):
        with pytest.raises(
            ValueError, match="column 'assistant_masks' is not a 0/1 list of 4 values"
        ):
            fold_masks({**row, "assistant_masks": bad}, masks)
    for short in (
        row,
        {"input_ids": [5, 6, 7, 8]},
    ):  # labels one short: refused, with or without a mask to fold
        with pytest.raises(ValueError, match="column 'labels' holds 3 values for 4 input ids"):
            fold_masks({**short, "labels": [5, 6, 7]}, masks)


def _documents(rows, lengths: list) -> list:
    """The labels of the documents of `lengths`, in order, from the packed rows (padding tails
    skipped)."""
    docs, want = [], list(lengths)
    for r in range(rows.n_rows):
        _, pos, labels = rows.row(r)
        starts = [0] if pos is None else (pos == 0).nonzero().flatten().tolist()
        for a, b in zip(starts, starts[1:] + [len(labels)]):
            if want and b - a == want[0]:
                docs.append(labels[a:b].tolist())
                want.pop(0)
    assert not want, f"documents of {want} tokens not found"
    return docs


@pytest.mark.parametrize(
    "keys",
    [
        ("labels",),
        ("completion_mask",),
        ("assistant_masks",),
        ("labels", "completion_mask", "assistant_masks"),
    ],
)
def test_ds_longctx_train_and_the_hf_trainer_fold_the_same_labels(tmp_path, keys):
    """The same token rows through `ds-longctx train`'s data path (build_data, no EOS) and the HF
    Trainer's (`_longctx_rows`' collate, lists and tensors): both give the reference written here,
    label (else token) where every mask holds 1."""
    import json
    import random
    from types import SimpleNamespace

    import datasets

    from ds_longctx.integrations.hf_trainer import LongCtxTrainerMixin

    rng = random.Random(len(keys))
    rows, want = [], []
    for n in (7, 12, 5, 9):
        ids = [rng.randrange(4, 500) for _ in range(n)]
        row = {"input_ids": ids}
        for k in keys:  # the last token trains: the data path refuses a row with no trained target
            row[k] = (
                [rng.choice([-100, t]) for t in ids[:-1]] + [ids[-1]]
                if k == "labels"
                else [rng.randint(0, 1) for _ in ids[:-1]] + [1]
            )
        rows.append(row)
        base = row.get("labels", ids)
        want.append(
            [
                lab if all(row[k][j] for k in keys if k != "labels") else -100
                for j, lab in enumerate(base)
            ]
        )
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RunConfig(
        data=str(path),
        seq_len=L,
        data_layout="pack",
        shuffle=False,
        add_eos=False,
        data_cache_dir=str(tmp_path / "cache"),
    )
    assert (
        _documents(
            build_data(cfg, load_hf_config("qwen3-tiny"), 1), [len(r["input_ids"]) for r in rows]
        )
        == want
    )
    trainer = SimpleNamespace(
        args=SimpleNamespace(),
        data_collator=list,
        _get_collator_with_removed_columns=lambda c, description: c,
    )
    for dataset in (
        datasets.Dataset.from_list(rows),
        datasets.Dataset.from_list(rows).with_format("torch"),
    ):
        dataset, collate = LongCtxTrainerMixin._longctx_rows(trainer, dataset, "training")
        folded = collate([dataset[j] for j in range(len(rows))])
        assert [_as_list(e["labels"]) for e in folded] == want
        assert all(set(e) == {"input_ids", "labels"} for e in folded)


def _as_list(v) -> list:
    return v.tolist() if torch.is_tensor(v) else v
