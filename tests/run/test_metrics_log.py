"""run/metrics_log.py's writers in one process: Weights & Biases offline (a stand-in module records
what it is asked), a missing package named before anything is written, an older file's `tensorboard`
key read as report_to."""

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


def test_wandb_online_with_its_host_unreachable_is_refused_in_one_line_within_seconds(monkeypatch):
    """WANDB_MODE=online and a W&B host that answers no connect (a local port nobody listens on):
    refused in
    one line naming the host and WANDB_MODE=offline, in seconds; offline needs no probe, and a host
    that answers passes."""
    import socket
    import time

    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())  # wandb "installed"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_MODE", "online")
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        metrics_log.check_reporter("wandb")
    assert time.monotonic() - t0 < metrics_log.PROBE_S + 2
    assert str(e.value).startswith(
        f"report_to=wandb with WANDB_MODE=online: the W&B host 127.0.0.1:{port} cannot be reached ("
    ) and str(e.value).endswith(
        "); set WANDB_MODE=offline (`wandb sync` uploads the run later), or report_to: none"
    )
    assert "\n" not in str(e.value)
    for mode in ("offline", "disabled"):
        monkeypatch.setenv("WANDB_MODE", mode)
        metrics_log.check_reporter("wandb")
    monkeypatch.delenv("WANDB_MODE")  # unset: the run sets offline
    metrics_log.check_reporter("wandb")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listening.getsockname()[1]}")
        monkeypatch.setenv("WANDB_MODE", "online")
        metrics_log.check_reporter("wandb")
