"""The synthetic long-range task: key-value retrieval whose keys sit >= 90% of the sequence back.

    task = SyntheticRetrieval(seq_len, vocab_size, seed)   # what `data: synthetic` trains on
    batch = task.get(step, micro_batch, dp_rank, dp_size)  # data.Batch, as data.TokenRows gives
    held = task.held_out()                                 # what `eval_data: synthetic` evaluates

Used by the demo, the tests (tests/distributed/test_ulysses.py) and benchmarks/bench_long_range.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional

import torch

from ds_longctx.data.rows import Batch, step_samples
from ds_longctx.parallel.units import IGNORE_INDEX

PAD, BOS, EOS, SEP = 0, 1, 2, 3  # the task's special token ids
HELD_OUT_SEED = 1_000_000  # seed shift of the held-out stream (`held_out`)


@dataclass(frozen=True)
class SyntheticRetrieval:
    """Key-value retrieval with long-range structure, identical for any world size and sp_size.

    `BOS k1 v1 k2 v2 ... <filler> SEP k v ...`: pairs at the start, queries at the end, so a
    query looks back >= `min_distance` tokens. Sample `i` depends only on (seed, i). Defaults,
    `fused_pairs` and `supervise`: docs/design/data.md.
    """

    seq_len: int
    vocab_size: int
    seed: int = 0
    pairs_fraction: float = 0.1
    num_queries: int = 8
    num_pairs: Optional[int] = None
    num_keys: Optional[int] = None
    num_values: Optional[int] = None
    fused_pairs: bool = False
    supervise: str = (
        "all"  # "all": every next token (labels=None); "queries": only the query values
    )
    skipped_rows: ClassVar[int] = (
        0  # no source rows to leave out (TokenRows' field, in metrics.jsonl)
    )

    def __post_init__(self):
        if self.vocab_size < 16:
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small for the synthetic task; need >= 16"
            )
        if self.seq_len < 4 * self.num_queries + 8:
            raise ValueError(
                f"seq_len={self.seq_len} is too short for {self.num_queries} synthetic queries; "
                f"use seq_len >= {4 * self.num_queries + 8}"
            )
        keys, values, filler = self.ranges
        if len(filler) < 1:
            raise ValueError(
                f"num_keys={len(keys)} x num_values={len(values)} fused pair ids leave no filler "
                f"in vocab_size={self.vocab_size}; lower num_keys / num_values"
            )
        if self.pairs < self.num_queries or self.pairs > len(keys):
            raise ValueError(
                f"num_pairs={self.pairs} must be in [num_queries={self.num_queries}, {len(keys)} "
                "keys]"
            )
        pair_tokens = self.pairs if self.fused_pairs else 2 * self.pairs
        if self.num_pairs is not None and 1 + pair_tokens > self.seq_len - 3 * self.num_queries:
            raise ValueError(
                f"{self.pairs} pairs and {self.num_queries} queries do not fit "
                f"seq_len={self.seq_len}; lower num_pairs / num_queries or raise seq_len"
            )
        if self.supervise not in ("all", "queries"):
            raise ValueError(f"supervise={self.supervise!r}; use 'all' or 'queries'")

    @property
    def ranges(self) -> tuple[range, range, range]:
        """Token ids of keys, values and filler (fused pair ids, if any, sit between values and
        filler)."""
        if self.fused_pairs:
            k, v = self.num_keys or 8, self.num_values or 16
            return (
                range(4, 4 + k),
                range(4 + k, 4 + k + v),
                range(4 + k + v + k * v, self.vocab_size),
            )
        third = (self.vocab_size - 4) // 3
        keys = range(4, 4 + min(third, self.num_keys or third))
        values = range(4 + third, 4 + third + min(third, self.num_values or third))
        return keys, values, range(4 + 2 * third, self.vocab_size)

    @property
    def pairs(self) -> int:
        if self.num_pairs is not None:
            return self.num_pairs
        n_keys = len(self.ranges[0])
        return max(self.num_queries, min(n_keys, int(self.seq_len * self.pairs_fraction) // 2))

    @property
    def min_distance(self) -> int:
        """Fewest tokens between a query's key and the pair it retrieves (the shortest
        look-back)."""
        first_query_key = self.seq_len - 3 * self.num_queries + 1
        last_pair = self.pairs if self.fused_pairs else 1 + 2 * (self.pairs - 1)
        return first_query_key - last_pair

    def draw(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens [L], query-value positions [Q], positions of the queried pairs [Q]: their key
        token, or the fused pair token) of sample `index`."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        keys, values, filler = self.ranges
        L, n_pairs = self.seq_len, self.pairs
        tok = torch.randint(filler.start, filler.stop, (L,), generator=g)
        tok[0] = BOS
        k = keys.start + torch.randperm(len(keys), generator=g)[:n_pairs]
        v = torch.randint(values.start, values.stop, (n_pairs,), generator=g)
        if self.fused_pairs:
            tok[1 : 1 + n_pairs] = values.stop + (k - keys.start) * len(values) + (v - values.start)
        else:
            tok[1 : 1 + 2 * n_pairs : 2], tok[2 : 2 + 2 * n_pairs : 2] = k, v
        q = torch.randperm(n_pairs, generator=g)[: self.num_queries]
        start = L - 3 * self.num_queries
        tok[start::3], tok[start + 1 :: 3], tok[start + 2 :: 3] = SEP, k[q], v[q]
        return tok, torch.arange(start + 2, L, 3), (1 + q) if self.fused_pairs else (1 + 2 * q)

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens `[seq_len]`, query-value positions `[num_queries]`) of sample `index`."""
        tok, value_pos, _ = self.draw(index)
        return tok, value_pos

    def batch(self, step: int, micro_batch: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """`[micro_batch, seq_len]` for one data-parallel replica at one step."""
        return self.get(step, micro_batch, dp_rank, dp_size).input_ids

    def get(self, step: int, micro_batch: int, dp_rank: int, dp_size: int) -> Batch:
        """`Batch` for one replica at one step (labels only on the query values with
        supervise='queries')."""
        return self.rows(step_samples(step, micro_batch, dp_rank, dp_size))

    def rows(self, samples: range) -> Batch:
        """`Batch` of samples `samples` (one row each)."""
        drawn = [self.sample(i) for i in samples]
        ids = torch.stack([tok for tok, _ in drawn])
        if self.supervise == "all":
            return Batch(ids)
        labels = torch.full_like(ids, IGNORE_INDEX)
        for i, (_, pos) in enumerate(drawn):
            labels[i, pos] = ids[i, pos]
        return Batch(ids, labels=labels)

    def held_out(self) -> "SyntheticRetrieval":
        """The same task from another seed stream (the run's eval rows)."""
        return replace(self, seed=self.seed + HELD_OUT_SEED)

    def signature(self) -> dict:
        return {
            "kind": "synthetic",
            "seq_len": self.seq_len,
            "seed": self.seed,
            "vocab_size": self.vocab_size,
        }
