"""The row formats in one table, `FORMAT_TABLE`, which config, scan, sources and tokenize ask; the
row checks, and the tokens and labels of pairs and token rows (a session's: data/chat.py).

    rec = row_format("messages")                                 # RowFormat: keys, layout, train_on
    fmt = detect_format(first_row_keys, "text", "auto")          # the first record whose keys fit
    why = row_problem(obj, fmt)                                  # None, or what is wrong with a row

A label differs from its token only where the user's `labels` say so."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Optional

from ds_longctx.parallel.units import IGNORE_INDEX

ROLES = ("system", "user", "assistant", "tool")
MASK_KEYS = ("labels", "completion_mask", "assistant_masks")  # which tokens of a tokens row train
MASK_COLUMNS = MASK_KEYS[1:]  # 0/1 per token, 1: it trains
TOKEN_KEYS = MASK_KEYS + ("attention_mask",)  # what a tokens row may carry beside input_ids


@dataclass(frozen=True)
class RowFormat:
    """One row format: its keys, layout, trained tokens, scanned columns and tokenizer."""

    name: str
    keys: tuple  # required (text: data.text_field)
    optional: tuple = ()
    objective: str = "sft"  # sft: data.format names it
    layout: str = "pack"  # data_layout auto's
    train_on: tuple = ("all",)  # data.train_on's values that apply
    trains: str = "all"  # data.train_on's default
    column: str = "string"  # scanned as: string, json (a JSON text) or ids
    nested: bool = False  # Parquet / hub columns checked when tokenized
    text_field: bool = False  # its key is data.text_field
    first_row_optional: bool = False  # rows carry the first row's optional keys
    tokens: str = ""  # "module:function" in data/: row -> (input_ids, labels)

    @property
    def masked(self) -> bool:  # labels say what trains (text: every token)
        return self.trains != "all"

    @property
    def needs_tokenizer(self) -> bool:
        return self.column != "ids"

    def required(self, text_field: str) -> tuple:
        return (text_field,) if self.text_field else self.keys

    def tokens_fn(self):
        module, _, name = self.tokens.partition(":")
        return getattr(importlib.import_module(f"ds_longctx.data.{module}"), name)


# fmt: off
FORMAT_TABLE = (  # detect_format tries them in this order
    RowFormat("text", ("text",), layout="concat", text_field=True, tokens="formats:text_tokens"),
    RowFormat("messages", ("messages",), ("tools",), trains="assistant",
              train_on=("assistant", "last_assistant", "all"), column="json", nested=True,
              tokens="chat:session_tokens"),
    RowFormat("prompt_completion", ("prompt", "completion"), train_on=("completion", "all"),
              trains="completion", nested=True, tokens="formats:pair_row"),
    RowFormat("tokens", ("input_ids",), TOKEN_KEYS, trains="labels", column="ids",
              first_row_optional=True, tokens="formats:token_row"),
    RowFormat("preference", ("chosen", "rejected"), ("prompt",), objective="dpo", train_on=(),
              trains="completion", tokens="preference:pair_tokens_of"),
    RowFormat("rollout", (), ("prompt", "completion", "messages", "tools", "reward", "group",
                              "advantage", "old_logps"),  # prompt + completion or messages
              objective="grpo", train_on=(), trains="completion", tokens="rl_rows:rollout_tokens"),
)
# fmt: on
ROW_FORMATS = tuple(r.name for r in FORMAT_TABLE if r.objective == "sft")  # data.format, less auto
TRAIN_ON = tuple(
    dict.fromkeys(v for r in FORMAT_TABLE if r.objective == "sft" for v in r.train_on if v != "all")
) + ("all",)


_BY_NAME = {r.name: r for r in FORMAT_TABLE}


def row_format(name: str) -> RowFormat:
    """The record of format `name`; ValueError listing the table's names."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    raise ValueError(
        f"row format {name!r} is none of {[r.name for r in FORMAT_TABLE]}; use one of those"
    )


