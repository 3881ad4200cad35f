"""One long agent session over a corpus of real files, built to a length in tokens
(corpora/agent_sessions.py writes them).

    maker = SessionMaker(files, Renderer(tok), min_tokens, max_tokens)
    # {"name", "tools", "messages", "meta"}: the same row for the same (index, seed)
    row = maker.build(index, seed)

The assistant reads files through tools and answers questions about files read far back
(corpora/code_facts.py). Every session has between min_tokens and max_tokens tokens; a corpus that
cannot fill one is refused, nothing is cut. Length, question and `meta["answers"]` rules:
docs/design/corpora.md."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field

from ds_longctx.corpora.code_facts import KINDS, facts_of
from ds_longctx.corpora.session_chat import (
    SYSTEM,
    TOOLS,
    Renderer,
    token_at,
    tool_call,
    trained_run,
)
from ds_longctx.data.scan import DataError

FINAL_QUESTIONS = 3
QA_BUDGET = 256  # tokens of a question and its answer, at most
RESERVE = FINAL_QUESTIONS * QA_BUDGET
MIN_DISTANCE = 512  # tokens back, at least, where a question looks
ASK_P = 0.3  # chance of a question after a read
SEARCH_P = 0.1  # chance of a search after a read
SEARCH_LINES = 20  # lines a search returns, at most


def margin(min_tokens: int) -> int:
    """How far below its target a session may end (tokens)."""
    return max(256, min_tokens // 32)


def lowest_max(min_tokens: int) -> int:
    """The smallest max_tokens that leaves a session room above min_tokens."""
    return min_tokens + RESERVE + margin(min_tokens)


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the corpus root, "/"-separated
    group: str  # the module or package it belongs to (stdlib_corpus.document_of)
    text: str


@dataclass
class _Read:
    file: SourceFile
    message: int  # the tool message's index
    start: int  # its first token in the session
    facts: list  # [(Fact, its evidence's last token in the session)]


@dataclass
class _Session:
    messages: list
    tokens: int = 0
    trained: int = 0
    runs: list = field(default_factory=list)  # [first, end) of each assistant turn's trained tokens
    reads: list = field(default_factory=list)
    keys: dict = field(default_factory=dict)  # fact key -> files read so far holding it
    asked: set = field(default_factory=set)
    answers: list = field(default_factory=list)


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(max(hi, lo))))


def _qa(f, path: str, rng: random.Random) -> tuple:
    """(question, answer, where the value starts in the answer) of fact `f` of the file at
    `path`."""
    s, v = f.subject, f.value
    if f.kind == "default":
        q = rng.choice(
            [
                f"In `{path}`, what is the default value of the parameter `{f.param}` of `{s}`?",
                f"What does `{f.param}` default to in `{s}`, in `{path}`?",
            ]
        )
        head, tail = f"`{f.param}` defaults to `", f"` in `{s}` (`{path}`)."
    elif f.kind == "params":
        q = rng.choice(
            [
                f"How many parameters does `{s}` in `{path}` declare?",
                f"Count the parameters of `{s}` in `{path}`, and name them.",
            ]
        )
        head, tail = (
            f"`{s}` declares ",
            f" parameter{'s' if v != '1' else ''}: " + ", ".join(f"`{n}`" for n in f.names) + ".",
        )
    elif f.kind == "bases":
        q = rng.choice(
            [
                f"Which base classes does `{s}` in `{path}` name?",
                f"What does `{s}` in `{path}` inherit from?",
            ]
        )
        head, tail = f"`{s}` derives from `", "`."
    elif f.kind == "constant":
        q = f"What value does `{path}` assign to `{s}` at module level?"
        head, tail = f"`{s}` is `", f"` in `{path}`."
    else:
        q = rng.choice(
            [
                f"How does the docstring of `{s}` in `{path}` begin?",
                f"Quote the first line of the docstring of `{s}` in `{path}`.",
            ]
        )
        head, tail = "Its first line reads: ", ""
    return q, head + v + tail, len(head)


class SessionMaker:
    """Builds sessions over `files` (module doc); each file's tokens and facts are worked out
    once."""

    def __init__(self, files: list, ren: Renderer, min_tokens: int, max_tokens: int, bar=None):
        self.groups: dict = {}
        for f in files:
            self.groups.setdefault(f.group, []).append(f)
        self.ren, self.min, self.max, self.bar = ren, min_tokens, max_tokens, bar
        self.margin = margin(min_tokens)
        self._files: dict = {}
        self._corpus = files

    # ------------------------------------------------------------------------- pieces
    def _file(self, f: SourceFile) -> tuple:
        """(tokens of the tool message holding `f`, [(fact, its evidence's last token in that
        message)])."""
        if f.path not in self._files:
            piece, enc = self.ren.message({"role": "tool", "content": f.text})
            head = piece.index(f.text)
            ends = [e for _, e in enc.offsets]
            self._files[f.path] = (
                len(enc.ids),
                [(x, token_at(ends, head + x.span[1] - 1)) for x in facts_of(f.text)],
            )
        return self._files[f.path]

    def _add(self, s: _Session, m: dict, tools=None) -> None:
        piece, enc = self.ren.message(m, tools)
        s.messages.append(m)
        if m["role"] == "assistant":
            a, b = trained_run(piece, enc)
            s.trained += b - a
            s.runs.append([s.tokens + a, s.tokens + b])
        s.tokens += len(enc.ids)

    def _cost(self, *messages) -> int:
        return sum(len(self.ren.message(m)[1].ids) for m in messages)

    # ------------------------------------------------------------------------- tools
    def _listing(self, group: str) -> tuple:
        paths = [f.path for f in self.groups[group]]
        folder = paths[0].rsplit("/", 1)[0] if len(paths) > 1 else ""
        while folder and not all(p.startswith(folder + "/") for p in paths):
            folder = folder.rsplit("/", 1)[0] if "/" in folder else ""
        return folder, "\n".join(paths)

    def _search(self, pattern: str, folder: str) -> str:
        lines, more = [], 0
        for f in self._corpus:
            if folder and not f.path.startswith(folder + "/") or pattern not in f.text:
                continue
            for i, line in enumerate(f.text.split("\n"), 1):
                if pattern in line:
                    if len(lines) < SEARCH_LINES:
                        lines.append(f"{f.path}:{i}: {line.strip()}")
                    else:
                        more += 1
        return "\n".join(lines + ([f"... {more} more"] if more else []))

    # ------------------------------------------------------------------------- questions
    def _ask(self, s: _Session, rng: random.Random, lo: float, limit: int) -> bool:
        """Ask and answer one question about a file read about D tokens back (D in [lo, s.tokens]);
        False when no fact fits."""
        if not s.reads or s.tokens < lo:
            return False
        want = s.tokens - _loguniform(rng, lo, s.tokens)
        i = min(max(bisect_right([r.start for r in s.reads], want) - 1, 0), len(s.reads) - 1)
        order = sorted(range(len(s.reads)), key=lambda j: (abs(j - i), j))
        for j in order[:8]:
            r = s.reads[j]
            facts = [(x, t) for x, t in r.facts if x.key not in s.asked and s.keys.get(x.key) == 1]
            while facts:
                kind = rng.choice(sorted({x.kind for x, _ in facts}, key=KINDS.index))
                x, ev = rng.choice([p for p in facts if p[0].kind == kind])
                facts.remove((x, ev))
                if self._answer(s, rng, r, x, ev, lo, limit):
                    return True
        return False

    def _answer(
        self, s: _Session, rng: random.Random, r: _Read, x, ev: int, lo: float, limit: int
    ) -> bool:
        """Ask about fact `x` of read `r` (its evidence ends at token `ev`) and answer it, if the
        answer comes at least `lo` tokens after the evidence and the pair fits under `limit`; False
        otherwise."""
        q, a, at = _qa(x, r.file.path, rng)
        if x.kind != "params" and x.value in q:
            return False
        user, answer = {"role": "user", "content": q}, {"role": "assistant", "content": a}
        qn = len(self.ren.message(user)[1].ids)
        piece, enc = self.ren.message(answer)
        if qn + len(enc.ids) > QA_BUDGET or s.tokens + qn + len(enc.ids) > limit:
            return False
        first = s.tokens + qn + token_at([e for _, e in enc.offsets], piece.index(a))
        if first - ev < lo:
            return False
        s.asked.add(x.key)
        self._add(s, user)
        self._add(s, answer)
        s.answers.append(
            {
                "message": len(s.messages) - 1,
                "evidence_message": r.message,
                "distance_tokens": first - ev,
                "kind": x.kind,
                "path": r.file.path,
                "subject": x.subject,
                "param": x.param,
                "value": x.value,
                "evidence_chars": list(x.span),
                "answer_chars": [at, at + len(x.value)],
            }
        )
        return True

    # ------------------------------------------------------------------------- reading
    def _read(
        self, s: _Session, rng: random.Random, f: SourceFile, folder: str, limit: int
    ) -> None:
        """The read of `f` (its call and result), maybe a search and a question after it."""
        n, facts = self._file(f)
        self._add(s, tool_call("read_file", f"Reading `{f.path}`.", path=f.path))
        s.reads.append(_Read(f, len(s.messages), s.tokens, [(x, s.tokens + t) for x, t in facts]))
        self._add(s, {"role": "tool", "content": f.text})
        for x, _ in facts:
            s.keys[x.key] = s.keys.get(x.key, 0) + 1
        if self.bar is not None:
            self.bar.update(n)
        if facts and rng.random() < SEARCH_P:
            name = rng.choice(facts)[0].subject.rsplit(".", 1)[-1]
            found = {"role": "tool", "content": self._search(name, folder)}
            ask = tool_call(
                "search",
                f"Searching for `{name}`" + (f" under `{folder}`." if folder else "."),
                pattern=name,
                path=folder or ".",
            )
            if s.tokens + self._cost(ask, found) <= limit:
                self._add(s, ask)
                self._add(s, found)
        if rng.random() < ASK_P:
            self._ask(s, rng, MIN_DISTANCE, limit)

    def _group(
        self, s: _Session, rng: random.Random, group: str, limit: int, stop: int, largest: int
    ) -> None:
        """Read the files of one module or package that fit under `limit` (at most `largest` tokens
        each), until the session reaches `stop`."""
        folder, listing = self._listing(group)
        opening = [{"role": "user", "content": f"Now look at `{group}`."}]
        if folder:
            opening += [
                tool_call("list_files", f"Listing `{folder}`.", path=folder),
                {"role": "tool", "content": listing},
            ]
        opened, head = False, None
        for f in self.groups[group]:
            n, _ = self._file(f)
            read = self._cost(tool_call("read_file", f"Reading `{f.path}`.", path=f.path)) + n
            head = self._cost(*opening) if head is None else head
            if n > largest or s.tokens + read + (0 if opened else head) > limit:
                continue
            if not opened:
                for m in opening:
                    self._add(s, m)
                opened = True
            self._read(s, rng, f, folder, limit)
            if s.tokens >= stop:
                return

    # ------------------------------------------------------------------------- a session
    def build(self, index: int, seed: int) -> dict:
        """Session `index` of `seed` (module doc) as a row."""
        rng = random.Random(f"ds_longctx-sessions/{seed}/{index}")
        target = round(_loguniform(rng, lowest_max(self.min), self.max))
        limit, stop = target - RESERVE, target - RESERVE - self.margin
        s = _Session([])
        self._add(s, {"role": "system", "content": SYSTEM}, TOOLS)
        self._add(
            s,
            {
                "role": "user",
                "content": "We are going to read parts of the Python standard library. I will "
                "point you at modules; read their code, then answer my questions "
                "about what you read.",
            },
        )
        groups = sorted(self.groups)
        rng.shuffle(groups)
        for g in groups:
            self._group(s, rng, g, limit, stop, target // 2)
            if s.tokens >= stop:
                break
        while s.tokens < stop and self._ask(
            s, rng, MIN_DISTANCE, limit
        ):  # no file fits: questions fill the gap
            pass
        name = f"session-{index:04d}"
        if s.tokens < stop:
            raise DataError(
                f"{name}: the corpus ({len(self._corpus)} files, {len(self.groups)} modules) "
                "filled "
                f"{s.tokens:,} of its {target:,}-token target; lower --max_tokens, or use a larger "
                f"corpus (fewer --only names)"
            )
        for _ in range(FINAL_QUESTIONS):
            self._ask(s, rng, max(MIN_DISTANCE, s.tokens / 2), target)
        if not s.answers:
            raise DataError(
                f"{name}: no fact of the files it read could be asked about; use a larger corpus "
                f"(fewer --only names) or raise --min_tokens"
            )
        return {
            "name": name,
            "tools": TOOLS,
            "messages": s.messages,
            "meta": {
                "tokens": s.tokens,
                "target_tokens": target,
                "trained_tokens": s.trained,
                "trained_runs": s.runs,
                "files_read": len(s.reads),
                "answers": s.answers,
            },
        }
