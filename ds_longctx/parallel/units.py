"""Constants every layer shares, torch-free, at the bottom of the package (data, levers, run and the
commands import them from here).

    IGNORE_INDEX   the label of a position that trains nothing (padding, a prompt, a tool's output):
                   -100, as torch's cross_entropy and HF's collators take it
    GB             the project's GB (10**9 bytes), in budgets, plans, reports and disk sizes
"""

IGNORE_INDEX = -100
GB = 10**9
