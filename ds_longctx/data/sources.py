"""Where the documents come from: a local file or directory (read through once and checked,
data/scan.py) or a hub name.

    builder, files = resolve_source("corpus/")    # ("text" | "json" | "parquet" | "hub", [paths])
    docs = load_documents(cfg)                    # Documents: a datasets.Dataset (Arrow) + bad rows

Every refusal is a `DataError` naming the value (the file, line and byte offset where there is one)
and the fix.
"""

from __future__ import annotations

# datasets and pyarrow are imported where documents are loaded (seconds at import).
import logging
from dataclasses import dataclass
from pathlib import Path

from ds_longctx.data.formats import detect_format, row_format
from ds_longctx.data.scan import MAX_NAMED, DataError, Fault, Scan, json_documents, json_rows
from ds_longctx.data.scan_source import scan_files

__all__ = [
    "DataError",
    "Documents",
    "check_source",
    "load_documents",
    "locate_rows",
    "prepared_split",
    "resolve_source",
]

log = logging.getLogger("ds_longctx")

FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
)  # any one: a tokenizer loads
# what a tokenizer or model directory holds (passed as data by mistake)
_TOKENIZER_FILES = (*TOKENIZER_FILES, "special_tokens_map.json")
_MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
# what marks a corpus directory of `ds-longctx data prepare` (corpora/prepare.py)
PREPARED_CARD = "data_card.json"


@dataclass
class Documents:
    """The raw documents and how many rows were left out as bad on the way (data.skip_bad_rows)."""

    ds: object  # datasets.Dataset
    skipped_rows: int = 0
    format: str = "text"  # a name of data/formats.py ROW_FORMATS
    mask_keys: tuple = ()  # the optional columns every row carries (tokens: labels / masks)


def _not_a_corpus(data: str, p: Path) -> None:
    """Refuse a model checkpoint or a tokenizer (a directory, or its config / tokenizer file) passed
    as data."""
    names = {f.name for f in p.iterdir()} if p.is_dir() else {p.name}
    tok, model = sorted(names & set(_TOKENIZER_FILES)), sorted(names & set(_MODEL_FILES))
    if model and (p.is_dir() or p.name == "config.json"):
        what, use = "a model checkpoint", "model"
    elif tok:
        what, use = "a tokenizer", "tokenizer"
    else:
        return
    raise DataError(
        f"data={data!r} is {what} ({', '.join(model + tok)}), not documents; pass it as {use}: and "
        "point data at your .jsonl/.txt/.parquet corpus (a file or a directory of them)"
    )


def prepared_split(data: str, split: str = "train") -> str:
    """`data`, or for a corpus directory that `ds-longctx data prepare` wrote (its PREPARED_CARD
    beside train.jsonl and eval.jsonl) the file of `split`: the card, the tokenizer and the other
    split are not this split's documents."""
    p = Path(data).expanduser()
    if p.is_dir() and (p / PREPARED_CARD).is_file() and (p / f"{split}.jsonl").is_file():
        return str(p / f"{split}.jsonl")
    return data


def resolve_source(data: str) -> tuple[str, list[str]]:
    """(`datasets` builder, files) for a local file or directory (a prepared corpus: its
    train.jsonl, `prepared_split`); ("hub", []) for a name that is not a path."""
    p = Path(prepared_split(data)).expanduser()
    looks_local = p.exists() or data.startswith((".", "/", "~")) or p.suffix.lower() in FORMATS
    if not looks_local:
        return "hub", []
    if not p.exists():
        raise DataError(
            f"data={data!r} does not exist; pass an existing .txt/.jsonl/.json/.parquet file or a "
            f"directory of them (or data: synthetic)"
        )
    _not_a_corpus(data, p)
    if not (p.is_file() or p.is_dir()):  # a device, a pipe, a socket: nothing to read twice
        raise DataError(
            f"data={data!r} is neither a regular file nor a directory; pass a "
            ".txt/.jsonl/.json/.parquet file or a directory of them"
        )
    if p.is_file():
        files = [p]
    else:
        files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise DataError(
                f"data={data!r} is an empty directory; put .txt/.jsonl/.json/.parquet files in it"
            )
    kinds = {FORMATS.get(f.suffix.lower()) for f in files}
    unknown = [f for f in files if f.suffix.lower() not in FORMATS]
    if unknown:
        raise DataError(
            f"data file {str(unknown[0])!r} has extension {unknown[0].suffix or '(none)'!r}; "
            f"supported: {sorted(FORMATS)} (rename it, convert it, or move it out of {data!r})"
        )
    if len(kinds) > 1:
        raise DataError(
            f"data={data!r} mixes formats {sorted(kinds)}; a run reads one format: split the "
            f"directory or convert the files"
        )
    return kinds.pop(), [str(f) for f in files]


