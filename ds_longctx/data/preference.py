"""Preference pairs (TRL's format): `prompt` + `chosen` + `rejected`, as plain strings or as lists
of messages, or `chosen` + `rejected` alone as whole conversations whose last message is the
completion (TRL's implicit prompt).

    pairs = read_pairs(["pairs.jsonl"], tok, eos)  # [(chosen, rejected)], each (ids, labels)
    ids, pos, labels, seq = pack_pairs(pairs)      # one packed row: chosen, rejected, chosen, ...

Only completion tokens train, with SFT's rules (data/formats.py `pair_tokens`, data/chat.py for
messages); EOS ends a plain completion and trains. In a packed row, sequence 2p is pair p's chosen,
2p + 1 its rejected; `seq` names the sequence of each trained token (IGNORE_INDEX elsewhere), the
key of levers/preference.py's per-sequence sums.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import torch

from ds_longctx.data import chat, formats
from ds_longctx.data.rows import Batch, RowOrder
from ds_longctx.data.sources import DataError, resolve_source
from ds_longctx.parallel.json_keys import DuplicateKey, TooDeep, loads_unique
from ds_longctx.parallel.units import IGNORE_INDEX

PAIR_KEYS = formats.row_format("preference").keys


def _empty(value) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, list) and not any(
        isinstance(m, dict) and m.get("content") for m in value
    )


def split_pair(obj) -> tuple:
    """(prompt, chosen, rejected) of a row, or a str saying what is wrong. Conversations given whole
    (no `prompt`) share every message but their last, which is the completion."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object: write one pair per line"
    missing = [k for k in PAIR_KEYS if k not in obj]
    if missing:
        return (
            f"no {missing[0]!r} key (its keys: {sorted(obj)[:8]}): a preference pair holds prompt, "
            f"chosen and rejected"
        )
    prompt, chosen, rejected = obj.get("prompt"), obj["chosen"], obj["rejected"]
    if prompt is None and all(isinstance(v, list) and v for v in (chosen, rejected)):
        if chosen[:-1] != rejected[:-1]:
            at = next(i for i, (a, b) in enumerate(zip(chosen, rejected + [None])) if a != b)
            return (
                f"chosen and rejected differ before their last message (at message {at}): a pair "
                f"shares its prompt; give the shared messages as 'prompt' and one completion each"
            )
        prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
    if prompt is None:
        return "no 'prompt' key: give the prompt, or chosen and rejected as whole conversations"
    kinds = {type(v) for v in (prompt, chosen, rejected)}
    if kinds not in ({str}, {list}):
        return (
            "prompt, chosen and rejected are all strings or all lists of messages; convert the odd "
            "one"
        )
    for k, v in (("chosen", chosen), ("rejected", rejected)):
        if _empty(v):
            return (
                f"{k!r} is an empty completion: nothing to compare; drop the pair or write the "
                "completion"
            )
    if isinstance(prompt, list):
        why = formats.row_problem({"messages": prompt + chosen}, "messages") or formats.row_problem(
            {"messages": prompt + rejected}, "messages"
        )
        if why:
            return why
    return prompt, chosen, rejected


def completion_tokens(tok, prompt, completion, eos: Optional[int]) -> tuple[list, list]:
    """(input_ids, labels) of prompt + completion: SFT's tokens, the completion alone trains."""
    if isinstance(prompt, str):
        ids, labels = formats.pair_tokens(tok, prompt, completion, "completion")
        if eos is not None and ids[-1] != eos:
            ids, labels = ids + [eos], labels + [eos]
        return ids, labels
    talk = formats.conversational({"prompt": prompt, "completion": completion})
    return chat.session_tokens(tok, talk["messages"], None, "assistant")


def pair_tokens_of(tok, obj, eos: Optional[int]) -> tuple:
    """((chosen ids, labels), (rejected ids, labels)) of one row; ChatError saying what is wrong."""
    got = split_pair(obj)
    if isinstance(got, str):
        raise formats.ChatError(got)
    prompt, chosen, rejected = got
    seqs = tuple(completion_tokens(tok, prompt, c, eos) for c in (chosen, rejected))
    for k, (_, labels) in zip(PAIR_KEYS, seqs):
        if all(v == IGNORE_INDEX for v in labels[1:]):
            raise formats.ChatError(
                f"{k!r} gives no trained token (the template or tokenizer left it empty)"
            )
    return seqs


