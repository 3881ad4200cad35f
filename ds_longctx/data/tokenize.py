"""Rows -> token ids and labels through the datasets cache: the tokenizer, EOS, the cut, and a
fingerprint of all.

    tok = load_tokenizer(cfg, vocab_size)               # checked against the model's vocabulary
    tokenized = tokenize(
        docs.ds, tok, cfg, eos_id(tok, hf_config), docs.format, docs.mask_keys, vocab_size
    )
    skipped = check_tokenized(tokenized, cfg, docs.skipped_rows)   # data/tokenize_check.py

Every document from here on is `input_ids` + `labels` (IGNORE_INDEX where it does not train): text
trains every token, chat rows what data/chat.py says, prompt/completion rows their completion, token
rows their own labels or mask.
"""

from __future__ import annotations

# transformers and datasets are imported where a tokenizer is loaded and text tokenized (seconds at
# import).
import hashlib
import json
from pathlib import Path
from typing import Optional

from ds_longctx.data import chat, formats
from ds_longctx.data.budget import (
    RowOverBudget,
    over_budget_reason,
    row_budget,
    row_size_problem,
    token_bytes,
)
from ds_longctx.data.sources import TOKENIZER_FILES, DataError
from ds_longctx.parallel.units import IGNORE_INDEX


def tokenizer_path(cfg) -> Optional[str]:
    """The tokenizer directory of the run (`tokenizer_of`)."""
    return tokenizer_of(cfg.data.tokenizer, cfg.model.name)


def tokenizer_of(tokenizer: Optional[str], model: str) -> Optional[str]:
    """The tokenizer directory of a run of `model`: `tokenizer` when given, else the model directory
    when it holds one, else None. A model directory is one with a config.json, as
    config.model.resolve_model reads a name."""
    if tokenizer:
        return tokenizer
    p = Path(model)
    if (p / "config.json").is_file() and any((p / f).is_file() for f in TOKENIZER_FILES):
        return str(p)
    return None


