"""A time budget for one data row's chat-template rendering: past it the row is refused, never
waited for; a row too large for it, or surely longer than seq_len under truncate refuse, is refused
by its size before it is rendered.

    # RowOverBudget once ROW_BUDGET_S have passed; the caller refuses the row (file, line)
    with row_budget():
        ids, labels = session_tokens(...)
    # None: render it
    why = row_size_problem(len(row_json_bytes), seq_len, "refuse", token_bytes(tok))

SIGALRM, repeated every REPEAT_S, on the main thread only; docs/design/data.md says why."""

from __future__ import annotations

import contextlib
import signal
import threading

from ds_longctx.parallel.disk import size_text

ROW_BUDGET_S = 120.0  # seconds for one row's rendering and tokenization
REPEAT_S = 0.5
ROW_BYTES_MAX = 48 * 2**20  # what the budget renders at the rate measured (docs/design/data.md)
JSON_BYTES_MAX = 6  # JSON bytes one byte of text takes at most (a control character's \uXXXX)


class RowOverBudget(BaseException):
    """The row's budget is spent: the caller refuses the row."""


def _expire(signum, frame):
    raise RowOverBudget


@contextlib.contextmanager
def row_budget(seconds: float | None = None):
    """The block raises RowOverBudget once `seconds` (default ROW_BUDGET_S) have passed (module
    doc)."""
    seconds = ROW_BUDGET_S if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        yield
    finally:
        while True:  # an alarm due as the row ends may land here: the timer is stopped all the same
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except RowOverBudget:
                continue


def over_budget_reason(seconds: float | None = None) -> str:
    """The refusal of a row past its budget (the caller names its file and line)."""
    return (
        "rendering and tokenizing this row took over "
        f"{ROW_BUDGET_S if seconds is None else seconds:g} s, the "
        "budget of one row (data/budget.py), so it is refused rather than waited for; fix its "
        f"chat template (a loop without end) or split the row"
    )


def token_bytes(tok) -> int:
    """The longest token of `tok`'s vocabulary in UTF-8 bytes: no token stands for more text."""
    return max((len(t.encode()) for t in tok.get_vocab()), default=1)


def row_size_problem(nbytes: int, seq_len: int, rule: str | None, longest: int) -> str | None:
    """Why a chat row of `nbytes` JSON bytes is refused unrendered: over ROW_BYTES_MAX, or under
    truncate refuse surely over seq_len tokens (each at most `longest` bytes of text); None: render
    it."""

    if nbytes > ROW_BYTES_MAX:
        return (
            f"this chat row is {size_text(nbytes)}, over the {size_text(ROW_BYTES_MAX)} one row "
            "may be "
            f"(what its {ROW_BUDGET_S:g} s budget renders: data/budget.py), so it is refused "
            f"before rendering; split it into shorter sessions"
        )
    per_token = JSON_BYTES_MAX * longest
    if rule == "refuse" and nbytes > seq_len * per_token:
        return (
            f"this chat row is {size_text(nbytes)}, so at least {nbytes // per_token} tokens (at "
            "most "
            f"{per_token} JSON bytes a token), over seq_len={seq_len}, which data.truncate: refuse "
            "refuses; "
            f"refused before rendering; split it into sessions of at most {seq_len} tokens, or set "
            f"data.truncate: split"
        )
    return None
