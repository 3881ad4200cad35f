"""Cut a batch into this rank's sequence slice.

Design notes: docs/design/parallel.md, section `sharding.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ds_longctx.parallel.units import IGNORE_INDEX


@dataclass
class Shard:
    input_ids: torch.Tensor  # [b, L/sp]
    position_ids: torch.Tensor  # [b, L/sp] global positions
    shift_labels: torch.Tensor  # [b, L/sp] target of each token, IGNORE_INDEX where none
    cu_seqlens: Optional[
        torch.Tensor
    ]  # int32 [n_docs + 1] offsets in the full sequence, None if 1 doc/row
    max_seqlen: Optional[int]
    pad: int  # tokens of padding appended to reach a multiple of sp


def shift_labels(
    input_ids: torch.Tensor,
    labels: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`[b, L]` -> `[b, L]`: target of token i is labels[i+1] (labels default to input_ids); last is
    ignored, and so is the last token of each packed document (where position_ids[i+1] == 0)."""
    src = input_ids if labels is None else labels
    out = torch.full_like(src, IGNORE_INDEX)
    out[:, :-1] = src[:, 1:]
    if position_ids is not None:
        out[:, :-1][position_ids[:, 1:] == 0] = IGNORE_INDEX
    return out


def trained_counts(
    input_ids: torch.Tensor,
    labels: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """int64 [b]: the tokens of each row of a full batch `[b, L]` whose next token trains (what
    `shard_batch`'s shift_labels leave unignored over all SP ranks)."""
    packed = position_ids is not None and bool((position_ids[:, 1:] == 0).any())
    return (shift_labels(input_ids, labels, position_ids if packed else None) != IGNORE_INDEX).sum(
        dim=1
    )


def doc_boundaries(position_ids: torch.Tensor) -> tuple[Optional[torch.Tensor], Optional[int]]:
    """cu_seqlens (int32) and max document length of a packed row `[1, L]`; (None, None) if one
    document."""
    pos = position_ids[0]
    starts = torch.nonzero(pos == 0).flatten()
    if starts.numel() == 0 or starts[0] != 0:
        raise ValueError("packed position_ids must start at 0 and restart at 0 for each document")
    if starts.numel() == 1:
        if not torch.equal(pos, torch.arange(pos.numel(), device=pos.device)):
            raise ValueError("position_ids of a single document must be 0..L-1")
        return None, None
    cu = torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def shard_batch(
    input_ids: torch.Tensor,
    sp_size: int,
    sp_rank: int,
    labels: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
    pad_token_id: int = 0,
) -> Shard:
    """This rank's slice of a full batch `[b, L]` (see module docstring)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
    b, L = input_ids.shape
    if L < sp_size:
        raise ValueError(
            f"sequence of {L} tokens is shorter than sp_size={sp_size}; each rank needs a token"
        )
    packed = position_ids is not None and bool((position_ids[:, 1:] == 0).any())
    if packed and b != 1:
        raise ValueError(f"packed documents need micro_batch=1, got batch {b}")
    if position_ids is None:
        position_ids = torch.arange(L, device=input_ids.device).expand(b, L)
    targets = shift_labels(input_ids, labels, position_ids if packed else None)
    cu, max_len = doc_boundaries(position_ids) if packed else (None, None)

    pad = (-L) % sp_size
    if pad:
        # [b, L] -> [b, L + pad]: pad tokens continue the positions, predict nothing, come after
        # every real token
        input_ids = torch.cat([input_ids, input_ids.new_full((b, pad), pad_token_id)], dim=1)
        targets = torch.cat([targets, targets.new_full((b, pad), IGNORE_INDEX)], dim=1)
        tail = position_ids[:, -1:] + torch.arange(1, pad + 1, device=position_ids.device)
        position_ids = torch.cat([position_ids, tail], dim=1)
        if cu is not None:
            cu = torch.cat([cu, cu.new_tensor([L + pad])])  # padding is its own document
            max_len = max(max_len, pad)
    n = (L + pad) // sp_size
    sl = slice(sp_rank * n, (sp_rank + 1) * n)
    return Shard(
        input_ids=input_ids[:, sl].contiguous(),
        position_ids=position_ids[:, sl].contiguous(),
        shift_labels=targets[:, sl].contiguous(),
        cu_seqlens=cu,
        max_seqlen=max_len,
        pad=pad,
    )
