"""Evaluation on CPU (ZeRO-3, gloo, real processes, tiny Qwen3, fp32): the eval loss and the
per-position curve of SP=2, and of dp=2 with a row left over, equal SP=1's and a plain HF model's
per-token cross-entropy written here (rel <= 1e-5); nothing is kept for backward and the peak does
not grow with the rows; `ds-longctx eval` of a checkpoint saved by `ds-longctx train` gives that
run's in-training eval at the same step; bad input exits 2 before any worker starts."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import read_metrics, rel_err, run_cli, tiny_model, torchrun

pytestmark = pytest.mark.slow
TOL = 1e-5
BUCKETS = (
    6  # 64 positions in 6 buckets: spans of 10 and 11, edges not multiples of the SP slice (32)
)


def evaluate(tmp_path, nproc, sp, rows=3, micro_batch=1, length=64, memory=False, levers=()):
    out = tmp_path / f"eval_{nproc}_{sp}_{micro_batch}_{memory}_{len(levers)}.pt"
    torchrun(
        nproc,
        [
            "tests/distributed/eval_worker.py",
            "--sp",
            str(sp),
            "--rows",
            str(rows),
            "--length",
            str(length),
            "--micro_batch",
            str(micro_batch),
            "--buckets",
            str(BUCKETS),
            "--out",
            str(out),
            *(["--memory"] if memory else []),
            *(x for kv in levers for x in ("--set", kv)),
        ],
    )
    return torch.load(out)


# every lever whose layers act differently in training: offloaded checkpoint, cached attention,
# tiled MLP, plain CE
LEVERS = (
    "activation_offload=true",
    "offload_layers=1",
    "attention_cache_layers=1",
    "tiled_mlp=true",
    "tile_tokens=7",
    "chunked_loss=false",
)


def reference(input_ids, labels, buckets):
    """(token-mean CE, per-bucket mean CE, per-bucket tokens) of a plain HF model in eval mode:
    position i of a row
    predicts labels[i + 1] and falls in bucket floor(i * buckets / L)."""
    model = tiny_model(seed=0, attn="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()  # [R, L, V]
    target = torch.full_like(labels, -100)
    target[:, :-1] = labels[:, 1:]
    ce = F.cross_entropy(
        logits.transpose(1, 2), target, reduction="none"
    ).double()  # [R, L], 0 where ignored
    valid = target != -100
    L = input_ids.shape[1]
    bucket = [math.floor(i * buckets / L) for i in range(L)]
    sums, counts = [0.0] * buckets, [0] * buckets
    for i, k in enumerate(bucket):
        sums[k] += float(ce[:, i][valid[:, i]].sum())
        counts[k] += int(valid[:, i].sum())
    curve = [s / c if c else None for s, c in zip(sums, counts)]
    return sum(sums) / sum(counts), curve, counts


@pytest.fixture(scope="module")
def sp1(tmp_path_factory):
    return evaluate(tmp_path_factory.mktemp("sp1"), 1, 1)


@pytest.mark.parametrize(
    "nproc,sp,micro_batch,levers",
    [(1, 1, 1, ()), (2, 2, 2, ()), (2, 1, 1, ()), (2, 2, 1, LEVERS)],
    ids=["sp1", "sp2_micro_batch2", "dp2_row_left_over", "sp2_every_lever"],
)
def test_eval_loss_and_curve_equal_sp1_and_plain_hf(tmp_path, sp1, nproc, sp, micro_batch, levers):
    got = (
        sp1 if nproc == 1 else evaluate(tmp_path, nproc, sp, micro_batch=micro_batch, levers=levers)
    )
    per_batch = (
        nproc // sp * micro_batch
    )  # rows per eval batch over all replicas: 3 rows become 4 with 2 a batch,
    assert (
        got["input_ids"].shape[0] == -(-3 // per_batch) * per_batch
    )  # the last one with every label ignored
    loss, curve, counts = reference(got["input_ids"], got["labels"], BUCKETS)
    assert got["edges"] == [math.ceil(k * 64 / BUCKETS) for k in range(BUCKETS + 1)]
    assert got["tokens"] == 3 * 63 and got["bucket_tokens"] == counts
    assert rel_err(got["loss"], loss) <= TOL, (got["loss"], loss)
    assert rel_err(got["bucket_loss"], curve) <= TOL, (got["bucket_loss"], curve)
    assert (
        rel_err(got["loss"], sp1["loss"]) <= TOL
        and rel_err(got["bucket_loss"], sp1["bucket_loss"]) <= TOL
    )
    assert got["rows"] == 3 and torch.equal(got["input_ids"][:3], sp1["input_ids"])
    assert got["training_after"]  # eval mode for the call only
    assert got["saved_for_backward"] == 0  # no activation kept for a backward, under SP too


def test_eval_peak_does_not_grow_with_rows(tmp_path):
    """Peak CPU bytes allocated while evaluating 2 and 8 rows of 256 tokens (one process: the
    profiler does not see gloo's threads free the SP all-to-all buffers;
    tests/distributed/eval_worker.py). The meter is exact enough to see a 64 KiB hidden state kept
    per row."""
    got = evaluate(tmp_path, 1, 1, length=256, memory=True)
    assert got["peak_2"] > 0 and got["saved_for_backward"] == 0
    assert got["peak_8"] <= got["peak_2"], (got["peak_8"], got["peak_2"])
    assert got["peak_8_keeping_rows"] >= got["peak_2"] + 8 * got["kept_bytes_per_row"]


# ----------------------------------------------------------------------------- the command line
EVAL = ["--eval_data", "synthetic", "--eval_rows", "3", "--eval_buckets", "4"]


def train(out, extra=()):
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--model",
            "qwen3-tiny",
            "--seq_len",
            "64",
            "--steps",
            "3",
            "--dtype",
            "fp32",
            "--lr",
            "1e-3",
            "--save_every",
            "2",
            *extra,
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """3 steps of `ds-longctx train` (SP=2) with an evaluation after every step and checkpoints at
    steps 2 and 3."""
    out = tmp_path_factory.mktemp("trained") / "run"
    return out, train(out, [*EVAL, "--eval_every", "1"])


def test_train_writes_eval_lines_curve_and_progress_bar(trained, tmp_path):
    out, log = trained
    rows = read_metrics(out)
    train_rows, evals = [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in rows] == [1, 1, 2, 2, 3, 3] and "eval_loss" not in train_rows[0]
    assert [(r["step"], r["eval_tokens"], r["eval_rows"]) for r in evals] == [
        (s, 3 * 63, 3) for s in (1, 2, 3)
    ]
    curve = read_metrics(out, "eval_curve.jsonl")
    assert [c["step"] for c in curve] == [1, 2, 3] and curve[0]["edges"] == [0, 16, 32, 48, 64]
    mean = sum(c * n for c, n in zip(curve[2]["loss"], curve[2]["tokens"])) / 189
    assert mean == pytest.approx(evals[2]["eval_loss"])
    assert (
        evals[2]["eval_loss"] < evals[0]["eval_loss"]
    )  # the rows are held out, the model learns the format
    assert f"eval={evals[2]['eval_loss']:.4f}" in log
    # evaluating changes nothing in training: the same run without eval has bit-identical losses
    train(tmp_path / "no_eval")
    assert [r["loss"] for r in read_metrics(tmp_path / "no_eval")] == [
        r["loss"] for r in train_rows
    ]


@pytest.mark.parametrize(
    "nproc", [[], ["--nproc", "2"]], ids=["world_of_the_checkpoint", "nproc_given"]
)
def test_ds_longctx_eval_of_the_checkpoint_gives_the_in_training_eval(trained, tmp_path, nproc):
    """Without --nproc eval starts the checkpoint's world; with it (as its --help documents) the
    same, the option reaching the workers as given (torchrun once took it for an ambiguous
    --nproc-per-node)."""
    out, _ = trained
    res = run_cli(
        [
            "eval",
            "--checkpoint",
            str(out),
            "--tag",
            "step2",
            "--data",
            "synthetic",
            "--out",
            str(tmp_path),
            *nproc,
        ],
        timeout=300,
        output_dir=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    (trained_eval,) = [r for r in read_metrics(out) if "eval_loss" in r and r["step"] == 2]
    (line,) = read_metrics(tmp_path)
    assert line["step"] == 2 and line["checkpoint"].endswith("step2") and line["eval_tokens"] == 189
    assert rel_err(line["eval_loss"], trained_eval["eval_loss"]) <= 1e-6, (line, trained_eval)
    (curve,), trained_curve = (
        read_metrics(tmp_path, "eval_curve.jsonl"),
        read_metrics(out, "eval_curve.jsonl")[1],
    )
    assert rel_err(curve["loss"], trained_curve["loss"]) <= 1e-6
    assert f"eval_loss {line['eval_loss']:.6f}" in res.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["--nproc", "1"],
            "written by world_size=2 with sp_size=2, this eval has 1 processes; ZeRO-3 partitions "
            "are per rank: evaluate with --nproc 2",
        ),
        (["--seq_len", "128"], "changes seq_len: 64 -> 128"),
        (["--tag", "step9"], "checkpoint tag 'step9' does not exist"),
        (["--rows", "0"], "eval_rows=0 must be >= 1"),
        (["--data", "/no/such.jsonl"], "data='/no/such.jsonl' does not exist"),
    ],
    ids=["layout", "model_key", "tag", "rows", "data"],
)
def test_ds_longctx_eval_refuses_bad_input_before_work(trained, tmp_path, args, needle):
    out, _ = trained
    before = (out / "metrics.jsonl").read_text()
    data = [] if "--data" in args else ["--data", "synthetic"]
    res = run_cli(["eval", "--checkpoint", str(out), *data, *args], timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert needle in res.stderr and last.startswith(("refused before start", "  eval.rows")), (
        res.stderr[-2000:]
    )
    assert (
        "torch.distributed.run" not in res.stderr and "Traceback" not in res.stderr
    )  # no worker started
    assert (out / "metrics.jsonl").read_text() == before


def test_eval_into_a_run_another_process_writes_is_refused_and_eval_elsewhere_only_reads(
    trained, tmp_path, capsys, monkeypatch
):
    """`ds-longctx eval` writes its lines into the run's output_dir by default: while another
    process holds that directory's lock it exits 2 before any worker, naming the holder; with --out
    elsewhere it only reads the run and starts, holding the lock of --out alone (in-process, the
    workers' start faked)."""
    import os

    from ds_longctx import cli
    from ds_longctx.checkpoint.run_lock import lock_holder
    from tests.helpers import hold_lock

    out, _ = trained
    holder = hold_lock(out)
    try:
        before = (out / "metrics.jsonl").read_text()
        with pytest.raises(SystemExit) as stopped:
            cli.main(["eval", "--checkpoint", str(out), "--data", "synthetic"])
        last = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
        assert stopped.value.code == 2 and last.startswith(
            f"refused before start: output_dir={str(out)!r} is in use by pid {holder.pid} on host "
        )
        assert (
            last.endswith(
                "or pass --out another directory (an eval that writes elsewhere only reads the "
                "checkpoint)"
            )
            and (out / "metrics.jsonl").read_text() == before
        )
        started = []
        monkeypatch.setattr(
            "ds_longctx.run.launch.launch",
            lambda n, args, module, output_dir=None: (
                started.append(lock_holder(tmp_path / "ev")) or 0
            ),
        )
        with pytest.raises(SystemExit) as done:
            cli.main(
                [
                    "eval",
                    "--checkpoint",
                    str(out),
                    "--data",
                    "synthetic",
                    "--out",
                    str(tmp_path / "ev"),
                ]
            )
        assert (
            done.value.code == 0
            and started[0]["pid"] == os.getpid()
            and lock_holder(out)["pid"] == holder.pid
        )
        assert not (
            tmp_path / "ev"
        ).exists()  # released: the lock file and the directory it made (nothing written)
    finally:
        holder.kill()
        holder.wait()


def test_ds_longctx_eval_without_a_checkpoint(tmp_path):
    res = run_cli(["eval", "--checkpoint", str(tmp_path), "--data", "synthetic"], timeout=120)
    assert res.returncode == 2 and "eval: no checkpoint in" in res.stderr, res.stderr[-2000:]


def test_train_refuses_a_bad_eval_section_before_starting_workers(tmp_path):
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--eval_data",
            "synthetic",
            "--eval_rows",
            "0",
            "--output_dir",
            str(tmp_path / "run"),
        ],
        timeout=120,
    )
    assert res.returncode == 2 and "eval_rows=0 must be >= 1" in res.stderr, res.stderr[-2000:]
    assert "torch.distributed.run" not in res.stderr and not (tmp_path / "run").exists()
