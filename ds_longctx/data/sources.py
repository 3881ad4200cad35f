"""Where the documents come from: a local file or directory (sniffed before anything is converted) or a hub name.

    builder, files = resolve_source("corpus/")          # ("text" | "json" | "parquet" | "hub", [paths])
    docs = load_documents(cfg)                          # a datasets.Dataset of raw documents (Arrow, cached)

Files are sniffed before anything is converted (a binary file, a line that is not JSON, a Parquet file without
its magic are refused with the file's name); every refusal is a `DataError` naming the value and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_SNIFF_BYTES = 1 << 16

class DataError(ValueError):
    """Bad data input: the message names the value and the fix."""



def resolve_source(data: str) -> tuple[str, list[str]]:
    """(`datasets` builder, files) for a local file or directory; ("hub", []) for a name that is not a path."""
    p = Path(data).expanduser()
    looks_local = p.exists() or data.startswith((".", "/", "~")) or p.suffix.lower() in FORMATS
    if not looks_local:
        return "hub", []
    if not p.exists():
        raise DataError(f"data={data!r} does not exist; pass an existing .txt/.jsonl/.json/.parquet file or a "
                        f"directory of them (or data: synthetic)")
    if p.is_file():
        files = [p]
    else:
        files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise DataError(f"data={data!r} is an empty directory; put .txt/.jsonl/.json/.parquet files in it")
    kinds = {FORMATS.get(f.suffix.lower()) for f in files}
    unknown = [f for f in files if f.suffix.lower() not in FORMATS]
    if unknown:
        raise DataError(f"data file {str(unknown[0])!r} has extension {unknown[0].suffix or '(none)'!r}; supported: "
                        f"{sorted(FORMATS)} (rename it, convert it, or move it out of {data!r})")
    if len(kinds) > 1:
        raise DataError(f"data={data!r} mixes formats {sorted(kinds)}; a run reads one format: split the "
                        f"directory or convert the files")
    return kinds.pop(), [str(f) for f in files]


def sniff_files(builder: str, files: list[str], source: str = "") -> None:
    """Refuse files whose first bytes are not what their extension says, or no text at all (before any
    conversion)."""
    blank = 0
    for f in files:
        if builder == "parquet":
            with open(f, "rb") as fh:
                start = fh.read(4)
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(size - 4, 0))
                end = fh.read(4)
            if start != b"PAR1" or end != b"PAR1":
                raise DataError(f"data file {f!r} is not a Parquet file (no PAR1 magic at both ends); write it with "
                                f"pyarrow/pandas `to_parquet`, or rename it to its real format")
            continue
        with open(f, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
        if b"\x00" in head:
            raise DataError(f"data file {f!r} is not text (NUL byte at offset {head.index(0)}); pass UTF-8 text, "
                            f"JSON lines or Parquet")
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(head) - 4:  # a multi-byte character cut by the sniff window is fine
                raise DataError(f"data file {f!r} is not UTF-8 text (byte {head[e.start]:#04x} at offset {e.start}); "
                                f"convert it to UTF-8 (e.g. `iconv -t utf-8`)") from None
            text = head[:e.start].decode("utf-8")
        blank += not text.strip() and len(head) < _SNIFF_BYTES
        if builder == "json" and f.endswith(".jsonl"):
            first = next((line for line in text.splitlines() if line.strip()), None)
            if first is not None:
                try:
                    obj = json.loads(first)
                except json.JSONDecodeError as e:
                    raise DataError(f"data file {f!r} line 1 is not JSON ({e.msg}); JSON lines need one object per "
                                    f"line, e.g. {{\"text\": \"...\"}}") from None
                if not isinstance(obj, dict):
                    raise DataError(f"data file {f!r} line 1 is a JSON {type(obj).__name__}, not an object; write one "
                                    f"object per line, e.g. {{\"text\": \"...\"}}")
    if blank == len(files):
        raise DataError(f"data={source or files[0]!r} is empty (0 documents: {len(files)} file(s) with no text); "
                        f"give it documents or point data at the right file")


def load_documents(cfg):
    """The raw documents as a `datasets.Dataset` (converted to Arrow in the cache on first use)."""
    import datasets
    builder, files = resolve_source(cfg.data.source)
    try:
        if builder == "hub":
            ds = datasets.load_dataset(cfg.data.source, split=cfg.data.split, cache_dir=cfg.data.cache_dir)
        else:
            sniff_files(builder, files, cfg.data.source)
            kwargs = {"sample_by": cfg.data.text_unit} if builder == "text" else {}
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cfg.data.cache_dir,
                                       **kwargs)
    except DataError:
        raise
    except Exception as e:  # the builders' own errors, one line, with the source named
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        if builder == "hub":
            raise DataError(f"data={cfg.data.source!r} is not a local path and could not be loaded from the hub "
                            f"(split {cfg.data.split!r}): {first}; pass a local .txt/.jsonl/.parquet file or "
                            f"directory, or check the name and the network") from None
        raise DataError(f"data={cfg.data.source!r} could not be read as {builder}: {type(e).__name__}: {first}; check "
                        f"the file's format matches its extension") from None
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"data={cfg.data.source!r} split {cfg.data.split!r} gave a {type(ds).__name__}; pass a split "
                        f"name (data_split) that exists")
    if ds.num_rows == 0:
        raise DataError(f"data={cfg.data.source!r} is empty (0 documents in split {cfg.data.split!r}); give it documents "
                        f"or point data at the right file")
    if "input_ids" not in ds.column_names and cfg.data.text_field not in ds.column_names:
        raise DataError(f"data={cfg.data.source!r} has no column text_field={cfg.data.text_field!r} (columns: "
                        f"{ds.column_names}); set text_field to the column holding the text, or provide input_ids")
    return ds


# ----------------------------------------------------------------------------- tokenizer
