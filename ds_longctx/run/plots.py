"""`ds-longctx plot RUN_DIR [RUN_DIR ...] [--out DIR]`: each run's metrics.jsonl against step, the
runs overlaid.

    written = plot_runs(["runs/a", "runs/b"], "plots")    # plots/loss.png, plots/lr.png, ...
    figs = figures(read_runs(["runs/a"]))                 # {panel: matplotlib Figure}: a notebook's

One PNG per panel of PANELS (loss and eval loss, lr, grad norm, tokens/s, memory, dpo rewards), one
colour per run; a panel no run has is not written."""

from __future__ import annotations

# matplotlib is imported inside the functions that draw (an optional package, seconds at import).
import argparse
import sys
from pathlib import Path

from ds_longctx.checkpoint.layout import METRICS_FILE
from ds_longctx.parallel.disk import mark_written, not_ours, user_path
from ds_longctx.run.evaluate import read_jsonl
from ds_longctx.run.refuse import refuse

GB = 1e9
# panel -> (y-axis label, the metrics.jsonl fields it draws, the unit each is divided by)
PANELS = {
    "loss": ("loss", ("loss", "eval_loss"), 1),
    "lr": ("learning rate", ("lr",), 1),
    "grad_norm": ("gradient norm (before clipping)", ("grad_norm",), 1),
    "tokens_per_s": ("tokens / s", ("tokens_per_s",), 1),
    "memory": ("GB", ("peak_gpu_bytes", "host_rss_bytes"), GB),
    "rewards": ("DPO reward", ("rewards/chosen", "rewards/rejected", "rewards/margins"), 1),
    "reward_accuracy": ("DPO reward accuracy", ("rewards/accuracies",), 1),
}
STYLES = {"eval_loss": dict(linestyle="none", marker="o"), "host_rss_bytes": dict(linestyle="--")}
NAMES = {
    "loss": "train",
    "eval_loss": "eval",
    "peak_gpu_bytes": "peak GPU reserved",
    "host_rss_bytes": "host RSS",
    "rewards/chosen": "chosen",
    "rewards/rejected": "rejected",
    "rewards/margins": "margin",
}
INSTALL = "pip install matplotlib"
PLOT_MARKER = (
    ".ds_longctx-plot"  # which PNGs of --out a plot wrote, with their sha256 (disk.mark_written)
)


def read_runs(dirs: list) -> dict:
    """{label: metrics lines} per run directory, labelled by its name; ValueError naming one without
    a readable metrics.jsonl."""
    runs = {}
    names = [Path(d).resolve().name for d in dirs]
    for d, name in zip(dirs, names):
        path = Path(d) / METRICS_FILE
        if not path.is_file():
            raise ValueError(
                f"{d}: no {METRICS_FILE} there; pass a run's output_dir (the directory `ds-longctx "
                f"train` wrote {METRICS_FILE} into)"
            )
        try:
            lines = read_jsonl(path)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(
                f"{path} cannot be read as JSON lines ({type(e).__name__}: {e}); pass a run's "
                f"metrics.jsonl as the run wrote it"
            ) from None
        runs[name if names.count(name) == 1 else str(d)] = [
            r for r in lines if isinstance(r, dict) and "step" in r
        ]
    return runs


def series(lines: list, field: str) -> tuple:
    """(steps, values) of the lines that carry a numeric `field`."""
    points = [(r["step"], r[field]) for r in lines if isinstance(r.get(field), (int, float))]
    return tuple(zip(*points)) if points else ((), ())


def figures(runs: dict) -> dict:
    """{panel: Figure} of every panel at least one run has a field of."""
    from matplotlib.figure import Figure

    out = {}
    for panel, (ylabel, fields, unit) in PANELS.items():
        drawn = [(label, f, series(lines, f)) for label, lines in runs.items() for f in fields]
        drawn = [(label, f, s) for label, f, s in drawn if s[0]]
        if not drawn:
            continue
        fig = Figure(figsize=(7, 4), layout="constrained")
        ax = fig.add_subplot()
        colours = {label: f"C{i}" for i, label in enumerate(runs)}
        for label, f, (steps, values) in drawn:
            name = label if len(fields) == 1 else f"{label}: {NAMES[f]}"
            ax.plot(
                steps,
                [v / unit for v in values],
                color=colours[label],
                label=name,
                **STYLES.get(f, {}),
            )
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(panel.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        out[panel] = fig
    return out


def plot_runs(dirs: list, out) -> list:
    """Write `out`/PANEL.png for each panel of the runs in `dirs`; the paths written. ValueError on
    a bad run directory or a missing matplotlib (naming its install)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            f"ds-longctx plot draws with matplotlib, which is not installed: {INSTALL}"
        ) from None
    runs = read_runs(dirs)
    figs = figures(runs)
    if not figs:
        raise ValueError(
            f"{', '.join(map(str, dirs))}: no line of {METRICS_FILE} has any of "
            f"{sorted({f for _, fields, _ in PANELS.values() for f in fields})}; nothing to plot"
        )
    out, names = Path(user_path(str(out))), [f"{panel}.png" for panel in figs]
    if out.is_dir() and (theirs := not_ours(out, PLOT_MARKER, names)):
        raise ValueError(
            f"--out {out} holds {', '.join(theirs)}, which no plot wrote there (or changed since), "
            "so "
            f"nothing is written; choose another --out (an earlier plot's own files are replaced)"
        )
    out.mkdir(parents=True, exist_ok=True)
    for name, fig in zip(names, figs.values()):
        fig.savefig(out / name, dpi=100)
    mark_written(out, PLOT_MARKER, names)
    return [out / name for name in names]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds-longctx plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="a run's output_dir (holding metrics.jsonl)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory for the PNGs (default: RUN_DIR/plots of the first run)",
    )
    return p


def main(argv: list) -> int:
    a = parser().parse_args(argv)
    out = a.out or str(Path(a.runs[0]) / "plots")
    try:
        written = plot_runs(a.runs, out)
    except ValueError as e:
        refuse(f"refused: {e}")
    except OSError as e:
        refuse(
            f"refused: --out {out}: cannot write there ({type(e).__name__}: {e}); choose another "
            "--out"
        )
    print(
        f"{len(written)} plot(s) of {len(a.runs)} run(s) in {out}: "
        f"{', '.join(p.name for p in written)}",
        file=sys.stdout,
        flush=True,
    )
    return 0
