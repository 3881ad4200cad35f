"""The streaming check of local data files: every byte read, lines of any length, every fault named by file, line and
byte offset, before anything is converted.

    scan = scan_files("json", ["c.jsonl"], "text")         # Scan: rows, mode, bad rows (first MAX_NAMED named)
    scan.refuse_bad(skip=False, source="c.jsonl")          # DataError naming the first bad row, unless skip
    ds = datasets.Dataset.from_generator(json_documents, gen_kwargs=scan.gen_kwargs(), ...)   # the good rows

Faults of a file (refused always, `DataError`): a text file that is not UTF-8 or holds a NUL byte, a Parquet file
without its magic or whose column is not text, a .json array that is not UTF-8 or does not parse. Faults of a row
(refused unless `data.skip_bad_rows`, else skipped and counted): a JSON line that is not UTF-8, not JSON or not an
object, or that gives a key twice at any depth (parallel/json_keys.py, as run configs are read; in a .json array: the
file is refused), a row without the text field (`text_field`), or whose value is not a string (null, a number, a list,
...), a Parquet row whose text is null. A blank line is no row. Rows hold text (`text_field`), or token ids where the
first object row has `input_ids` and no text field ("tokens" mode: every row then needs a list of ints there), or a
chat session (`messages`) or `prompt` / `completion` strings: `data.format` names the mode, or the first row decides
(data/formats.py checks those rows: a message without a role, an unknown role, `tool_calls` not a list, ...).

Written by hand because `datasets`' JSON builder (pyarrow) cannot do it: a malformed line fails the whole file with
"row N" of its 10 MB chunk (no file line, no byte offset), so no row can be skipped; a text field holding a number in
one row turns the whole column into JSON-encoded values (`on_mixed_types="use_json"`), which would train on `5` and
`"\"...\""`; a missing field becomes a silent null. The good rows still go through `datasets`
(`Dataset.from_generator`: Arrow in the cache, under a fingerprint of the files' paths, sizes and mtimes).

A scan is kept per process for the same files (path, size, mtime) and options: preflight and the load share it.
Sources over 256 MB show a progress bar (bytes; rank 0 only).
"""

from __future__ import annotations

# pyarrow is imported where a parquet file is scanned, not at import.
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from tqdm import tqdm

from ds_longctx.data.formats import (
    conversational,
    detect_format,
    keys_problem,
    other_format,
    row_problem,
    token_keys,
    utf8_row,
)
from ds_longctx.parallel.json_keys import DuplicateKey, TooDeep, json_kind, loads_unique, raw_decode_unique

log = logging.getLogger("ds_longctx")

MAX_NAMED = 5          # bad rows named in a refusal or in the log; the rest are counted
_CHUNK = 1 << 20       # bytes read at a time from a text file
_VERSION = "scan-v2"   # part of the cache fingerprint of the rows read here
_BAR_BYTES = 256 << 20  # sources at least this large show a progress bar
NL = b"\n"


class DataError(ValueError):
    """Bad data input: the message names the value and the fix."""


@dataclass(frozen=True)
class Fault:
    """What is wrong at one place of a file: `line` is 1-based (a JSON line, a text line, a Parquet row, a JSON
    array's element), `offset` the byte offset in the file (None for Parquet rows)."""
    file: str
    line: int
    offset: Optional[int]
    what: str
    unit: str = "line"

    def where(self) -> str:
        at = f" (byte {self.offset})" if self.offset is not None else ""
        return f"data file {self.file!r} {self.unit} {self.line}{at}"

    def short(self) -> str:
        return f"{Path(self.file).name}:{self.line}: {self.what}"


