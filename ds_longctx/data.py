"""Training data. For now: a synthetic long-range task, identical for any world size and sp_size.

Synthetic key-value retrieval (`SyntheticRetrieval`): a sequence opens with key-value pairs packed into its
first `pairs_fraction` of tokens, then filler, then queries `SEP key value` at the end. Predicting a
query's value needs the pair placed ~90% of the sequence earlier: long-range structure a model can
only learn if attention really spans the whole (sequence-parallel) sequence. Sample `i` depends only on
(seed, i), so every layout of ranks sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, EOS, SEP = 0, 1, 2, 3


@dataclass(frozen=True)
class SyntheticRetrieval:
    seq_len: int
    vocab_size: int
    seed: int = 0
    pairs_fraction: float = 0.1
    num_queries: int = 8

    def __post_init__(self):
        if self.vocab_size < 16:
            raise ValueError(f"vocab_size={self.vocab_size} is too small for the synthetic task; need >= 16")
        if self.seq_len < 4 * self.num_queries + 8:
            raise ValueError(f"seq_len={self.seq_len} is too short for {self.num_queries} synthetic queries; "
                             f"use seq_len >= {4 * self.num_queries + 8}")

    @property
    def ranges(self) -> tuple[range, range, range]:
        """Token ids of keys, values and filler (three equal thirds above the 4 specials)."""
        third = (self.vocab_size - 4) // 3
        return range(4, 4 + third), range(4 + third, 4 + 2 * third), range(4 + 2 * third, self.vocab_size)

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens `[seq_len]`, query-value positions `[num_queries]`) of sample `index`."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        keys, values, filler = self.ranges
        L = self.seq_len
        tok = torch.randint(filler.start, filler.stop, (L,), generator=g)
        tok[0] = BOS
        n_pairs = max(self.num_queries, min(len(keys), int(L * self.pairs_fraction) // 2))
        k = keys.start + torch.randperm(len(keys), generator=g)[:n_pairs]
        v = torch.randint(values.start, values.stop, (n_pairs,), generator=g)
        tok[1:1 + 2 * n_pairs:2], tok[2:2 + 2 * n_pairs:2] = k, v
        q = torch.randperm(n_pairs, generator=g)[:self.num_queries]
        start = L - 3 * self.num_queries
        tok[start::3], tok[start + 1::3], tok[start + 2::3] = SEP, k[q], v[q]
        return tok, torch.arange(start + 2, L, 3)

    def batch(self, step: int, micro_batch: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """`[micro_batch, seq_len]` for one data-parallel replica at one step."""
        first = (step * dp_size + dp_rank) * micro_batch
        return torch.stack([self.sample(first + i)[0] for i in range(micro_batch)])
