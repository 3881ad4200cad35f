"""`ds-longctx plot`: two runs' metrics.jsonl (written here by hand, no training) drawn and written
as PNGs, a field a run lacks left out, and a directory without metrics.jsonl refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_longctx.run.plots import PLOT_MARKER
from tests.helpers import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(d: Path, lines: list) -> Path:
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return d


def two_runs(tmp_path: Path) -> tuple:
    """`full`: every field, an eval line at step 2; `older`: no lr nor grad_norm (written before
    they existed)."""
    full = [
        {
            "step": s,
            "loss": 5.0 - s,
            "lr": 1e-3 * s,
            "grad_norm": 2.0 / s,
            "tokens": 512,
            "tokens_per_s": 100.0 * s,
            "peak_gpu_bytes": int(2e9 * s),
            "host_rss_bytes": int(3e9),
        }
        for s in (1, 2, 3)
    ]
    full.insert(2, {"step": 2, "eval_loss": 4.5, "eval_tokens": 1024, "eval_rows": 2})
    older = [
        {
            "step": s,
            "loss": 6.0 - s,
            "tokens": 512,
            "tokens_per_s": 50.0,
            "peak_gpu_bytes": 0,
            "host_rss_bytes": int(1e9),
        }
        for s in (1, 2)
    ]
    return write_run(tmp_path / "full", full), write_run(tmp_path / "older", older)


def test_each_panel_draws_each_runs_fields_against_step(tmp_path):
    from ds_longctx.run.plots import PANELS, figures, read_runs

    full, older = two_runs(tmp_path)
    figs = figures(read_runs([str(full), str(older)]))
    assert list(figs) == [
        p for p in PANELS if not p.startswith("reward")
    ]  # no dpo run: no reward panel
    drawn = {
        p: {
            line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in f.axes[0].lines
        }
        for p, f in figs.items()
    }
    assert drawn["loss"] == {
        "full: train": ([1, 2, 3], [4.0, 3.0, 2.0]),
        "full: eval": ([2], [4.5]),
        "older: train": ([1, 2], [5.0, 4.0]),
    }
    assert drawn["lr"] == {
        "full": ([1, 2, 3], [1e-3, 2e-3, 3e-3])
    }  # older has no lr: left out, no error
    assert set(drawn["grad_norm"]) == {"full"}
    assert drawn["memory"]["full: peak GPU reserved"] == ([1, 2, 3], [2.0, 4.0, 6.0])  # GB
    assert drawn["memory"]["older: host RSS"] == ([1, 2], [1.0, 1.0])


def test_a_dpo_run_draws_its_rewards_and_their_accuracy(tmp_path):
    from ds_longctx.run.plots import figures, read_runs

    lines = [
        {
            "step": s,
            "loss": 0.7 / s,
            "rewards/chosen": 0.1 * s,
            "rewards/rejected": -0.2 * s,
            "rewards/margins": 0.3 * s,
            "rewards/accuracies": 0.5,
        }
        for s in (1, 2)
    ]
    figs = figures(read_runs([str(write_run(tmp_path / "dpo", lines))]))
    drawn = {
        p: {line.get_label(): list(line.get_ydata()) for line in f.axes[0].lines}
        for p, f in figs.items()
    }
    assert drawn["rewards"] == {
        "dpo: chosen": [0.1, 0.2],
        "dpo: rejected": [-0.2, -0.4],
        "dpo: margin": [0.3, 0.6],
    }
    assert drawn["reward_accuracy"] == {"dpo": [0.5, 0.5]}


def test_plot_writes_a_png_per_panel_for_two_runs(tmp_path):
    full, older = two_runs(tmp_path)
    out = tmp_path / "plots"
    res = run_cli(["plot", str(full), str(older), "--out", str(out)], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["grad_norm.png", "loss.png", "lr.png", "memory.png", "tokens_per_s.png"], names
    assert sorted(p.name for p in out.iterdir()) == sorted(names + [PLOT_MARKER])
    assert all(
        (out / n).read_bytes().startswith(PNG) and (out / n).stat().st_size > 5000 for n in names
    )
    assert f"5 plot(s) of 2 run(s) in {out}" in res.stdout


def test_only_the_panels_a_run_has_are_written(tmp_path):
    """A run without lr and grad_norm (an older metrics.jsonl): no lr.png, no grad_norm.png; the
    default --out."""
    _, older = two_runs(tmp_path)
    res = run_cli(["plot", str(older)], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in (older / "plots").iterdir()) == sorted(
        [PLOT_MARKER, "loss.png", "memory.png", "tokens_per_s.png"]
    )


def test_a_directory_without_metrics_is_refused_naming_it(tmp_path):
    full, _ = two_runs(tmp_path)
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    res = run_cli(["plot", str(full), str(empty), "--out", str(tmp_path / "plots")], timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("refused:") and str(empty) in last and "metrics.jsonl" in last, last
    assert not (tmp_path / "plots").exists()


def test_without_matplotlib_plot_is_refused_naming_the_install(tmp_path, monkeypatch):
    import sys

    import pytest

    from ds_longctx.run import plots

    full, _ = two_runs(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(ValueError, match="pip install matplotlib"):
        plots.plot_runs([str(full)], tmp_path / "plots")


def test_plot_out_keeps_a_users_own_png(tmp_path):
    """--out holding a PNG of a panel's name that no plot wrote (or one changed since) is refused,
    nothing written; an earlier plot's own unchanged PNGs are replaced."""
    from ds_longctx.run.plots import plot_runs

    _, older = two_runs(tmp_path)
    out = tmp_path / "figures"
    assert sorted(p.name for p in plot_runs([older], out)) == [
        "loss.png",
        "memory.png",
        "tokens_per_s.png",
    ]
    plot_runs([older], out)  # its own files: replaced
    (out / "loss.png").write_bytes(PNG + b"my own figure")
    with pytest.raises(ValueError) as e:
        plot_runs([older], out)
    assert str(e.value) == (
        f"--out {out} holds loss.png, which no plot wrote there (or changed since), so nothing is "
        f"written; choose another --out (an earlier plot's own files are replaced)"
    )
    assert (out / "loss.png").read_bytes() == PNG + b"my own figure"
