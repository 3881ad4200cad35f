"""The Python standard library as a training corpus, offline: its documents, a BPE tokenizer trained
on them, a card.

    ds-longctx data prepare --stdlib --out DIR [--vocab_size 32000] [--eval_every 10]
                                               [--eval_min_chars 131072] [--only json,email,...]

DIR gets train.jsonl and eval.jsonl (one {"name", "text"} object per document, in the order below),
tokenizer/ (a PreTrainedTokenizerFast directory) and the data card (data_card.md, data_card.json),
written all or nothing (corpus_write.py).

Documents: the `*.py` files of this interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`; site-packages, dist-packages and __pycache__ left out). One
document per top-level module (`os.py` -> `os`) or package tree (`asyncio/`, every .py file under it
-> `asyncio`); the `test` package, CPython's regression tests (hundreds of independent modules),
gives one document per module or subpackage under it (`test.test_os`). A document is its files in
sorted relative-path order, each opened by a line `# file: <path under the stdlib>`; documents are
listed in sorted name order (`ORDER`). Files are decoded as Python reads them (`tokenize.open`:
their PEP 263 coding); a file that does not decode is left out and named in the card.

Held out (eval.jsonl): the documents of at least `eval_min_chars` characters, ranked by length
(longest first, ties by name), every `eval_every`-th from the second: long documents of every size
class, none of them seen in training, so that a row of eval data is one document's span (the
long-range eval).

Tokenizer: byte-level BPE (HF `tokenizers`: the GPT-2 pre-tokenizer, no normalizer) trained on
train.jsonl alone, `vocab_size` ids in all (the 256 bytes and the specials included): <|endoftext|>
0 (EOS, appended to each document in training), <|pad|> 1, <|bos|> 2; nothing is added on encoding.
A model trains on it when its vocab_size is at least the tokenizer's (data/tokenize.py refuses
otherwise).
"""

from __future__ import annotations

# tokenizers and transformers are imported where the tokenizer is trained and saved, after the
# documents are read.
import json
import platform
import sys
import sysconfig
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ds_longctx.corpora.corpus_write import check_prepare_dir, check_vocab_size, write_corpus
from ds_longctx.data.scan import DataError

SPECIALS = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "bos_token": "<|bos|>"}
SPLIT_PACKAGES = (
    "test",
)  # packages of independent modules: one document per module or subpackage under them
LEFT_OUT_DIRS = {"site-packages", "dist-packages", "__pycache__"}
ORDER = (
    "documents in sorted name order; a document's files in sorted relative-path order, each opened "
    "by a line '# file: <path under the stdlib>'"
)
HIST_EDGES = [0] + [
    2**k for k in range(8, 23)
]  # tokens per document: [0, 256), [256, 512), ... [2^21, 2^22)


@dataclass
class Document:
    name: str
    files: list  # paths relative to the stdlib
    text: str
    tokens: int = 0  # BPE tokens, without the EOS training appends
    split: str = "train"


# ----------------------------------------------------------------------------- documents
def document_of(rel: Path) -> str:
    """The document a stdlib file belongs to: its top-level module or package, one level down in
    SPLIT_PACKAGES."""
    parts = rel.with_suffix("").parts if len(rel.parts) == 1 else rel.parts
    if parts[0] in SPLIT_PACKAGES and len(rel.parts) > 1:
        return f"{parts[0]}.{Path(rel.parts[1]).stem}"
    return parts[0]


def stdlib_files(root: Path) -> list:
    """The stdlib's .py files (relative paths, sorted), without site-packages, dist-packages and
    __pycache__."""
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*.py")
        if p.is_file() and not LEFT_OUT_DIRS & set(p.relative_to(root).parts[:-1])
    )


def read_files(root: Path, only: set | None) -> tuple[dict, list]:
    """({document: [(file, text)]} in name order, [(file, why) left out]), every file read through
    `tokenize.open`; `only`: the documents to keep (DataError naming any that is not one)."""
    grouped: dict = {}
    for rel in stdlib_files(root):
        grouped.setdefault(document_of(rel), []).append(rel)
    if only is not None:
        unknown = sorted(only - set(grouped))
        if unknown:
            raise DataError(
                f"--only names {unknown}, which are not documents of {root}; pick from e.g. "
                f"{sorted(grouped)[:12]} (top-level modules and packages, test.<module>)"
            )
        grouped = {k: v for k, v in grouped.items() if k in only}
    read, left_out = {}, []
    bar = tqdm(total=sum(len(v) for v in grouped.values()), desc="read stdlib", unit="file")
    for name in sorted(grouped):
        for rel in grouped[name]:
            bar.update(1)
            try:
                with tokenize.open(root / rel) as fh:
                    body = fh.read()
            except (
                SyntaxError,
                UnicodeDecodeError,
            ) as e:  # a bad coding cookie or bytes that do not decode
                why = str(e).replace(repr(str(root / rel)), "it").splitlines()[0][:120]
                left_out.append((rel.as_posix(), f"{type(e).__name__}: {why}"))
                continue
            read.setdefault(name, []).append((rel.as_posix(), body))
    bar.close()
    return read, left_out


