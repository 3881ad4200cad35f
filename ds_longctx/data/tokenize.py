"""Text -> token ids through the datasets cache: the tokenizer, EOS, and a fingerprint of both.

    tok = load_tokenizer(cfg, vocab_size)               # checked against the model's vocabulary
    tokenized = tokenize(docs, tok, cfg, eos_id(tok, hf_config))   # `input_ids` per document, cached
"""

from __future__ import annotations

# transformers and datasets are imported where a tokenizer is loaded and text tokenized (seconds at import).
import hashlib
import json
from pathlib import Path
from typing import Optional

from ds_longctx.data.sources import DataError


def tokenizer_path(cfg) -> Optional[str]:
    """The tokenizer directory of the run (`tokenizer_of`)."""
    return tokenizer_of(cfg.data.tokenizer, cfg.model.name)


def tokenizer_of(tokenizer: Optional[str], model: str) -> Optional[str]:
    """The tokenizer directory of a run of `model`: `tokenizer` when given, else the model directory when it holds
    one (a local HF checkpoint), else None."""
    if tokenizer:
        return tokenizer
    p = Path(model)
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
    ids = max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)  # added tokens may sit past len - 1
    if ids > vocab_size:
        raise DataError(f"tokenizer={path!r} has {ids} tokens but the model {cfg.model.name!r} has vocab_size="
                        f"{vocab_size}: ids >= {vocab_size} would index past the embedding; use the model's own "
                        f"tokenizer, or a model whose vocabulary covers this one (a config.json of its geometry with "
                        f"\"vocab_size\": {-(-ids // 128) * 128} as --model)")
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
    if cfg.data.add_eos and eos is None:
        raise DataError("add_eos=true but neither the tokenizer nor the model config has an EOS token; set "
                        "add_eos: false or use a tokenizer with an eos_token")
    append = [eos] if cfg.data.add_eos else []
    pretokenized = "input_ids" in docs.column_names
    if not pretokenized and tok is None:
        raise DataError(f"data={cfg.data.source!r} is text and needs a tokenizer; set tokenizer to a local tokenizer "
                        f"directory (the model's own), or provide an input_ids column")
    key = json.dumps([docs._fingerprint, pretokenized, _files_digest(tokenizer_path(cfg)) if not pretokenized
                      else "", cfg.data.text_field, append, "v1"])
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    list_type = getattr(datasets, "List", None) or datasets.Sequence  # datasets >= 4 | 3.x
    features = datasets.Features({"input_ids": list_type(datasets.Value("int32"))})

    if pretokenized:
        def fn(batch):
            return {"input_ids": [list(ids) + append if len(ids) else [] for ids in batch["input_ids"]]}
        source_cols = ["input_ids"]
    else:
        field = cfg.data.text_field

        def fn(batch):  # every value is a string: the scan (or the null check of columnar data) saw to it
            ids = tok(batch[field], add_special_tokens=True, return_attention_mask=False, verbose=False)["input_ids"]
            return {"input_ids": [x + append if x else [] for x in ids]}
        source_cols = [field]
    try:
        return docs.map(fn, batched=True, batch_size=64, input_columns=None,
                        remove_columns=docs.column_names, features=features, new_fingerprint=fingerprint,
                        num_proc=cfg.data.tokenize_num_proc if cfg.data.tokenize_num_proc > 1 else None,
                        desc="tokenize" if not pretokenized else "read token ids")
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, DataError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"data={cfg.data.source!r} column {source_cols[0]!r} could not be turned into token ids "
                        f"({type(e).__name__}: {first}); input_ids must be lists of ints, {cfg.data.text_field!r} "
                        f"strings") from None


# ----------------------------------------------------------------------------- layouts
