"""`ds-longctx data prepare`: a corpus with its tokenizer and data card, written all or nothing into
a new directory.

    ds-longctx data prepare --stdlib --out DIR [--vocab_size 32000] [--eval_every 10]
                                               [--eval_min_chars 131072] [--only json,email,...]
    ds-longctx data prepare --sessions [N] --out DIR [--min_tokens 32768] [--max_tokens 1048576]
                                                     [--seed 0]
                                                     [--vocab_size 32000 | --corpus CORPUS_DIR]
                                                     [--tokenizer MODEL_DIR] [--only json,...]

--stdlib: the Python standard library as documents (corpora/stdlib_corpus.py). --sessions: N long
agent sessions (16 without N) whose tool results are the library's files and whose answers quote
facts read far back (corpora/agent_sessions.py). A source takes its own options only; every bad
value is refused (DataError: exit 2 through the CLI, one line naming the value and the fix) before
any file is read (an --only name that is no document: once the file names are listed).
"""

from __future__ import annotations

import argparse

from ds_longctx.corpora.agent_sessions import prepare_sessions
from ds_longctx.corpora.stdlib_corpus import prepare
from ds_longctx.data.scan import DataError
from ds_longctx.parallel.disk import user_path

SESSIONS = 16
# options of one source, with their defaults (None in the parser, so that a value given to the other
# is seen)
STDLIB_OPTIONS = {"eval_every": 10, "eval_min_chars": 131072}
SESSIONS_OPTIONS = {
    "min_tokens": 32768,
    "max_tokens": 1048576,
    "seed": 0,
    "corpus": None,
    "tokenizer": None,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds-longctx data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser(
        "prepare",
        help="write a corpus, its tokenizer and its data card",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument(
        "--stdlib", action="store_true", help="the Python standard library of this interpreter"
    )
    prep.add_argument(
        "--sessions",
        type=int,
        nargs="?",
        const=SESSIONS,
        default=None,
        metavar="N",
        help=f"N long agent sessions over the standard library (default {SESSIONS})",
    )
    prep.add_argument(
        "--out", required=True, type=user_path, help="new (or empty) directory for the corpus"
    )
    prep.add_argument(
        "--vocab_size",
        type=int,
        default=None,
        help="BPE vocabulary, bytes and special tokens included (default 32000)",
    )
    prep.add_argument(
        "--only",
        default=None,
        help="comma-separated document names to keep (a quick, small corpus)",
    )
    stdlib = prep.add_argument_group("--stdlib only")
    stdlib.add_argument(
        "--eval_every", type=int, help="hold out every N-th long document (default 10)"
    )
    stdlib.add_argument(
        "--eval_min_chars",
        type=int,
        help="held-out documents are at least this long (default 131072)",
    )
    sessions = prep.add_argument_group("--sessions only")
    sessions.add_argument("--min_tokens", type=int, help="shortest session, tokens (default 32768)")
    sessions.add_argument(
        "--max_tokens", type=int, help="longest session, tokens (default 1048576)"
    )
    sessions.add_argument(
        "--seed",
        type=int,
        help="the sessions drawn (default 0): the same seed gives the same bytes",
    )
    sessions.add_argument(
        "--corpus",
        type=user_path,
        help="a directory of `data prepare --stdlib` to read files and the tokenizer "
        "from (default: read the standard library, train a BPE)",
    )
    sessions.add_argument(
        "--tokenizer",
        type=user_path,
        help="a model's tokenizer directory (with the ChatML special tokens "
        "<|im_start|> and <|im_end|>) to write the sessions in, no BPE trained",
    )
    return p


MAX_VOCAB = 1 << 20  # ids of a trained BPE: 7x Qwen3's


def resolve(args) -> argparse.Namespace:
    """`args` with the source's defaults filled in; DataError for no source or two, an option of the
    other source, or --vocab_size with --corpus."""
    if args.stdlib == (args.sessions is not None):
        raise DataError(
            "data prepare needs one source: --stdlib (the Python standard library as documents) or "
            "--sessions [N] (long agent sessions over it)"
        )
    mine, other = (
        (STDLIB_OPTIONS, SESSIONS_OPTIONS) if args.stdlib else (SESSIONS_OPTIONS, STDLIB_OPTIONS)
    )
    given = [k for k in other if getattr(args, k) is not None]
    if given:
        source = "--stdlib" if args.stdlib else "--sessions"
        raise DataError(
            f"--{given[0]} {getattr(args, given[0])} does not apply to {source}; drop it (it is an "
            f"option of {'--sessions' if args.stdlib else '--stdlib'})"
        )
    if getattr(args, "corpus", None) is not None and args.vocab_size is not None:
        raise DataError(
            f"--vocab_size {args.vocab_size} with --corpus {args.corpus!r}: the sessions reuse the "
            f"corpus's tokenizer; drop --vocab_size (or --corpus, to train a new BPE)"
        )
    if getattr(args, "tokenizer", None) is not None and args.vocab_size is not None:
        raise DataError(
            f"--vocab_size {args.vocab_size} with --tokenizer {args.tokenizer!r}: the sessions use "
            f"that tokenizer's vocabulary; drop --vocab_size"
        )
    if (
        args.vocab_size is not None and not 256 <= args.vocab_size <= MAX_VOCAB
    ):  # past it the BPE trainer aborts
        raise DataError(
            f"--vocab_size {args.vocab_size}: give 256 to {MAX_VOCAB:,} ids (a byte-level BPE "
            f"needs its 256 bytes; Qwen3's vocabulary has 151,669), e.g. --vocab_size 32000"
        )
    for k, v in mine.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.vocab_size is None and args.corpus is None and args.tokenizer is None:
        args.vocab_size = 32000
    return args


def main(argv: list) -> int:
    """`ds-longctx data prepare ...`: 0 when written; a DataError (exit 2 through the CLI) on bad
    input."""
    args = resolve(parser().parse_args(argv))
    if args.stdlib:
        c = prepare(args)
        print(
            f"{args.out}: {sum(c['documents'].values())} documents ({c['documents']['eval']} held "
            f"out), {sum(c['tokens'].values()):,} tokens, longest {c['longest']['name']} "
            f"({c['longest']['tokens']:,} "
            f"tokens), tokenizer {c['tokenizer']['size']:,} ids, {c['seconds']['total']:.0f} s; "
            f"card: {args.out}/data_card.md"
        )
        return 0

    c, seconds = prepare_sessions(args)
    t = c["tokens"]
    print(
        f"{args.out}: {c['sessions']} sessions, {t['min']:,} to {t['max']:,} tokens (median "
        f"{t['median']:,}), "
        f"{c['answers']['count']} answers, tokenizer {c['tokenizer']['size']:,} ids, {seconds:.0f} "
        f"s; card: {args.out}/data_card.md"
    )
    return 0
