"""The disk tier's GPU runs (`disk_tier.jsonl`: benchmarks/disk_tier.sh, one per session directory)
for docs/results.md and the README: the longest length planned with the disk against the host-only
plan, then run, each peak and the step time against the plan."""

from __future__ import annotations

from results_format import META, meta, n, result_file, table
from results_rehearsal import model_label, off

STEP_TOL = 0.15  # disk_tier.sh's bar for the step time


def _closed(text: str) -> str:
    """`text` with the parentheses a short regex match left open closed."""
    return text + ")" * (text.count("(") - text.count(")"))


def _step(r: dict) -> str:
    m, p = r["measured"], r["planned"]
    only = " (its only step: compiling included)" if r["steps"] == 1 else " (the last)"
    bar = "inside" if abs(m["step_s"] / p["step_s"] - 1) <= STEP_TOL else "outside"
    bar += f" ±{STEP_TOL:.0%}"
    return (
        f"step {m['step_s']:.1f} s{only} against {p['step_s']} s predicted "
        f"({off(m['step_s'], p['step_s'])}, {bar})"
    )


def disk_tier_rows(d: dict) -> list:
    """The README's row: the newest run's lengths with and without the disk, its peaks and its
    step (every run: docs/results.md)."""
    out = []
    for r in d.get("disk_tier", [])[-1:]:
        p, m = r["planned"], r["measured"]
        peaks = ", ".join(
            f"{what} {m[mk]:.1f} GB (plan {p[pk]})"
            for what, mk, pk in (
                ("GPU", "gpu_gb", "gpu_gb"),
                ("host", "host_used_gb", "host_gb"),
                ("disk", "disk_peak_gb", "disk_gb"),
            )
        )
        out.append(
            [
                f"longest {model_label(r['model'])} with the disk tier, {r['machine']}",
                f"planned, then run (measured, {r['steps']} step{'s' * (r['steps'] > 1)})",
                f"{n(p['seq_len'])} tokens against {n(p['host_only_seq_len'])} host-only; {peaks}; "
                + _step(r),
                "",
                result_file("disk_tier"),
            ]
        )
    return out


def disk_tier(d: dict) -> str:
    """Each disk-tier run: planned against measured, and the disk's bandwidth and bytes."""
    rows = []
    for r in d.get("disk_tier", []):
        p, m = r["planned"], r["measured"]
        written = m.get("disk_written_gb_per_step") or m.get("disk_written_gb")
        rows.append(
            [
                model_label(r["model"]),
                r["machine"],
                n(p["seq_len"]),
                n(p["host_only_seq_len"]),
                p["placement"],
                r["steps"],
                *(
                    f"{m[mk]:.1f} / {p[pk]} ({off(m[mk], p[pk])})"
                    for mk, pk in (
                        ("gpu_gb", "gpu_gb"),
                        ("host_used_gb", "host_gb"),
                        ("disk_peak_gb", "disk_gb"),
                        ("step_s", "step_s"),
                    )
                ),
                f"{written:.1f}" if written else "",
                _closed(p["bandwidth"]),
                *meta(r),
            ]
        )
    head = ["model", "machine", "seq_len", "host-only", "placement", "steps", "GPU GB (plan)"]
    head += ["host GB (plan)", "disk GB (plan)", "step s, the last (predicted)"]
    head += ["disk GB written a step"]
    head += ["disk bandwidth", *META]
    return table(head, rows)
