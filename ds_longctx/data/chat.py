"""Which tokens of a chat session train, through the tokenizer's chat template: its `{% generation
%}` markers, else what each message adds to the rendering.

    # labels[i] = ids[i] where it trains, else -100
    ids, labels = session_tokens(tok, messages, tools, "assistant")

`train_on` picks the messages; a message's own `"train"` overrides it. A template that rewrites
earlier turns is refused. The marker and prefix rules: docs/design/data.md."""

from __future__ import annotations

# transformers is imported where a chat template is read: importing this module does not load it.
import bisect
import json
import re
from typing import Optional

from ds_longctx.data.formats import (  # noqa: F401 (the row API stays importable from here)
    MASK_KEYS,
    ROLES,
    ROW_FORMATS,
    ChatError,
    call_function,
    detect_format,
    pair_tokens,
    row_problem,
    token_labels,
)
from ds_longctx.parallel.units import IGNORE_INDEX

_GENERATION = re.compile(r"{%-?\s*generation\s*-?%}")


def template_messages(messages: list, parse: bool = True) -> list:
    """The messages as the chat template reads them: text parts ({"type": "text", "text": ...})
    joined into one string (a template given a list writes its repr or nothing); with `parse`,
    tool-call arguments given as JSON text as the object it holds (HF's form: most templates write
    them with tojson, which would quote the text)."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "".join(part["text"] for part in m["content"])
        if parse and isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_parsed(call) for call in m["tool_calls"]]
        out.append(m)
    return out


def _parsed(call: dict) -> dict:
    f = call_function(call)
    if not isinstance(f.get("arguments"), str):
        return call
    f = {**f, "arguments": json.loads(f["arguments"]) if f["arguments"].strip() else {}}
    return {**call, "function": f} if isinstance(call.get("function"), dict) else f


def _text_arguments(messages: list) -> bool:
    """Whether some tool call gives its arguments as JSON text."""
    return any(
        isinstance(call_function(c).get("arguments"), str)
        for m in messages
        for c in m.get("tool_calls") or []
    )


def message_trains(m: dict, train_on: str, is_last_assistant: bool) -> bool:
    """Whether message `m` trains: its own `train` (null: none, as Arrow gives a missing key), else
    assistant messages (last_assistant: the last one only)."""
    if m.get("train") is not None:
        return bool(m["train"])
    if train_on == "all":
        return True
    return m["role"] == "assistant" and (train_on == "assistant" or is_last_assistant)


def _render(tok, messages, tools, generation_prompt: bool = False) -> str:
    if not messages:
        return ""
    return tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )


def _shared(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


def _closing(full: str, with_prompt: str, offsets: list) -> str:
    """What the template writes after the last message only when no generation prompt follows
    (Phi-3's EOS): the tail of `full` past its common prefix with `with_prompt`, that prefix cut
    back to a token start of `full`."""
    at = _shared(full, with_prompt)
    k = bisect.bisect_right([a for a, _ in offsets], at) - 1
    if k >= 0 and offsets[k][1] > at:  # `at` falls inside token k: the tail starts with it
        at = offsets[k][0]
    return full[at:]


def _direct(tok, messages: list, tools, full: str, prompted: str):
    """`render(i, generation_prompt)` of the first i messages through transformers' compiled
    template, the messages converted for it once (apply_chat_template converts all of them at every
    call: most of the prefix rule's time); None where this transformers has no such path or it does
    not give apply_chat_template's own renderings of the whole session, `full` and `prompted` (with
    the generation prompt)."""
    try:  # private helpers of transformers: any change in them falls back to apply_chat_template
        from transformers.utils import chat_template_utils as ctu

        compiled = ctu._compile_jinja_template(tok.get_chat_template(None, tools))
        plain = ctu._plain_template_data  # JSON types only, as the sandbox gets them
        chat = ctu._alias_reasoning_fields(plain(ctu._normalize_chat_messages(messages)))
        extra, schemas = plain(dict(tok.special_tokens_map)), plain(tools)

        def render(i: int, generation_prompt: bool = False) -> str:
            return (
                compiled.render(
                    messages=chat[:i],
                    tools=schemas,
                    documents=None,
                    add_generation_prompt=generation_prompt,
                    **extra,
                )
                if i
                else ""
            )

        same = render(len(messages)) == full and render(len(messages), True) == prompted
    except Exception:
        return None
    return render if same else None


class _Prefixes:
    """Where the first i messages end in the full rendering: their own rendering less the closing
    tail, which must start the full rendering (None where it does not: the template renders them
    otherwise once more follow)."""

    def __init__(self, tok, messages: list, tools, full: str, closing: str, direct=None):
        self.tok, self.messages, self.tools, self.full, self.closing = (
            tok,
            messages,
            tools,
            full,
            closing,
        )
        self.direct = direct  # `_direct`'s render, or None: apply_chat_template

    def render(self, i: int, generation_prompt: bool = False) -> str:
        try:
            if self.direct is not None:
                return self.direct(i, generation_prompt)
            return _render(self.tok, self.messages[:i], self.tools, generation_prompt)
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ChatError(
                f"the chat template renders the whole session but not its first {i} messages "
                f"({type(e).__name__}: {first}), so the tokens of each message cannot be told "
                "apart; use "
                f"a template with {{% generation %}} markers (HF's assistant mask), data.train_on: "
                f"last_assistant, or data.train_on: all"
            ) from None

    def end(self, i: int) -> Optional[int]:
        text = self.render(i)
        if self.closing and text.endswith(self.closing):
            text = text[: -len(self.closing)]
        return len(text) if self.full.startswith(text) else None


def message_spans(tok, messages: list, tools, trains: list, full: str, offsets: list) -> list:
    """[(start, end)] characters of the full rendering `full` (token `offsets`) that each message
    with trains[i] adds: the rendering of the first i + 1 messages less that of the first i (an
    assistant's from the end of the generation prompt, its role header). ChatError when a trained
    message's rendering does not start the full one (a template that rewrites earlier turns: drops
    past reasoning)."""
    prompted = _render(tok, messages, tools, True)
    closing = _closing(full, prompted, offsets)
    at = _Prefixes(
        tok, messages, tools, full, closing, _direct(tok, messages, tools, full, prompted)
    )
    spans = []
    for i, m in enumerate(messages):
        if not trains[i]:
            continue
        start, end = at.end(i), at.end(i + 1)
        if start is None or end is None or start > end:
            raise ChatError(
                f"the chat template rewrites earlier turns (message {i}, {m['role']}, renders "
                "otherwise "
                "once later messages follow: past reasoning dropped, the system prompt moved, "
                "...), so "
                "its tokens cannot be told apart; use a template with {% generation %} markers "
                f"(HF's assistant mask), data.train_on: last_assistant (only the final answer), or "
                f"data.train_on: all"
            )
        if (
            m["role"] == "assistant" and i > 0
        ):  # the generation prompt (role header, maybe more) does not train
            head = _shared(at.render(i, generation_prompt=True), full)
            start = head if start <= head <= end else start
        spans.append((start, end))
    return spans


def span_mask(offsets: list, spans: list) -> list:
    """0/1 per token: 1 where the token's characters overlap a span (HF's rule for its assistant
    mask)."""
    keep, k = [0] * len(offsets), 0
    for j, (a, b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if b > spans[k][0]:
            keep[j] = 1
    return keep


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


def _marked(tok, messages: list, tools, trains: list) -> tuple[list, list]:
    """(ids, 0/1 per token) through HF's assistant mask; its k-th run of marked tokens is the k-th
    assistant message (counted only where some assistant message does not train)."""
    out = tok.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    wanted = [t for t, m in zip(trains, messages) if m["role"] == "assistant"]
    if all(wanted):
        return ids, mask
    runs = _runs(mask)
    if len(runs) != len(wanted):
        raise ChatError(
            f"the template's {{% generation %}} blocks mark {len(runs)} spans but the session has "
            f"{len(wanted)} assistant messages, so the ones that do not train cannot be told "
            "apart; give "
            f"each assistant message one generation block, or train every assistant message"
        )
    keep = [0] * len(ids)
    for (a, b), t in zip(runs, wanted):
        keep[a:b] = [int(t)] * (b - a)
    return ids, keep


def _session_mask(tok, template: str, messages: list, tools, trains: list) -> tuple[list, list]:
    """(ids, 0/1 per token) of a session whose messages train where `trains` says (module doc)."""
    if all(
        trains
    ):  # nothing to tell apart: the rendering as it is (a template that rewrites turns is fine)
        ids = list(
            tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        return ids, [1] * len(ids)
    if not tok.is_fast:  # HF's mask and the prefix rule both need the characters of each token
        raise ChatError(
            f"the tokenizer ({type(tok).__name__}) is not a fast one: it gives no character "
            "offsets, so "
            "the tokens of each message cannot be told apart; save it with a tokenizer.json (its "
            f"fast form), or set data.train_on: all"
        )
    marked = bool(_GENERATION.search(template))
    placed = [
        t and not (marked and m["role"] == "assistant") for t, m in zip(trains, messages)
    ]  # by the prefix rule
    if marked:
        ids, keep = _marked(tok, messages, tools, trains)
        if not any(placed):
            return ids, keep
    full = _render(tok, messages, tools)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    spans = span_mask(offsets, message_spans(tok, messages, tools, placed, full, offsets))
    return (
        (ids, [a | b for a, b in zip(keep, spans)]) if marked else (list(enc["input_ids"]), spans)
    )


def session_tokens(tok, messages: list, tools, train_on: str) -> tuple[list, list]:
    """(input_ids, labels) of one chat session through the tokenizer's chat template (module
    doc)."""
    try:
        template = tok.get_chat_template(None, tools)
    except Exception as e:
        raise ChatError(
            f"the tokenizer has no chat template ({type(e).__name__}); set tokenizer.chat_template "
            f"(tokenizer_config.json) or use a tokenizer that has one"
        ) from None
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    trains = [message_trains(m, train_on, i == last) for i, m in enumerate(messages)]
    try:
        try:
            ids, keep = _session_mask(tok, template, template_messages(messages), tools, trains)
        except ChatError:
            raise
        except Exception:
            if not _text_arguments(messages):
                raise
            # a template that writes the arguments as text (DeepSeek's) takes the JSON text as given
            ids, keep = _session_mask(
                tok, template, template_messages(messages, parse=False), tools, trains
            )
    except ChatError:
        raise
    except Exception as e:  # the template's own error (jinja, a role it refuses, ...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ChatError(
            f"the chat template failed to render this session ({type(e).__name__}: {first}); fix "
            f"the row or the template"
        ) from None
    return ids, [t if k else IGNORE_INDEX for t, k in zip(ids, keep)]