def check_source(cfg) -> Scan | None:
    """Read every file of a local source through (data/scan.py) and refuse what it cannot train on:
    a fault of a file, an empty source, a bad row unless data.skip_bad_rows. None for a hub name
    (checked once loaded)."""
    builder, files = resolve_source(cfg.data.source)
    if builder == "hub":
        return None
    scan = scan_files(builder, files, cfg.data.text_field, cfg.data.format)
    if (scan.blank_files == len(files)) if builder == "text" else not scan.rows + scan.bad:
        raise DataError(
            f"data={cfg.data.source!r} is empty (0 documents: {len(files)} file(s) with no text); "
            f"give it documents or point data at the right file"
        )
    scan.refuse_bad(cfg.data.skip_bad_rows, cfg.data.source)
    return scan


def load_documents(cfg) -> Documents:
    """The raw documents as a `datasets.Dataset` (converted to Arrow in the cache on first use), bad
    rows left out (with data.skip_bad_rows) or refused (check_source)."""
    builder, files = resolve_source(cfg.data.source)
    scan = check_source(cfg)
    ds = _read_dataset(cfg, builder, files, scan)
    fmt, mask_keys = _row_format(cfg, ds, scan)
    if builder in ("hub", "parquet") and not row_format(fmt).nested:
        docs = _drop_null_rows(ds, cfg, scan, fmt)
        return Documents(docs.ds, docs.skipped_rows, fmt, mask_keys)
    return Documents(ds, scan.bad if scan is not None else 0, fmt, mask_keys)


def _read_dataset(cfg, builder: str, files: list, scan: Scan | None):
    """The source as one non-empty `datasets.Dataset`; a builder's own error becomes a one-line
    DataError."""
    import datasets

    try:
        if builder == "hub":
            ds = datasets.load_dataset(
                cfg.data.source, split=cfg.data.split, cache_dir=cfg.data.cache_dir
            )
        elif (
            builder == "json"
        ):  # our reader (it names bad rows and leaves them out), datasets' Arrow cache
            kinds = {
                "ids": datasets.List(datasets.Value("int64")),
                "string": datasets.Value("string"),
            }
            features = datasets.Features({k: kinds[v] for k, v in scan.columns().items()})
            ds = datasets.Dataset.from_generator(
                json_documents,
                features=features,
                gen_kwargs=scan.gen_kwargs(),
                fingerprint=scan.fingerprint(),
                cache_dir=cfg.data.cache_dir,
            )
        else:
            kwargs = {"sample_by": cfg.data.text_unit} if builder == "text" else {}
            ds = datasets.load_dataset(
                builder, data_files=files, split="train", cache_dir=cfg.data.cache_dir, **kwargs
            )
    except DataError:
        raise
    except Exception as e:  # the builders' own errors, one line, with the source named
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        if builder == "hub":
            raise DataError(
                f"data={cfg.data.source!r} is not a local path and could not be loaded from the "
                f"hub (split {cfg.data.split!r}): {first}; pass a local .txt/.jsonl/.parquet file "
                "or directory, or check the name and the network"
            ) from None
        raise DataError(
            f"data={cfg.data.source!r} could not be read as {builder}: {type(e).__name__}: "
            f"{first}; check the file's format matches its extension"
        ) from None
    if not isinstance(ds, datasets.Dataset):
        raise DataError(
            f"data={cfg.data.source!r} split {cfg.data.split!r} gave a {type(ds).__name__}; pass a "
            "split name (data_split) that exists"
        )
    if ds.num_rows == 0:
        raise DataError(
            f"data={cfg.data.source!r} is empty (0 documents in split {cfg.data.split!r}); give it "
            f"documents or point data at the right file"
        )
    return ds