class ChatError(ValueError):
    """One row cannot give tokens and labels: the message says why and what to do (tokenize names
    its file:line)."""


# --------------------------------------------------------------------------- formats and row checks
def detect_format(keys, text_field: str, fmt: str) -> str:
    """The row format: `fmt` unless "auto", else the first sft record of FORMAT_TABLE whose keys the
    row holds (text when none fits, whose check then names the missing key). A conversational
    prompt/completion row, read as a session (`conversational`), is messages."""
    keys = set(keys)
    if fmt == "prompt_completion" and "messages" in keys and "prompt" not in keys:
        return "messages"
    if fmt != "auto":
        return fmt
    sft = [r for r in FORMAT_TABLE if r.objective == "sft"]
    return next((r.name for r in sft if set(r.required(text_field)) <= keys), sft[0].name)


def conversational(obj: dict) -> dict:
    """A row whose `prompt` and `completion` are lists of messages (TRL's conversational
    prompt/completion) as a session: the completion's messages train, not its tool output nor the
    prompt (a message's own `train` decides first); any other row as it is."""
    prompt, completion = obj.get("prompt"), obj.get("completion")
    if "messages" in obj or not (isinstance(prompt, list) and isinstance(completion, list)):
        return obj

    def flagged(m, trains: bool):
        return (
            {**m, "train": trains and m.get("role") != "tool"}
            if isinstance(m, dict) and m.get("train") is None
            else m
        )

    return {
        "messages": [flagged(m, False) for m in prompt] + [flagged(m, True) for m in completion],
        "tools": obj.get("tools"),
    }


def other_format(obj: dict, text_field: str, mode: str) -> Optional[str]:
    """Why a row that does not fit `mode` rows is a row of another format (None where it is
    none)."""
    other = detect_format(obj, text_field, "auto")
    if other == mode or (other == "text" and text_field not in obj):
        return None
    return (
        f"a {other} row (its keys: {sorted(obj)[:8]}) among {mode} rows (the first row's format, "
        "or data.format): one source holds one format; convert this row, or move it to a file of "
        "its own"
    )


def _ints(v) -> bool:
    return isinstance(v, list) and all(type(x) is int for x in v)


def row_problem(obj: dict, fmt: str) -> Optional[str]:
    """What is wrong with a row of format messages, prompt_completion or tokens (None: nothing)."""
    if fmt != "tokens" and (masks := [k for k in MASK_KEYS if k in obj]):
        return (
            f"{masks[0]!r} beside the {fmt} fields: which tokens of a {fmt} row train is its "
            "template's and train_on's (or each message's own \"train\"), so it would be dropped; "
            "drop the key, or give token rows (input_ids with labels)"
        )
    if fmt == "prompt_completion":
        for k in ("prompt", "completion"):
            if not isinstance(obj.get(k), str):
                return (
                    f"{k!r} is missing or not a string: prompt_completion rows hold two strings "
                    "(or two lists of messages, TRL's conversational form, where the first row "
                    "does)"
                )
        return None
    if fmt == "tokens":
        if not _ints(obj.get("input_ids")):
            return "'input_ids' is not a list of ints: rows hold token ids, as the first row does"
        return token_problem(obj["input_ids"], {k: obj[k] for k in TOKEN_KEYS if k in obj}, None)
    return _messages_problem(obj.get("messages"), obj.get("tools"))


def _messages_problem(messages, tools) -> Optional[str]:
    if not isinstance(messages, list) or not messages:
        return (
            "'messages' is missing or not a non-empty list: a chat row holds a list of {role, "
            "content} objects"
        )
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        return (
            "'tools' is not a list of objects: give the row's tools as a list of function schemas"
        )
    for i, m in enumerate(messages):
        why = _message_problem(m)
        if why:
            return f"message {i}{why}"
    return None


