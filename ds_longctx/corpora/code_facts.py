"""Facts about a Python file, read from the file itself with `ast`: the questions an agent session
asks and their answers, each with the characters of the file that hold its evidence.

    facts = facts_of(text)        # [Fact], in file order; [] for a file that does not parse

Kinds (`KINDS`):
- default:  the default value of a keyword argument (`def f(x, timeout=30)` -> `timeout` of `f` is
  `30`)
- params:   the number of parameters a function declares (`self`, `*args` and `**kwargs` count one
  each)
- bases:    the base classes of a class, as written (`class C(A, B)` -> `A, B`)
- constant: the value of an UPPER_CASE module-level name assigned once (`DEFAULT_PORT = 8080`)
- doc:      the first line of a function's or class's docstring

Rules: a subject (`Class.method`, `function`, `NAME`) defined twice in a file gives no fact (the
answer would not be unique); evidence and values are ASCII and, except for params (a signature may
span lines), on one line; values are at most MAX_VALUE characters. Positions are characters of
`text` (ast's UTF-8 column offsets converted).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

KINDS = ("default", "params", "bases", "constant", "doc")
MAX_VALUE = 60  # characters of a value (a docstring line: MAX_DOC)
MAX_DOC = 100
MIN_DOC = 12


@dataclass(frozen=True)
class Fact:
    kind: str  # one of KINDS
    subject: str  # qualified name: `Class.method`, `function`, `NAME`
    param: str  # the parameter of a default ("" for the other kinds)
    value: str  # the answer as quoted (params: the count)
    span: tuple  # (start, end) characters of `text` holding the evidence
    names: tuple = ()  # params: the parameters in order

    @property
    def key(self) -> tuple:
        """What a question names: unique in a file (and checked unique in a session by its
        builder)."""
        return self.kind, self.subject, self.param


class _Positions:
    """Characters of `text` from ast's (line, UTF-8 column) positions; lines split at "\\n" only."""

    def __init__(self, text: str):
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def char(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        col = col if line.isascii() else len(line.encode("utf-8")[:col].decode("utf-8", "replace"))
        return self.starts[lineno - 1] + col

    def span(self, first: ast.AST, last: ast.AST | None = None) -> tuple:
        last = last or first
        return self.char(first.lineno, first.col_offset), self.char(
            last.end_lineno, last.end_col_offset
        )


def _plain(text: str, span: tuple, one_line: bool = True, most: int = MAX_VALUE) -> str | None:
    """The characters of `span` when they make a quotable value (ASCII, short, one line), else
    None."""
    s = text[span[0] : span[1]]
    if not s or not s.isascii() or len(s) > most or (one_line and "\n" in s) or "`" in s:
        return None
    return s


def _signature(fn, qual: str, pos: _Positions, text: str) -> list:
    """default and params facts of one function."""
    a = fn.args
    plain = a.posonlyargs + a.args
    out = []
    for arg, default in zip(plain[len(plain) - len(a.defaults) :], a.defaults):
        if (v := _plain(text, pos.span(default))) is not None:
            out.append(Fact("default", qual, arg.arg, v, pos.span(default)))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if default is not None and (v := _plain(text, pos.span(default))) is not None:
            out.append(Fact("default", qual, arg.arg, v, pos.span(default)))
    every = plain + ([a.vararg] if a.vararg else []) + a.kwonlyargs + ([a.kwarg] if a.kwarg else [])
    if every:
        ends = [n for n in every + a.defaults + [d for d in a.kw_defaults if d is not None]]
        last = max(ends, key=lambda n: (n.end_lineno, n.end_col_offset))
        span = (pos.char(fn.lineno, fn.col_offset), pos.char(last.end_lineno, last.end_col_offset))
        if text[span[0] : span[1]].isascii():
            names = tuple(n.arg for n in every)
            out.append(Fact("params", qual, "", str(len(names)), span, names))
    return out


def _docline(node, pos: _Positions, text: str) -> Fact | None:
    """The doc fact of a function or class: its docstring's first line as written in the file."""
    body = node.body
    if not (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return None
    s = body[0].value
    start = pos.char(s.lineno, s.col_offset)
    raw = text[start : pos.char(s.end_lineno, s.end_col_offset)]
    opening = len(raw) - len(raw.lstrip("rRuU"))
    quotes = 3 if raw[opening : opening + 3] in ('"""', "'''") else 1
    first = raw[opening + quotes :].split("\n")[0]
    line = first.strip()
    want = s.value.strip().split("\n")[0].strip()
    if (
        line != want
        or "\\" in line
        or not MIN_DOC <= len(line) <= MAX_DOC
        or not line.isascii()
        or "`" in line
    ):
        return None
    at = start + opening + quotes + first.index(line)
    return Fact("doc", "", "", line, (at, at + len(line)))


def _constants(tree: ast.Module, pos: _Positions, text: str) -> list:
    """constant facts: UPPER_CASE names assigned once in the whole module, at its top level, to a
    literal."""
    stores: dict = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
    out = []
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        name = node.targets[0].id
        if not (name.isupper() and stores.get(name) == 1 and len(name) > 1):
            continue
        try:
            ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if (v := _plain(text, pos.span(node.value))) is not None:
            out.append(Fact("constant", name, "", v, pos.span(node.value)))
    return out


def _walk(body: list, prefix: str):
    """(qualified name, node) of every class and function at module level or inside classes, in file
    order."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}{node.name}"
            yield qual, node
            if isinstance(node, ast.ClassDef):
                yield from _walk(node.body, qual + ".")


def facts_of(text: str) -> list:
    """Every fact of a Python file's text (module doc), in file order; [] when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    pos = _Positions(text)
    defined: dict = {}
    found = []
    for qual, node in _walk(tree.body, ""):
        defined[qual] = defined.get(qual, 0) + 1
        if isinstance(node, ast.ClassDef):
            if (
                node.bases
                and (v := _plain(text, pos.span(node.bases[0], node.bases[-1]))) is not None
            ):
                found.append(Fact("bases", qual, "", v, pos.span(node.bases[0], node.bases[-1])))
        else:
            found += _signature(node, qual, pos, text)
        if (doc := _docline(node, pos, text)) is not None:
            found.append(Fact("doc", qual, "", doc.value, doc.span))
    found += _constants(tree, pos, text)
    keys: dict = {}
    for f in found:
        keys[f.key] = keys.get(f.key, 0) + 1
    return sorted(
        (f for f in found if defined.get(f.subject, 1) == 1 and keys[f.key] == 1),
        key=lambda f: (f.span, f.key),
    )
