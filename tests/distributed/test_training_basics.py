"""The training basics on CPU (ZeRO-3, 2 gloo processes, SP=2, fp32): gradient accumulation of 4
equals one step over the same 4 micro-batches; a cosine schedule with warm-up reaches its floor at
the last step; every metrics line carries loss, lr, grad norm, trained tokens, tokens/s, step time
and peaks; TensorBoard events hold the same numbers; `--epochs 2` runs two passes over the data's
rows."""

import math

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.plan.lr_schedule import lr_factor
from tests.corpus import token_ids
from tests.helpers import read_metrics, rel_err, run_cli, text_run_args

pytestmark = pytest.mark.slow
RUN = [
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "64",
    "--sp_size",
    "2",
    "--dtype",
    "fp32",
    "--steps",
    "3",
    "--lr",
    "1e-3",
    "--lr_schedule",
    "cosine",
    "--warmup_steps",
    "1",
    "--min_lr",
    "1e-4",
]


def train(out, *extra):
    res = run_cli(["train", "--nproc", "2", *RUN, "--output_dir", str(out), *extra], output_dir=out)
    assert res.returncode == 0, res.stderr[-3000:]
    return read_metrics(out)


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("accum") / "run"
    return out, train(out, "--micro_batch", "1", "--grad_accum", "4", "--report_to", "tensorboard")


def test_grad_accum_of_4_equals_one_step_over_the_4_micro_batches(accumulated, tmp_path):
    _, acc = accumulated
    one = train(tmp_path / "one", "--micro_batch", "4", "--grad_accum", "1", "--report_to", "none")
    assert [r["trained_tokens"] for r in acc] == [r["trained_tokens"] for r in one]
    assert max(rel_err(a["loss"], b["loss"]) for a, b in zip(acc, one)) <= 1e-5, (acc, one)
    assert max(rel_err(a["grad_norm"], b["grad_norm"]) for a, b in zip(acc, one)) <= 1e-5
    assert acc[0]["tokens"] == one[0]["tokens"] == 4 * 64  # 4 sequences a step either way


def test_cosine_with_warmup_reaches_its_floor_at_the_last_step(accumulated):
    _, rows = accumulated
    assert [r["lr"] for r in rows] == pytest.approx([0.0, 1e-3, 1e-4])
    cfg = RunConfig(lr=1e-3, min_lr=1e-4, lr_schedule="cosine", warmup_steps=10)
    f = lr_factor(cfg.optimizer, 110)  # 10 warm-up steps, then a half cosine over steps 11..110
    assert [f(i) for i in (0, 5, 10)] == pytest.approx([0, 0.5, 1])
    assert f(60) * 1e-3 == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 50 / 99)) / 2)
    assert f(109) * 1e-3 == pytest.approx(1e-4)
    lin = lr_factor(RunConfig(lr=1e-3, min_lr=0.0, lr_schedule="linear").optimizer, 5)
    assert [lin(i) for i in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])


def test_every_metrics_line_has_the_basics_and_tensorboard_holds_them(accumulated):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows = accumulated
    for r in rows:
        for key in (
            "loss",
            "lr",
            "grad_norm",
            "trained_tokens",
            "tokens_per_s",
            "seconds",
            "peak_gpu_bytes",
            "host_rss_bytes",
        ):
            assert r.get(key) is not None, (key, r)
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        assert 0 < r["optimizer_s"] < r["seconds"]  # the optimizer step's share of the step
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    for key in ("loss", "lr", "grad_norm", "trained_tokens"):
        got = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows], key


def test_epochs_run_two_passes_over_the_rows(tmp_path):
    from tests.corpus import documents

    args = text_run_args(tmp_path / "data", docs=20)
    tokens = sum(len(ids) + 1 for ids in token_ids(documents(20, seed=1)))  # + EOS per document
    rows = tokens // 64  # concat: rows of seq_len
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *args,
            "--epochs",
            "2",
            "--grad_accum",
            "2",
            "--report_to",
            "none",
            "--output_dir",
            str(tmp_path / "run"),
        ],
        output_dir=tmp_path / "run",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    per_epoch = rows // 2  # dp 1 x micro_batch 1 x grad_accum 2
    assert len(read_metrics(tmp_path / "run")) == 2 * per_epoch
    assert f"epochs 2: {rows} rows, {per_epoch} steps an epoch" in res.stderr
    both = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *args,
            "--epochs",
            "2",
            "--steps",
            "5",
            "--output_dir",
            str(tmp_path / "x"),
        ]
    )
    assert (
        both.returncode == 2
        and "both say how long to train" in both.stderr.strip().splitlines()[-1]
    )


def test_two_replicas_with_unequal_trained_tokens_equal_one_replica_over_both_rows(tmp_path):
    """Packed rows hold different numbers of trained tokens (padding, document ends): DP=2 weighs
    every trained token of the step alike, as one process accumulating the same two rows does; so
    does the per-sequence mean."""
    args = [a for a in text_run_args(tmp_path / "data") if a not in ("--sp_size", "2")]
    base = [*args, "--data_layout", "pack", "--steps", "2", "--report_to", "none"]
    for average in ("tokens", "sequences"):
        dp2 = run_cli(
            [
                "train",
                "--nproc",
                "2",
                *base,
                "--sp_size",
                "1",
                "--loss_average",
                average,
                "--output_dir",
                str(tmp_path / f"dp2_{average}"),
            ],
            output_dir=tmp_path / f"dp2_{average}",
        )
        one = run_cli(
            [
                "train",
                "--nproc",
                "1",
                *base,
                "--grad_accum",
                "2",
                "--loss_average",
                average,
                "--output_dir",
                str(tmp_path / f"one_{average}"),
            ],
            output_dir=tmp_path / f"one_{average}",
        )
        assert dp2.returncode == 0 and one.returncode == 0, (dp2.stderr[-2000:], one.stderr[-2000:])
        a, b = read_metrics(tmp_path / f"dp2_{average}"), read_metrics(tmp_path / f"one_{average}")
        assert [r["trained_tokens"] for r in a] == [r["trained_tokens"] for r in b]
        assert max(rel_err(x["loss"], y["loss"]) for x, y in zip(a, b)) <= 1e-5, (average, a, b)
        assert max(rel_err(x["grad_norm"], y["grad_norm"]) for x, y in zip(a, b)) <= 1e-5, (
            average,
            a,
            b,
        )
