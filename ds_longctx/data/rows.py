"""Token rows of exactly seq_len from tokenized documents, in the (seed, step) order (layouts in
data/__init__.py).

rows = TokenRows(tokenized, seq_len, "concat" | "pack" | "document", seed, shuffle, pad_id)
batch = rows.get(step, micro_batch, dp_rank, dp_size)   # Batch: input_ids [b, L], position_ids,
labels
"""

from __future__ import annotations

# pyarrow is imported where Arrow columns are read, not at import.
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ds_longctx.data.sources import DataError
from ds_longctx.parallel.units import IGNORE_INDEX

log = logging.getLogger("ds_longctx")


@dataclass
class Batch:
    input_ids: torch.Tensor  # [b, L]
    position_ids: Optional[torch.Tensor] = None  # [b, L]; restarts at 0 per packed document
    labels: Optional[torch.Tensor] = (
        None  # [b, L]; IGNORE_INDEX where nothing trains (padding, prompts)
    )


def _token_stream(tokenized, column: str = "input_ids"):
    """(all tokens (or labels) as one Arrow ChunkedArray [T] (memory-mapped), document lengths int64
    [N])."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = tokenized.data.table.column(column)
    if tokenized._indices is not None:  # a filtered/selected view: materialize in index order
        col = tokenized.with_format("arrow")[:][column]
        col = col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col])
    stream = pa.chunked_array([c.flatten() for c in col.chunks], type=pa.int32())
    lengths = (
        np.concatenate([pc.list_value_length(c).to_numpy(zero_copy_only=False) for c in col.chunks])
        if col.num_chunks
        else np.zeros(0, np.int64)
    )
    return stream, lengths.astype(np.int64)


def pack_rows(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Next-fit packing of documents (in order) into rows of `seq_len` tokens.

    Returns (row_ptr [R+1], seg_start [S], seg_len [S]): row r holds segments
    row_ptr[r]:row_ptr[r+1], each `seg_len` tokens from `seg_start` in the token stream. Documents
    longer than seq_len become several segments of at most seq_len (each its own document)."""
    starts = (
        np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    )
    seg_start, seg_len, row_ptr = [], [], [0]
    fill = 0
    for s0, n in zip(starts.tolist(), lengths.tolist()):
        while n > 0:
            piece = min(n, seq_len)
            if fill + piece > seq_len:
                row_ptr.append(len(seg_start))
                fill = 0
            seg_start.append(s0)
            seg_len.append(piece)
            fill += piece
            s0, n = s0 + piece, n - piece
    if fill:
        row_ptr.append(len(seg_start))
    return (
        np.asarray(row_ptr, np.int64),
        np.asarray(seg_start, np.int64),
        np.asarray(seg_len, np.int64),
    )


def step_samples(step: int, micro_batch: int, dp_rank: int, dp_size: int, offset: int = 0) -> range:
    """The samples dp replica `dp_rank` reads at `step`: offset + (step * dp + r) * b ... + b - 1
    (the order in the module doc of data/__init__.py; also the HF Trainer's sampler,
    integrations/hf_data.py). A step's samples over every replica are [offset + step * dp * b,
    offset + (step + 1) * dp * b) whatever dp is: a resume at another dp with the same global batch
    continues the same stream (checkpoint/layout.py; `offset` moves it where the batch changed)."""
    first = offset + (step * dp_size + dp_rank) * micro_batch
    return range(first, first + micro_batch)


def step_batches(
    data, step: int, micro_batch: int, grad_accum: int, dp_rank: int, dp_size: int, offset: int = 0
) -> list:
    """The grad_accum `Batch`es of `[micro_batch, L]` that dp replica `dp_rank` trains in optimizer
    step `step + 1` (`data`: TokenRows or SyntheticRetrieval): its micro_batch x grad_accum samples
    of `step_samples`, in order."""
    samples = step_samples(step, micro_batch * grad_accum, dp_rank, dp_size, offset)
    return [data.rows(samples[k * micro_batch : (k + 1) * micro_batch]) for k in range(grad_accum)]


