"""What a rehearsal of an objective-dpo config steps on instead of its pairs file: one synthetic
preference pair per row of seq_len, its prompt shared (branch ids 0, 1, 2:
parallel/shared_prefix.py), so the attention it times is the
shared layout's. The reference log-probs are zeros: the reference pass is not rehearsed (plan.txt
states its time).

    dpo_completion(a, cfg)  # a.completion_len resolved, checked
    # data.preference.PairRows, ref set:
    rows = synthetic_pair_rows(seq_len, vocab, completion_len, seed)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# torch and the data are imported where the row is made: `ds-longctx rehearse` checks its arguments
# first.
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.plan.levers import default_completion_len

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def dpo_completion(a, cfg: RunConfig) -> None:
    """Objective dpo: `a.completion_len` resolved (the planner's default where not given) and
    checked."""
    if cfg.train.objective == "dpo":
        if a.completion_len is None:
            a.completion_len = default_completion_len(cfg.train.seq_len)
        check_completion_len(cfg.train.seq_len, a.completion_len)


def check_completion_len(seq_len: int, c: int) -> int:
    """The synthetic row's prompt tokens; ValueError where completions of `c` leave fewer than 2."""
    prompt = seq_len - 2 * c - 1
    if c < 1 or prompt < 2:
        raise ValueError(
            f"--completion_len {c}: a dpo row of {seq_len:,} tokens holds a prompt of at least 2 "
            f"tokens and two completions; give 1 to {(seq_len - 3) // 2:,}"
        )
    return prompt


def synthetic_pair_rows(seq_len: int, vocab: int, completion_len: int, seed: int):
    """A prompt of seq_len - 2·completion_len - 1 tokens, then chosen and rejected of completion_len
    + 1 each (the prompt's last token heads both: data/preference.pack_shared_pairs), random ids,
      one row of exactly seq_len."""
    import torch

    from ds_longctx.data.preference import PairRows

    c = completion_len
    prompt = check_completion_len(seq_len, c)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (prompt + 2 * c,), generator=g).tolist()
    head = ids[:prompt]
    chosen, rejected = ids[prompt : prompt + c], ids[prompt + c :]
    rejected[0] = (chosen[0] + 1) % vocab  # the branches part at their first token
    pair = tuple((head + tail, [IGNORE_INDEX] * prompt + tail) for tail in (chosen, rejected))
    rows = PairRows([pair], seq_len, seed, False, 0, "synthetic dpo row", shared=True)
    rows.ref = torch.zeros(1, 2)
    return rows
