"""Rows that say which of their tokens train: chat sessions (`messages`), prompt/completion pairs, token ids with
labels. Their row checks (a reason per bad row, for data/scan.py) and their token ids and labels (data/tokenize.py).

    fmt = detect_format(first_row_keys, "text", "auto")          # text | messages | prompt_completion | tokens
    why = row_problem(obj, fmt, "text")                          # None, or what is wrong with one JSON row
    ids, labels = session_tokens(tok, messages, tools, "assistant")   # labels[i] = ids[i] where it trains, else -100

Which tokens of a session train (`train_on`; a message's own `"train": true|false` overrides it, tool output trains
only under all):
- a template with `{% generation %}` markers: the tokens HF's `return_assistant_tokens_mask` marks; its k-th run of
  marked tokens is the k-th assistant message.
- otherwise: what each message adds to the rendering (render the first i messages, then the first i + 1; the
  difference is message i; an assistant message's starts after its generation prompt, the role header). The
  pieces must join to the full rendering: a template that rewrites earlier turns (drops their reasoning) is refused.
Rules that cost nothing to state: a label differs from its token only where the user's `labels` say so (any id in
the vocabulary, or -100); the first token of a document is never a target (nothing precedes it).
"""

from __future__ import annotations

import re
from typing import Optional

from ds_longctx.parallel.units import IGNORE_INDEX

ROW_FORMATS = ("text", "messages", "prompt_completion", "tokens")   # data.format, less auto
ROLES = ("system", "user", "assistant", "tool")
MASK_KEYS = ("labels", "completion_mask", "assistant_masks")   # what a tokens row may carry beside input_ids
_GENERATION = re.compile(r"{%-?\s*generation\s*-?%}")


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
    if tools is not None and not isinstance(tools, list):
        return "'tools' is not a list: give the row's tools as a list of function schemas"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            return f"message {i} has no 'role': every message is an object with role and content"
        if m["role"] not in ROLES:
            return f"message {i} has role {m['role']!r}; use one of {list(ROLES)}"
        if "tool_calls" in m and m["tool_calls"] is not None and not isinstance(m["tool_calls"], list):
            return f"message {i}: 'tool_calls' is not a list: give the calls as a list of {{function: ...}} objects"
        if m.get("train") is not None and not isinstance(m["train"], bool):
            return f"message {i}: 'train' is {m['train']!r}; use true or false"
        if not isinstance(m.get("content", ""), (str, list, type(None))):
            return f"message {i}: 'content' is not a string: write the message's text as a JSON string"
    return None


# ----------------------------------------------------------------------------- sessions
def message_trains(m: dict, train_on: str, is_last_assistant: bool) -> bool:
    """Whether message `m` trains: its own `train` (null: none, as Arrow gives a missing key), else assistant messages
    (last_assistant: the last one only)."""
    if m.get("train") is not None:
        return bool(m["train"])
    if train_on == "all":
        return True
    return m["role"] == "assistant" and (train_on == "assistant" or is_last_assistant)


def _render(tok, messages, tools, generation_prompt: bool = False) -> str:
    if not messages:
        return ""
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)


def message_spans(tok, messages: list, tools) -> tuple[str, list]:
    """(the full rendering, [(start, end) characters of what message i adds]); ChatError when the pieces do not join
    to the full rendering (a template that rewrites earlier turns)."""
    full = _render(tok, messages, tools)
    spans, before = [], ""
    for i, m in enumerate(messages):
        after = _render(tok, messages[:i + 1], tools)
        if not (after.startswith(before) and full.startswith(after)):
            raise ChatError(f"the chat template rewrites earlier turns (rendering the first {i + 1} messages does not "
                            f"extend the first {i}, or the whole session does not extend them), so the tokens of "
                            f"each message cannot be told apart; use a template with {{% generation %}} markers "
                            f"(HF's assistant mask), or data.train_on: all")
        start = len(before)
        if m["role"] == "assistant":  # the role header is the generation prompt: it does not train
            head = _render(tok, messages[:i], tools, generation_prompt=True)
            if len(head) >= start and after.startswith(head):
                start = len(head)
        spans.append((start, len(after)))
        before = after
    return full, spans


def _runs(mask: list) -> list:
    """[(start, end)] of each run of 1s in a 0/1 list."""
    runs, start = [], None
    for j, v in enumerate(list(mask) + [0]):
        if v and start is None:
            start = j
        elif not v and start is not None:
            runs.append((start, j))
            start = None
    return runs


def session_tokens(tok, messages: list, tools, train_on: str) -> tuple[list, list]:
    """(input_ids, labels) of one chat session through the tokenizer's chat template (module doc)."""
    try:
        template = tok.get_chat_template(None, tools)
    except Exception as e:
        raise ChatError(f"the tokenizer has no chat template ({type(e).__name__}); set tokenizer.chat_template "
                        f"(tokenizer_config.json) or use a tokenizer that has one") from None
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    trains = [message_trains(m, train_on, i == last) for i, m in enumerate(messages)]
    try:
        if all(trains):  # nothing to tell apart: the rendering as it is (a template that rewrites turns is fine)
            ids = list(tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"])
            return ids, list(ids)
        if _GENERATION.search(template) and not any(t and m["role"] != "assistant"
                                                     for t, m in zip(trains, messages)):
            out = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
            runs = _runs(mask)
            wanted = [t for t, m in zip(trains, messages) if m["role"] == "assistant"]
            if len(runs) != len(wanted):
                raise ChatError(f"the template's {{% generation %}} blocks mark {len(runs)} spans but the session has "
                                f"{len(wanted)} assistant messages; give each assistant message one generation block")
            keep = [j for (a, b), t in zip(runs, wanted) if t for j in range(a, b)]
        else:
            full, spans = message_spans(tok, messages, tools)
            enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(enc["input_ids"])
            chars = [span for span, t in zip(spans, trains) if t]
            keep = [j for j, (a, _) in enumerate(enc["offset_mapping"]) if any(s <= a < e for s, e in chars)]
    except ChatError:
        raise
    except Exception as e:  # the template's own error (jinja, a role it refuses, ...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ChatError(f"the chat template failed to render this session ({type(e).__name__}: {first}); fix the "
                        f"row or the template") from None
    labels = [IGNORE_INDEX] * len(ids)
    for j in keep:
        labels[j] = ids[j]
    return ids, labels


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
