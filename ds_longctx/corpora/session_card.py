"""The data card of `ds-longctx data prepare --sessions`: lengths, trained tokens, answers and how
far back their evidence lies (data_card.json, data_card.md, and data_card.png where matplotlib is
installed).

    c = session_card(rows, files, source, vocab, args)
    # {"data_card.json": bytes, "data_card.md": bytes[, "data_card.png": bytes]}
    files = card_files(c)

Medians are the upper middle value (`statistics.median_high`): a count of tokens, never a half.
Nothing in the card depends on the clock: the same sessions give the same bytes.
"""

from __future__ import annotations

# matplotlib is imported where the figure is drawn (optional, seconds at import).
import io
import json
import platform
from statistics import median_high

from ds_longctx.corpora.code_facts import KINDS
from ds_longctx.corpora.session_builder import FINAL_QUESTIONS, MIN_DISTANCE, margin
from ds_longctx.corpora.session_chat import CHAT_SPECIALS, TOOLS
from ds_longctx.corpora.stdlib_corpus import SPECIALS
from ds_longctx.data.tokenize_check import untrained_windows

DISTANCE_EDGES = [0] + [
    1024 * 4**k for k in range(6)
]  # [0, 1k), [1k, 4k), ... [256k, 1M), [1M, ...)
# the prepare options the card records, in this order
CARD_OPTIONS = ("sessions", "min_tokens", "max_tokens", "seed", "vocab_size", "corpus", "tokenizer")
TEMPLATE = (
    "ChatML: <|im_start|>ROLE\\n...<|im_end|>, tools in the system turn, tool calls as <tool_call> "
    "JSON "
    "</tool_call>, tool results in `tool` turns; `{% generation %}` around each assistant turn's "
    "content, calls and <|im_end|>"
)


def _stats(values: list) -> dict:
    return {
        "min": min(values),
        "median": median_high(values),
        "max": max(values),
        "total": sum(values),
    }


def bucket_counts(values: list, edges: list = DISTANCE_EDGES) -> list:
    """How many values fall in each bucket: bucket k holds edges[k] <= v < edges[k + 1]; the last is
    open."""
    counts = [0] * len(edges)
    for v in values:
        counts[bucket_index(v, edges)] += 1
    return counts


def bucket_index(v: int, edges: list = DISTANCE_EDGES) -> int:
    """The bucket k of `v`: edges[k] <= v < edges[k + 1]; the last is open."""
    return max(k for k, e in enumerate(edges) if v >= e)


def split_windows(meta: list) -> list:
    """Per seq_len L (powers of two from 1024, below the longest session + EOS): the sessions longer
    than L, their windows of L under data.truncate split and those with no trained token
    (`tokenize_check.untrained_windows`)."""
    import numpy as np

    trained = [
        np.concatenate([np.arange(a, b) for a, b in m["trained_runs"]] or [np.zeros(0, np.int64)])
        for m in meta
    ]
    out, L = [], 1024
    while L < max(m["tokens"] for m in meta) + 1:
        counts = [
            untrained_windows(m["tokens"] + 1, t, L)
            for m, t in zip(meta, trained)
            if m["tokens"] + 1 > L
        ]
        out.append(
            {
                "seq_len": L,
                "sessions": len(counts),
                "windows": sum(w for w, _ in counts),
                "untrained": sum(e for _, e in counts),
            }
        )
        L *= 2
    return out


def session_card(rows: list, files: list, source: str, python: str, vocab: int, args) -> dict:
    """The card's facts (module doc); `source`: where the files were read, `python`: the version
    they are of."""
    meta = [r["meta"] for r in rows]
    answers = [a for m in meta for a in m["answers"]]
    distances = [a["distance_tokens"] for a in answers]
    tokens = [m["tokens"] for m in meta]
    trained = _stats([m["trained_tokens"] for m in meta])
    return {
        "source": "corpus" if args.corpus else "python-stdlib",
        "read_from": source,
        "python": python,
        "implementation": platform.python_implementation(),
        "files": len(files),
        "modules": len({f.group for f in files}),
        "only": sorted(args.only.split(",")) if args.only else None,
        "options": {k: getattr(args, k) for k in CARD_OPTIONS},
        "sessions": len(rows),
        "tokens": _stats(tokens),
        "length_rule": "a target drawn log-uniformly from [min_tokens + reserve + margin, "
        "max_tokens], built to "
        f"within margin ({margin(args.min_tokens)} tokens) below it; tokens of the rendered "
        f"session, without the EOS training appends",
        "trained_tokens": {
            **trained,
            "share": round(trained["total"] / sum(tokens), 4),
            "rule": "the tokens of the assistant turns' generation blocks, as HF's assistant mask "
            "marks them",
        },
        "split_windows": {
            "by_seq_len": split_windows(meta),
            "rule": "a session (with the EOS training appends) longer than seq_len is cut into "
            "windows "
            "of seq_len (data.truncate: split, pack's default), each its own document; a window "
            "whose tokens after its first hold no trained token trains nothing",
        },
        "answers": {
            "count": len(answers),
            "per_session": _stats([len(m["answers"]) for m in meta]),
            "by_kind": {k: sum(a["kind"] == k for a in answers) for k in KINDS},
            "rule": "after a read the user may ask about a file read earlier, "
            f"its evidence at least {MIN_DISTANCE} tokens before the answer "
            f"(log-uniformly far); {FINAL_QUESTIONS} last "
            "questions ask about the farther half of the session",
        },
        "distance_tokens": {
            **_stats(distances),
            "edges": DISTANCE_EDGES,
            "counts": bucket_counts(distances),
            "rule": "token index of the answer's first character less that of the evidence's last "
            "character, in the rendered session",
        },
        "tokenizer": _tokenizer_facts(vocab, args),
        "tools": [t["function"]["name"] for t in TOOLS],
        "per_session": [_session_row(r, m) for r, m in zip(rows, meta)],
    }