def read_documents(root: Path, only: set | None) -> tuple[list, list]:
    """(documents in name order, [(file, why) left out]): `read_files`, each document its files'
    texts joined."""
    read, left_out = read_files(root, only)
    docs = [
        Document(
            name,
            [rel for rel, _ in files],
            "".join(
                f"# file: {rel}\n{body}{'' if body.endswith(chr(10)) else chr(10)}"
                for rel, body in files
            ),
        )
        for name, files in read.items()
    ]
    return docs, left_out


def hold_out(docs: list, every: int, min_chars: int) -> list:
    """Mark the held-out documents (module doc); returns their names, longest first."""
    long = sorted(
        (d for d in docs if len(d.text) >= min_chars), key=lambda d: (-len(d.text), d.name)
    )
    held = long[1::every]
    if not held:
        raise DataError(
            f"{len(long)} document(s) have >= {min_chars} characters: too few to hold every "
            f"{every}-th out from the second; lower --eval_min_chars or --eval_every, or keep more "
            f"documents (--only)"
        )
    for d in held:
        d.split = "eval"
    return [d.name for d in held]


# ----------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list, vocab_size: int, specials: tuple = tuple(SPECIALS.values())):
    """A byte-level BPE (`tokenizers.Tokenizer`) of `vocab_size` ids, `specials` first, trained on
    `texts` (module doc)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        show_progress=True,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def count_tokens(docs: list, tok) -> None:
    """Each document's token count (no specials), batches of ~4 M characters, a progress bar over
    characters."""
    bar = tqdm(total=sum(len(d.text) for d in docs), desc="tokenize", unit="char", unit_scale=True)
    batch, chars = [], 0
    for i, d in enumerate(docs):
        batch.append(d)
        chars += len(d.text)
        if chars >= 4 << 20 or i == len(docs) - 1:
            for b, e in zip(
                batch, tok.encode_batch([b.text for b in batch], add_special_tokens=False)
            ):
                b.tokens = len(e.ids)
            bar.update(chars)
            batch, chars = [], 0
    bar.close()


def save_tokenizer(tok, path: Path) -> int:
    """`tok` as a PreTrainedTokenizerFast directory (EOS, PAD, BOS set); returns its size (len)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIALS)
    fast.save_pretrained(str(path))
    return len(fast)


# ----------------------------------------------------------------------------- the card
def histogram(tokens: list) -> list:
    """Documents per bin of HIST_EDGES (bin k: HIST_EDGES[k] <= tokens < HIST_EDGES[k + 1]); the
    last bin is open."""
    counts = [0] * len(HIST_EDGES)
    for n in tokens:
        counts[max(k for k, e in enumerate(HIST_EDGES) if n >= e)] += 1
    return counts


def card(
    docs: list, root: Path, left_out: list, held: list, vocab: int, args, seconds: dict
) -> dict:
    import tokenizers
    import transformers

    by = {s: [d for d in docs if d.split == s] for s in ("train", "eval")}
    longest = max(docs, key=lambda d: (d.tokens, d.name))
    return {
        "source": "python-stdlib",
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "stdlib": str(root),
        "platform": platform.platform(),
        "order": ORDER,
        "split_packages": list(SPLIT_PACKAGES),
        "documents": {s: len(v) for s, v in by.items()},
        "tokens": {s: sum(d.tokens for d in v) for s, v in by.items()},
        "characters": {s: sum(len(d.text) for d in v) for s, v in by.items()},
        "files": sum(len(d.files) for d in docs),
        "files_left_out": [{"file": f, "why": w} for f, w in left_out],
        "longest": {
            "name": longest.name,
            "tokens": longest.tokens,
            "characters": len(longest.text),
            "files": len(longest.files),
            "split": longest.split,
        },
        "histogram": {
            "edges": HIST_EDGES,
            "train": histogram([d.tokens for d in by["train"]]),
            "eval": histogram([d.tokens for d in by["eval"]]),
        },
        "eval_rule": f"documents of >= {args.eval_min_chars} characters, longest first, every "
        f"{args.eval_every}-th from the second",
        "eval_documents": held,
        "tokenizer": {
            "kind": "byte-level BPE",
            "trained_on": "train.jsonl",
            "size": vocab,
            "asked": args.vocab_size,
            "specials": SPECIALS,
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
        },
        "only": sorted(args.only.split(",")) if args.only else None,
        "seconds": seconds,
        "per_document": [
            {
                "name": d.name,
                "split": d.split,
                "files": len(d.files),
                "characters": len(d.text),
                "tokens": d.tokens,
            }
            for d in docs
        ],
    }


