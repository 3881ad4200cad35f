"""Preference pairs (TRL's format): `prompt` + `chosen` + `rejected`, as plain strings or as lists of messages, or
`chosen` + `rejected` alone as whole conversations whose last message is the completion (TRL's implicit prompt).

    pairs = read_pairs(["pairs.jsonl"], tok, eos)      # [(chosen (ids, labels), rejected (ids, labels))]
    ids, pos, labels, seq = pack_pairs(pairs)          # one packed row: chosen, rejected, chosen, ...

Only completion tokens train, with SFT's rules (data/formats.py `pair_tokens`, data/chat.py for messages); EOS ends a
plain completion and trains. In a packed row, sequence 2p is pair p's chosen, 2p + 1 its rejected; `seq` names the
sequence of each trained token (IGNORE_INDEX elsewhere), the key of levers/preference.py's per-sequence sums.
"""

from __future__ import annotations

import json
from typing import Optional

import torch

from ds_longctx.data import chat, formats
from ds_longctx.data.sources import DataError
from ds_longctx.parallel.units import IGNORE_INDEX

PAIR_KEYS = ("chosen", "rejected")


def _empty(value) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, list) and not any(isinstance(m, dict) and m.get("content") for m in value)


def split_pair(obj) -> tuple:
    """(prompt, chosen, rejected) of a row, or a str saying what is wrong. Conversations given whole (no `prompt`)
    share every message but their last, which is the completion."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object: write one pair per line"
    missing = [k for k in PAIR_KEYS if k not in obj]
    if missing:
        return (f"no {missing[0]!r} key (its keys: {sorted(obj)[:8]}): a preference pair holds prompt, chosen and "
                f"rejected")
    prompt, chosen, rejected = obj.get("prompt"), obj["chosen"], obj["rejected"]
    if prompt is None and all(isinstance(v, list) and v for v in (chosen, rejected)):
        if chosen[:-1] != rejected[:-1]:
            at = next(i for i, (a, b) in enumerate(zip(chosen, rejected + [None])) if a != b)
            return (f"chosen and rejected differ before their last message (at message {at}): a pair shares its "
                    f"prompt; give the shared messages as 'prompt' and one completion each")
        prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
    if prompt is None:
        return "no 'prompt' key: give the prompt, or chosen and rejected as whole conversations"
    kinds = {type(v) for v in (prompt, chosen, rejected)}
    if kinds not in ({str}, {list}):
        return "prompt, chosen and rejected are all strings or all lists of messages; convert the odd one"
    for k, v in (("chosen", chosen), ("rejected", rejected)):
        if _empty(v):
            return f"{k!r} is an empty completion: nothing to compare; drop the pair or write the completion"
    if isinstance(prompt, list):
        why = formats.row_problem({"messages": prompt + chosen}, "messages") or \
            formats.row_problem({"messages": prompt + rejected}, "messages")
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
            raise formats.ChatError(f"{k!r} gives no trained token (the template or tokenizer left it empty)")
    return seqs


def read_pairs(files: list, tok, eos: Optional[int]) -> list:
    """Every pair of JSON-lines `files`, tokenized; DataError naming the first bad row's file and line."""
    pairs = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line_no, text in enumerate(fh, 1):
                if not text.strip():
                    continue
                try:
                    pairs.append(pair_tokens_of(tok, json.loads(text), eos))
                except (json.JSONDecodeError, formats.ChatError) as e:
                    what = f"not JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
                    raise DataError(f"data file {f!r} line {line_no}: {what}") from None
    if not pairs:
        raise DataError(f"data files {files} hold no preference pair; write one JSON object per line")
    return pairs


def pack_pairs(pairs: list) -> tuple:
    """One row of the pairs' sequences as documents (chosen, rejected, chosen, ...): input_ids, position_ids (each
    document from 0), labels and seq (int64 [T] each, T their total length)."""
    ids, pos, labels, seq = [], [], [], []
    for k, (s_ids, s_labels) in enumerate(s for pair in pairs for s in pair):
        ids += s_ids
        pos += range(len(s_ids))
        labels += s_labels
        seq += [k if v != IGNORE_INDEX else IGNORE_INDEX for v in s_labels]
    return tuple(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, labels, seq))