ROW_ERRORS = (json.JSONDecodeError, DuplicateKey, TooDeep, formats.ChatError)


def read_json_lines(files: list, build, errors: tuple = ROW_ERRORS) -> list:
    """`build(obj, where)` of every JSON line of `files` (blank lines skipped); an `errors` one
    raised by the reader or by `build` is a DataError naming its file and line."""
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line_no, text in enumerate(fh, 1):
                if not text.strip():
                    continue
                try:
                    out.append(build(loads_unique(text), f"file {f!r} line {line_no}"))
                except errors as e:
                    what = f"not JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
                    raise DataError(f"data file {f!r} line {line_no}: {what}") from None
    return out


def read_pairs(files: list, tok, eos: Optional[int], seq_len: Optional[int] = None) -> list:
    """Every pair of JSON-lines `files`, tokenized; DataError naming the first bad row's file and
    line (a pair whose two sequences together pass `seq_len` is one: a row holds both)."""

    def pair(obj, where):
        got = pair_tokens_of(tok, obj, eos)
        n = len(got[0][0]) + len(got[1][0])
        if seq_len is not None and n > seq_len:
            raise formats.ChatError(
                f"the pair's two sequences hold {n} tokens together, more than "
                f"seq_len={seq_len} (a row holds both); raise seq_len or shorten it"
            )
        return got

    pairs = read_json_lines(files, pair)
    if not pairs:
        raise DataError(
            f"data files {files} hold no preference pair; write one JSON object per line"
        )
    return pairs


def pack_pairs(pairs: list) -> tuple:
    """One row of the pairs' sequences as documents (chosen, rejected, chosen, ...): input_ids,
    position_ids (each document from 0), labels and seq (int64 [T] each, T their total length)."""
    ids, pos, labels, seq = [], [], [], []
    for k, (s_ids, s_labels) in enumerate(s for pair in pairs for s in pair):
        ids += s_ids
        pos += range(len(s_ids))
        labels += s_labels
        seq += [k if v != IGNORE_INDEX else IGNORE_INDEX for v in s_labels]
    return tuple(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, labels, seq))


def _shared_len(chosen: tuple, rejected: tuple) -> int:
    """Tokens the two sequences share from the start, none of them trained."""
    n = 0
    for a, la, b, lb in zip(*chosen, *rejected):
        if a != b or la != IGNORE_INDEX or lb != IGNORE_INDEX:
            break
        n += 1
    return n


def pack_shared_pairs(pairs: list) -> tuple:
    """One row of the pairs, each its prompt once, then both completions
    (parallel/shared_prefix.py): input_ids, position_ids, labels, seq and branch (0 the shared
    prompt, 1 chosen, 2 rejected; int64 [T] each). The prompt's last token starts each branch (it
    predicts the branch's first token), the branches' positions continue the prompt's. Tokens,
    labels and sequence ids are those of `pack_pairs` with the prompt written once."""
    ids, pos, labels, seq, branch = [], [], [], [], []
    for p, (c, r) in enumerate(pairs):
        keep = max(_shared_len(c, r) - 1, 0)
        ids += c[0][:keep]
        pos += range(keep)
        labels += [IGNORE_INDEX] * keep
        seq += [IGNORE_INDEX] * keep
        branch += [0] * keep
        for k, (s_ids, s_labels) in enumerate((c, r)):
            ids += s_ids[keep:]
            pos += range(keep, len(s_ids))
            labels += s_labels[keep:]
            seq += [2 * p + k if v != IGNORE_INDEX else IGNORE_INDEX for v in s_labels[keep:]]
            branch += [k + 1 if keep else 0] * (
                len(s_ids) - keep
            )  # no shared token: two plain documents
    return tuple(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, labels, seq, branch))