def open_tokenizer(path, named=None):
    """The tokenizer saved in directory `path` as every command loads one: local files only, and no
    Python of the directory's own (trust_remote_code=False: transformers neither runs it nor asks on
    a terminal). DataError naming `named` (default: `path`) and the fix where it cannot be
    loaded."""
    from transformers import AutoTokenizer

    named = str(path) if named is None else named
    try:
        return AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as e:
        if "trust_remote_code" in str(e):
            raise DataError(
                f"tokenizer={named!r} asks to run Python of its own (auto_map in its "
                "tokenizer_config.json), which ds_longctx never runs; pass a tokenizer whose class "
                f"transformers ships (`tokenizer.save_pretrained` of a loaded one)"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(
            f"tokenizer={named!r} could not be loaded ({type(e).__name__}: {first}); pass a "
            f"directory saved by `tokenizer.save_pretrained`"
        ) from None


def load_tokenizer(cfg, vocab_size: int):
    """The run's tokenizer, checked against the model's vocabulary; None when there is none to
    load."""
    path = tokenizer_path(cfg)
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(
            f"tokenizer={path!r} is not a directory; pass a local tokenizer directory (one with "
            f"tokenizer.json / tokenizer_config.json, e.g. the model's own checkpoint directory)"
        )
    tok = open_tokenizer(p, path)
    ids = max(
        len(tok), max(tok.get_vocab().values(), default=-1) + 1
    )  # added tokens may sit past len - 1
    if ids > vocab_size:
        raise DataError(
            f"tokenizer={path!r} has {ids} tokens but the model {cfg.model.name!r} has vocab_size="
            f"{vocab_size}: ids >= {vocab_size} would index past the embedding; use the model's "
            "own tokenizer, or a model whose vocabulary covers this one (a config.json of its "
            "geometry with "
            f'"vocab_size": {-(-ids // 128) * 128} as --model)'
        )
    return tok


def eos_id(tok, hf_config) -> Optional[int]:
    if tok is not None and tok.eos_token_id is not None:
        return int(tok.eos_token_id)
    e = getattr(hf_config, "eos_token_id", None)
    return int(e[0] if isinstance(e, (list, tuple)) else e) if e is not None else None


def _files_digest(path: Optional[str]) -> str:
    """Hash of a tokenizer directory's files (what the cache fingerprint depends on), its chat
    template (chat_template.jinja, where transformers saves it) included."""
    h = hashlib.sha256()
    if path:
        for f in sorted(Path(path).glob("*")):
            if f.is_file() and f.suffix in (".json", ".model", ".txt", ".tiktoken", ".jinja"):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cut_rule(cfg) -> Optional[str]:
    """How a document longer than seq_len is cut: data.truncate, else the layout's own rule (pack:
    split into
    windows, document: head); None for concat (its stream is cut at row borders)."""
    layout, rule = cfg.data.layout, cfg.data.truncate
    if layout == "concat":
        if rule is not None:
            raise DataError(
                f"data.truncate={rule!r} with data_layout='concat': concat joins documents and "
                "cuts the "
                f"stream at row borders; use data_layout: pack or document, or leave truncate unset"
            )
        return None
    if layout == "document" and rule == "split":
        raise DataError(
            "data.truncate='split' with data_layout='document' (one document per row); use head or "
            "refuse, or data_layout: pack"
        )
    return rule or ("split" if layout == "pack" else "head")


def default_train_on(cfg, fmt: str) -> str:
    """data.train_on, else the format's default (its record's `trains`); refused where it is none of
    the record's `train_on`."""
    rec = formats.row_format(fmt)
    want = cfg.data.train_on or rec.trains
    if cfg.data.train_on is not None and want not in rec.train_on:
        note = f" ({fmt} rows train where their labels say)" if rec.trains == "labels" else ""
        raise DataError(
            f"data.train_on={want!r} does not apply to {fmt} rows of data={cfg.data.source!r}; use "
            f"one of {list(rec.train_on)}{note}"
        )
    return want


def _row_maker(fmt: str, tok, cfg, mask_keys: tuple, vocab_size):
    """fn(a batch of rows) -> [(input_ids, labels), or the ChatError of a row that gives none] of
    format `fmt`, by its record's `tokens`: text a batch at once (the fast tokenizer's threads), a
    session after its JSON."""
    rec = formats.row_format(fmt)
    train_on, row_tokens = default_train_on(cfg, fmt), rec.tokens_fn()
    if not rec.masked:
        return lambda batch: row_tokens(tok, batch[cfg.data.text_field])

    def one(r):  # a session: JSON text (data/scan.py), or TRL's conversational pair
        talk = formats.conversational(r) if rec.nested else r
        if talk is not r or rec.column == "json":
            return session(talk)
        return row_tokens(tok, r, train_on, mask_keys, vocab_size)

    rule, longest = cut_rule(cfg), token_bytes(tok) if tok is not None else 1

    def session(r):
        if isinstance(r["messages"], str):  # JSON lines, as written (data/scan.py)
            size = len(r["messages"].encode()) + len((r.get("tools") or "").encode())
            if why := row_size_problem(size, cfg.train.seq_len, rule, longest):
                raise formats.ChatError(why)  # before its JSON is read or rendered
            msgs, tools = json.loads(r["messages"]), json.loads(r.get("tools") or "null")
        else:
            msgs, tools = (
                formats.without_nulls(r["messages"]),
                formats.without_nulls(r.get("tools")),
            )
        why = formats.row_problem(
            {"messages": msgs, "tools": tools}, "messages"
        )  # hub / Parquet rows: unscanned
        if why:
            raise formats.ChatError(why)
        return chat.session_tokens(
            tok, msgs, tools, train_on if rec.column == "json" else "assistant"
        )

    def many(batch):
        got = []
        for i in range(len(next(iter(batch.values())))):
            try:
                with row_budget():
                    got.append(one({k: v[i] for k, v in batch.items()}))
            except formats.ChatError as e:
                got.append(e)
            except RowOverBudget:
                got.append(formats.ChatError(over_budget_reason()))
        return got

    return many


def tokenize(
    docs,
    tok,
    cfg,
    eos: Optional[int],
    fmt: str = "text",
    mask_keys: tuple = (),
    vocab_size: Optional[int] = None,
):
    """Documents -> `input_ids` and `labels` (int32 lists; labels IGNORE_INDEX where nothing
    trains), `trained` (the targets that train), `cut` (tokens left out by truncate head) and `bad`
    (why a row gives no document, "" when it does), through the datasets cache.

    EOS appended (`add_eos`) trains when the document's last token does. A document longer than
    seq_len is cut here under `cut_rule` head (or marked bad under refuse); one left with no trained
    target is marked bad."""
    import datasets

    _check_can_tokenize(cfg, eos, fmt, tok)
    rule, L = cut_rule(cfg), cfg.train.seq_len
    many = _row_maker(fmt, tok, cfg, tuple(mask_keys), vocab_size)
    fingerprint = _cache_fingerprint(docs, cfg, eos, fmt, mask_keys, vocab_size, rule, L)
    fn = _documents_fn(
        many, eos if cfg.data.add_eos else None, rule, L, formats.row_format(fmt).masked
    )
    try:
        return docs.map(
            fn,
            batched=True,
            batch_size=64,
            remove_columns=docs.column_names,
            features=_features(datasets),
            new_fingerprint=fingerprint,
            num_proc=cfg.data.tokenize_num_proc if cfg.data.tokenize_num_proc > 1 else None,
            desc="tokenize" if formats.row_format(fmt).needs_tokenizer else "read token ids",
        )
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, DataError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(
            f"data={cfg.data.source!r} ({fmt} rows) could not be turned into token ids "
            f"({type(e).__name__}: {first}); input_ids must be lists of ints, "
            f"{cfg.data.text_field!r} strings"
        ) from None


def _check_can_tokenize(cfg, eos: Optional[int], fmt: str, tok) -> None:
    """DataError where add_eos has no EOS, or rows that are not token ids have no tokenizer."""
    if cfg.data.add_eos and eos is None:
        raise DataError(
            "add_eos=true but neither the tokenizer nor the model config has an EOS token; set "
            "add_eos: false or use a tokenizer with an eos_token"
        )
    if formats.row_format(fmt).needs_tokenizer and tok is None:
        raise DataError(
            f"data={cfg.data.source!r} is {fmt} and needs a tokenizer; set tokenizer to a local "
            f"tokenizer directory (the model's own), or provide an input_ids column"
        )


def _cache_fingerprint(
    docs, cfg, eos: Optional[int], fmt: str, mask_keys, vocab_size, rule: Optional[str], L: int
) -> str:
    """The datasets cache fingerprint of `tokenize`: the rows and everything that changes their
    tokens."""
    key = json.dumps(
        [
            docs._fingerprint,
            fmt,
            list(mask_keys),
            default_train_on(cfg, fmt),
            vocab_size,
            _files_digest(tokenizer_path(cfg)) if formats.row_format(fmt).needs_tokenizer else "",
            cfg.data.text_field,
            cfg.data.add_eos and eos,
            rule,
            L if rule in ("head", "refuse") else 0,
            "v6",
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _features(datasets):
    """The columns `tokenize` writes."""
    list_type = getattr(datasets, "List", None) or datasets.Sequence  # datasets >= 4 | 3.x
    return datasets.Features(
        {
            "input_ids": list_type(datasets.Value("int32")),
            "labels": list_type(datasets.Value("int32")),
            "trained": datasets.Value("int64"),
            "cut": datasets.Value("int64"),
            "bad": datasets.Value("string"),
        }
    )


def _documents_fn(many, eos: Optional[int], rule: Optional[str], L: int, masked: bool):
    """fn(a batch of rows) -> the columns of `_features`: each row made by `many`, then `_finish`ed
    (`masked`: its labels say what trains; else every token does)."""

    def fn(batch):
        out = {"input_ids": [], "labels": [], "trained": [], "cut": [], "bad": []}
        for got in many(batch):
            if isinstance(got, formats.ChatError):
                ids, labels, why, cut = [], [], str(got), 0
            else:
                ids, labels, why, cut = _finish(*got, eos, rule, L, masked)
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            out["trained"].append(
                sum(v != IGNORE_INDEX for v in labels[1:]) if masked else max(len(ids) - 1, 0)
            )
            out["cut"].append(cut)
            out["bad"].append(why)
        return out

    return fn


def _finish(
    ids: list, labels: list, eos: Optional[int], rule: Optional[str], L: int, masked: bool
) -> tuple:
    """(ids, labels, why bad or "", tokens cut) of one document: EOS appended unless it ends with
    one (trained when the last token is), cut by `rule`; a `masked` one (not text) must keep a
    trained target (an empty one too: an empty text is a blank document)."""
    if not ids:
        return (
            [],
            [],
            "the row holds no tokens: nothing to learn from; drop it" if masked else "",
            0,
        )
    if (
        eos is not None and ids[-1] != eos
    ):  # a document that ends with EOS (Llama's turns, TRL's rows) keeps one
        ids, labels = (
            list(ids) + [eos],
            list(labels) + [eos if labels[-1] != IGNORE_INDEX else IGNORE_INDEX],
        )
    if len(ids) > L and rule == "refuse":
        return (
            [],
            [],
            (
                f"a document of {len(ids)} tokens is longer than seq_len={L} and data.truncate is "
                f"refuse; shorten it, raise seq_len, or set data.truncate: head or split"
            ),
            0,
        )
    cut = max(len(ids) - L, 0) if rule == "head" else 0
    if cut:
        ids, labels = ids[:L], labels[:L]
    if masked and all(v == IGNORE_INDEX for v in labels[1:]):
        after = f" after cutting to seq_len={L} ({rule})" if cut else ""
        return (
            [],
            [],
            (
                f"no token trains{after}: the row has nothing to learn from; check its messages "
                f"(an assistant turn, train flags), data.train_on, or raise seq_len"
            ),
            0,
        )
    return ids, labels, "", cut