def card_markdown(c: dict) -> str:
    """The data card as markdown: provenance, counts, the longest documents, the histogram."""
    docs = sorted(c["per_document"], key=lambda d: -d["tokens"])
    total = {k: sum(c[k].values()) for k in ("documents", "tokens", "characters")}
    lines = [
        f"# Data card: the Python {c['python']} standard library as a corpus",
        "",
        f"Written by `ds-longctx data prepare --stdlib` from `{c['stdlib']}` "
        f"({c['implementation']}, "
        f"{c['platform']}) in {c['seconds']['total']:.0f} s. Order: {c['order']}. Held out: "
        f"{c['eval_rule']}.",
        "Tokens: the BPE's, without the EOS that training appends to each document.",
        "",
        "| | documents | tokens | characters |",
        "| --- | ---: | ---: | ---: |",
    ]
    for s in ("train", "eval"):
        lines.append(
            f"| {s} | {c['documents'][s]:,} | {c['tokens'][s]:,} | {c['characters'][s]:,} |"
        )
    lines += [
        f"| all | {total['documents']:,} | {total['tokens']:,} | {total['characters']:,} |",
        "",
        f"Longest document: `{c['longest']['name']}`, {c['longest']['tokens']:,} tokens, "
        f"{c['longest']['characters']:,} characters, {c['longest']['files']} files "
        f"({c['longest']['split']}). "
        f"Files: {c['files']:,} read, {len(c['files_left_out'])} left out"
        + "".join(f"; `{f['file']}` ({f['why']})" for f in c["files_left_out"])
        + ".",
        "",
        f"Tokenizer: {c['tokenizer']['kind']}, {c['tokenizer']['size']:,} ids, trained on "
        "train.jsonl "
        f"(tokenizers {c['tokenizer']['tokenizers']}); specials {c['tokenizer']['specials']}.",
        "",
        "## Tokens per document",
        "",
        "| tokens | train | eval |",
        "| --- | ---: | ---: |",
    ]
    edges, h = c["histogram"]["edges"], c["histogram"]
    for k, lo in enumerate(edges):
        if h["train"][k] or h["eval"][k]:
            hi = f"{edges[k + 1]:,}" if k + 1 < len(edges) else "..."
            lines.append(f"| {lo:,} - {hi} | {h['train'][k]} | {h['eval'][k]} |")
    lines += [
        "",
        "## The 15 longest documents",
        "",
        "| document | split | files | tokens |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [
        f"| `{d['name']}` | {d['split']} | {d['files']} | {d['tokens']:,} |" for d in docs[:15]
    ]
    lines += ["", "Held out: " + ", ".join(f"`{n}`" for n in c["eval_documents"]) + ".", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- entry point
def check_prepare_out(args) -> Path:
    """`check_prepare_dir` for --stdlib, with its sizes checked."""
    check_vocab_size(args.vocab_size, len(SPECIALS))
    if args.eval_every < 1 or args.eval_min_chars < 0:
        raise DataError(
            f"--eval_every {args.eval_every} must be >= 1 and --eval_min_chars "
            f"{args.eval_min_chars} >= 0"
        )
    return check_prepare_dir(args.out, "train.jsonl, eval.jsonl, tokenizer/ and the data card")


def prepare(args) -> dict:
    """Write the corpus (module doc) to args.out; returns the card."""
    out = check_prepare_out(args)
    root = Path(sysconfig.get_paths()["stdlib"])
    seconds, t0 = {}, time.perf_counter()
    docs, left_out = read_documents(root, set(args.only.split(",")) if args.only else None)
    held = hold_out(docs, args.eval_every, args.eval_min_chars)
    seconds["read"] = round(time.perf_counter() - t0, 1)
    tok = train_tokenizer([d.text for d in docs if d.split == "train"], args.vocab_size)
    seconds["tokenizer"] = round(time.perf_counter() - t0 - sum(seconds.values()), 1)
    count_tokens(docs, tok)
    seconds["tokenize"] = round(time.perf_counter() - t0 - sum(seconds.values()), 1)
    lines = {
        split: "".join(
            json.dumps({"name": d.name, "text": d.text}, ensure_ascii=False) + "\n"
            for d in docs
            if d.split == split
        ).encode()
        for split in ("train", "eval")
    }

    def make_card(vocab: int) -> tuple:
        seconds["write"] = round(time.perf_counter() - t0 - sum(seconds.values()), 1)
        seconds["total"] = round(time.perf_counter() - t0, 1)
        c = card(docs, root, left_out, held, vocab, args, seconds)
        return c, {
            "data_card.json": (json.dumps(c, indent=1) + "\n").encode(),
            "data_card.md": card_markdown(c).encode(),
        }

    return write_corpus(
        out, lines, lambda path: save_tokenizer(tok, path), tok.get_vocab_size(), make_card
    )
