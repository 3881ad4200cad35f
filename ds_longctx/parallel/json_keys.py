"""JSON read strictly: a key given twice in one object is refused, never the last one kept as
`json.loads` does. The one rule for every JSON a user writes (run configs: config/config_file.py;
data rows: data/scan.py). Torch-free, at the bottom.

    # DuplicateKey(path, first_line, second_line) where a key appears twice; TooDeep:
    obj = loads_unique(text)
    # the same, of the value at text[i:] (a JSON array's element):
    obj, end = raw_decode_unique(text, i)
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional


class DuplicateKey(ValueError):
    """A key given twice in one object: its dotted path (`messages[1].role`) and the lines of both
    (None: unknown)."""

    def __init__(self, path: str, first: Optional[int], second: Optional[int]):
        super().__init__(f"key {path} appears twice; keep one")
        self.path, self.first, self.second = path, first, second

    def lines(self) -> str:
        """' (lines 3 and 7)', ' (line 3)' (both on one line), or '' where not known."""
        if not (self.first and self.second):
            return ""
        return (
            f" (lines {self.first} and {self.second})"
            if self.first != self.second
            else f" (line {self.first})"
        )


class TooDeep(ValueError):
    """Containers nested deeper than Python's JSON reader goes (its recursion limit)."""

    def __init__(self):
        super().__init__(
            "nested deeper than the JSON reader goes (Python's recursion limit, about 1,000 "
            "levels); flatten it"
        )


class _Twice(Exception):
    pass


def _unique(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):
        raise _Twice
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_unique)


def loads_unique(text: str) -> Any:
    """`json.loads(text)`, or DuplicateKey naming the first key given twice, TooDeep for a value
    nested past the reader (json.JSONDecodeError as json's)."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Twice:
        raise duplicate_in(text) from None
    except RecursionError:
        raise TooDeep from None


def raw_decode_unique(text: str, i: int) -> tuple:
    """`json.JSONDecoder().raw_decode(text, i)` (the value at `i` and where it ends), or
    DuplicateKey as `loads_unique`, its lines counted within the value."""
    try:
        return _DECODER.raw_decode(text, i)
    except RecursionError:
        raise TooDeep from None
    except _Twice:
        end = json.JSONDecoder().raw_decode(text, i)[1]
        raise duplicate_in(text[i:end]) from None


def json_kind(v) -> str:
    """The JSON type of a parsed value: object, list, string, number, boolean or null."""
    names = {
        dict: "object",
        list: "list",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
    }
    return "null" if v is None else names.get(type(v), type(v).__name__)


# a JSON string, or one structural character (numbers and literals are skipped over)
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]')


def duplicate_in(text: str) -> DuplicateKey:
    """The first key given twice in one object of the valid JSON `text`: its dotted path and both
    lines."""
    # one per open container: [path, {key: line} (None: an array), item index, expecting a key]
    frames: list = []
    line, pos = 1, 0
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        top = frames[-1] if frames else None
        if tok in "{[":
            at = top[4] if top and top[1] is not None else (f"{top[0]}[{top[2]}]" if top else "")
            frames.append([at, {} if tok == "{" else None, 0, tok == "{", at])
        elif tok in "}]":
            frames.pop()
        elif tok == ",":
            top[2] += 1
            top[3] = top[1] is not None
        elif tok[0] == '"' and top and top[3]:  # a key
            line, pos = line + text.count("\n", pos, m.start()), m.start()
            key = json.loads(tok)
            top[4] = f"{top[0]}.{key}" if top[0] else key
            if key in top[1]:
                return DuplicateKey(top[4], top[1][key], line)
            top[1][key], top[3] = line, False
    return DuplicateKey("?", None, None)