def _message_problem(m) -> Optional[str]:
    """What is wrong with one message, worded to follow "message i" (None: nothing)."""
    if not isinstance(m, dict) or "role" not in m:
        return " has no 'role': every message is an object with role and content"
    if m["role"] not in ROLES:
        return f" has role {m['role']!r}; use one of {list(ROLES)}"
    if m.get("train") is not None and not isinstance(m["train"], bool):
        return f": 'train' is {m['train']!r}; use true or false"
    content = m.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            text = (
                isinstance(part, dict)
                and part.get("type") in (None, "text")
                and isinstance(part.get("text"), str)
            )
            if not text:
                what = part.get("type") if isinstance(part, dict) else part
                return (
                    f": content part {j} is not text ({str(what)[:40]!r}): a text model reads only "
                    f'{{"type": "text", "text": ...}} parts; drop the others or write the content '
                    f"as a string"
                )
    elif not isinstance(content, (str, type(None))):
        return (
            ": 'content' is not a string: write the message's text as a JSON string (or a list of "
            "text parts)"
        )
    calls = m.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        return ": 'tool_calls' is not a list: give the calls as a list of {function: ...} objects"
    for j, call in enumerate(calls or []):
        why = _call_problem(call)
        if why:
            return f", tool call {j}{why}"
    return None


def _call_problem(call) -> Optional[str]:
    """What is wrong with one tool call (OpenAI's {type, function: {name, arguments}}, or {name,
    arguments})."""
    if not isinstance(call, dict):
        return (
            ' is not an object: give {"type": "function", "function": {"name": ..., "arguments": '
            "{...}}}"
        )
    f = call_function(call)
    if not isinstance(f.get("name"), str):
        return ' has no function name: give {"function": {"name": ..., "arguments": {...}}}'
    args = f.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return (
                f": 'arguments' is a string that is not a JSON object ({f['arguments'][:40]!r}); "
                "give the arguments as an object, or as the JSON text of one"
            )
    elif args is not None and not isinstance(args, dict):
        return f": 'arguments' is {str(args)[:40]!r}; give the arguments as an object"
    return None


