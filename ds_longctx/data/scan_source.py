"""A local source read through, file by file: text and Parquet checked here, JSON rows by
data/scan.py (its module doc lists every fault). The one entry is `scan_files`; preflight and the
load call it alike.

    scan = scan_files("json", ["c.jsonl"], "text")    # Scan: rows, mode, bad rows (MAX_NAMED named)

A scan is kept per process for the same files (path, size, mtime) and options: preflight and the
load share it. Sources over 256 MB show a progress bar (bytes; rank 0 only).
"""

from __future__ import annotations

# pyarrow is imported where a parquet file is scanned, not at import.
import os

from tqdm import tqdm

from ds_longctx.data.formats import detect_format, row_format
from ds_longctx.data.scan import NL, DataError, Fault, Scan, json_rows

_CHUNK = 1 << 20  # bytes read at a time from a text file
_BAR_BYTES = 256 << 20  # sources at least this large show a progress bar

_SCANS: dict = {}


def _stamp(f: str) -> tuple:
    st = os.stat(f)
    return (os.path.realpath(f), st.st_size, st.st_mtime_ns)


def scan_files(builder: str, files: list, text_field: str, fmt: str = "auto") -> Scan:
    """Read every file of a local source ("text", "json", "parquet"); DataError on a fault of a file
    (module doc). Kept per process for unchanged files."""
    stamps = [_stamp(f) for f in files]
    key = (builder, tuple(stamps), text_field, fmt)
    if key in _SCANS:
        return _SCANS[key]
    scan = Scan(builder, list(files), text_field, fmt=fmt, stamps=stamps)
    total = sum(s[1] for s in stamps)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="check data",
        leave=False,
        disable=total < _BAR_BYTES or os.environ.get("RANK", "0") != "0",
    )
    for f, (_, size, _) in zip(files, stamps):
        if builder == "text":
            scan.blank_files += not _scan_text(f)
            scan.rows += 1
        elif builder == "parquet":
            _scan_parquet(f, scan)
        else:
            shown = 0
            for done, got in json_rows(f, scan):
                if isinstance(got, Fault):
                    scan.add_bad(got)
                else:
                    scan.rows += 1
                if done - shown >= _CHUNK * 4:
                    bar.update(done - shown)
                    shown = done
            size -= shown
        bar.update(size)
    bar.close()
    _SCANS[key] = scan
    return scan


# ----------------------------------------------------------------------------- text
def _scan_text(f: str) -> bool:
    """Check a text file is UTF-8 without NUL bytes, streaming; True when it holds non-whitespace
    text."""
    base, line, carry, seen_text = 0, 1, b"", False
    with open(f, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            data = carry + chunk
            if not data:
                return seen_text
            if b"\x00" in data:
                at = data.index(b"\x00")
                raise DataError(
                    f"data file {f!r} line {line + data.count(NL, 0, at)} (byte {base + at}) is "
                    "not text (NUL byte); pass UTF-8 text, JSON lines or Parquet"
                )
            try:
                text = data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as e:
                if chunk and e.reason == "unexpected end of data" and e.start >= len(data) - 3:
                    text, carry = (
                        data[: e.start].decode("utf-8"),
                        data[e.start :],
                    )  # a character cut by the chunk
                else:
                    raise DataError(
                        f"data file {f!r} line {line + data.count(NL, 0, e.start)} (byte "
                        f"{base + e.start}): byte {data[e.start]:#04x} is not UTF-8 text; convert "
                        "it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                    ) from None
            seen_text = seen_text or bool(text.strip())
            used = len(data) - len(carry)
            line += data.count(NL, 0, used)
            base += used


# ----------------------------------------------------------------------------- Parquet
def _scan_parquet(f: str, scan: Scan) -> None:
    """Magic at both ends, the text (or input_ids) column present and typed, null rows as bad
    rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with open(f, "rb") as fh:
        start = fh.read(4)
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(size - 4, 0))
        end = fh.read(4)
    if start != b"PAR1" or end != b"PAR1":
        raise DataError(
            f"data file {f!r} is not a Parquet file (no PAR1 magic at both ends); write it with "
            f"pyarrow/pandas `to_parquet`, or rename it to its real format"
        )
    pf = pq.ParquetFile(f)
    names = pf.schema_arrow.names
    if not scan.mode_decided:
        scan.mode_decided = True
        scan.mode = detect_format(names, scan.text_field, scan.fmt)
    rec = row_format(scan.mode)
    if rec.nested:  # nested columns: their rows are checked when tokenized
        need = list(rec.keys)
        if not set(need) <= set(names):
            raise DataError(
                f"data file {f!r} has no column {need} (columns: {names}); data.format is "
                f"{scan.mode}"
            )
        scan.rows += pf.metadata.num_rows
        return
    column = rec.required(scan.text_field)[0]
    if column not in names:
        raise DataError(
            f"data file {f!r} has no column {column!r} (columns: {names}); set text_field to the "
            "column holding the text, or provide input_ids"
        )
    kind = pf.schema_arrow.field(column).type
    ok = (
        (pa.types.is_list(kind) or pa.types.is_large_list(kind))
        if rec.column == "ids"
        else (pa.types.is_string(kind) or pa.types.is_large_string(kind))
    )
    if not ok:
        want = "a list of ints" if rec.column == "ids" else "text"
        raise DataError(
            f"data file {f!r} column {column!r} is {kind}, not {want}; set text_field to the "
            "column holding the text, or convert that column to strings"
        )
    row = 0
    for batch in pf.iter_batches(columns=[column], batch_size=65536):
        col = batch.column(0)
        if col.null_count:
            for i in pc.indices_nonzero(pc.is_null(col)).to_pylist():
                scan.add_bad(
                    Fault(f, row + i + 1, None, f"{column!r} is null: no text", unit="row")
                )
        scan.rows += len(col) - col.null_count
        row += len(col)
