"""run/metrics_log.py's writers in one process: Weights & Biases offline (a stand-in module records what it is
asked), a missing package named before anything is written, an older file's `tensorboard` key read as report_to."""

import os
import sys
from types import SimpleNamespace

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.run import metrics_log
from tests.helpers import read_metrics


def test_wandb_runs_offline_under_the_run_and_logs_every_train_line(tmp_path, monkeypatch):
    calls = []
    run = SimpleNamespace(
        log=lambda values, step: calls.append(("log", step, values)),
        finish=lambda: calls.append(("finish",)),
    )
    fake = SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = RunConfig(report_to="wandb", output_dir=str(tmp_path))
    log = metrics_log.MetricsLog(tmp_path, 0, "wandb", enabled=True, cfg=cfg)
    assert os.environ["WANDB_MODE"] == "offline"
    log.write(
        {
            "step": 1,
            "loss": 2.5,
            "lr": 1e-3,
            "grad_norm": 0.7,
            "trained_tokens": 60,
            "tokens_per_s": 9.0,
            "seconds": 1.0,
            "peak_gpu_bytes": 0,
            "host_rss_bytes": 5,
        }
    )
    log.write({"step": 1, "eval_loss": 2.0})
    log.close()
    init = calls[0][1]
    assert init["dir"] == str(tmp_path) and init["config"]["logging"]["report_to"] == "wandb"
    assert calls[1] == (
        "log",
        1,
        {
            "train/loss": 2.5,
            "train/lr": 1e-3,
            "train/grad_norm": 0.7,
            "train/tokens_per_s": 9.0,
            "train/seconds": 1.0,
            "train/trained_tokens": 60,
            "train/peak_gpu_bytes": 0,
            "train/host_rss_bytes": 5,
        },
    )
    assert calls[2] == ("log", 1, {"eval/loss": 2.0}) and calls[3] == ("finish",)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 1]


def test_a_missing_reporter_is_named_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(
        ValueError, match="report_to=wandb needs the wandb package: pip install wandb"
    ):
        metrics_log.check_reporter("wandb")
    metrics_log.check_reporter("auto")  # auto falls back to metrics.jsonl alone
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "old,want",
    [
        ({"tensorboard": False}, "none"),
        ({"logging": {"tensorboard": True}}, "auto"),
        ({"logging.tensorboard": "false"}, "none"),
    ],
)
def test_an_older_files_tensorboard_key_reads_as_report_to(old, want):
    assert RunConfig(**old).logging.report_to == want
