"""Scored rollouts for objective grpo, one per line of a JSON-lines file: `prompt` + `completion`
(strings or lists of messages) or a session (`messages`, its assistant turns trained); `reward` +
`group`, or a ready `advantage`; optional `old_logps` (one float per trained token, EOS included).

    seqs = read_rollouts(["rollouts.jsonl"], tok, eos, seq_len, "group")  # [Rollout]
    rows = RolloutRows(seqs, seq_len, seed, shuffle, pad_id)  # rows.row(r) -> RolloutBatch

Only completion tokens train (SFT's rules: data/preference.completion_tokens, data/chat.py).
Advantages of rewards follow TRL's GRPO: (r - group mean) / (std + 1e-4), std of the group
(`group`), of every reward (`batch`) or 1 (`none`), over the whole file. In a packed row, `seq`
numbers the row's trained tokens 0..K-1 (IGNORE_INDEX elsewhere): levers/policy_loss.py's per-token
log-probs come back in that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ds_longctx.data import chat, formats
from ds_longctx.data.preference import completion_tokens, read_json_lines
from ds_longctx.data.rows import Batch, RowOrder
from ds_longctx.data.sources import DataError
from ds_longctx.parallel.units import IGNORE_INDEX


@dataclass
class Rollout:
    ids: list  # input_ids of prompt + completion
    labels: list  # the completion's tokens, IGNORE_INDEX elsewhere
    reward: Optional[float]
    group: object  # the reward's group id (None with a ready advantage)
    advantage: Optional[float]  # given, or set by `advantages_of`
    old: Optional[list]  # per trained token, or None (the policy's own, detached)
    where: str  # "file line N", for messages


def _number(obj: dict, key: str) -> Optional[str]:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return f"{key}={v!r} is not a finite number; give one"
    return None


def _empty(v) -> bool:
    if isinstance(v, str):
        return not v.strip()
    return not (isinstance(v, list) and any(isinstance(m, dict) and m.get("content") for m in v))


def _score_problem(obj: dict) -> Optional[str]:
    """What is wrong with a row's reward, group, advantage and old_logps keys (None: nothing)."""
    old = obj.get("old_logps")
    if old is not None and not (
        isinstance(old, list) and all(_number({"v": v}, "v") is None for v in old)
    ):
        return "old_logps is a list of finite numbers, one per completion token"
    if "advantage" in obj:
        return _number(obj, "advantage")
    if "reward" not in obj:
        return "no 'reward' (with its 'group') nor 'advantage': a rollout needs its score"
    if why := _number(obj, "reward"):
        return why
    group = obj.get("group")
    if not isinstance(group, (str, int)) or isinstance(group, bool):
        return "a 'reward' needs its 'group' id (a string or integer: the rollouts of one prompt)"
    return None


def rollout_tokens(tok, obj, eos: Optional[int]) -> tuple:
    """(input_ids, labels) of one row; ChatError saying what is wrong."""
    if not isinstance(obj, dict):
        raise formats.ChatError(f"a JSON {type(obj).__name__}, not an object: one rollout per line")
    if "messages" in obj:
        if why := formats.row_problem(obj, "messages"):
            raise formats.ChatError(why)
        return chat.session_tokens(tok, obj["messages"], obj.get("tools"), "assistant")
    if "prompt" not in obj or "completion" not in obj:
        raise formats.ChatError(
            f"no 'prompt' and 'completion' nor 'messages' (its keys: {sorted(obj)[:8]})"
        )
    prompt, completion = obj["prompt"], obj["completion"]
    if {type(prompt), type(completion)} not in ({str}, {list}):
        raise formats.ChatError("prompt and completion are both strings or both lists of messages")
    if _empty(completion):
        raise formats.ChatError("an empty completion: nothing to train; drop the row")
    if isinstance(prompt, list) and (
        why := formats.row_problem({"messages": prompt + completion}, "messages")
    ):
        raise formats.ChatError(why)
    return completion_tokens(tok, prompt, completion, eos)


def _rollout(tok, obj, eos, seq_len, where) -> Rollout:
    if isinstance(obj, dict) and (why := _score_problem(obj)):
        raise formats.ChatError(why)
    ids, labels = rollout_tokens(tok, obj, eos)
    labels = [IGNORE_INDEX] + list(labels[1:])  # a document's first token has nothing before it
    n = sum(v != IGNORE_INDEX for v in labels)
    if n == 0:
        raise formats.ChatError(
            "the completion gives no trained token (the template left it empty)"
        )
    old = obj.get("old_logps")
    if old is not None and len(old) != n:
        raise formats.ChatError(
            f"old_logps holds {len(old)} values, the completion {n} tokens (EOS included); give "
            "one per token"
        )
    if len(ids) > seq_len:
        raise formats.ChatError(
            f"{len(ids)} tokens, more than seq_len={seq_len}; raise seq_len or shorten it"
        )
    adv = obj.get("advantage")
    return Rollout(ids, labels, obj.get("reward"), obj.get("group"), adv, old, where)


