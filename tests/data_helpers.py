"""Small local data for the data / bad-input / resume tests: a word-level tokenizer and a corpus (no network)."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def make_tokenizer(path: Path, n_words: int = 60) -> Path:
    """A WordLevel tokenizer over `n_words` words + 4 specials, saved as a PreTrainedTokenizerFast directory
    (ids: [PAD]=0 [BOS]=1 [EOS]=2 [UNK]=3, then w0, w1, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIALS + words(n_words))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                   unk_token="[UNK]")
    fast.save_pretrained(str(path))
    return path


def documents(n_docs: int, min_words: int = 5, max_words: int = 40, n_words: int = 60, seed: int = 0) -> list[str]:
    import random
    rng = random.Random(seed)
    vocab = words(n_words)
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(min_words, max_words))) for _ in range(n_docs)]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d}) + "\n" for d in docs))
    return path


def write_txt_dir(path: Path, docs: list[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (path / f"doc{i:04d}.txt").write_text(d + "\n")
    return path


def write_parquet(path: Path, docs: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": docs}), str(path))
    return path


def token_ids(docs: list[str]) -> list[list[int]]:
    """What make_tokenizer gives for each document (word wK -> id K + 4), without EOS."""
    return [[int(w[1:]) + len(SPECIALS) for w in d.split()] for d in docs]
