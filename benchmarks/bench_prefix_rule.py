"""The labels of a long agent session under a chat template without `{% generation %}` markers (the
prefix rule, data/chat.py): seconds with the prefixes rendered through the compiled template
(`_direct`) and through apply_chat_template, and whether both give the same ids and labels. CPU
only.

    python benchmarks/bench_prefix_rule.py [--turns 250] [--tool_words 1500] [--repeats 3] \\
        [--out DIR]

A session: a system message, then `turns` times a user question, an assistant tool call, a tool
result of `tool_words` words and an assistant answer; ChatML without markers (tests/corpus.py),
word-level tokenizer. Writes prefix_rule_<date>.json under --out (default: harness.raw_dir()).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs

sys.path.insert(0, str(ROOT))


def session(turns: int, tool_words: int) -> list:
    """The benchmark's messages (module doc), drawn with a fixed seed."""
    rng, words = random.Random(0), [f"w{i}" for i in range(50)]
    text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    call = {"type": "function", "function": {"name": "read", "arguments": {"path": "x"}}}
    msgs = [{"role": "system", "content": "you are"}]
    for _ in range(turns):
        msgs += [
            {"role": "user", "content": text(50)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": text(tool_words)},
            {"role": "assistant", "content": text(30)},
        ]
    return msgs


def timed(fn, repeats: int) -> tuple:
    """(median seconds of `repeats` calls, the last result)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=250)
    ap.add_argument("--tool_words", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(raw_dir()))
    args = ap.parse_args()
    if min(args.turns, args.tool_words, args.repeats) < 1:
        ap.error("--turns, --tool_words and --repeats: give whole numbers >= 1")
    from transformers import AutoTokenizer

    import ds_longctx.data.chat as chat
    from tests.corpus import chat_template, make_chat_tokenizer

    with tempfile.TemporaryDirectory() as d:
        tok = AutoTokenizer.from_pretrained(
            str(make_chat_tokenizer(Path(d) / "tok", chat_template(False)))
        )
    msgs = session(args.turns, args.tool_words)
    run = lambda: chat.session_tokens(tok, msgs, None, "assistant")  # noqa: E731
    direct_s, direct = timed(run, args.repeats)
    real, chat._direct = chat._direct, lambda *a: None
    try:
        plain_s, plain = timed(run, args.repeats)
    finally:
        chat._direct = real
    ids, labels = direct
    row = {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(None),
        "machine": (
            f"CPU, {platform.processor() or platform.machine()}, Python {platform.python_version()}"
        ),
        "command": "python benchmarks/bench_prefix_rule.py " + " ".join(sys.argv[1:]),
        "messages": len(msgs),
        "tokens": len(ids),
        "trained_tokens": sum(x != -100 for x in labels),
        "repeats": args.repeats,
        "direct_s": round(direct_s, 3),
        "apply_chat_template_s": round(plain_s, 3),
        "speedup": round(plain_s / direct_s, 2),
        "same_ids_and_labels": direct == plain,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"prefix_rule_{row['date']}.json"
    path.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row), f"\n-> {path}")
    if not row["same_ids_and_labels"]:
        sys.exit("the direct renders gave other ids or labels than apply_chat_template's")


if __name__ == "__main__":
    main()
