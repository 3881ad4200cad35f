"""Long agent sessions over the Python standard library read through tools, with questions whose
answers sit far back in the session.

    ds-longctx data prepare --sessions [N] --out DIR [--min_tokens 32768] [--max_tokens 1048576]
                                                     [--seed 0] [--tokenizer MODEL_DIR]
                                                     [--vocab_size 32000 | --corpus CORPUS_DIR]
                                                     [--only json,...]

DIR gets train.jsonl, tokenizer/ and the data card, written all or nothing
(corpus_write.write_corpus). The same files, options and seed give the same bytes. Files, tokenizers
and refusals: docs/design/corpora.md."""

from __future__ import annotations

# transformers is imported where the tokenizer is made (seconds at import).
import json
import math
import re
import sys
import sysconfig
import time
from pathlib import Path

import psutil
from tqdm import tqdm

from ds_longctx.corpora.corpus_write import check_prepare_dir, check_vocab_size, write_corpus
from ds_longctx.corpora.session_builder import SessionMaker, SourceFile, lowest_max
from ds_longctx.corpora.session_card import card_files, session_card
from ds_longctx.corpora.session_chat import CHAT_SPECIALS, CHAT_TEMPLATE, Renderer
from ds_longctx.corpora.stdlib_corpus import SPECIALS, document_of, read_files, train_tokenizer
from ds_longctx.data.scan import DataError
from ds_longctx.data.tokenize import open_tokenizer
from ds_longctx.parallel.disk import free_bytes, size_text

MIN_TOKENS = 2048  # the shortest session asked for, at least
MAX_TOKENS = 1 << 24
BYTES_PER_TOKEN = (
    4.2  # train.jsonl bytes per session token (the committed 32,000-id cards: 4.12 and 4.16)
)
HELD_COPIES = (
    3  # the sessions are held in memory as rows, their JSON text and its bytes before writing
)
_HEADER = re.compile(r"^# file: (\S+\.py)\n", re.M)


def check_session_args(args) -> Path:
    """Every option of --sessions, refused (DataError) before anything is read; the --out
    directory."""
    if args.sessions < 1:
        raise DataError(f"--sessions {args.sessions}: write at least 1 session")
    if not MIN_TOKENS <= args.min_tokens <= MAX_TOKENS:
        raise DataError(
            f"--min_tokens {args.min_tokens} must be in [{MIN_TOKENS}, {MAX_TOKENS}]: a session "
            f"holds reads and the answers about them"
        )
    if not lowest_max(args.min_tokens) <= args.max_tokens <= MAX_TOKENS:
        raise DataError(
            f"--max_tokens {args.max_tokens} must be in [{lowest_max(args.min_tokens)}, "
            f"{MAX_TOKENS}] "
            f"with --min_tokens {args.min_tokens} (room for the last questions and the margin a "
            f"session is built to); raise --max_tokens or lower --min_tokens"
        )
    if args.corpus is not None:
        c = Path(args.corpus)
        if not (
            (c / "data_card.json").is_file()
            and (c / "train.jsonl").is_file()
            and (c / "tokenizer").is_dir()
        ):
            raise DataError(
                f"--corpus {args.corpus!r} is not a directory `ds-longctx data prepare --stdlib` "
                "wrote (no "
                f"data_card.json, train.jsonl and tokenizer/ in it); prepare one, or drop --corpus"
            )
    if args.tokenizer is not None:
        model_tokenizer(args.tokenizer)
    elif args.corpus is None:
        check_vocab_size(args.vocab_size, len(SPECIALS) + len(CHAT_SPECIALS))
    out = check_prepare_dir(args.out, "train.jsonl, tokenizer/ and the data card")
    check_session_room(args)  # free space, once --out is known writable
    return out


def check_session_room(args) -> None:
    """Refuse (DataError) a request whose sessions would not fit this machine's available memory,
    where they are built, or the free space of --out: the mean of the log-uniform target lengths,
    BYTES_PER_TOKEN, HELD_COPIES."""

    low, high = lowest_max(args.min_tokens), args.max_tokens
    mean = (high - low) / math.log(high / low) if high > low else low  # tokens per session
    size = args.sessions * mean * BYTES_PER_TOKEN
    ram, free = psutil.virtual_memory().available, free_bytes(args.out)
    what = (
        f"--sessions {args.sessions:,} of ~{mean:,.0f} tokens on average are ~{size_text(size)} of "
        "train.jsonl"
    )
    if size * HELD_COPIES > ram:
        raise DataError(
            f"{what}, built in memory (~{size_text(size * HELD_COPIES)}), and this machine has "
            f"{size_text(ram)} available; write fewer sessions or lower --max_tokens"
        )
    if free is not None and size > free:
        raise DataError(
            f"{what}, and {args.out!r} has {size_text(free)} free; write fewer sessions, lower "
            f"--max_tokens or choose an --out with more space"
        )


def _keep(text: str) -> bool:
    return bool(text.strip()) and not any(t in text for t in (*SPECIALS.values(), *CHAT_SPECIALS))


