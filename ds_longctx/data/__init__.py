"""Training data: local files or a hub dataset -> token rows of exactly `seq_len` (synthetic task:
synthetic.py).

    data = build_data(cfg, hf_config, dp_size)     # TokenRows, or SyntheticRetrieval ("synthetic")
    batch = data.get(step, micro_batch, dp_rank, dp_size)   # Batch: input_ids [b, L], position_ids
    held = build_eval_data(cfg, hf_config)         # eval_data's rows, read alike (None: no eval)

Modules import only those before them: formats -> scan -> scan_source -> sources -> budget ->
tokenize -> rows -> synthetic -> build, which holds the entry points and the checks that span them.
Rules: a bad local row is refused or, with `data.skip_bad_rows`, counted and left out; every layout
(concat, pack, document) slices labels with the tokens; the row order depends only on (seed, step).
Sources, formats (one table: data/formats.py), layouts and order: docs/design/data.md."""

from __future__ import annotations

__all__ = [
    "Batch",
    "DataError",
    "TokenRows",
    "build_data",
    "build_eval_data",
    "build_pairs",
    "check_data_source",
    "check_eval_source",
    "check_packing",
    "eval_view",
    "resolve_layout",
]


def __getattr__(name: str):
    """data/build.py's entry points, imported on first use: config reads data/formats.py without
    torch."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ds_longctx.data import build

    return getattr(build, name)
