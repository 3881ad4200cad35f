"""One shared prompt under two completions: attention over a row whose documents may branch.

Design notes: docs/design/parallel.md, section `shared_prefix.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class SharedLayout:
    gather: torch.Tensor  # int64 [s']: the row token written at each virtual position
    take: torch.Tensor  # int64 [s]: the virtual position each row token reads its output from
    cu_seqlens: torch.Tensor  # int32 [n + 1]: the virtual documents' offsets (the keys')
    max_seqlen: int
    cu_seqlens_q: torch.Tensor  # int32 [n + 1]: the row's queries per virtual document (S+B1, B2)
    max_seqlen_q: int


def _runs(branch: list, a: int, b: int) -> Optional[tuple]:
    """(S, B1, B2) as index ranges of document [a, b) when its branch ids are 0..0 1..1 2..2 with B1
    and B2 not empty; None where the document does not branch (no 2); ValueError where it branches
    out of that order."""
    ids = branch[a:b]
    if 2 not in ids:
        if any(x not in (0,) for x in ids):
            raise ValueError(
                f"tokens {a}..{b - 1} carry branch ids {sorted(set(ids))} without a second branch "
                "(2)"
            )
        return None
    n0, n1 = ids.count(0), ids.count(1)
    if n1 == 0 or ids != [0] * n0 + [1] * n1 + [2] * (len(ids) - n0 - n1):
        raise ValueError(
            f"tokens {a}..{b - 1} branch out of order: a document holds its shared prefix (0), "
            "then its "
            f"first branch (1), then its second (2), each contiguous and both branches non-empty"
        )
    return range(a, a + n0), range(a + n0, a + n0 + n1), range(a + n0 + n1, b)


def shared_layout(
    position_ids: torch.Tensor, branch: torch.Tensor, pad: int = 0
) -> Optional[SharedLayout]:
    """The virtual sequence of a row `[L]` and `pad` tokens of SP padding after it (module doc):
    documents start where
    positions are 0, and the padding is one of its own. None where no document branches."""
    n, br = len(position_ids), branch.tolist() + [0] * pad
    s = n + pad
    starts = sorted(
        {0, *torch.nonzero(position_ids == 0).flatten().tolist(), *([n] if pad else [])}
    ) + [s]
    gather, take, cu, cu_q, branched = [], [0] * s, [0], [0], False
    for a, b in zip(starts[:-1], starts[1:]):
        runs = _runs(br, a, b)
        parts = [range(a, b)] if runs is None else [(*runs[0], *runs[1]), (*runs[0], *runs[2])]
        branched |= runs is not None
        cu_q += [b] if runs is None else [runs[2].start, b]
        for k, part in enumerate(parts):
            for i in part:
                if k == 0 or i >= runs[2].start:  # S is read from its first copy
                    take[i] = len(gather)
                gather.append(i)
            cu.append(len(gather))
    if not branched:
        return None
    cu_t, cu_q_t = (torch.tensor(c, dtype=torch.int32) for c in (cu, cu_q))
    return SharedLayout(
        torch.tensor(gather, dtype=torch.int64),
        torch.tensor(take, dtype=torch.int64),
        cu_t,
        int((cu_t[1:] - cu_t[:-1]).max()),
        cu_q_t,
        int((cu_q_t[1:] - cu_q_t[:-1]).max()),
    )