@dataclass
class Scan:
    """What a scan found: rows that will be read, bad rows (counted; the first MAX_NAMED kept), the row mode."""
    builder: str
    files: list
    text_field: str
    fmt: str = "auto"                  # data.format: the mode asked for ("auto": the first row decides)
    mode: str = "text"                 # text | messages | prompt_completion | tokens (data/formats.py ROW_FORMATS)
    mask_keys: tuple = ()              # tokens rows: the labels / mask keys of the first row (formats.TOKEN_KEYS)
    mode_decided: bool = False         # by the first object row (JSON) or the first file's columns (Parquet)
    rows: int = 0                      # good rows (documents)
    bad: int = 0
    named: list = field(default_factory=list)
    stamps: list = field(default_factory=list)   # (real path, size, mtime_ns) per file
    blank_files: int = 0               # files with no non-whitespace text (text builder only)
    reported_by: int = 0               # the pid that logged the skipped rows (a forked worker logs again)

    def add_bad(self, fault: Fault) -> None:
        self.bad += 1
        if len(self.named) < MAX_NAMED:
            self.named.append(fault)

    def refuse_bad(self, skip: bool, source: str) -> None:
        """DataError naming the first bad row unless `skip`; with `skip`, log what is skipped."""
        if not self.bad:
            return
        first = self.named[0]
        total = self.rows + self.bad
        if not skip:
            also = ", ".join(f"{Path(f.file).name}:{f.line}" for f in self.named[1:])
            more = f" ({self.bad} of {total} rows are bad, also {also}{' ...' if self.bad > MAX_NAMED else ''})" \
                if self.bad > 1 else ""
            raise DataError(f"{first.where()}: {first.what}; fix that {first.unit} in the file, or set "
                            f"data.skip_bad_rows: true to skip such rows{more}")
        if not self.rows:
            raise DataError(f"data={source!r}: all {self.bad} rows are bad, nothing is left to train on (the first: "
                            f"{first.where()}: {first.what})")
        if self.reported_by != os.getpid():  # once per process (preflight and the load share this scan)
            self.reported_by = os.getpid()
            log.info("data=%r: skipping %d bad row(s) of %d (data.skip_bad_rows): %s%s", source, self.bad, total,
                     "; ".join(f.short() for f in self.named), " ..." if self.bad > len(self.named) else "")

    def skipped(self) -> list:
        """The named bad rows as 'file:line: what' (the first MAX_NAMED)."""
        return [f.short() for f in self.named]

    def gen_kwargs(self) -> dict:
        return {"files": list(self.files), "text_field": self.text_field, "mode": self.mode,
                "mask_keys": self.mask_keys}

    def columns(self) -> dict:
        """The columns of the rows `json_documents` yields: name -> "string" or "ids"."""
        return {"text": {self.text_field: "string"}, "messages": {"messages": "string", "tools": "string"},
                "prompt_completion": {"prompt": "string", "completion": "string"},
                "tokens": {"input_ids": "ids", **{k: "ids" for k in self.mask_keys}}}[self.mode]

    def fingerprint(self) -> str:
        key = json.dumps([_VERSION, self.builder, self.stamps, self.text_field, self.mode, self.mask_keys])
        return hashlib.sha256(key.encode()).hexdigest()[:16]


_SCANS: dict = {}


def _stamp(f: str) -> tuple:
    st = os.stat(f)
    return (os.path.realpath(f), st.st_size, st.st_mtime_ns)