def advantages_of(seqs: list, scale: str) -> None:
    """Set each rollout's advantage from its reward as TRL's GRPO does (module doc); DataError for a
    group of one."""
    groups: dict = {}
    for s in seqs:
        if s.advantage is None:
            groups.setdefault(s.group, []).append(s)
    if not groups:
        return
    every = torch.tensor([s.reward for g in groups.values() for s in g], dtype=torch.float64)
    for g, members in groups.items():
        if len(members) == 1:
            raise DataError(
                f"data {members[0].where}: group {g!r} has one rollout; GRPO's advantage compares "
                f"a group's rollouts (give several, or a ready 'advantage')"
            )
        r = torch.tensor([s.reward for s in members], dtype=torch.float64)
        std = {"group": r.std(), "batch": every.std(), "none": None}[scale]
        adv = r - r.mean()
        adv = adv if std is None else adv / (std + 1e-4)
        for s, a in zip(members, adv.tolist()):
            s.advantage = a


def read_rollouts(files: list, tok, eos: Optional[int], seq_len: int, scale: str) -> list:
    """Every rollout of JSON-lines `files`, tokenized, advantages set; DataError naming the first
    bad row's file and line."""
    seqs = read_json_lines(
        files,
        lambda obj, where: _rollout(tok, obj, eos, seq_len, where),
        (ValueError, formats.ChatError),
    )
    if not seqs:
        raise DataError(f"data files {files} hold no rollout; write one JSON object per line")
    advantages_of(seqs, scale)
    return seqs


@dataclass
class RolloutBatch(Batch):
    seq: Optional[torch.Tensor] = (
        None  # [1, L] index of each trained token in the row (0..K-1), else IGNORE_INDEX
    )
    items: tuple = ()  # the row's rollouts, by index in the data
    token_seq: Optional[torch.Tensor] = (
        None  # [K] which of the row's rollouts each trained token is of
    )
    advantages: Optional[torch.Tensor] = None  # [K] fp32, each token its rollout's
    old: Optional[torch.Tensor] = None  # [K] fp32 old log-probs, NaN where not given
    ref: Optional[torch.Tensor] = None  # [K] fp32 reference log-probs, once computed
    max_len: int = 0  # dr_grpo's max_completion_length

    def n_logps(self) -> int:
        return len(self.token_seq)


class RolloutRows:
    """Rows of seq_len holding whole rollouts, next-fit in file order, the rest padding, in the
    (seed, step) order of data/rows.py. `ref`: the reference log-probs of every trained token [T]
    (rollout order), set before step 1."""

    def __init__(
        self, seqs: list, seq_len: int, seed: int, shuffle: bool, pad_id: int, max_len=None
    ):
        self.seqs, self.seq_len, self.pad_id = seqs, seq_len, pad_id
        self.counts = [sum(v != IGNORE_INDEX for v in s.labels) for s in seqs]
        self.starts = [0]
        for n in self.counts:
            self.starts.append(self.starts[-1] + n)
        self.max_len = max_len or max(self.counts)
        self.rows_of, fill = [[]], 0
        for i, s in enumerate(seqs):
            if fill + len(s.ids) > seq_len:
                self.rows_of.append([])
                fill = 0
            self.rows_of[-1].append(i)
            fill += len(s.ids)
        self.n_rows, self.seed, self.shuffle = len(self.rows_of), seed, shuffle
        self.order = RowOrder(self.n_rows, seed, shuffle)
        self.skipped_rows = 0
        self.ref: Optional[torch.Tensor] = None

    def signature(self) -> dict:
        """What a resumed run must find unchanged for the order (and the stored reference) to
        hold."""
        return {
            "kind": "rollouts",
            "seq_len": self.seq_len,
            "n_rows": self.n_rows,
            "n_rollouts": len(self.seqs),
            "tokens": self.starts[-1],
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    ref_shape = (-1,)  # the reference table: [tokens]

    def ref_numel(self) -> int:
        return self.starts[-1]

    def ref_slots(self, batch: RolloutBatch) -> torch.Tensor:
        """Where the batch's per-token log-probs [K] go in the reference table [T]."""
        return torch.cat([torch.arange(self.starts[i], self.starts[i + 1]) for i in batch.items])

    def row(self, r: int) -> RolloutBatch:
        """Row r as a batch of one: its rollouts as documents, padded to seq_len (a document of its
        own)."""
        at = self.rows_of[r]
        ids, pos, labels, seq, tok_seq, adv, old = [], [], [], [], [], [], []
        for k, i in enumerate(at):
            s = self.seqs[i]
            ids += s.ids
            pos += range(len(s.ids))
            labels += s.labels
            for v in s.labels:
                seq.append(len(tok_seq) if v != IGNORE_INDEX else IGNORE_INDEX)
                if v != IGNORE_INDEX:
                    tok_seq.append(k)
            adv += [s.advantage] * self.counts[i]
            old += s.old if s.old is not None else [math.nan] * self.counts[i]
        pad = self.seq_len - len(ids)
        ids += [self.pad_id] * pad
        pos += range(pad)
        labels += [IGNORE_INDEX] * pad
        seq += [IGNORE_INDEX] * pad
        long = [torch.tensor(x, dtype=torch.int64)[None] for x in (ids, pos, labels, seq)]
        batch = RolloutBatch(*long, items=tuple(at), token_seq=torch.tensor(tok_seq))
        batch.advantages, batch.old = torch.tensor(adv), torch.tensor(old, dtype=torch.float32)
        batch.max_len = self.max_len
        if self.ref is not None:
            batch.ref = self.ref[self.ref_slots(batch)]
        return batch

    def rows(self, samples: range) -> RolloutBatch:
        if len(samples) != 1:
            raise ValueError(
                f"rollout rows are packed: one row per micro-batch, asked for {len(samples)}"
            )
        return self.row(self.order.row_of_sample(samples[0]))