def pair_files(source: str) -> list:
    """The JSON-lines files of a preference source (a .jsonl file, or a directory of them)."""
    builder, files = resolve_source(source)
    if builder != "json":
        raise DataError(
            f"data={source!r} is {builder} data; objective dpo and grpo read JSON lines (of "
            f"prompt, chosen and rejected; of scored rollouts)"
        )
    return files


@dataclass
class PairBatch(Batch):
    seq: Optional[torch.Tensor] = (
        None  # [1, L] sequence id of each trained token (module doc), else IGNORE_INDEX
    )
    pairs: tuple = ()  # the row's pairs, by index in the data (the reference log-probs' rows)
    ref: Optional[torch.Tensor] = (
        None  # [P, 2] their reference log-probs (chosen, rejected), once computed
    )
    branch: Optional[torch.Tensor] = (
        None  # [1, L] shared-prompt rows: 0 prompt, 1 chosen, 2 rejected (else None)
    )

    def n_logps(self) -> int:
        return 2 * len(self.pairs)


class PairRows:
    """Rows of seq_len holding whole pairs, next-fit in file order, the rest padding (a document of
    its own), in the (seed, step) order of data/rows.py; `shared`: each pair's prompt once
    (`pack_shared_pairs`). `ref`: the reference log-probs [pairs, 2] (chosen, rejected), set by the
    run before its first step."""

    def __init__(
        self,
        pairs: list,
        seq_len: int,
        seed: int,
        shuffle: bool,
        pad_id: int,
        source: str = "",
        shared: bool = False,
    ):
        self.pairs, self.seq_len, self.pad_id, self.source, self.shared = (
            pairs,
            seq_len,
            pad_id,
            source,
            shared,
        )
        self.rows_of, fill = [[]], 0
        for i, (c, r) in enumerate(pairs):
            n = len(c[0]) + len(r[0]) - (max(_shared_len(c, r) - 1, 0) if shared else 0)
            if fill + n > seq_len:
                self.rows_of.append([])
                fill = 0
            self.rows_of[-1].append(i)
            fill += n
        self.n_rows, self.seed, self.shuffle = len(self.rows_of), seed, shuffle
        self.order = RowOrder(self.n_rows, seed, shuffle)
        self.skipped_rows = 0
        self.ref: Optional[torch.Tensor] = None

    def signature(self) -> dict:
        """What a resumed run must find unchanged for the order to continue."""
        return {
            "kind": "pairs",
            "seq_len": self.seq_len,
            "n_rows": self.n_rows,
            "n_pairs": len(self.pairs),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shared": self.shared,
        }

    ref_shape = (-1, 2)  # the reference table: [pairs, 2], chosen first

    def ref_numel(self) -> int:
        return 2 * len(self.pairs)

    def ref_slots(self, batch: PairBatch) -> torch.Tensor:
        """Where the batch's log-probs [2P] go in the flat reference table."""
        return torch.tensor([2 * p + k for p in batch.pairs for k in (0, 1)])

    def row(self, r: int) -> PairBatch:
        """Row r as a batch of one: its pairs packed (`pack_pairs`), padded to seq_len."""
        at = self.rows_of[r]
        pairs = [self.pairs[i] for i in at]
        ids, pos, labels, seq, *branch = (
            pack_shared_pairs(pairs) if self.shared else pack_pairs(pairs)
        )
        pad = self.seq_len - len(ids)
        if pad:  # a plain document of its own
            ids = torch.cat([ids, ids.new_full((pad,), self.pad_id)])
            pos = torch.cat([pos, torch.arange(pad)])
            labels, seq = (torch.cat([t, t.new_full((pad,), IGNORE_INDEX)]) for t in (labels, seq))
            branch = [torch.cat([b, b.new_zeros(pad)]) for b in branch]
        return PairBatch(
            ids[None],
            pos[None],
            labels[None],
            seq[None],
            tuple(at),
            None if self.ref is None else self.ref[at],
            branch[0][None] if branch else None,
        )

    def rows(self, samples: range) -> PairBatch:
        if len(samples) != 1:
            raise ValueError(
                f"preference rows are packed: one row per micro-batch, asked for {len(samples)}"
            )
        return self.row(self.order.row_of_sample(samples[0]))
