"""The HF Trainer and TRL's SFTTrainer through `ds_longctx.integrations.hf_trainer` (CPU, gloo, 2
processes, SP=2, qwen3-tiny, fp32): step for step the losses `ds-longctx train` writes for the same
token rows, seed and optimizer settings, with the Trainer's step counter, epoch and logged loss
right, for concatenated and packed rows; eval under SP gives the step-1 loss on the step-1 rows; and
launch/trl_sft.py (SFTTrainer on a folder of text files) runs under `accelerate launch` with the
accelerate.yaml of `ds-longctx plan`. Which tokens train: TRL's assistant / completion masks and a
tokenized dataset's labels and masks give per row the token set `ds-longctx train` trains (1
process); the loss's weights: DP=2 with unequal trained tokens (one replica none) equals one process
over the same rows, loss and every gradient.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import (
    chat_template,
    documents,
    make_chat_tokenizer,
    make_tokenizer,
    write_txt_dir,
)
from tests.data.test_chat import SESSION, TOOLS
from tests.helpers import ROOT, cpu_env, free_port, read_metrics, rel_err, run_cli, torchrun

pytestmark = pytest.mark.slow
STEP1, STEP2 = 1e-5, 1e-4  # fp32 rel: the step-1 loss, the step-2 loss (after one optimizer step)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list:
    """Run-config options over a folder of text files and a word-level tokenizer (the seed guide's
    books, in small)."""
    d = tmp_path_factory.mktemp("books")
    make_tokenizer(d / "tok")
    write_txt_dir(d / "books", documents(120, seed=1))
    return [
        "--model",
        "qwen3-tiny",
        "--seq_len",
        "64",
        "--dtype",
        "fp32",
        "--lr",
        "1e-3",
        "--sp_size",
        "2",
        "--data",
        str(d / "books"),
        "--tokenizer",
        str(d / "tok"),
        "--data_cache_dir",
        str(d / "cache"),
        "--steps",
        "2",
    ]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """(layout, grad_accum) -> the per-step losses `ds_longctx.train` writes on 2 processes for the
    corpus (each run once; the processes `ds-longctx train --nproc 2` starts)."""
    runs = {}

    def losses(layout: str, accum: int = 1) -> list:
        if (layout, accum) not in runs:
            out = tmp_path_factory.mktemp(f"ref_{layout}_{accum}")
            torchrun(
                2,
                [
                    "ds_longctx.train",
                    *corpus,
                    "--data_layout",
                    layout,
                    "--grad_accum",
                    str(accum),
                    "--output_dir",
                    str(out),
                ],
                module=True,
            )
            runs[layout, accum] = [r["loss"] for r in read_metrics(out)]
            assert len(runs[layout, accum]) == 2
        return runs[layout, accum]

    return losses


def assert_same_losses(got: list, ref: list) -> None:
    assert len(got) == 2, got
    assert rel_err(got[0], ref[0]) <= STEP1, (got, ref)
    assert rel_err(got[1], ref[1]) <= STEP2, (got, ref)


@pytest.mark.parametrize(
    "kind,layout,accum", [("trainer", "concat", 1), ("sft", "pack", 1), ("sft", "concat", 2)]
)
def test_trainer_logs_the_ds_longctx_train_losses(tmp_path, corpus, reference, kind, layout, accum):
    """Step for step the losses `ds-longctx train` writes: a plain Trainer on concatenated rows,
    SFTTrainer on packed rows, and SFTTrainer under grad_accum 2 (a step's two micro-batches, read
    as `ds-longctx train` reads them)."""
    out = tmp_path / "result.json"
    res = torchrun(
        2,
        [
            "tests/distributed/hf_trainer_worker.py",
            "--trainer",
            kind,
            "--out",
            str(out),
            "--",
            *corpus,
            "--data_layout",
            layout,
            "--grad_accum",
            str(accum),
            "--output_dir",
            str(tmp_path / "run"),
        ],
    )
    # optimizer.state_at_build under the Trainer too: the Adam moments before the first batch
    # (run/optimizer_state.py)
    assert "optimizer state: made at build for 1 sub-groups (AdamW" in res.stdout + res.stderr
    got = json.loads(out.read_text())
    ref = reference(layout, accum)
    history = got["log_history"]
    train = [h for h in history if "loss" in h]
    assert_same_losses([h["loss"] for h in train], ref)
    # the step counter: 2 optimizer steps, not 2 x sp; an epoch is rows / (dp x accum) steps of
    # accum micro-batches; the batch counts dp replicas
    dp = got["dp"]
    assert got["global_step"] == 2 and [h["step"] for h in train] == [1, 2]
    # each logged step carries its time (as metrics.jsonl's `seconds`); no GPU here, so no
    # peak_gpu_bytes
    assert all(h["seconds"] > 0 and "peak_gpu_bytes" not in h for h in train), train
    assert (
        got["steps_per_epoch"] == got["n_rows"] // (dp * accum) * accum
    )  # the loader's micro-batches
    assert train[1]["epoch"] == pytest.approx(2 * accum / got["steps_per_epoch"])
    assert (
        got["train_batch_size"] == dp * accum
    )  # DeepSpeed's micro_batch x accumulation x dp (micro_batch 1)
    final = next(h for h in history if "train_loss" in h)
    assert final["train_loss"] == pytest.approx(sum(h["loss"] for h in train) / 2, rel=1e-6)
    # eval under SP before the first step, on the first step's rows: the step-1 loss (concat rows
    # train alike, so the Trainer's mean over the eval batches is the token mean)
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert len(evals) == 1 and rel_err(evals[0], ref[0]) <= STEP1, (evals, ref)
    assert got["sp_peers_same"]
    if layout == "pack":  # the documents of the row reached the attention as separate sequences
        assert got["documents"] > 1, got["documents"]


def test_sft_trainer_tokenizes_a_text_dataset_on_the_documented_route(tmp_path, corpus):
    """The README's route with your own `datasets.Dataset` of text (a `text` column) instead of
    rows_dataset: the args of `training_args` skip TRL's preparation for our rows; `trainer` gives a
    text dataset back to TRL to tokenize (no "No columns in the dataset match" error), and it trains
    2 steps under SP=2."""
    out = tmp_path / "result.json"
    torchrun(
        2,
        [
            "tests/distributed/hf_trainer_worker.py",
            "--trainer",
            "sft_text",
            "--out",
            str(out),
            "--",
            *corpus,
            "--output_dir",
            str(tmp_path / "run"),
        ],
    )
    got = json.loads(out.read_text())
    assert got["global_step"] == 2 and got["dataset_kwargs"] == {}, got
    assert len(got["losses"]) == 2 and all(4 < x < 6.5 for x in got["losses"]), (
        got
    )  # about ln 64 words + specials


def test_trl_sft_example_under_accelerate_launch_with_the_plans_config(tmp_path, corpus, reference):
    """launch/trl_sft.py as README's "Use from TRL" runs it: `ds-longctx plan` writes
    accelerate.yaml and run.yaml, `accelerate launch` starts 2 processes; the options after --config
    override the plan (fp32, the corpus, and both layers' attention output cached: the plan caches
    none at the tiny model's head_dim 16, where a GPU would run cuDNN SDPA, but the CPU's flash
    kernel pair caches). Rank 0 prints one JSON line per logged step. The model is a checkpoint
    directory holding its tokenizer, and no --tokenizer is given: the directory's is taken (TRL's
    script asked the Hub for it)."""
    import shutil

    from tests.helpers import tiny_model

    model = (
        tmp_path / "tiny_qwen3"
    )  # the weights qwen3-tiny's random init draws for seed 0: the reference's
    tiny_model(seed=0).save_pretrained(model)
    tok = corpus[corpus.index("--tokenizer") + 1]
    for f in Path(tok).iterdir():
        shutil.copy(f, model / f.name)
    args = [a for i, a in enumerate(corpus) if "--tokenizer" not in corpus[max(i - 1, 0) : i + 1]]
    args[args.index("--model") + 1] = str(model)
    plan = tmp_path / "plan"
    res = run_cli(
        ["plan", "--model", "qwen3-tiny", "--seq_len", "64", "--gpus", "2", "--out", str(plan)]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    env = cpu_env()
    env["PATH"] = f"{sys.executable.rsplit('/', 1)[0]}:{env.get('PATH', '')}"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(plan / "accelerate.yaml"),
        "--main_process_port",
        str(free_port()),
        "launch/trl_sft.py",
        "--config",
        str(plan / "run.yaml"),
        *args,
        "--placement",
        "cache:2",
        "--output_dir",
        str(tmp_path / "run"),
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    logs = [json.loads(m) for m in re.findall(r'\{"step": [^{}]*\}', res.stdout)]
    assert_same_losses([r["loss"] for r in logs if "loss" in r], reference("concat"))
    assert [r["step"] for r in logs if "loss" in r] == [1, 2]
    saved = (
        tmp_path / "run"
    )  # as any HF Trainer run: the model and tokenizer, and the run config's report_to
    assert (saved / "config.json").is_file() and list(saved.glob("*.safetensors"))
    assert (saved / "tokenizer.json").is_file() and "_ds_longctx" not in (
        saved / "config.json"
    ).read_text()
    assert list((saved / "runs").rglob("events.out.tfevents.*")), sorted(
        p.name for p in saved.rglob("*")
    )


# ----------------------------------------------------------------------------- which tokens train,
# and their weights
SESSIONS = [
    SESSION,
    [{"role": "user", "content": "w11 w12 w13"}, {"role": "assistant", "content": "w14"}],
    [
        {"role": "system", "content": "w1"},
        {"role": "user", "content": "w2"},
        {"role": "assistant", "content": "w3 w4"},
        {"role": "user", "content": "w5 w6"},
        {"role": "assistant", "content": "w7 w8 w9"},
    ],
]
PAIRS = [
    {"prompt": "w1 w2 w3", "completion": " w4 w5"},
    {"prompt": "w6", "completion": " w7 w8 w9"},
    {"prompt": "w10 w11 w12 w13", "completion": " w14"},
]


def token_rows(seed: int, masks: tuple) -> list:
    """Rows of token ids (12-20 ids) with 0/1 masks or labels (-100 where a token does not train)
    drawn at random."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(3):
        ids = [rng.randrange(4, 60) for _ in range(rng.randint(12, 20))]
        row = {"input_ids": ids}
        for key in masks:
            bits = [rng.random() < 0.5 for _ in ids]
            row[key] = (
                [t if b else -100 for t, b in zip(ids, bits)]
                if key == "labels"
                else [int(b) for b in bits]
            )
        rows.append(row)
    return rows


