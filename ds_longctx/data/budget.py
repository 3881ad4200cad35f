"""A time budget for one data row's chat-template rendering: past it the row is refused, never
waited for.

    with row_budget():      # RowOverBudget once ROW_BUDGET_S have passed; the caller refuses the row (file, line)
        ids, labels = session_tokens(...)

SIGALRM, repeated every REPEAT_S, on the main thread only; docs/design/data.md says why."""

from __future__ import annotations

import contextlib
import signal
import threading

ROW_BUDGET_S = 120.0  # seconds for one row's rendering and tokenization
REPEAT_S = 0.5


class RowOverBudget(BaseException):
    """The row's budget is spent: the caller refuses the row."""


def _expire(signum, frame):
    raise RowOverBudget


@contextlib.contextmanager
def row_budget(seconds: float | None = None):
    """The block raises RowOverBudget once `seconds` (default ROW_BUDGET_S) have passed (module doc)."""
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
        f"rendering and tokenizing this row took over {ROW_BUDGET_S if seconds is None else seconds:g} s, the "
        f"budget of one row (data/budget.py), so it is refused rather than waited for; fix its chat template (a "
        f"loop without end) or split the row"
    )