def _row_format(cfg, ds, scan: Scan | None) -> tuple:
    """(the row format, the token rows' mask keys) of the loaded rows; DataError when its columns
    are missing."""
    fmt = (
        scan.mode
        if scan is not None
        else detect_format(ds.column_names, cfg.data.text_field, cfg.data.format)
    )
    rec = row_format(fmt)
    mask_keys = (
        scan.mask_keys
        if scan is not None and scan.builder == "json"
        else tuple(k for k in rec.optional if k in ds.column_names)
        if rec.first_row_optional
        else ()
    )
    need = list(rec.required(cfg.data.text_field))
    if not set(need) <= set(ds.column_names):
        raise DataError(
            f"data={cfg.data.source!r} has no column {need} for data.format {fmt} (columns: "
            f"{ds.column_names}); set text_field to the column holding the text, or data.format"
        )
    log.info(
        "data=%r: rows are %s (%s)",
        cfg.data.source,
        fmt,
        "data.format" if cfg.data.format != "auto" else "detected from the first row",
    )
    return fmt, mask_keys


def locate_rows(cfg, indices: list) -> dict:
    """{i: where} for rows i (0-based) of the loaded documents: "data file 'f' line N" for JSON
    files, else "data=... row i+1"."""
    builder, files = resolve_source(cfg.data.source)
    if builder != "json":
        return {i: f"data={cfg.data.source!r} row {i + 1}" for i in indices}
    seen = check_source(cfg)  # the files are read again (an error path: rows tokenization refused)
    scan = Scan(
        "json", files, seen.text_field, mode=seen.mode, mode_decided=True, mask_keys=seen.mask_keys
    )
    want, out, k = set(indices), {}, 0
    for f in files:
        for _, (line, got) in json_rows(f, scan, lines=True):
            if not isinstance(got, Fault):
                if k in want:
                    out[k] = f"data file {f!r} line {line}"
                k += 1
    return out


def _drop_null_rows(ds, cfg, scan: Scan | None, fmt: str | None = None) -> Documents:
    """Loaded columnar rows of format `fmt` (one column; None: the columns say): text must be
    strings; null rows are refused, or left out with data.skip_bad_rows (a Parquet file's were named
    by its scan, a hub split's here)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rec = row_format(fmt or detect_format(ds.column_names, cfg.data.text_field, "auto"))
    column = rec.required(cfg.data.text_field)[0]
    col = ds.data.column(column)
    if rec.column != "ids" and not (
        pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
    ):
        raise DataError(
            f"data={cfg.data.source!r} column {column!r} holds {col.type}, not text; set "
            "text_field to the column holding the text"
        )
    if not col.null_count:
        return Documents(ds)
    nulls = pc.indices_nonzero(pc.is_null(col)).to_pylist()
    named = scan.skipped() if scan is not None else [f"row {i + 1}" for i in nulls[:MAX_NAMED]]
    if not cfg.data.skip_bad_rows:
        raise DataError(
            f"data={cfg.data.source!r} split {cfg.data.split!r}: {len(nulls)} of {ds.num_rows} "
            f"rows have no text (null {column!r}): {'; '.join(named)}; drop those rows or set "
            "data.skip_bad_rows: true to skip them"
        )
    if len(nulls) == ds.num_rows:
        raise DataError(
            f"data={cfg.data.source!r}: all {ds.num_rows} rows have a null {column!r}; set "
            "text_field to the column holding the text"
        )
    if scan is None:
        log.info(
            "data=%r: skipping %d row(s) with a null %r (data.skip_bad_rows): %s",
            cfg.data.source,
            len(nulls),
            column,
            "; ".join(named),
        )
    keep = ds.filter(lambda v: v is not None, input_columns=[column], desc="leave out null rows")
    return Documents(keep, len(nulls))
