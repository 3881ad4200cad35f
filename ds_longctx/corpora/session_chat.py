"""What an agent session is written in: its tools, its system prompt, its chat template (ChatML with
tools, tool calls and `{% generation %}` markers) and the tokenizer that renders it, message by
message.

    ren = Renderer(tok)                  # tok: a PreTrainedTokenizerFast carrying CHAT_TEMPLATE
    piece, enc = ren.message(m, TOOLS)   # one message rendered, its tokens (with character offsets)

The template renders each message on its own: the whole session's rendering is the join of its
messages' (the system message carries the tools), and every piece starts with <|im_start|> and ends
with "<|im_end|>\\n" (an assistant piece: "<|im_end|>" then "\\n"), special tokens that cut the
text, so a session's tokens are its pieces' tokens end to end. An assistant piece's generation block
(what trains) is its content, its tool calls and its <|im_end|>.
"""

from __future__ import annotations

from bisect import bisect_right

CHAT_SPECIALS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
ASSISTANT_HEAD = "<|im_start|>assistant\n"
_NL = "{{ '\\n' }}"
CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}{% set sys = messages[0].content %}{% else "
    "%}{% set sys = '' %}{% endif %}"
    "{%- if sys or tools %}<|im_start|>system" + _NL + "{{ sys }}"
    "{%- if tools %}{% if sys %}"
    + _NL
    + _NL
    + "{% endif %}# Tools"
    + _NL
    + _NL
    + "You may call one or more functions. Their signatures are within <tools></tools>:"
    + _NL
    + "<tools>"
    "{%- for t in tools %}"
    + _NL
    + "{{ t | tojson }}{% endfor %}"
    + _NL
    + "</tools>"
    + _NL
    + _NL
    + "For each call, return a JSON object with the function's name and arguments within "
    "<tool_call></tool_call>."
    "{%- endif %}<|im_end|>" + _NL + "{% endif %}"
    "{%- for m in messages %}{%- if loop.first and m.role == 'system' %}"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant"
    + _NL
    + "{% generation %}{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}{% if m.content or not loop.first %}"
    + _NL
    + "{% endif %}<tool_call>"
    + _NL
    + "{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}"
    + _NL
    + "</tool_call>{% endfor %}"
    "<|im_end|>{% endgeneration %}"
    + _NL
    + "{%- else %}<|im_start|>{{ m.role }}"
    + _NL
    + "{{ m.content }}<|im_end|>"
    + _NL
    + "{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant" + _NL + "{% endif %}"
)

SYSTEM = (
    "You are a coding agent in a read-only checkout of the Python standard library. Use the tools "
    "to look "
    "around. When the user asks about code you have already read, answer from what you read, "
    "quoting the code exactly, without reading the file again."
)


def _tool(name: str, doc: str, **params) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": doc,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _tool(
        "list_files",
        "List the Python files under a directory of the checkout, one path a line.",
        path="a directory, relative to the checkout's root",
    ),
    _tool(
        "read_file",
        "Return the whole text of a file.",
        path="a file, relative to the checkout's root",
    ),
    _tool(
        "search",
        "Lines holding a literal string in the files under a directory, as path:line: text.",
        pattern="the literal string",
        path="a directory, relative to the checkout's root",
    ),
]


def tool_call(name: str, content: str, **arguments) -> dict:
    """An assistant message that says `content` and calls tool `name` with `arguments`."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def token_at(ends: list, char: int) -> int:
    """The index of the token that holds character `char` of a text whose tokens end at characters
    `ends` (`[e for _, e in encoding.offsets]`)."""
    return bisect_right(ends, char)


class Renderer:
    """One message at a time through the tokenizer's chat template (module doc)."""

    def __init__(self, tok):
        self.tok = tok
        self.backend = tok.backend_tokenizer

    def piece(self, m: dict, tools=None) -> str:
        return self.tok.apply_chat_template([m], tools=tools, tokenize=False)

    def encode(self, text: str):
        return self.backend.encode(text, add_special_tokens=False)

    def message(self, m: dict, tools=None) -> tuple:
        """(the rendering of message `m`, its `tokenizers.Encoding`)."""
        piece = self.piece(m, tools)
        return piece, self.encode(piece)

    def session(self, messages: list, tools) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False)


def trained_run(piece: str, enc) -> tuple[int, int]:
    """[first, end) of the tokens of an assistant piece that its generation block covers (what HF's
    assistant mask marks: one run)."""
    if not (piece.startswith(ASSISTANT_HEAD) and piece.endswith("<|im_end|>\n")):
        raise AssertionError(
            f"an assistant piece of CHAT_TEMPLATE has another shape: {piece[:60]!r}"
        )
    a, b = len(ASSISTANT_HEAD), len(piece) - 1
    marked = [j for j, (s, e) in enumerate(enc.offsets) if e > a and s < b]
    return marked[0], marked[-1] + 1
