"""The all-or-nothing write every `ds-longctx data prepare` shares: --out checked first, everything
written under `<out>.partial` and renamed to `<out>` at the end.

    out = check_prepare_dir(args.out, "train.jsonl, tokenizer/ and the data card")
    card = write_corpus(out, {"train": bytes}, save, ids, make_card)

A `<out>.partial` that is not prepare's is refused, never removed."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ds_longctx.data.scan import DataError
from ds_longctx.parallel.disk import (
    NotOurs,
    check_partial,
    clear_partial,
    describe_os_error,
    existing_ancestor,
    finish_partial,
    free_bytes,
    is_disk_error,
    make_partial,
    partial_maker,
    size_text,
    unwritable,
)

PARTIAL_FIX = "move it away (or choose another --out)"
TOKENIZER_BYTES_PER_ID = (
    100  # tokenizer.json and its companions, per vocabulary id (a 32,000-id BPE: ~2.5 MB)
)


def check_prepare_dir(out: str, writes: str) -> Path:
    """The --out directory, refused (DataError) before anything is read: not new or empty, or an
    `<out>.partial` that an earlier prepare did not leave (parallel/disk.check_partial). `writes`:
    what prepare puts there."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(
            f"--out {str(out)!r} exists and is not an empty directory; choose a new one (prepare "
            f"writes {writes} there)"
        )
    if why := unwritable(out):
        raise DataError(f"--out {str(out)!r} cannot be written: {why}; choose a writable --out")
    try:
        check_partial(out.with_name(out.name + ".partial"), PARTIAL_FIX)
    except NotOurs as e:
        raise DataError(f"--out {str(out)!r}: {e}") from None
    return out


def check_vocab_size(vocab_size: int, specials: int) -> None:
    if vocab_size < 256 + specials + 1:
        raise DataError(
            f"--vocab_size {vocab_size} must be > {256 + specials} (the bytes and the {specials} "
            f"special tokens); try --vocab_size 512 or more"
        )


def write_corpus(out: Path, lines: dict, save, ids: int, make_card) -> dict:
    """The tokenizer (`save(path)` writes it, returns its size; `ids`: about its vocabulary),
    `<split>.jsonl` for each of `lines` (their bytes) and the card (`make_card(size)` -> (card,
    {file name: bytes})) into `<out>.partial` (made with its marker), renamed to `out` at the end;
    returns the card. A full disk or a permission is refused before the first byte where the free
    space is short, else named in one line (DataError) with nothing left behind."""
    partial = out.with_name(out.name + ".partial")
    needed = sum(len(b) for b in lines.values()) + TOKENIZER_BYTES_PER_ID * ids
    free = free_bytes(out)
    if free is not None and free < needed:
        raise DataError(
            f"--out {str(out)!r}: the corpus needs ~{size_text(needed)} and "
            f"{existing_ancestor(out)} has "
            f"{size_text(free)} free; choose an --out on a filesystem with more space"
        )
    if said := clear_partial(partial, PARTIAL_FIX):
        print(said, file=sys.stderr)
    try:
        make_partial(partial)
        vocab = save(partial / "tokenizer")
        for split, data in lines.items():
            (partial / f"{split}.jsonl").write_bytes(data)
        c, files = make_card(vocab)
        for name, data in files.items():
            (partial / name).write_bytes(data)
        finish_partial(partial, out)
    except BaseException as e:
        if (
            partial_maker(partial) is not None
        ):  # ours, made above (without the marker it was never made)
            shutil.rmtree(partial, ignore_errors=True)
        if not is_disk_error(e):
            raise
        raise DataError(
            f"--out {str(out)!r}: writing the corpus failed: "
            f"{describe_os_error(e, partial, needed)}; "
            f"nothing was left there; free space or choose another --out"
        ) from None
    return c