def stdlib_source(only: set | None) -> tuple[list, str]:
    """(the standard library's files as SourceFiles, where it is)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    read, _ = read_files(root, only)
    return [
        SourceFile(rel, name, body)
        for name, files in read.items()
        for rel, body in files
        if _keep(body)
    ], str(root)


def corpus_source(corpus: Path, only: set | None) -> list:
    """The files of a prepared corpus's documents (module doc), in document and file order."""
    docs = []
    for split in ("train", "eval"):
        path = corpus / f"{split}.jsonl"
        if path.is_file():
            docs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    docs.sort(key=lambda d: d["name"])
    if only is not None and (unknown := sorted(only - {d["name"] for d in docs})):
        raise DataError(
            f"--only names {unknown}, which are not documents of --corpus {str(corpus)!r}; pick "
            f"from e.g. {[d['name'] for d in docs][:12]}"
        )
    files = []
    for d in docs:
        if only is not None and d["name"] not in only:
            continue
        heads = [
            m for m in _HEADER.finditer(d["text"]) if document_of(Path(m.group(1))) == d["name"]
        ]
        for m, nxt in zip(heads, heads[1:] + [None]):
            body = d["text"][m.end() : nxt.start() if nxt else len(d["text"])]
            if _keep(body):
                files.append(SourceFile(m.group(1), d["name"], body))
    return files


def model_tokenizer(path: str):
    """The fast tokenizer of a model directory, refused (DataError) unless the ChatML turn markers
    (CHAT_SPECIALS' first two) are special tokens of it: the rendering cuts at them
    (session_chat.py)."""

    try:
        tok = open_tokenizer(path)
    except DataError as e:
        raise DataError(
            f"--tokenizer {path!r} holds no tokenizer transformers can load ({e}); give a model "
            f"directory (e.g. `ds-longctx models get ... --out DIR`)"
        ) from None
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    missing = [t for t in CHAT_SPECIALS[:2] if t not in specials]
    if missing or not tok.is_fast:
        raise DataError(
            f"--tokenizer {path!r} lacks the ChatML special tokens "
            f"{missing or '(not a fast tokenizer)'}"
            f" the sessions' chat template is written in; use a ChatML model's tokenizer, or drop "
            f"--tokenizer to train a BPE"
        )
    return tok


def session_tokenizer(files: list, args):
    """The sessions' tokenizer (module doc), carrying CHAT_TEMPLATE."""
    from transformers import PreTrainedTokenizerFast

    if args.tokenizer is not None:
        tok = model_tokenizer(args.tokenizer)
    elif args.corpus is not None:
        tok = open_tokenizer(Path(args.corpus) / "tokenizer")
        tok.add_special_tokens({"additional_special_tokens": list(CHAT_SPECIALS)})
    else:
        bpe = train_tokenizer(
            [f.text for f in files], args.vocab_size, (*SPECIALS.values(), *CHAT_SPECIALS)
        )
        tok = PreTrainedTokenizerFast(
            tokenizer_object=bpe, **SPECIALS, extra_special_tokens=list(CHAT_SPECIALS)
        )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_sessions(files: list, tok, args) -> list:
    """Every session as a row, each checked: its pieces join to the template's rendering of the
    whole session."""
    ren = Renderer(tok)
    bar = tqdm(total=None, desc="sessions", unit="tok", unit_scale=True)
    maker = SessionMaker(files, ren, args.min_tokens, args.max_tokens, bar)
    rows = []
    for i in range(args.sessions):
        row = maker.build(i, args.seed)
        whole = ren.session(row["messages"], row["tools"])
        pieces = [ren.piece(row["messages"][0], row["tools"])] + [
            ren.piece(m) for m in row["messages"][1:]
        ]
        if whole != "".join(pieces):
            raise AssertionError(
                f"{row['name']}: the chat template does not render messages one at a time"
            )
        rows.append(row)
        bar.set_postfix(sessions=len(rows))
    bar.close()
    return rows


def prepare_sessions(args) -> tuple[dict, float]:
    """Write the sessions (module doc) to args.out; returns (the card, seconds taken)."""
    out = check_session_args(args)
    t0 = time.perf_counter()
    only = set(args.only.split(",")) if args.only else None
    if args.corpus is not None:
        files, source = corpus_source(Path(args.corpus), only), str(Path(args.corpus).resolve())
        python = json.loads((Path(args.corpus) / "data_card.json").read_text()).get("python", "?")
    else:
        (files, source), python = stdlib_source(only), sys.version.split()[0]
    if not files:
        raise DataError(
            "the corpus holds no file to read; give --only names of documents with code"
        )
    tok = session_tokenizer(files, args)
    specials = [t.content for t in tok.added_tokens_decoder.values()]
    files = [
        f for f in files if not any(t in f.text for t in specials)
    ]  # a model tokenizer's own specials too
    rows = build_sessions(files, tok, args)
    lines = {"train": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()}

    def make_card(vocab: int) -> tuple:
        c = session_card(rows, files, source, python, vocab, args)
        return c, card_files(c)

    def save(path: Path) -> int:
        tok.save_pretrained(str(path))
        return len(tok)

    c = write_corpus(out, lines, save, len(tok), make_card)
    return c, time.perf_counter() - t0
