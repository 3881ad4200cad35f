"""Per-rank slices: pre-shifted labels (none lost at a slice border), global positions, padding,
packing."""

import pytest
import torch

from ds_longctx.parallel.sharding import doc_boundaries, shard_batch
from ds_longctx.parallel.units import IGNORE_INDEX


def full_targets(ids):
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], IGNORE_INDEX)], dim=1)


@pytest.mark.parametrize("L,sp", [(16, 2), (16, 4), (15, 4), (5, 4)])
def test_slices_reassemble_the_full_sequence(L, sp):
    ids = torch.arange(100, 100 + 2 * L).view(2, L)
    shards = [shard_batch(ids, sp, r) for r in range(sp)]
    pad = shards[0].pad
    assert pad == (-L) % sp

    def cat(f):
        return torch.cat([getattr(s, f) for s in shards], dim=1)

    assert torch.equal(cat("input_ids")[:, :L], ids)
    assert torch.equal(
        cat("shift_labels")[:, :L], full_targets(ids)
    )  # border tokens keep their next token
    assert (cat("shift_labels")[:, L:] == IGNORE_INDEX).all()
    assert torch.equal(cat("position_ids"), torch.arange(L + pad).expand(2, -1))
    assert all(s.cu_seqlens is None for s in shards)


def test_packed_documents_ignore_cross_document_labels():
    ids = torch.arange(10)[None]
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]])
    s = shard_batch(ids, 2, 0, position_ids=pos)
    t = shard_batch(ids, 2, 1, position_ids=pos)
    labels = torch.cat([s.shift_labels, t.shift_labels], dim=1)[0].tolist()
    assert labels == [1, 2, IGNORE_INDEX, 4, 5, 6, IGNORE_INDEX, 8, 9, IGNORE_INDEX]
    assert s.cu_seqlens.tolist() == [0, 3, 7, 10] and s.max_seqlen == 4


def test_bad_position_ids_and_shapes():
    with pytest.raises(ValueError, match="must start at 0"):
        doc_boundaries(torch.tensor([[1, 2, 0]]))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        shard_batch(torch.arange(4), 2, 0)
    with pytest.raises(ValueError, match="shorter than sp_size=4"):
        shard_batch(torch.arange(3)[None], 4, 0)
    with pytest.raises(ValueError, match="micro_batch=1"):
        shard_batch(
            torch.zeros(2, 6, dtype=torch.long),
            2,
            0,
            position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]] * 2),
        )
