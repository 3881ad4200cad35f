"""Rows for the HF Trainer under SP, in `ds-longctx train`'s order (an SP group reads the same rows,
dp replicas different ones), and the run's token rows as a `datasets.Dataset`.

    dataset = rows_dataset(cfg)                     # data/: files -> rows of seq_len
    loader = train_loader(dataset, collate, state, micro_batch, seed, shuffle)
    loader = eval_loader(dataset, collate, state, batch_size)

Dimensions: b micro batch, L seq_len, R rows, dp replicas. Why not the Trainer's loaders:
docs/design/integrations.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

# datasets is imported where a dataset is made: the loaders need only torch.
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ds_longctx.data import build_data
from ds_longctx.data.formats import MASK_COLUMNS, folded_labels
from ds_longctx.data.rows import RowOrder, filled_row, step_samples
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.run.model import load_hf_config
from ds_longctx.run.ranks import rank0_first

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

ROWS_TAG = "ds_longctx token rows"  # DatasetInfo.description of `rows_dataset`'s datasets
ROW_COLUMNS = ("input_ids", "position_ids", "labels")


class StepSampler(Sampler):
    """Row indices of one dp replica, `per_step` rows per optimizer step, in `ds-longctx train`'s
    order."""

    def __init__(
        self, n_rows: int, per_step: int, dp_rank: int, dp_size: int, seed: int, shuffle: bool
    ):
        self.order = RowOrder(n_rows, seed, shuffle)
        self.per_step, self.dp_rank, self.dp_size = per_step, dp_rank, dp_size
        self.steps_per_epoch = n_rows // (dp_size * per_step)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{n_rows} rows are fewer than one step needs (dp={dp_size} x micro_batch x "
                "grad_accum="
                f"{per_step}); add data, lower seq_len, or lower micro_batch or grad_accum"
            )
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps_per_epoch * self.per_step

    def __iter__(self):
        first = self.epoch * self.steps_per_epoch
        for step in range(first, first + self.steps_per_epoch):
            for i in step_samples(step, self.per_step, self.dp_rank, self.dp_size):
                yield self.order.row_of_sample(i)


class EpochLoader(DataLoader):
    """A DataLoader whose `set_epoch` reaches its sampler."""

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


def _loader_kwargs(num_workers: int) -> dict:
    return {"num_workers": num_workers, "pin_memory": torch.cuda.is_available()}


def train_loader(
    dataset,
    collate,
    state,
    micro_batch: int,
    seed: int,
    shuffle: bool,
    num_workers: int = 0,
    grad_accum: int = 1,
) -> EpochLoader:
    """Batches `[b, L]` of this rank's dp replica, grad_accum per step."""
    sampler = StepSampler(
        len(dataset), micro_batch * grad_accum, state.dp_rank, state.dp_size, seed, shuffle
    )
    return EpochLoader(
        dataset,
        batch_size=micro_batch,
        sampler=sampler,
        collate_fn=collate,
        **_loader_kwargs(num_workers),
    )


def eval_loader(dataset, collate, state, batch_size: int, num_workers: int = 0) -> DataLoader:
    """Every row once per dp replica group, in order."""
    sampler = DistributedSampler(
        dataset, num_replicas=state.dp_size, rank=state.dp_rank, shuffle=False
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        **_loader_kwargs(num_workers),
    )


def collate_rows(examples: list) -> dict:
    """Rows of 1-D token tensors -> int64 `[b, L]` tensors, column by column."""
    return {
        k: torch.stack([torch.as_tensor(e[k]) for e in examples]).long()
        for k in ROW_COLUMNS
        if k in examples[0]
    }


def applied_masks(args) -> tuple:
    """The mask columns that say which tokens train: `assistant_masks`, and `completion_mask` unless
    `completion_only_loss=False`."""
    off = getattr(args, "completion_only_loss", None) is False
    return tuple(k for k in MASK_COLUMNS if not (off and k == "completion_mask"))


def fold_masks(example: dict, masks: tuple) -> dict:
    """`example` with its `masks` columns folded into `labels` (a token trains where its label is
    set and every mask is 1) and dropped; a column of the wrong length is refused."""
    if not isinstance(example, Mapping):  # a dataset of tuples carries no named mask
        return example
    ids, given = example.get("input_ids"), example.get("labels")
    if ids is not None and given is not None and len(given) != len(ids):
        raise ValueError(
            f"column 'labels' holds {len(given)} values for {len(ids)} input ids: give one label "
            f"per token ({IGNORE_INDEX} where it does not train)"
        )
    present = [k for k in masks if example.get(k) is not None]
    if not present or ids is None:
        return example
    for k in present:
        mask = torch.as_tensor(example[k])
        if mask.shape != (len(ids),) or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(
                f"column {k!r} is not a 0/1 list of {len(ids)} values (one per input id): give one "
                f"0 (no training) or 1 (trains) per token, or drop the column"
            )
    given = {k: _as_list(example[k]) for k in ("labels", *present) if example.get(k) is not None}
    labels = folded_labels(_as_list(ids), given, tuple(present))
    out = {k: v for k, v in example.items() if k not in present}
    src = ids if example.get("labels") is None else example["labels"]
    out["labels"] = (
        torch.as_tensor(labels, dtype=torch.as_tensor(src).dtype)
        if torch.is_tensor(ids)
        else labels
    )
    return out


def _as_list(v) -> list:
    return v.tolist() if hasattr(v, "tolist") else list(v)


def masked_collate(collate, masks: tuple, examples: list) -> dict:
    """`collate(examples)` after `fold_masks`; module-level so that a partial of it pickles."""
    return collate([fold_masks(e, masks) for e in examples])


def is_rows_dataset(dataset) -> bool:
    """Whether `dataset` came from `rows_dataset`."""
    return getattr(getattr(dataset, "info", None), "description", None) == ROWS_TAG


def needs_preparing(dataset) -> bool:
    """Whether TRL must tokenize `dataset`: a `datasets.Dataset` without token ids."""
    import datasets

    return isinstance(dataset, datasets.Dataset) and "input_ids" not in dataset.column_names


def token_rows_dataset(rows):
    """A `data.TokenRows` as an in-memory `datasets.Dataset` of int32 columns: `input_ids`, `labels`
    and, packed, `position_ids`."""
    import datasets

    packed = rows.layout == "pack"
    cols = {k: [] for k in ROW_COLUMNS if packed or k != "position_ids"}
    for j in range(rows.n_rows):
        ids, pos, labels = filled_row(*rows.row(j))
        for k, t in (("input_ids", ids), ("position_ids", pos), ("labels", labels)):
            if k in cols:
                cols[k].append(t.numpy().astype(np.int32))
    return datasets.Dataset.from_dict(
        cols, info=datasets.DatasetInfo(description=ROWS_TAG)
    ).with_format("torch")


def rows_dataset(cfg: RunConfig, hf_config=None):
    """The token rows `ds-longctx train` reads for `cfg`, as a `datasets.Dataset`. Call after
    `hf_trainer.training_args`."""
    hf = hf_config if hf_config is not None else load_hf_config(cfg.model.name)
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    rows = rank0_first(lambda: build_data(cfg, hf, world // cfg.parallel.sp_size), rank)
    return token_rows_dataset(rows)
