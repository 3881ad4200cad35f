"""Local data rows read through: every fault named by file, line and byte offset, before anything is
converted. The types of a scan (`DataError`, `Fault`, `Scan`) and the JSON rows; data/scan_source.py
reads whole sources.

    scan = scan_files("json", ["c.jsonl"], "text")    # data/scan_source.py: Scan, bad rows
    scan.refuse_bad(skip=False, source="c.jsonl")     # DataError naming the first bad row (or skip)
    ds = datasets.Dataset.from_generator(json_documents, gen_kwargs=scan.gen_kwargs(), ...)

Faults of a file (refused always, `DataError`): a text file that is not UTF-8 or holds a NUL byte, a
Parquet file without its magic or whose column is not text, a .json array that is not UTF-8 or does
not parse. Faults of a row (refused unless `data.skip_bad_rows`, else skipped and counted): a JSON
line that is not UTF-8, not JSON or not an object, or that gives a key twice at any depth
(parallel/json_keys.py; in a .json array: the file is refused), a row without the text field
(`text_field`) or whose value is not a string, a Parquet row whose text is null. A blank line is no
row. Rows hold one format of data/formats.py's FORMAT_TABLE: `data.format` names the mode, or the
first row decides (data/formats.py checks those rows). Why `datasets`' own JSON builder is not used:
`docs/design/data.md`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from ds_longctx.data.formats import (
    conversational,
    detect_format,
    keys_problem,
    other_format,
    row_format,
    row_problem,
    utf8_row,
)
from ds_longctx.parallel.json_keys import (
    DuplicateKey,
    TooDeep,
    json_kind,
    loads_unique,
    raw_decode_unique,
)

log = logging.getLogger("ds_longctx")

MAX_NAMED = 5  # bad rows named in a refusal or in the log; the rest are counted
_VERSION = "scan-v2"  # part of the cache fingerprint of the rows read here
NL = b"\n"


class DataError(ValueError):
    """Bad data input: the message names the value and the fix."""


@dataclass(frozen=True)
class Fault:
    """What is wrong at one place of a file: `line` is 1-based (a JSON line, a text line, a Parquet
    row, a JSON array's element), `offset` the byte offset in the file (None for Parquet rows)."""

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
    """What a scan found: rows that will be read, bad rows (counted; the first MAX_NAMED kept), the
    row mode."""

    builder: str
    files: list
    text_field: str
    fmt: str = "auto"  # data.format: the mode asked for ("auto": the first row decides)
    mode: str = "text"  # a name of data/formats.py ROW_FORMATS
    mask_keys: tuple = ()  # the first row's optional keys, where every row carries them (tokens)
    mode_decided: bool = (
        False  # by the first object row (JSON) or the first file's columns (Parquet)
    )
    rows: int = 0  # good rows (documents)
    bad: int = 0
    named: list = field(default_factory=list)
    stamps: list = field(default_factory=list)  # (real path, size, mtime_ns) per file
    blank_files: int = 0  # files with no non-whitespace text (text builder only)
    reported_by: int = 0  # the pid that logged the skipped rows (a forked worker logs again)

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
            more = (
                f" ({self.bad} of {total} rows are bad, also "
                f"{also}{' ...' if self.bad > MAX_NAMED else ''})"
                if self.bad > 1
                else ""
            )
            raise DataError(
                f"{first.where()}: {first.what}; fix that {first.unit} in the file, or set "
                f"data.skip_bad_rows: true to skip such rows{more}"
            )
        if not self.rows:
            raise DataError(
                f"data={source!r}: all {self.bad} rows are bad, nothing is left to train on (the "
                f"first: {first.where()}: {first.what})"
            )
        if (
            self.reported_by != os.getpid()
        ):  # once per process (preflight and the load share this scan)
            self.reported_by = os.getpid()
            log.info(
                "data=%r: skipping %d bad row(s) of %d (data.skip_bad_rows): %s%s",
                source,
                self.bad,
                total,
                "; ".join(f.short() for f in self.named),
                " ..." if self.bad > len(self.named) else "",
            )

    def skipped(self) -> list:
        """The named bad rows as 'file:line: what' (the first MAX_NAMED)."""
        return [f.short() for f in self.named]

    def gen_kwargs(self) -> dict:
        return {
            "files": list(self.files),
            "text_field": self.text_field,
            "mode": self.mode,
            "mask_keys": self.mask_keys,
        }

    def columns(self) -> dict:
        """The columns of the rows `json_documents` yields: name -> "string" or "ids"."""
        rec = row_format(self.mode)
        extra = self.mask_keys if rec.first_row_optional else rec.optional
        kind = "ids" if rec.column == "ids" else "string"
        return {k: kind for k in rec.required(self.text_field) + tuple(extra)}

    def fingerprint(self) -> str:
        key = json.dumps(
            [_VERSION, self.builder, self.stamps, self.text_field, self.mode, self.mask_keys]
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------ JSON lines / a JSON array
def _row_value(obj, scan: Scan) -> tuple:
    """(the row's text or token ids, None) or (None, what is wrong with it). The first object row
    decides the mode."""
    if not isinstance(obj, dict):
        return None, (
            f"a JSON {json_kind(obj)}, not an object: write one object per row, e.g. "
            f'{{"{scan.text_field}": "..."}}'
        )
    talk, first = conversational(obj), not scan.mode_decided
    if first:
        scan.mode_decided, scan.mode = True, detect_format(talk, scan.text_field, scan.fmt)
    rec = row_format(scan.mode)
    if first and rec.first_row_optional:
        scan.mask_keys = tuple(k for k in rec.optional if k in obj)
    obj = talk if rec.column == "json" else obj  # a session: a conversational pair is one
    if not rec.text_field:
        why = row_problem(obj, scan.mode) or (
            rec.first_row_optional and keys_problem(obj, scan.mask_keys)
        )
        if why:
            return None, other_format(obj, scan.text_field, scan.mode) or why
        row = {
            k: (json.dumps(obj.get(k), ensure_ascii=False) if rec.column == "json" else obj.get(k))
            for k in scan.columns()
        }
        return utf8_row(row)
    if scan.text_field not in obj:
        return None, other_format(obj, scan.text_field, rec.name) or (
            f"no text_field={scan.text_field!r} key (its keys: {sorted(obj)[:8]}): set text_field "
            "to the key holding the text"
        )
    value = obj[scan.text_field]
    if not isinstance(value, str):
        return None, (
            f"{scan.text_field!r} is a JSON {json_kind(value)} ({json.dumps(value)[:40]}), not a "
            "string: write the text as a JSON string"
        )
    return utf8_row({scan.text_field: value})


def json_rows(f: str, scan: Scan, lines: bool = False) -> Iterator[tuple]:
    """(bytes read so far, row dict | Fault) of every row of a JSON lines file, or of a .json file
    holding one array (`_json_array`); blank lines are no rows. `lines`: (line or element number,
    row | Fault) in place of the row."""
    with open(f, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if f.lower().endswith(".json") and head.startswith(b"["):
        for k, (done, got) in enumerate(_json_array(f, scan), 1):
            yield done, ((k, got) if lines else got)
        return
    offset = 0
    hint = (
        " (a .json file holds JSON lines or one array of objects)"
        if f.lower().endswith(".json")
        else ""
    )
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
                yield (
                    offset,
                    Fault(
                        f,
                        line_no,
                        start + e.start,
                        f"byte {raw[e.start]:#04x} is not UTF-8: convert "
                        f"it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
                    ),
                )
                continue
            text = text.rstrip("\r\n")
            try:
                obj = loads_unique(text)
            except (DuplicateKey, TooDeep) as e:
                yield offset, Fault(f, line_no, start, str(e))
                continue
            except json.JSONDecodeError as e:
                at = start + len(text[: e.pos].encode("utf-8"))
                cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
                yield (
                    offset,
                    Fault(
                        f,
                        line_no,
                        at,
                        f"not JSON ({e.msg}{'' if e.msg.endswith(' at') else ' at'} "
                        f"character {e.pos + 1}{'; cut short?' if cut else ''}){hint}",
                    ),
                )
                continue
            value, why = _row_value(obj, scan)
            got = Fault(f, line_no, start, why) if why else value
            yield offset, ((line_no, got) if lines else got)


def _json_array(f: str, scan: Scan) -> Iterator[tuple]:
    """The elements of a file holding one JSON array (read whole, as `datasets` does): each element
    a row."""
    raw = Path(f).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"data file {f!r} line {raw.count(NL, 0, e.start) + 1} (byte {e.start}): byte "
            f"{raw[e.start]:#04x} is not UTF-8; convert it to UTF-8 (e.g. `iconv -f latin1 -t "
            "utf-8`)"
        ) from None
    ws = " \t\r\n"
    i, byte_at, line_at, counted = (
        text.index("[") + 1,
        3 if raw.startswith(b"\xef\xbb\xbf") else 0,
        1,
        0,
    )

    def where(
        pos: int,
    ) -> tuple:  # (line, byte offset) of char `pos`; positions only grow: counted forward once
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
            raise DataError(
                f"data file {f!r} line {where(i)[0] + (getattr(e, 'first', 1) or 1) - 1}: element "
                f"{element + 1} of the array: {e}"
            ) from None
        except json.JSONDecodeError as e:
            line, at = where(e.pos)
            raise DataError(
                f"data file {f!r} line {line} (byte {at}): not JSON ({e.msg}), in element "
                f"{element + 1} of the array; fix the file (a .json file holds JSON lines or one "
                "array of objects)"
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
        raise DataError(
            f"data file {f!r} line {line} (byte {at}): expected ',' or ']' after element {element} "
            "of the array; fix the file (a .json file holds JSON lines or one array of objects)"
        )


def json_documents(
    files: list, text_field: str, mode: str, mask_keys: tuple = ()
) -> Iterator[dict]:
    """The good rows of JSON files as `datasets` rows (`Scan.columns`: {text_field: str},
    {"input_ids": [int], ...}, messages and tools as JSON strings, ...), in file order: the
    generator of `Dataset.from_generator` (bad rows were counted by the scan and are left out
    here)."""
    scan = Scan("json", files, text_field, mode=mode, mode_decided=True, mask_keys=tuple(mask_keys))
    for f in files:
        for _, got in json_rows(f, scan):
            if not isinstance(got, Fault):
                yield got