def scan_files(builder: str, files: list, text_field: str, fmt: str = "auto") -> Scan:
    """Read every file of a local source ("text", "json", "parquet"); DataError on a fault of a file (module doc).
    Kept per process for unchanged files."""
    stamps = [_stamp(f) for f in files]
    key = (builder, tuple(stamps), text_field, fmt)
    if key in _SCANS:
        return _SCANS[key]
    scan = Scan(builder, list(files), text_field, fmt=fmt, stamps=stamps)
    total = sum(s[1] for s in stamps)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="check data", leave=False,
               disable=total < _BAR_BYTES or os.environ.get("RANK", "0") != "0")
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
    """Check a text file is UTF-8 without NUL bytes, streaming; True when it holds non-whitespace text."""
    base, line, carry, seen_text = 0, 1, b"", False
    with open(f, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            data = carry + chunk
            if not data:
                return seen_text
            if b"\x00" in data:
                at = data.index(b"\x00")
                raise DataError(f"data file {f!r} line {line + data.count(NL, 0, at)} (byte {base + at}) is not text "
                                f"(NUL byte); pass UTF-8 text, JSON lines or Parquet")
            try:
                text = data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as e:
                if chunk and e.reason == "unexpected end of data" and e.start >= len(data) - 3:
                    text, carry = data[:e.start].decode("utf-8"), data[e.start:]  # a character cut by the chunk
                else:
                    raise DataError(f"data file {f!r} line {line + data.count(NL, 0, e.start)} (byte "
                                    f"{base + e.start}): byte {data[e.start]:#04x} is not UTF-8 text; convert it to "
                                    f"UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None
            seen_text = seen_text or bool(text.strip())
            used = len(data) - len(carry)
            line += data.count(NL, 0, used)
            base += used


# ----------------------------------------------------------------------------- JSON lines / a JSON array
def _row_value(obj, scan: Scan) -> tuple:
    """(the row's text or token ids, None) or (None, what is wrong with it). The first object row decides the mode."""
    if not isinstance(obj, dict):
        return None, (f"a JSON {json_kind(obj)}, not an object: write one object per row, e.g. "
                      f"{{\"{scan.text_field}\": \"...\"}}")
    talk = conversational(obj)
    if not scan.mode_decided:
        scan.mode_decided = True
        scan.mode = detect_format(talk, scan.text_field, scan.fmt)
        scan.mask_keys = token_keys(obj) if scan.mode == "tokens" else ()
    obj = talk if scan.mode == "messages" else obj
    if scan.mode != "text":
        why = row_problem(obj, scan.mode) or (scan.mode == "tokens" and keys_problem(obj, scan.mask_keys))
        if why:
            return None, other_format(obj, scan.text_field, scan.mode) or why
        row = {k: (json.dumps(obj.get(k), ensure_ascii=False) if kind == "string" and scan.mode == "messages" else
                   obj.get(k)) for k, kind in scan.columns().items()}
        return utf8_row(row)
    if scan.text_field not in obj:
        return None, other_format(obj, scan.text_field, "text") or (
            f"no text_field={scan.text_field!r} key (its keys: {sorted(obj)[:8]}): set text_field to the key holding "
            f"the text")
    value = obj[scan.text_field]
    if not isinstance(value, str):
        return None, (f"{scan.text_field!r} is a JSON {json_kind(value)} ({json.dumps(value)[:40]}), not a string: "
                      f"write the text as a JSON string")
    return utf8_row({scan.text_field: value})


def json_rows(f: str, scan: Scan, lines: bool = False) -> Iterator[tuple]:
    """(bytes read so far, row dict | Fault) of every row of a JSON lines file, or of a .json file holding one
    array (`_json_array`); blank lines are no rows. `lines`: (line or element number, row | Fault) in place of the
    row."""
    with open(f, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if f.lower().endswith(".json") and head.startswith(b"["):
        for k, (done, got) in enumerate(_json_array(f, scan), 1):
            yield done, ((k, got) if lines else got)
        return
    offset = 0
    hint = " (a .json file holds JSON lines or one array of objects)" if f.lower().endswith(".json") else ""
    with open(f, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):  # a binary file's lines: any length, `\n`-terminated
            start, offset = offset, offset + len(raw)
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, start = raw[3:], start + 3
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield offset, Fault(f, line_no, start + e.start, f"byte {raw[e.start]:#04x} is not UTF-8: convert "
                                                                 f"it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)")
                continue
            text = text.rstrip("\r\n")
            try:
                obj = loads_unique(text)
            except (DuplicateKey, TooDeep) as e:
                yield offset, Fault(f, line_no, start, str(e))
                continue
            except json.JSONDecodeError as e:
                at = start + len(text[:e.pos].encode("utf-8"))
                cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
                yield offset, Fault(f, line_no, at, f"not JSON ({e.msg}{'' if e.msg.endswith(' at') else ' at'} "
                                                    f"character {e.pos + 1}{'; cut short?' if cut else ''}){hint}")
                continue
            value, why = _row_value(obj, scan)
            got = Fault(f, line_no, start, why) if why else value
            yield offset, ((line_no, got) if lines else got)


def _json_array(f: str, scan: Scan) -> Iterator[tuple]:
    """The elements of a file holding one JSON array (read whole, as `datasets` does): each element a row."""
    raw = Path(f).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"data file {f!r} line {raw.count(NL, 0, e.start) + 1} (byte {e.start}): byte "
                        f"{raw[e.start]:#04x} is not UTF-8; convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                        ) from None
    ws = " \t\r\n"
    i, byte_at, line_at, counted = text.index("[") + 1, 3 if raw.startswith(b"\xef\xbb\xbf") else 0, 1, 0

    def where(pos: int) -> tuple:  # (line, byte offset) of char `pos`; positions only grow: counted forward once
        nonlocal byte_at, line_at, counted
        byte_at += len(text[counted:pos].encode("utf-8"))
        line_at += text.count("\n", counted, pos)
        counted = pos
        return line_at, byte_at

    element = 0
    while True:
        while i < len(text) and text[i] in ws:
            i += 1
        if i < len(text) and text[i] == "]" and element == 0:
            return
        try:
            obj, end = raw_decode_unique(text, i)
        except (DuplicateKey, TooDeep) as e:  # a doubled key's lines are counted within the element
            raise DataError(f"data file {f!r} line {where(i)[0] + (getattr(e, 'first', 1) or 1) - 1}: element "
                            f"{element + 1} of the array: {e}") from None
        except json.JSONDecodeError as e:
            line, at = where(e.pos)
            raise DataError(f"data file {f!r} line {line} (byte {at}): not JSON ({e.msg}), in element {element + 1} "
                            f"of the array; fix the file (a .json file holds JSON lines or one array of objects)"
                            ) from None
        element += 1
        value, why = _row_value(obj, scan)
        if why:
            line, at = where(i)
            value = Fault(f, element, at, f"{why} (line {line})", unit="element")
        yield 0, value
        i = end
        while i < len(text) and text[i] in ws:
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "]":
            return
        line, at = where(i)
        raise DataError(f"data file {f!r} line {line} (byte {at}): expected ',' or ']' after element {element} of "
                        f"the array; fix the file (a .json file holds JSON lines or one array of objects)")


def json_documents(files: list, text_field: str, mode: str, mask_keys: tuple = ()) -> Iterator[dict]:
    """The good rows of JSON files as `datasets` rows (`Scan.columns`: {text_field: str}, {"input_ids": [int], ...},
    messages and tools as JSON strings, ...), in file order: the generator of `Dataset.from_generator` (bad rows were
    counted by the scan and are left out here)."""
    scan = Scan("json", files, text_field, mode=mode, mode_decided=True, mask_keys=tuple(mask_keys))
    for f in files:
        for _, got in json_rows(f, scan):
            if not isinstance(got, Fault):
                yield got


# ----------------------------------------------------------------------------- Parquet
def _scan_parquet(f: str, scan: Scan) -> None:
    """Magic at both ends, the text (or input_ids) column present and typed, null rows as bad rows."""
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
        raise DataError(f"data file {f!r} is not a Parquet file (no PAR1 magic at both ends); write it with "
                        f"pyarrow/pandas `to_parquet`, or rename it to its real format")
    pf = pq.ParquetFile(f)
    names = pf.schema_arrow.names
    if not scan.mode_decided:
        scan.mode_decided = True
        scan.mode = detect_format(names, scan.text_field, scan.fmt)
    if scan.mode in ("messages", "prompt_completion"):  # nested columns: their rows are checked when tokenized
        need = ["messages"] if scan.mode == "messages" else ["prompt", "completion"]
        if not set(need) <= set(names):
            raise DataError(f"data file {f!r} has no column {need} (columns: {names}); data.format is {scan.mode}")
        scan.rows += pf.metadata.num_rows
        return
    column = "input_ids" if scan.mode == "tokens" else scan.text_field
    if column not in names:
        raise DataError(f"data file {f!r} has no column {column!r} (columns: {names}); set text_field to the column "
                        f"holding the text, or provide input_ids")
    kind = pf.schema_arrow.field(column).type
    ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) if column == "input_ids" else (
        pa.types.is_string(kind) or pa.types.is_large_string(kind))
    if not ok:
        want = "a list of ints" if column == "input_ids" else "text"
        raise DataError(f"data file {f!r} column {column!r} is {kind}, not {want}; set text_field to the column "
                        f"holding the text, or convert that column to strings")
    row = 0
    for batch in pf.iter_batches(columns=[column], batch_size=65536):
        col = batch.column(0)
        if col.null_count:
            for i in pc.indices_nonzero(pc.is_null(col)).to_pylist():
                scan.add_bad(Fault(f, row + i + 1, None, f"{column!r} is null: no text", unit="row"))
        scan.rows += len(col) - col.null_count
        row += len(col)
