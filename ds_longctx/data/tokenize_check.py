"""The tokenized rows checked: rows marked bad refused by file and line (or counted), and the
trained tokens logged.

    skipped = check_tokenized(tokenized, cfg, docs.skipped_rows)  # after data/tokenize.tokenize

Under truncate split, `untrained_windows` counts the windows of L that hold no trained target (they
train nothing).
"""

from __future__ import annotations

# numpy and pyarrow are imported where rows are checked: importing this module loads neither.
import logging

from ds_longctx.data.scan import MAX_NAMED
from ds_longctx.data.sources import DataError, locate_rows
from ds_longctx.data.tokenize import cut_rule
from ds_longctx.parallel.units import IGNORE_INDEX

log = logging.getLogger("ds_longctx")


def untrained_windows(n_tokens: int, trained, L: int) -> tuple[int, int]:
    """(windows, those with no trained target) of a document of `n_tokens` cut into windows of L
    (truncate split: window k is tokens [kL, (k+1)L), its own document, so its first token is no
    target); `trained`: the indices of the tokens whose label trains."""
    import numpy as np

    t = np.asarray(trained, np.int64)
    windows = -(-n_tokens // L)
    return windows, windows - len(np.unique(t[t % L != 0] // L))


def _split_windows(tokenized, lengths, L: int) -> tuple[int, int, int]:
    """(documents longer than L, their windows of L, those with no trained target):
    `untrained_windows`."""
    import numpy as np

    col = tokenized.data.column("labels")
    long = np.flatnonzero(lengths > L)
    windows = empty = 0
    for i in long.tolist():
        labels = col[i].values.to_numpy(zero_copy_only=False)
        w, e = untrained_windows(len(labels), np.flatnonzero(labels != IGNORE_INDEX), L)
        windows, empty = windows + w, empty + e
    return len(long), windows, empty


def check_tokenized(tokenized, cfg, skipped_before: int) -> int:
    """Refuse the rows tokenization marked bad naming file and line (or count them with
    data.skip_bad_rows); log the trained tokens per document (min, median, max), their share of all
    tokens and, under truncate split, the windows that hold no trained target (they train nothing).
    Returns the skipped rows."""
    import numpy as np
    import pyarrow.compute as pc

    bad_col = tokenized.data.column("bad")
    bad = pc.indices_nonzero(pc.not_equal(bad_col, "")).to_pylist()
    if bad:
        named = bad[:MAX_NAMED]
        where = locate_rows(cfg, named)
        why = [bad_col[i].as_py() for i in named]
        if not cfg.data.skip_bad_rows:
            more = (
                f" ({len(bad)} rows are bad, also {', '.join(where[i] for i in named[1:])})"
                if len(bad) > 1
                else ""
            )
            raise DataError(
                f"{where[named[0]]}: {why[0]}; or set data.skip_bad_rows: true to skip such "
                f"rows{more}"
            )
        if len(bad) == tokenized.num_rows:
            raise DataError(
                f"data={cfg.data.source!r}: all {len(bad)} rows are bad (the first: "
                f"{where[named[0]]}: {why[0]})"
            )
        log.info(
            "data=%r: skipping %d row(s) tokenization refused (data.skip_bad_rows): %s",
            cfg.data.source,
            len(bad),
            "; ".join(f"{where[i]}: {w}" for i, w in zip(named, why)),
        )
    cut = tokenized.data.column("cut").to_numpy()
    if cut.any():
        log.info(
            "data: %d documents longer than seq_len=%d cut to their first %d tokens (%d tokens "
            "left out; data.truncate: head)",
            int((cut > 0).sum()),
            cfg.train.seq_len,
            cfg.train.seq_len,
            int(cut.sum()),
        )
    trained = tokenized.data.column("trained").to_numpy()
    lengths = pc.list_value_length(tokenized.data.column("input_ids")).to_numpy(
        zero_copy_only=False
    )
    real = trained[lengths > 0]
    if len(real):
        L = cfg.train.seq_len
        split = _split_windows(tokenized, lengths, L) if cut_rule(cfg) == "split" else (0, 0, 0)
        windows = (
            f"; {split[2]} of the {split[1]} windows of the {split[0]} documents longer than "
            f"seq_len={L} (data.truncate: split) hold no trained token and train nothing"
            if split[0]
            else ""
        )
        log.info(
            "data: trained tokens per document min %d, median %d, max %d; "
            "%.1f%% of all %d tokens%s",
            real.min(),
            int(np.median(real)),
            real.max(),
            100 * real.sum() / max(int(lengths.sum()), 1),
            int(lengths.sum()),
            windows,
        )
    return skipped_before + len(bad)