class RowOrder:
    """Which row sample i is: row perm_e[i mod R] of epoch e = i // R, perm_e drawn from (seed, e),
    or the identity with shuffle off. One permutation is kept (the current epoch's)."""

    def __init__(self, n_rows: int, seed: int, shuffle: bool):
        self.n_rows, self.seed, self.shuffle = n_rows, seed, shuffle
        self._perm_epoch, self._perm = -1, None

    def row_of_sample(self, i: int) -> int:
        epoch, j = divmod(i, self.n_rows)
        if not self.shuffle:
            return j
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.n_rows, generator=g), epoch
        return int(self._perm[j])


def filled_row(ids: torch.Tensor, pos: Optional[torch.Tensor], labels: torch.Tensor) -> tuple:
    """A row from `TokenRows.row` with position_ids (0..L-1) filled in where it has none."""
    return ids, torch.arange(len(ids)) if pos is None else pos, labels


class TokenRows:
    """Rows of exactly `seq_len` tokens over a tokenized dataset, in the (seed, step) order of the
    module doc. `skipped_rows`: rows of the source left out as bad (data.skip_bad_rows), reported in
    metrics.jsonl."""

    def __init__(
        self,
        tokenized,
        seq_len: int,
        layout: str,
        seed: int,
        shuffle: bool,
        pad_id: int,
        source: str = "",
        vocab_size: Optional[int] = None,
        skipped_rows: int = 0,
        cut: Optional[str] = None,
    ):
        self.seq_len, self.layout, self.seed, self.shuffle, self.pad_id = (
            seq_len,
            layout,
            seed,
            shuffle,
            pad_id,
        )
        self.source, self.skipped_rows = source, skipped_rows
        self.stream, lengths = _token_stream(tokenized)
        self.label_stream, _ = _token_stream(
            tokenized, "labels"
        )  # parallel to the tokens: IGNORE_INDEX or the target
        self.n_docs = int((lengths > 0).sum())
        self.n_tokens = int(lengths.sum())
        if self.n_tokens == 0:
            raise DataError(
                f"data={source!r} tokenized to 0 tokens ({len(lengths)} documents, all empty); "
                f"give it documents with text"
            )
        if vocab_size is not None:
            check_token_range(self.stream, vocab_size, source)
        if layout == "concat":
            self._concat_rows()
        elif layout == "document":
            self._document_rows(lengths)
        elif layout == "pack":
            self._packed_rows(lengths, cut)
        else:
            raise DataError(f"data_layout={layout!r} is unknown; use concat, pack or document")
        self.order = RowOrder(self.n_rows, seed, shuffle)

    def _concat_rows(self) -> None:
        """concat: the token stream cut into rows of seq_len; the tail shorter than a row is
        unused."""
        L, source = self.seq_len, self.source
        self.n_rows = self.n_tokens // L
        if self.n_rows == 0:
            raise DataError(
                f"data={source!r} has {self.n_tokens} tokens, fewer than one row of seq_len={L}; "
                f"add data or lower seq_len to at most {self.n_tokens}"
            )
        dropped = self.n_tokens - self.n_rows * L
        log.info(
            "data: %d documents, %d tokens -> %d rows of %d (concat; last %d tokens unused)",
            self.n_docs,
            self.n_tokens,
            self.n_rows,
            L,
            dropped,
        )

    def _document_rows(self, lengths: np.ndarray) -> None:
        """document: one row per non-empty document, its first seq_len tokens; a shorter one is
        refused."""
        L, source = self.seq_len, self.source
        nonempty = lengths[lengths > 0]
        short = int((nonempty < L).sum())
        if short:
            raise DataError(
                f"{short} of {len(nonempty)} documents in data={source!r} are shorter than "
                f"seq_len={L} "
                f"(shortest {int(nonempty.min())} tokens) and data_layout='document' takes one "
                "document per row; use data_layout: concat (join documents) or pack, or seq_len <= "
                f"{int(nonempty.min())}"
            )
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.doc_start = starts[lengths > 0]
        self.n_rows = len(self.doc_start)
        log.info(
            "data: %d documents -> %d rows of their first %d tokens (document)",
            self.n_docs,
            self.n_rows,
            L,
        )

    def _packed_rows(self, lengths: np.ndarray, cut: Optional[str]) -> None:
        """pack: whole documents packed into rows of seq_len (`pack_rows`), the rest padded."""
        L = self.seq_len
        self.row_ptr, self.seg_start, self.seg_len = pack_rows(lengths, L)
        if (
            lengths > L
        ).any():  # under head they were cut when tokenized, under refuse refused there
            log.info(
                "data: %d documents longer than seq_len=%d split into windows of %d, each its own "
                "document (data.truncate: %s)",
                int((lengths > L).sum()),
                L,
                L,
                cut or "split",
            )
        self.n_rows = len(self.row_ptr) - 1
        used = int(self.seg_len.sum())
        log.info(
            "data: %d documents, %d tokens -> %d packed rows of %d (%.1f%% padding)",
            self.n_docs,
            self.n_tokens,
            self.n_rows,
            L,
            100 * (1 - used / (self.n_rows * L)),
        )

    # ---------------------------------------------------------------- order
    def row_of_sample(self, i: int) -> int:
        return self.order.row_of_sample(i)

    def signature(self) -> dict:
        """What a resumed run must find unchanged for the order to continue (saved in each
        checkpoint)."""
        return {
            "kind": "files",
            "layout": self.layout,
            "seq_len": self.seq_len,
            "n_rows": self.n_rows,
            "n_tokens": self.n_tokens,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    # ---------------------------------------------------------------- rows
    def _slice(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, labels) int64 [n] from `start` of the stream."""
        return (
            self.stream.slice(start, n).to_numpy().astype(np.int64),
            self.label_stream.slice(start, n).to_numpy().astype(np.int64),
        )

    def row(self, r: int) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(input_ids [L], position_ids [L] or None (one causal sequence), labels [L]) of row r."""
        L = self.seq_len
        if self.layout in ("concat", "document"):
            ids, labels = self._slice(
                r * L if self.layout == "concat" else int(self.doc_start[r]), L
            )
            return torch.from_numpy(ids), None, torch.from_numpy(labels)
        a, b = int(self.row_ptr[r]), int(self.row_ptr[r + 1])
        parts = [
            self._slice(int(s), int(n)) for s, n in zip(self.seg_start[a:b], self.seg_len[a:b])
        ]
        ids = np.full(L, self.pad_id, np.int64)
        pos = np.zeros(L, np.int64)
        labels = np.full(L, IGNORE_INDEX, np.int64)
        at = 0
        for p, lab in parts:  # each document restarts its positions and keeps its own labels
            ids[at : at + len(p)], pos[at : at + len(p)], labels[at : at + len(p)] = (
                p,
                np.arange(len(p)),
                lab,
            )
            at += len(p)
        # the padding tail (if any) is one more "document" at position 0.. with every label ignored
        pos[at:] = np.arange(L - at)
        if at == L and b - a == 1:
            return (
                torch.from_numpy(ids),
                None,
                torch.from_numpy(labels),
            )  # one document filling the row: plain causal
        return torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(labels)

    def get(self, step: int, micro_batch: int, dp_rank: int, dp_size: int) -> Batch:
        """`Batch` of `[micro_batch, seq_len]` for one data-parallel replica at one step."""
        return self.rows(step_samples(step, micro_batch, dp_rank, dp_size))

    def rows(self, samples: range) -> Batch:
        """`Batch` of samples `samples` (their rows in the run's order)."""
        rows = [self.row(self.row_of_sample(i)) for i in samples]
        ids, labels = torch.stack([r[0] for r in rows]), torch.stack([r[2] for r in rows])
        if all(r[1] is None for r in rows):
            return Batch(ids, None, labels)
        return Batch(ids, torch.stack([filled_row(*r)[1] for r in rows]), labels)


# ----------------------------------------------------------------------------- checks and entry
# point
def check_token_range(stream, vocab_size: int, source: str) -> None:
    """Refuse token ids outside [0, vocab_size) (pre-tokenized data, or a tokenizer with added
    tokens)."""
    import pyarrow.compute as pc

    mm = pc.min_max(stream).as_py()
    lo, hi = mm["min"], mm["max"]
    if lo is not None and lo < 0:
        raise DataError(
            f"data={source!r} holds token id {lo} < 0; token ids must be in [0, {vocab_size}): "
            f"re-tokenize with the model's tokenizer"
        )
    if hi is not None and hi >= vocab_size:
        raise DataError(
            f"data={source!r} holds token id {hi} >= the model's vocab_size={vocab_size}; "
            "re-tokenize "
            f"with the model's own tokenizer (or use a model whose vocabulary covers these ids)"
        )
