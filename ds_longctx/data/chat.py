"""Rows that say which of their tokens train: chat sessions (`messages`), prompt/completion pairs, token ids with
labels. Their row checks (a reason per bad row, for data/scan.py) and the token ids and labels of prompt/completion and
token rows (data/tokenize.py); a session's: data/chat_masks.py.

    fmt = detect_format(first_row_keys, "text", "auto")          # text | messages | prompt_completion | tokens
    why = row_problem(obj, fmt, "text")                          # None, or what is wrong with one JSON row
    ids, labels = pair_tokens(tok, "prompt", "completion", "completion")   # labels[i] = ids[i] where it trains

Rules that cost nothing to state: a label differs from its token only where the user's `labels` say so (any id in
the vocabulary, or -100); the first token of a document is never a target (nothing precedes it).
"""

from __future__ import annotations

import json
from typing import Optional

from ds_longctx.parallel.units import IGNORE_INDEX

ROW_FORMATS = ("text", "messages", "prompt_completion", "tokens")   # data.format, less auto
ROLES = ("system", "user", "assistant", "tool")
MASK_KEYS = ("labels", "completion_mask", "assistant_masks")   # what a tokens row may carry beside input_ids


class ChatError(ValueError):
    """One row cannot give tokens and labels: the message says why and what to do (tokenize names its file:line)."""


# ----------------------------------------------------------------------------- formats and row checks
def detect_format(keys, text_field: str, fmt: str) -> str:
    """The row format: `fmt` unless "auto", else from the first row's keys (text_field, messages, prompt +
    completion, input_ids; text when none fits, whose check then names the missing key)."""
    if fmt != "auto":
        return fmt
    keys = set(keys)
    if text_field in keys:
        return "text"
    if "messages" in keys:
        return "messages"
    if {"prompt", "completion"} <= keys:
        return "prompt_completion"
    return "tokens" if "input_ids" in keys else "text"


def _ints(v) -> bool:
    return isinstance(v, list) and all(type(x) is int for x in v)


def row_problem(obj: dict, fmt: str) -> Optional[str]:
    """What is wrong with a row of format messages, prompt_completion or tokens (None: nothing)."""
    if fmt == "prompt_completion":
        for k in ("prompt", "completion"):
            if not isinstance(obj.get(k), str):
                return f"{k!r} is missing or not a string: prompt_completion rows hold two strings"
        return None
    if fmt == "tokens":
        if not _ints(obj.get("input_ids")):
            return "'input_ids' is not a list of ints: rows hold token ids, as the first row does"
        for k in MASK_KEYS:
            if k in obj and not (_ints(obj[k]) and len(obj[k]) == len(obj["input_ids"])):
                return (f"{k!r} is not a list of {len(obj['input_ids'])} ints (one per input id): give one label "
                        f"(or 0/1 mask value) per token")
        return None
    return _messages_problem(obj.get("messages"), obj.get("tools"))


def _messages_problem(messages, tools) -> Optional[str]:
    if not isinstance(messages, list) or not messages:
        return "'messages' is missing or not a non-empty list: a chat row holds a list of {role, content} objects"
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "'tools' is not a list of objects: give the row's tools as a list of function schemas"
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
            text = isinstance(part, dict) and part.get("type") in (None, "text") and isinstance(part.get("text"), str)
            if not text:
                what = part.get("type") if isinstance(part, dict) else part
                return (f": content part {j} is not text ({str(what)[:40]!r}): a text model reads only "
                        f"{{\"type\": \"text\", \"text\": ...}} parts; drop the others or write the content as a "
                        f"string")
    elif not isinstance(content, (str, type(None))):
        return ": 'content' is not a string: write the message's text as a JSON string (or a list of text parts)"
    calls = m.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        return ": 'tool_calls' is not a list: give the calls as a list of {function: ...} objects"
    for j, call in enumerate(calls or []):
        why = _call_problem(call)
        if why:
            return f", tool call {j}{why}"
    return None


def _call_problem(call) -> Optional[str]:
    """What is wrong with one tool call (OpenAI's {type, function: {name, arguments}}, or {name, arguments})."""
    if not isinstance(call, dict):
        return " is not an object: give {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": {...}}}"
    f = call_function(call)
    if not isinstance(f.get("name"), str):
        return " has no function name: give {\"function\": {\"name\": ..., \"arguments\": {...}}}"
    args = f.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return (f": 'arguments' is a string that is not a JSON object ({f['arguments'][:40]!r}); give the "
                    f"arguments as an object, or as the JSON text of one")
    elif args is not None and not isinstance(args, dict):
        return f": 'arguments' is {str(args)[:40]!r}; give the arguments as an object"
    return None


def call_function(call: dict) -> dict:
    """The {name, arguments} of a tool call: its `function`, or the call itself."""
    return call["function"] if isinstance(call.get("function"), dict) else call


def pair_tokens(tok, prompt: str, completion: str, train_on: str) -> tuple[list, list]:
    """(input_ids, labels) of a prompt/completion row: the prompt with the tokenizer's special tokens, then the
    completion; the completion trains (all: both)."""
    p = tok(prompt, add_special_tokens=True, return_attention_mask=False)["input_ids"]
    c = tok(completion, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return p + c, (p if train_on == "all" else [IGNORE_INDEX] * len(p)) + c


def token_labels(ids: list, given: Optional[list], key: Optional[str], vocab_size: Optional[int],
                 train_on: str) -> list:
    """The labels of a tokens row: `labels` as given (each -100 or an id in the vocabulary), a 0/1 mask (1: the token
    trains), or the tokens themselves (none given, or train_on all)."""
    if given is None or key is None or train_on == "all":
        return list(ids)
    if key != "labels":
        bad = [v for v in given if v not in (0, 1)]
        if bad:
            raise ChatError(f"{key!r} holds {bad[0]}; a mask holds 0 (no training) or 1 (the token trains)")
        return [t if v else IGNORE_INDEX for t, v in zip(ids, given)]
    top = vocab_size if vocab_size is not None else float("inf")
    bad = [v for v in given if v != IGNORE_INDEX and not 0 <= v < top]
    if bad:
        raise ChatError(f"'labels' holds {bad[0]}; a label is {IGNORE_INDEX} (no training) or a token id in "
                        f"[0, {vocab_size})")
    return list(given)
