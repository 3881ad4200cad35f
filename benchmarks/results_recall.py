"""The recall tables: a real model's exact match and answer loss by answer-to-evidence distance
(`recall.jsonl`, benchmarks/recall.sh), for docs/results.md and the README."""

from __future__ import annotations

from results_format import META, meta, n, result_file, table


def recall_rows(d: dict) -> list:
    """README rows: per recall run (one raw file), the base model and its last trained step, bucket
    by bucket from 4k on: exact match and what the evidence saves (loss without it less loss with
    it)."""
    runs: dict = {}
    for r in d.get("recall", []):
        runs.setdefault(r["source"].split(":")[0], []).append(r)
    out = []
    for rows in runs.values():
        last = max(r["step"] for r in rows if r["stage"] == "trained")
        base = {r["bucket"]: r for r in rows if r["stage"] == "base"}
        end = {r["bucket"]: r for r in rows if r["stage"] == "trained" and r["step"] == last}
        far = [b for b in end if b in base and not b.startswith(("0-", "1k-"))]
        cells = [
            f"{b} ({end[b]['answers']} answers): exact match {base[b]['recall_exact_match']:.0%} "
            f"-> {end[b]['recall_exact_match']:.0%}, evidence saves {saved(base[b]):.2f} -> "
            f"{saved(end[b]):.2f} nat"
            for b in far
        ]
        r = rows[0]
        out.append(
            [
                f"recall far back, {r['model_name']} fine-tuned {last} steps at "
                f"{n(r['seq_len'])} tokens, {r['device']}",
                "measured (base model, then trained)",
                "; ".join(cells),
                "",
                result_file("recall"),
            ]
        )
    return out


def recall(d: dict) -> str:
    """Each recall row: exact match of the answers' values and their loss with and without the
    evidence."""
    rows = [
        [
            r["model_name"],
            r["stage"],
            r["step"],
            n(r["seq_len"]),
            r["bucket"],
            r["answers"],
            f"{r['recall_exact_match']:.3f}",
            f"{r['loss_with_evidence']:.3f}",
            f"{r['loss_without_evidence']:.3f}",
            f"{saved(r):+.3f}",
            *meta(r),
        ]
        for r in d.get("recall", [])
    ]
    return table(
        [
            "model",
            "stage",
            "step",
            "seq_len",
            "distance",
            "answers",
            "exact match",
            "loss with evidence",
            "loss without",
            "evidence saves",
            *META,
        ],
        rows,
    )


def saved(r: dict) -> float:
    return r["loss_without_evidence"] - r["loss_with_evidence"]