def without_nulls(value):
    """`value` with every null-valued key of its objects dropped, at any depth: a Parquet or hub row
    gives each struct every key of its column (one call's arguments gain another's, as null), which
    no row wrote."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return [without_nulls(v) for v in value] if isinstance(value, list) else value


def call_function(call: dict) -> dict:
    """The {name, arguments} of a tool call: its `function`, or the call itself."""
    return call["function"] if isinstance(call.get("function"), dict) else call


def text_tokens(tok, texts: list) -> list:
    """[(input_ids, labels)] of a batch of text rows: every token trains."""
    ids = tok(texts, add_special_tokens=True, return_attention_mask=False, verbose=False)
    return [(x, list(x)) for x in ids["input_ids"]]


def pair_tokens(tok, prompt: str, completion: str, train_on: str) -> tuple[list, list]:
    """(input_ids, labels) of a prompt/completion row: the prompt with the tokenizer's special
    tokens, then the completion; the completion trains (all: both)."""
    p = tok(prompt, add_special_tokens=True, return_attention_mask=False)["input_ids"]
    c = tok(completion, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return p + c, (p if train_on == "all" else [IGNORE_INDEX] * len(p)) + c


def pair_row(tok, row: dict, train_on: str, given: tuple = (), vocab_size=None) -> tuple:
    return pair_tokens(tok, row["prompt"], row["completion"], train_on)


def token_row(tok, row: dict, train_on: str, given: tuple = (), vocab_size=None) -> tuple:
    return token_labels(list(row["input_ids"]), {k: row[k] for k in given}, vocab_size, train_on)


def token_keys(keys) -> tuple:
    """The keys of TOKEN_KEYS among `keys` (a tokens row's, or a table's columns), in TOKEN_KEYS
    order."""
    return tuple(k for k in TOKEN_KEYS if k in keys)


def keys_problem(row: dict, first: tuple) -> Optional[str]:
    """A tokens row without a labels / mask key of the first row's (`first`), or with one the first
    row has not: never dropped."""
    keys = token_keys(row)
    missing = [k for k in first if k not in keys]
    if missing:
        return f"no {missing[0]!r} key: every row carries it, as the first row does"
    extra = [k for k in keys if k not in first]
    if extra:
        return (
            f"{extra[0]!r} here but not in the first row (its labels and masks: "
            f"{', '.join(first) or 'none'}): every row carries those of the first row; give the "
            f"first row {extra[0]!r} too, or drop it here"
        )
    return None


def token_problem(ids: list, given: dict, vocab_size: Optional[int]) -> Optional[str]:
    """What is wrong with a tokens row (None: nothing): an id outside [0, vocab_size), a value of
    `given` (TOKEN_KEYS) that is not one int per id, a label neither IGNORE_INDEX nor an id, a mask
    value neither 0 nor 1."""
    top = vocab_size if vocab_size is not None else float("inf")
    vocab = f"[0, {vocab_size})" if vocab_size is not None else "[0, the vocabulary size)"
    if ids and (min(ids) < 0 or max(ids) >= top):
        j, bad = next((j, t) for j, t in enumerate(ids) if not 0 <= t < top)
        past = "< 0" if bad < 0 else f">= the model's vocab_size={vocab_size}"
        return (
            f"'input_ids' holds token id {bad} at position {j}, {past}; token ids are in {vocab}: "
            "re-tokenize with the model's tokenizer"
        )
    for k, v in given.items():
        if not (_ints(v) and len(v) == len(ids)):
            return (
                f"{k!r} is not a list of {len(ids)} ints (one per input id): give one label (or "
                "0/1 mask value) per token"
            )
        bad = (
            [x for x in v if x != IGNORE_INDEX and not 0 <= x < top]
            if k == "labels"
            else sorted(set(v) - {0, 1})
        )
        if bad and k == "labels":
            return (
                f"'labels' holds {bad[0]}; a label is {IGNORE_INDEX} (no training) or a token id "
                f"in {vocab}"
            )
        if bad:
            means = "0: padding, left out" if k == "attention_mask" else "1: the token trains"
            return f"{k!r} holds {bad[0]}; a mask holds 0 or 1 ({means})"
    return None


def folded_labels(ids: list, given: dict, masks: tuple = MASK_COLUMNS) -> list:
    """The labels of a row: its `labels` (without: the tokens), IGNORE_INDEX where a 0/1 mask of
    `masks` that `given` carries holds 0. The one fold of `token_labels` and the HF Trainer's
    (integrations/hf_data.py `fold_masks`)."""
    labels = list(given["labels"]) if given.get("labels") is not None else list(ids)
    for k in masks:
        if given.get(k) is not None:
            labels = [lab if v else IGNORE_INDEX for lab, v in zip(labels, given[k])]
    return labels


def token_labels(
    ids: list, given: dict, vocab_size: Optional[int], train_on: str
) -> tuple[list, list]:
    """(input_ids, labels) of a tokens row: `folded_labels`; train_on all: every token. A token
    whose `attention_mask` is 0 is padding, left out. ChatError naming what is wrong
    (`token_problem`)."""
    why = token_problem(ids, given, vocab_size)
    if why:
        raise ChatError(why)
    labels = list(ids) if train_on == "all" else folded_labels(ids, given)
    if "attention_mask" in given:
        keep = given["attention_mask"]
        return [t for t, v in zip(ids, keep) if v], [lab for lab, v in zip(labels, keep) if v]
    return list(ids), labels


def utf8_row(row: dict) -> tuple:
    """(row, None), or (None, why) where a string holds a lone UTF-16 surrogate (a \\ud800 escape
    without its pair): JSON allows it, UTF-8 (Arrow, the tokenizer) does not."""
    for k, v in row.items():
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return None, (
                    f"{k!r} holds a lone UTF-16 surrogate (\\u{ord(v[e.start]):04x}, an escape "
                    "without its pair): not text; remove it or give its pair"
                )
    return row, None
