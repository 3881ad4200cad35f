"""The preference runs (`preference.jsonl`: a DPO or GRPO run on a GPU, each step as it logged it)
for docs/results.md and the README."""

from __future__ import annotations

import math
from statistics import median

from results_format import META, gb, meta, n, result_file, table


def _timed(r: dict) -> list:
    """The step seconds after the first (the first compiles and allocates)."""
    return r["step_seconds"][1:] or r["step_seconds"]


def _finite(r: dict) -> bool:
    return all(math.isfinite(x) for key in ("losses", "rewards") for x in r[key])


def preference_rows(d: dict) -> list:
    """README rows: per preference run, its median step after the first, the reference pass, the
    peak GPU memory and whether every loss and reward was finite."""
    out = []
    for r in d.get("preference", []):
        ref = (
            f", reference pass {r['reference_seconds']:.1f} s ({r['reference_pairs']} pairs)"
            if r.get("reference_seconds") is not None
            else ""
        )
        out.append(
            [
                f"s/step, {r['objective'].upper()}, {r['model_name']}, {n(r['seq_len'])} tokens, "
                f"{r['device']}",
                f"measured, {r['steps']} steps",
                f"{median(_timed(r)):.1f} s (median of steps 2-{r['steps']}){ref}, "
                f"{gb(max(r['peak_gpu_bytes']))} GB peak GPU, losses and rewards "
                + ("finite" if _finite(r) else "NOT finite"),
                "",
                result_file("preference"),
            ]
        )
    return out


def preference(d: dict) -> str:
    """Each preference run: its steps, losses and rewards."""
    rows = [
        [
            r["objective"],
            r["model_name"],
            n(r["seq_len"]),
            r["steps"],
            f"{median(_timed(r)):.2f}",
            r.get("reference_seconds"),
            gb(max(r["peak_gpu_bytes"])),
            ", ".join(f"{x:.4f}" for x in r["losses"]),
            ", ".join(f"{x:.3f}" for x in r["rewards"]),
            *meta(r),
        ]
        for r in d.get("preference", [])
    ]
    head = ["objective", "model", "seq_len", "steps", "median s/step (2 on)", "reference s"]
    head += ["peak GPU GB", "losses", "rewards (chosen, rejected per step)", *META]
    return table(head, rows)