def trained(ids: list, labels: list) -> list:
    """The positions whose label trains, checked to be the token there."""
    assert all(lab in (-100, i) for i, lab in zip(ids, labels)), (ids, labels)
    return [j for j, lab in enumerate(labels) if lab != -100]


def split_documents(ids: list, pos: list, labels: list) -> list:
    """[(ids, trained positions)] of the documents of one row (cut where position_ids restart) that
    train a token (a packed row's padding tail trains none)."""
    starts = [j for j, p in enumerate(pos) if p == 0] + [len(pos)]
    return [
        (ids[a:b], trained(ids[a:b], labels[a:b]))
        for a, b in zip(starts, starts[1:])
        if any(lab != -100 for lab in labels[a:b])
    ]


def documents_of(rows) -> list:
    """The documents of ds_longctx's rows (`split_documents`)."""
    from ds_longctx.data.rows import filled_row

    return [
        d
        for r in range(rows.n_rows)
        for d in split_documents(*(t.tolist() for t in filled_row(*rows.row(r))))
    ]


def loader_documents(batches: list) -> list:
    """The documents of the worker's batches (one row each; packed ones cut at their position
    restarts)."""
    return [
        d
        for b in batches
        for d in split_documents(
            b["input_ids"][0],
            b["position_ids"][0] if b["position_ids"] else list(range(len(b["input_ids"][0]))),
            b["labels"][0],
        )
    ]


