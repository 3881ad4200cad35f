"""The HF Trainer and TRL's SFTTrainer through `ds_longctx.integrations.hf_trainer` (CPU, gloo, 2 processes, SP=2,
qwen3-tiny, fp32): step for step the losses `ds-longctx train` writes for the same token rows, seed and optimizer
settings, with the Trainer's step counter, epoch and logged loss right, for concatenated and packed rows; eval under
SP gives the step-1 loss on the step-1 rows; and launch/trl_sft.py (SFTTrainer on a folder of text files) runs under
`accelerate launch` with the accelerate.yaml of `ds-longctx plan`.
"""

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import (
    ROOT,
    cpu_env,
    documents,
    free_port,
    make_tokenizer,
    read_metrics,
    rel_err,
    run_cli,
    torchrun,
    write_txt_dir,
)

pytestmark = pytest.mark.slow
STEP1, STEP2 = 1e-5, 1e-4  # fp32 rel: the step-1 loss, the step-2 loss (after one optimizer step)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list:
    """Run-config options over a folder of text files and a word-level tokenizer (the seed guide's books, in small)."""
    d = tmp_path_factory.mktemp("books")
    make_tokenizer(d / "tok")
    write_txt_dir(d / "books", documents(120, seed=1))
    return ["--model", "qwen3-tiny", "--seq_len", "64", "--dtype", "fp32", "--lr", "1e-3", "--sp_size", "2",
            "--data", str(d / "books"), "--tokenizer", str(d / "tok"), "--data_cache_dir", str(d / "cache"),
            "--steps", "2"]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """layout -> the per-step losses `ds_longctx.train` writes on 2 processes for the corpus (each layout run once;
    the processes `ds-longctx train --nproc 2` starts)."""
    runs = {}

    def losses(layout: str) -> list:
        if layout not in runs:
            out = tmp_path_factory.mktemp(f"ref_{layout}")
            torchrun(2, ["ds_longctx.train", *corpus, "--data_layout", layout, "--output_dir", str(out)], module=True)
            runs[layout] = [r["loss"] for r in read_metrics(out)]
            assert len(runs[layout]) == 2
        return runs[layout]
    return losses


def assert_same_losses(got: list, ref: list) -> None:
    assert len(got) == 2, got
    assert rel_err(got[0], ref[0]) <= STEP1, (got, ref)
    assert rel_err(got[1], ref[1]) <= STEP2, (got, ref)


@pytest.mark.parametrize("kind,layout", [("trainer", "concat"), ("sft", "pack")])
def test_trainer_logs_the_ds_longctx_train_losses(tmp_path, corpus, reference, kind, layout):
    out = tmp_path / "result.json"
    res = torchrun(2, ["tests/distributed/hf_trainer_worker.py", "--trainer", kind, "--out", str(out), "--", *corpus,
                       "--data_layout", layout, "--output_dir", str(tmp_path / "run")])
    # optimizer.state_at_build under the Trainer too: the Adam moments before the first batch (run/optimizer_state.py)
    assert "optimizer state: made at build for 1 sub-groups (AdamW" in res.stdout + res.stderr
    got = json.loads(out.read_text())
    ref = reference(layout)
    history = got["log_history"]
    train = [h for h in history if "loss" in h]
    assert_same_losses([h["loss"] for h in train], ref)
    # the step counter: 2 optimizer steps, not 2 x sp; an epoch is rows / dp steps; the batch counts dp replicas
    dp = got["dp"]
    assert got["global_step"] == 2 and [h["step"] for h in train] == [1, 2]
    # each logged step carries its time (as metrics.jsonl's `seconds`); no GPU here, so no peak_gpu_bytes
    assert all(h["seconds"] > 0 and "peak_gpu_bytes" not in h for h in train), train
    assert got["steps_per_epoch"] == got["n_rows"] // dp
    assert train[1]["epoch"] == pytest.approx(2 / got["steps_per_epoch"])
    assert got["train_batch_size"] == dp  # DeepSpeed's micro_batch x accumulation x dp (micro_batch 1)
    final = next(h for h in history if "train_loss" in h)
    assert final["train_loss"] == pytest.approx(sum(h["loss"] for h in train) / 2, rel=1e-6)
    # eval under SP before the first step, on the first step's rows: the step-1 loss
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert len(evals) == 1 and rel_err(evals[0], ref[0]) <= STEP1, (evals, ref)
    assert got["sp_peers_same"]
    if layout == "pack":  # the documents of the row reached the attention as separate sequences
        assert got["documents"] > 1, got["documents"]


def test_sft_trainer_tokenizes_a_text_dataset_on_the_documented_route(tmp_path, corpus):
    """The README's route with your own `datasets.Dataset` of text (a `text` column) instead of rows_dataset: the args
    of `training_args` skip TRL's preparation for our rows; `trainer` gives a text dataset back to TRL to tokenize
    (no "No columns in the dataset match" error), and it trains 2 steps under SP=2."""
    out = tmp_path / "result.json"
    torchrun(2, ["tests/distributed/hf_trainer_worker.py", "--trainer", "sft_text", "--out", str(out), "--",
                 *corpus, "--output_dir", str(tmp_path / "run")])
    got = json.loads(out.read_text())
    assert got["global_step"] == 2 and got["dataset_kwargs"] == {}, got
    assert len(got["losses"]) == 2 and all(4 < x < 6.5 for x in got["losses"]), got  # about ln 64 words + specials


def test_trl_sft_example_under_accelerate_launch_with_the_plans_config(tmp_path, corpus, reference):
    """launch/trl_sft.py as README's "Use from TRL" runs it: `ds-longctx plan` writes accelerate.yaml and run.yaml,
    `accelerate launch` starts 2 processes; the options after --config override the plan (fp32, the corpus, and both
    layers' attention output cached: the plan caches none at the tiny model's head_dim 16, where a GPU would run
    cuDNN SDPA, but the CPU's flash kernel pair caches). Rank 0 prints one JSON line per logged step."""
    plan = tmp_path / "plan"
    res = run_cli(["plan", "--model", "qwen3-tiny", "--seq_len", "64", "--gpus", "2", "--out", str(plan)])
    assert res.returncode == 0, res.stderr[-3000:]
    env = cpu_env()
    env["PATH"] = f"{sys.executable.rsplit('/', 1)[0]}:{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(plan / "accelerate.yaml"),
           "--main_process_port", str(free_port()), "launch/trl_sft.py", "--config", str(plan / "run.yaml"),
           *corpus, "--placement", "cache:2", "--output_dir", str(tmp_path / "run")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    logs = [json.loads(m) for m in re.findall(r'\{"step": [^{}]*\}', res.stdout)]
    assert_same_losses([r["loss"] for r in logs if "loss" in r], reference("concat"))
    assert [r["step"] for r in logs if "loss" in r] == [1, 2]
    saved = tmp_path / "run"  # as any HF Trainer run: the model and tokenizer, and the run config's report_to
    assert (saved / "config.json").is_file() and list(saved.glob("*.safetensors"))
    assert (saved / "tokenizer.json").is_file()
    assert list((saved / "runs").rglob("events.out.tfevents.*")), sorted(p.name for p in saved.rglob("*"))