def _tokenizer_facts(vocab: int, args) -> dict:
    """The card's tokenizer: its size, specials, what it was trained on, the template, the library
    versions."""
    import tokenizers
    import transformers

    return {
        "size": vocab,
        "specials": SPECIALS,
        "chat_specials": list(CHAT_SPECIALS),
        "trained": f"the model tokenizer of {args.tokenizer}"
        if args.tokenizer
        else "corpus's"
        if args.corpus
        else "byte-level BPE on the files read from",
        "template": TEMPLATE,
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
    }


def _session_row(r: dict, m: dict) -> dict:
    """One session's line of the card: its name, sizes, reads, answers and the farthest answer's
    distance."""
    return {
        "name": r["name"],
        "tokens": m["tokens"],
        "target_tokens": m["target_tokens"],
        "trained_tokens": m["trained_tokens"],
        "messages": len(r["messages"]),
        "files_read": m["files_read"],
        "answers": len(m["answers"]),
        "farthest": max((a["distance_tokens"] for a in m["answers"]), default=0),
    }


def size_name(n: int) -> str:
    """1024 -> "1k", 1048576 -> "1M", else the number."""
    return (
        f"{n // 1048576}M"
        if n >= 1048576 and n % 1048576 == 0
        else f"{n // 1024}k"
        if n >= 1024 and n % 1024 == 0
        else str(n)
    )


def session_card_markdown(c: dict) -> str:
    t, tr, d, a = c["tokens"], c["trained_tokens"], c["distance_tokens"], c["answers"]
    o = c["options"]
    lines = [
        f"# Data card: {c['sessions']} long agent sessions over the Python {c['python']} standard "
        "library",
        "",
        f"Written by `ds-longctx data prepare --sessions {o['sessions']}` (min_tokens "
        f"{o['min_tokens']:,}, "
        f"max_tokens {o['max_tokens']:,}, seed {o['seed']}) from {c['files']:,} files of "
        f"{c['modules']} modules"
        f" (`{c['read_from']}`{', only ' + ', '.join(c['only']) if c['only'] else ''}). Tools: "
        + ", ".join(f"`{x}`" for x in c["tools"])
        + "; every tool result is a real file, listing or search "
        "of the corpus. Tokenizer: "
        + f"{c['tokenizer']['size']:,} ids ({c['tokenizer']['trained']}), "
        f"template {c['tokenizer']['template']}.",
        "",
        "| | min | median | max | total |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| tokens per session | {t['min']:,} | {t['median']:,} | {t['max']:,} | {t['total']:,} |",
        f"| trained tokens per session | {tr['min']:,} | {tr['median']:,} | {tr['max']:,} | "
        f"{tr['total']:,} |",
        f"| answers per session | {a['per_session']['min']} | {a['per_session']['median']} | "
        f"{a['per_session']['max']} | {a['count']} |",
        f"| answer-to-evidence distance (tokens) | {d['min']:,} | {d['median']:,} | {d['max']:,} | "
        "|",
        "",
        f"Trained: {100 * tr['share']:.1f}% of all tokens ({tr['rule']}). Lengths: "
        f"{c['length_rule']}.",
        "Answers by kind: "
        + ", ".join(f"{k} {n}" for k, n in a["by_kind"].items())
        + f". Asked: {a['rule']}.",
        "",
        "## Answer-to-evidence distance",
        "",
        f"Distance: {d['rule']}.",
        "",
        "| tokens | answers |",
        "| --- | ---: |",
    ]
    edges = d["edges"]
    for k, n in enumerate(d["counts"]):
        hi = size_name(edges[k + 1]) if k + 1 < len(edges) else "..."
        lines.append(f"| {size_name(edges[k])} - {hi} | {n} |")
    w = c["split_windows"]
    lines += [
        "",
        "## Windows of a session longer than seq_len",
        "",
        f"{w['rule'][0].upper()}{w['rule'][1:]}.",
        "",
        "| seq_len | sessions longer | windows | windows with no trained token |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {x['seq_len']:,} | {x['sessions']} | {x['windows']:,} | {x['untrained']:,} |"
        for x in w["by_seq_len"]
    ]
    lines += [
        "",
        "## Sessions",
        "",
        "| session | tokens | target | trained | messages | files read | answers | "
        "farthest answer (tokens back) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {s['name']} | {s['tokens']:,} | {s['target_tokens']:,} | {s['trained_tokens']:,} | "
        f"{s['messages']} | {s['files_read']} | {s['answers']} | {s['farthest']:,} |"
        for s in c["per_session"]
    ]
    return "\n".join(lines) + "\n"


def distance_png(c: dict) -> bytes | None:
    """The distance histogram as a PNG (matplotlib's Agg canvas, no pyplot); None without
    matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    d = c["distance_tokens"]
    fig = Figure(figsize=(6, 3.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [f"{size_name(e)}-" for e in d["edges"]]
    ax.bar(range(len(labels)), d["counts"], color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("answer-to-evidence distance (tokens)")
    ax.set_ylabel("answers")
    ax.set_title(f"{c['answers']['count']} answers in {c['sessions']} sessions")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def card_files(c: dict) -> dict:
    files = {
        "data_card.json": (json.dumps(c, indent=1) + "\n").encode(),
        "data_card.md": session_card_markdown(c).encode(),
    }
    if (png := distance_png(c)) is not None:
        files["data_card.png"] = png
    return files