def train_documents(tmp_path, name: str, rows: list, tok: str, **kw) -> list:
    """(ids, trained positions) per row as `ds-longctx train` reads them (data.build_data, packed
    rows of 64)."""
    from ds_longctx.config import RunConfig
    from ds_longctx.data import build_data
    from ds_longctx.run.model import load_hf_config

    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RunConfig(
        data=str(path),
        tokenizer=tok,
        seq_len=64,
        data_layout="pack",
        shuffle=False,
        data_cache_dir=str(tmp_path / f"cache_{name}"),
        **kw,
    )
    return documents_of(build_data(cfg, load_hf_config("qwen3-tiny"), 1))


def test_trl_masks_train_the_tokens_ds_longctx_train_does(tmp_path):
    """SFTTrainer's assistant_only_loss (chat rows with tool calls; packed too) and completion-only
    loss (prompt/completion rows), through `longctx.trainer`, train per row exactly the tokens
    `ds-longctx train` trains with train_on assistant / completion on the same rows (the first also
    HF's own assistant mask). A tokenized dataset's `labels` are used as given; a `completion_mask`
    without labels (TRL refuses it when its preparation is skipped) and `assistant_masks` beside
    labels under the plain Trainer (whose unused-column removal drops it) are folded into the
    labels: a token trains where every column says so."""
    from transformers import AutoTokenizer

    tok_dir = str(make_chat_tokenizer(tmp_path / "tok", chat_template(True)))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    chats = [
        {"messages": m, "tools": json.dumps(TOOLS) if m is SESSION else None} for m in SESSIONS
    ]
    labelled, masked, both = (
        token_rows(1, ("labels",)),
        token_rows(2, ("completion_mask",)),
        token_rows(3, ("labels", "assistant_masks")),
    )
    cases = {
        "messages": {"trainer": "sft", "args": {"assistant_only_loss": True}, "rows": chats},
        "packed": {
            "trainer": "sft",
            "args": {"assistant_only_loss": True, "packing": True},
            "rows": chats,
        },
        "pairs": {"trainer": "sft", "rows": PAIRS},
        "labels": {"trainer": "sft", "rows": labelled},
        "completion_mask": {"trainer": "sft", "rows": masked},
        "both": {"trainer": "trainer", "rows": both},
    }
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "got.json"
    torchrun(
        1,
        [
            "tests/distributed/hf_trainer_worker.py",
            "--trainer",
            "masks",
            "--cases",
            str(tmp_path / "cases.json"),
            "--out",
            str(out),
            "--",
            "--model",
            "qwen3-tiny",
            "--seq_len",
            "64",
            "--dtype",
            "fp32",
            "--sp_size",
            "1",
            "--shuffle",
            "false",
            "--tokenizer",
            tok_dir,
            "--output_dir",
            str(tmp_path / "run"),
        ],
    )
    got = {name: loader_documents(batches) for name, batches in json.loads(out.read_text()).items()}

    # chat sessions: TRL appends no EOS to a conversation, so the reference reads them with add_eos
    # false
    as_listed = [
        {**c, "tools": json.loads(c["tools"] or "null")} for c in chats
    ]  # a JSONL row's tools: a list
    ref = train_documents(
        tmp_path, "chats", as_listed, tok_dir, train_on="assistant", add_eos=False
    )
    hf = [
        tok.apply_chat_template(
            m,
            tools=TOOLS if m is SESSION else None,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        for m in SESSIONS
    ]
    assert ref == [
        (list(h["input_ids"]), [j for j, v in enumerate(h["assistant_masks"]) if v]) for h in hf
    ]
    assert all(0 < len(t) < len(ids) for ids, t in ref)  # a mask, not every token and not none
    assert got["messages"] == ref
    assert len(got["packed"]) == len(ref) and sorted(got["packed"]) == sorted(
        ref
    )  # TRL's packing reorders
    # prompt/completion: the completion trains, and the EOS appended to it
    ref = train_documents(tmp_path, "pairs", PAIRS, tok_dir)
    assert got["pairs"] == ref and all(
        t == list(range(len(p), len(ids)))
        for (ids, t), p in zip(ref, (tok(r["prompt"])["input_ids"] for r in PAIRS))
    )
    # token rows: the user's labels / masks, as ds-longctx train reads them; labels and a mask: both
    # say so
    for name, rows, key in (
        ("labels", labelled, "labels"),
        ("completion_mask", masked, "completion_mask"),
    ):
        want = [
            (r["input_ids"], [j for j, v in enumerate(r[key]) if v not in (0, -100)]) for r in rows
        ]
        assert got[name] == want == train_documents(tmp_path, name, rows, tok_dir, add_eos=False)
        assert all(0 < len(t) < len(ids) for ids, t in want)
    assert got["both"] == [
        (
            r["input_ids"],
            [
                j
                for j, (lab, m) in enumerate(zip(r["labels"], r["assistant_masks"]))
                if lab != -100 and m
            ],
        )
        for r in both
    ]


# trained targets per row of two optimizer steps of 4 rows: step 1's second replica (rows 2, 3)
# trains nothing, step 2's replicas train 3 and 34 tokens: a per-replica mean would halve step 1's
# loss and gradient and tilt step 2's
COUNTS = [5, 20, 0, 0, 3, 0, 25, 9]


@pytest.mark.parametrize("average", ["tokens", "sequences"])
def test_two_replicas_with_unequal_trained_tokens_equal_one_process_over_their_rows(
    tmp_path, average
):
    """SFTTrainer on a tokenized dataset with labels (rows of 32 tokens, COUNTS trained targets
    each), 2 steps: DP=2 (sp 1) with grad_accum 2 logs the losses and grad norms, and computes every
    full gradient before each optimizer step, of one process accumulating the same 4 rows a step
    (fp32, rel 1e-5), under both train.loss_average; a replica without trained tokens adds zero,
    nothing is NaN."""
    import random

    import torch

    rng = random.Random(5)
    rows = []
    for n in COUNTS:
        ids = [rng.randrange(4, 60) for _ in range(32)]
        keep = set(rng.sample(range(1, 32), n))
        rows.append(
            {"input_ids": ids, "labels": [t if j in keep else -100 for j, t in enumerate(ids)]}
        )
    (tmp_path / "cases.json").write_text(json.dumps({"train": {"trainer": "sft", "rows": rows}}))
    tok = str(make_tokenizer(tmp_path / "tok"))

    def run(nproc: int, accum: int) -> dict:
        out = tmp_path / f"{nproc}.pt"
        torchrun(
            nproc,
            [
                "tests/distributed/hf_trainer_worker.py",
                "--trainer",
                "weights",
                "--cases",
                str(tmp_path / "cases.json"),
                "--out",
                str(out),
                "--",
                "--model",
                "qwen3-tiny",
                "--seq_len",
                "32",
                "--dtype",
                "fp32",
                "--sp_size",
                "1",
                "--shuffle",
                "false",
                "--grad_accum",
                str(accum),
                "--steps",
                "2",
                "--loss_average",
                average,
                "--tokenizer",
                tok,
                "--output_dir",
                str(tmp_path / f"run{nproc}"),
            ],
        )
        return torch.load(out)

    dp2, one = run(2, 2), run(1, 4)
    assert (
        dp2["global_step"] == one["global_step"] == 2
        and len(dp2["grads"]) == len(one["grads"]) == 2
    )
    assert all(torch.isfinite(torch.tensor(x)) for x in dp2["losses"] + dp2["grad_norms"]), dp2
    assert max(rel_err(a, b) for a, b in zip(dp2["losses"], one["losses"])) <= 1e-5, (
        dp2["losses"],
        one["losses"],
    )
    assert max(rel_err(a, b) for a, b in zip(dp2["grad_norms"], one["grad_norms"])) <= 1e-5
    for got, ref in zip(dp2["grads"], one["grads"]):
        assert got.keys() == ref.keys()
        worst = max((rel_err(got[k], ref[k]), k) for k in ref)
        assert worst[0] <= 1e-5 and all(bool(torch.isfinite(g).all()) for g in got.values()), worst
        assert sum(float(g.abs().sum()) for g in ref.values()) > 0
