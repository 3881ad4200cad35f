"""Training data: local files or a hub dataset -> token rows of exactly `seq_len` (the synthetic task: synthetic.py).

    data = build_data(cfg, hf_config, dp_size)          # TokenRows (files) or SyntheticRetrieval ("synthetic")
    batch = data.get(step, micro_batch, dp_rank, dp_size)   # Batch: input_ids [b, L], position_ids, labels

Dimension legend: b micro batch, L seq_len, N documents, T tokens in the whole dataset, R rows.

Sources (`cfg.data`): a .txt / .jsonl / .json / .parquet file, a directory of files of one format, or a
`datasets` hub name (needs a reachable hub). Files are sniffed before anything is converted (a binary file,
a line that is not JSON, a Parquet file without its magic are refused with the file's name). The text goes
through the tokenizer in `datasets.map` (progress bar, cached in `data_cache_dir` under a fingerprint of the
source, the tokenizer files and the options, so a second run and every other rank read the cache). Data that
already has an `input_ids` column is used as token ids directly (checked against the vocabulary).

Layouts (`cfg.data_layout`), all built lazily from the tokenized documents (one int per document kept in
memory; a row's tokens are sliced from the memory-mapped Arrow stream when the row is used):
- concat: documents with EOS appended, joined end to end into one stream of T tokens, cut into
  R = T // L rows of exactly L tokens (the tail shorter than L is dropped). PG-19 style: books joined into
  ~1M-token rows, a row may start mid-document.
- pack: documents placed whole, in order, into rows of L (next fit); a document longer than L is cut into
  pieces of L, each its own document. Position ids restart at 0 per document and the row's tail is padding
  with ignored labels; `sharding.shard_batch` turns the restarts into `cu_seqlens` so attention never
  crosses a document (needs a varlen kernel: refused by `check_packing` where there is none).
- document: one document per row, its first L tokens; every document must have at least L tokens.

Order: sample i of the run is row perm_e[i mod R] of epoch e = i // R, perm_e drawn from (seed, e) (or the
identity with shuffle off); step s, dp replica r reads samples (s * dp + r) * b ... + b - 1. The order
depends only on (seed, step): every SP rank of a replica reads the same row, replicas read different rows,
and a resumed run continues it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ds_longctx.parallel.sharding import IGNORE_INDEX

log = logging.getLogger("ds_longctx")

PAD, BOS, EOS, SEP = 0, 1, 2, 3
FORMATS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_SNIFF_BYTES = 1 << 16


class DataError(ValueError):
    """Bad data input: the message names the value and the fix."""


@dataclass
class Batch:
    input_ids: torch.Tensor                       # [b, L]
    position_ids: Optional[torch.Tensor] = None   # [b, L]; restarts at 0 per packed document
    labels: Optional[torch.Tensor] = None         # [b, L]; IGNORE_INDEX where nothing is predicted (padding)


# ----------------------------------------------------------------------------- sources
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
    builder, files = resolve_source(cfg.data)
    try:
        if builder == "hub":
            ds = datasets.load_dataset(cfg.data, split=cfg.data_split, cache_dir=cfg.data_cache_dir)
        else:
            sniff_files(builder, files, cfg.data)
            kwargs = {"sample_by": cfg.text_unit} if builder == "text" else {}
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cfg.data_cache_dir,
                                       **kwargs)
    except DataError:
        raise
    except Exception as e:  # the builders' own errors, one line, with the source named
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        if builder == "hub":
            raise DataError(f"data={cfg.data!r} is not a local path and could not be loaded from the hub "
                            f"(split {cfg.data_split!r}): {first}; pass a local .txt/.jsonl/.parquet file or "
                            f"directory, or check the name and the network") from None
        raise DataError(f"data={cfg.data!r} could not be read as {builder}: {type(e).__name__}: {first}; check "
                        f"the file's format matches its extension") from None
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"data={cfg.data!r} split {cfg.data_split!r} gave a {type(ds).__name__}; pass a split "
                        f"name (data_split) that exists")
    if ds.num_rows == 0:
        raise DataError(f"data={cfg.data!r} is empty (0 documents in split {cfg.data_split!r}); give it documents "
                        f"or point data at the right file")
    if "input_ids" not in ds.column_names and cfg.text_field not in ds.column_names:
        raise DataError(f"data={cfg.data!r} has no column text_field={cfg.text_field!r} (columns: "
                        f"{ds.column_names}); set text_field to the column holding the text, or provide input_ids")
    return ds


# ----------------------------------------------------------------------------- tokenizer
def tokenizer_path(cfg) -> Optional[str]:
    """The tokenizer directory of the run: `tokenizer`, else the model directory when it holds one."""
    if cfg.tokenizer:
        return cfg.tokenizer
    p = Path(cfg.model)
    if p.is_dir() and any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return str(p)
    return None


def load_tokenizer(cfg, vocab_size: int):
    """The run's tokenizer, checked against the model's vocabulary; None when there is none to load."""
    path = tokenizer_path(cfg)
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(f"tokenizer={path!r} is not a directory; pass a local tokenizer directory (one with "
                        f"tokenizer.json / tokenizer_config.json, e.g. the model's own checkpoint directory)")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"tokenizer={path!r} could not be loaded ({type(e).__name__}: {first}); pass a directory "
                        f"saved by `tokenizer.save_pretrained`") from None
    if len(tok) > vocab_size:
        raise DataError(f"tokenizer={path!r} has {len(tok)} tokens but the model {cfg.model!r} has vocab_size="
                        f"{vocab_size}: ids >= {vocab_size} would index past the embedding; use the model's own "
                        f"tokenizer (or a model whose vocabulary covers this one)")
    return tok


def eos_id(tok, hf_config) -> Optional[int]:
    if tok is not None and tok.eos_token_id is not None:
        return int(tok.eos_token_id)
    e = getattr(hf_config, "eos_token_id", None)
    return int(e[0] if isinstance(e, (list, tuple)) else e) if e is not None else None


def _files_digest(path: Optional[str]) -> str:
    """Hash of a tokenizer directory's files (what the cache fingerprint depends on)."""
    h = hashlib.sha256()
    if path:
        for f in sorted(Path(path).glob("*")):
            if f.is_file() and f.suffix in (".json", ".model", ".txt", ".tiktoken"):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def tokenize(docs, tok, cfg, eos: Optional[int]):
    """Documents -> `input_ids` (int32 lists, EOS appended when `add_eos`), through the datasets cache."""
    import datasets
    if cfg.add_eos and eos is None:
        raise DataError("add_eos=true but neither the tokenizer nor the model config has an EOS token; set "
                        "add_eos: false or use a tokenizer with an eos_token")
    append = [eos] if cfg.add_eos else []
    pretokenized = "input_ids" in docs.column_names
    if not pretokenized and tok is None:
        raise DataError(f"data={cfg.data!r} is text and needs a tokenizer; set tokenizer to a local tokenizer "
                        f"directory (the model's own), or provide an input_ids column")
    key = json.dumps([docs._fingerprint, pretokenized, _files_digest(tokenizer_path(cfg)) if not pretokenized
                      else "", cfg.text_field, append, "v1"])
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    list_type = getattr(datasets, "List", None) or datasets.Sequence  # datasets >= 4 | 3.x
    features = datasets.Features({"input_ids": list_type(datasets.Value("int32"))})

    if pretokenized:
        def fn(batch):
            return {"input_ids": [list(ids) + append if len(ids) else [] for ids in batch["input_ids"]]}
        source_cols = ["input_ids"]
    else:
        field = cfg.text_field

        def fn(batch):
            texts = [t if isinstance(t, str) else "" for t in batch[field]]
            ids = tok(texts, add_special_tokens=True, return_attention_mask=False, verbose=False)["input_ids"]
            return {"input_ids": [x + append if x else [] for x in ids]}
        source_cols = [field]
    try:
        return docs.map(fn, batched=True, batch_size=64, input_columns=None,
                        remove_columns=docs.column_names, features=features, new_fingerprint=fingerprint,
                        num_proc=cfg.tokenize_num_proc if cfg.tokenize_num_proc > 1 else None,
                        desc="tokenize" if not pretokenized else "read token ids")
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, DataError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"data={cfg.data!r} column {source_cols[0]!r} could not be turned into token ids "
                        f"({type(e).__name__}: {first}); input_ids must be lists of ints, {cfg.text_field!r} "
                        f"strings") from None


# ----------------------------------------------------------------------------- layouts
def _token_stream(tokenized):
    """(all tokens as one Arrow ChunkedArray [T] (memory-mapped), document lengths int64 [N])."""
    import pyarrow as pa
    import pyarrow.compute as pc
    col = tokenized.data.table.column("input_ids")
    if tokenized._indices is not None:  # a filtered/selected view: materialize in index order
        col = tokenized.with_format("arrow")[:]["input_ids"]
        col = col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col])
    stream = pa.chunked_array([c.flatten() for c in col.chunks], type=pa.int32())
    lengths = np.concatenate([pc.list_value_length(c).to_numpy(zero_copy_only=False) for c in col.chunks]
                             ) if col.num_chunks else np.zeros(0, np.int64)
    return stream, lengths.astype(np.int64)


def pack_rows(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Next-fit packing of documents (in order) into rows of `seq_len` tokens.

    Returns (row_ptr [R+1], seg_start [S], seg_len [S]): row r holds segments row_ptr[r]:row_ptr[r+1], each
    `seg_len` tokens from `seg_start` in the token stream. Documents longer than seq_len become several
    segments of at most seq_len (each its own document)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    seg_start, seg_len, row_ptr = [], [], [0]
    fill = 0
    for s0, n in zip(starts.tolist(), lengths.tolist()):
        while n > 0:
            piece = min(n, seq_len)
            if fill + piece > seq_len:
                row_ptr.append(len(seg_start))
                fill = 0
            seg_start.append(s0)
            seg_len.append(piece)
            fill += piece
            s0, n = s0 + piece, n - piece
    if fill:
        row_ptr.append(len(seg_start))
    return np.asarray(row_ptr, np.int64), np.asarray(seg_start, np.int64), np.asarray(seg_len, np.int64)


class TokenRows:
    """Rows of exactly `seq_len` tokens over a tokenized dataset, in the (seed, step) order of the module doc."""

    def __init__(self, tokenized, seq_len: int, layout: str, seed: int, shuffle: bool, pad_id: int,
                 source: str = "", vocab_size: Optional[int] = None):
        self.seq_len, self.layout, self.seed, self.shuffle, self.pad_id = seq_len, layout, seed, shuffle, pad_id
        self.source = source
        self.stream, lengths = _token_stream(tokenized)
        self.n_docs = int((lengths > 0).sum())
        self.n_tokens = int(lengths.sum())
        if self.n_tokens == 0:
            raise DataError(f"data={source!r} tokenized to 0 tokens ({len(lengths)} documents, all empty); give it "
                            f"documents with text")
        if vocab_size is not None:
            check_token_range(self.stream, vocab_size, source)
        L = seq_len
        if layout == "concat":
            self.n_rows = self.n_tokens // L
            if self.n_rows == 0:
                raise DataError(f"data={source!r} has {self.n_tokens} tokens, fewer than one row of seq_len={L}; add "
                                f"data or lower seq_len to at most {self.n_tokens}")
            dropped = self.n_tokens - self.n_rows * L
            log.info("data: %d documents, %d tokens -> %d rows of %d (concat; last %d tokens unused)",
                     self.n_docs, self.n_tokens, self.n_rows, L, dropped)
        elif layout == "document":
            nonempty = lengths[lengths > 0]
            short = int((nonempty < L).sum())
            if short:
                raise DataError(f"{short} of {len(nonempty)} documents in data={source!r} are shorter than seq_len={L} "
                                f"(shortest {int(nonempty.min())} tokens) and data_layout='document' takes one "
                                f"document per row; use data_layout: concat (join documents) or pack, or seq_len <= "
                                f"{int(nonempty.min())}")
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            self.doc_start = starts[lengths > 0]
            self.n_rows = len(self.doc_start)
            log.info("data: %d documents -> %d rows of their first %d tokens (document)", self.n_docs, self.n_rows, L)
        elif layout == "pack":
            self.row_ptr, self.seg_start, self.seg_len = pack_rows(lengths, L)
            self.n_rows = len(self.row_ptr) - 1
            used = int(self.seg_len.sum())
            log.info("data: %d documents, %d tokens -> %d packed rows of %d (%.1f%% padding)", self.n_docs,
                     self.n_tokens, self.n_rows, L, 100 * (1 - used / (self.n_rows * L)))
        else:
            raise DataError(f"data_layout={layout!r} is unknown; use concat, pack or document")
        self._perm_epoch, self._perm = -1, None

    # ---------------------------------------------------------------- order
    def row_of_sample(self, i: int) -> int:
        epoch, j = divmod(i, self.n_rows)
        if not self.shuffle:
            return j
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.n_rows, generator=g), epoch
        return int(self._perm[j])

    def signature(self) -> dict:
        """What a resumed run must find unchanged for the order to continue (saved in each checkpoint)."""
        return {"kind": "files", "layout": self.layout, "seq_len": self.seq_len, "n_rows": self.n_rows,
                "n_tokens": self.n_tokens, "seed": self.seed, "shuffle": self.shuffle}

    # ---------------------------------------------------------------- rows
    def _slice(self, start: int, n: int) -> np.ndarray:
        return self.stream.slice(start, n).to_numpy().astype(np.int64)

    def row(self, r: int) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(input_ids [L], position_ids [L] or None, labels [L] or None) of row r."""
        L = self.seq_len
        if self.layout == "concat":
            return torch.from_numpy(self._slice(r * L, L)), None, None
        if self.layout == "document":
            return torch.from_numpy(self._slice(int(self.doc_start[r]), L)), None, None
        a, b = int(self.row_ptr[r]), int(self.row_ptr[r + 1])
        parts = [self._slice(int(s), int(n)) for s, n in zip(self.seg_start[a:b], self.seg_len[a:b])]
        ids = np.full(L, self.pad_id, np.int64)
        pos = np.zeros(L, np.int64)
        labels = np.full(L, IGNORE_INDEX, np.int64)
        at = 0
        for p in parts:  # each document restarts its positions; labels are the tokens themselves
            ids[at:at + len(p)], pos[at:at + len(p)], labels[at:at + len(p)] = p, np.arange(len(p)), p
            at += len(p)
        # the padding tail (if any) is one more "document" at position 0.. with every label ignored
        pos[at:] = np.arange(L - at)
        if at == L and b - a == 1:
            return torch.from_numpy(ids), None, None  # one document filling the row: plain causal
        return torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(labels)

    def get(self, step: int, micro_batch: int, dp_rank: int, dp_size: int) -> Batch:
        """`Batch` of `[micro_batch, seq_len]` for one data-parallel replica at one step."""
        first = (step * dp_size + dp_rank) * micro_batch
        rows = [self.row(self.row_of_sample(first + i)) for i in range(micro_batch)]
        ids = torch.stack([r[0] for r in rows])
        if all(r[1] is None for r in rows):
            return Batch(ids)
        L = self.seq_len
        pos = torch.stack([r[1] if r[1] is not None else torch.arange(L) for r in rows])
        labels = torch.stack([r[2] if r[2] is not None else r[0] for r in rows])
        return Batch(ids, pos, labels)


# ----------------------------------------------------------------------------- checks and entry point
def check_token_range(stream, vocab_size: int, source: str) -> None:
    """Refuse token ids outside [0, vocab_size) (pre-tokenized data, or a tokenizer with added tokens)."""
    import pyarrow.compute as pc
    mm = pc.min_max(stream).as_py()
    lo, hi = mm["min"], mm["max"]
    if lo is not None and lo < 0:
        raise DataError(f"data={source!r} holds token id {lo} < 0; token ids must be in [0, {vocab_size}): "
                        f"re-tokenize with the model's tokenizer")
    if hi is not None and hi >= vocab_size:
        raise DataError(f"data={source!r} holds token id {hi} >= the model's vocab_size={vocab_size}; re-tokenize "
                        f"with the model's own tokenizer (or use a model whose vocabulary covers these ids)")


def check_packing(cfg, on_cuda: Optional[bool] = None) -> None:
    """data_layout='pack' needs an attention kernel that keeps documents apart at this seq_len."""
    if cfg.data_layout != "pack":
        return
    from ds_longctx.parallel import attention
    on_cuda = torch.cuda.is_available() if on_cuda is None else on_cuda
    choice = attention.resolve_backend(cfg.attn_backend)
    if choice.backend == "flash_attn":
        return
    if on_cuda:
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
            return
        except ImportError:
            raise DataError(f"data_layout='pack' on CUDA with attn_backend={cfg.attn_backend!r} needs "
                            f"torch.nn.attention.varlen (torch >= 2.9, this is {torch.__version__}) or flash-attn; "
                            f"upgrade torch, install flash-attn, or use data_layout: concat") from None
    if cfg.seq_len > attention.MAX_MASKED_TOKENS:
        raise DataError(f"data_layout='pack' at seq_len={cfg.seq_len} needs a varlen attention kernel (CUDA); the "
                        f"CPU fallback masks a full seq_len^2 matrix and stops at {attention.MAX_MASKED_TOKENS} "
                        f"tokens; use seq_len <= {attention.MAX_MASKED_TOKENS}, data_layout: concat, or a GPU")


def check_data_source(cfg, vocab_size: int) -> None:
    """Cheap checks before any process group exists: the source resolves, files sniff right, the tokenizer fits."""
    if cfg.data == "synthetic":
        return
    builder, files = resolve_source(cfg.data)
    if builder != "hub":
        sniff_files(builder, files, cfg.data)
    load_tokenizer(cfg, vocab_size)
    check_packing(cfg)


def build_data(cfg, hf_config, dp_size: int):
    """The run's data: `SyntheticRetrieval` for data='synthetic', else `TokenRows` (validated; see module doc)."""
    vocab = hf_config.get_text_config().vocab_size
    if cfg.data == "synthetic":
        from ds_longctx.data.synthetic import SyntheticRetrieval
        return SyntheticRetrieval(cfg.seq_len, vocab, cfg.seed)
    check_packing(cfg)
    tok = load_tokenizer(cfg, vocab)
    docs = load_documents(cfg)
    tokenized = tokenize(docs, tok, cfg, eos_id(tok, hf_config))
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else eos_id(tok, hf_config) or 0
    rows = TokenRows(tokenized, cfg.seq_len, cfg.data_layout, cfg.seed, cfg.shuffle, int(pad), source=cfg.data,
                     vocab_size=vocab)
    need = dp_size * cfg.micro_batch
    if rows.n_rows < need:
        raise DataError(f"data={cfg.data!r} gives {rows.n_rows} rows of seq_len={cfg.seq_len} ({cfg.data_layout}) "
                        f"but one step needs {need} different rows (dp={dp_size} x micro_batch={cfg.micro_batch}); "
                        f"add data, lower seq_len, or lower micro_batch")
    return rows


def __getattr__(name: str):
    """`from ds_longctx.data import SyntheticRetrieval` keeps working; the task lives in synthetic.py."""
    if name == "SyntheticRetrieval":
        from ds_longctx.data.synthetic import SyntheticRetrieval
        return SyntheticRetrieval
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
