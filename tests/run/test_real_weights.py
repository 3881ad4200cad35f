"""A local HF checkpoint directory as `--model` (a tiny Qwen3 and its tokenizer, saved here by
transformers): every command that takes a model takes it, and `ds-longctx train` fine-tunes from its
weights. The reference is the HF model itself, loaded with `from_pretrained`, on the same token row:
plain cross-entropy of the next token.

One row of exactly SEQ words (no EOS), concat layout: step 1 trains on that row. lr is tiny, so the
eval after step 1 sees the weights the run loaded and the export gives them back."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.corpus import make_tokenizer, words, write_jsonl
from tests.helpers import read_metrics, rel_err, run_cli, tiny_config

pytestmark = pytest.mark.slow
SEQ = 64
TOL = 1e-5  # fp32, one process: ZeRO-3's flat partitions against the plain model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint directory, data file): a tiny Qwen3 whose lm_head is scaled up, so its loss (far
    above ln 512) tells its weights from any random init, with a WordLevel tokenizer saved beside
    it; one document of SEQ words."""
    import torch
    from transformers import Qwen3ForCausalLM

    d = tmp_path_factory.mktemp("real_weights")
    torch.manual_seed(3)
    model = Qwen3ForCausalLM(tiny_config())
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(str(d / "model"))
    make_tokenizer(d / "model")
    rng = random.Random(0)
    write_jsonl(d / "c.jsonl", [" ".join(rng.choice(words(60)) for _ in range(SEQ))])
    return d / "model", d / "c.jsonl"


def hf_loss(model_dir: Path, data: Path) -> float:
    """The checkpoint's own loss on the row: transformers' model and tokenizer, plain next-token
    cross-entropy."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = torch.tensor([tok(json.loads(data.read_text())["text"])["input_ids"]])
    assert ids.shape == (1, SEQ)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return float(F.cross_entropy(logits[0, :-1], ids[0, 1:]))


def train_args(model_dir: Path, data: Path, out: Path) -> list:
    """`ds-longctx train` of the checkpoint directory, its tokenizer taken from it (no
    --tokenizer)."""
    return [
        "train",
        "--nproc",
        "1",
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--seq_len",
        str(SEQ),
        "--add_eos",
        "false",
        "--dtype",
        "fp32",
        "--lr",
        "1e-20",
        "--steps",
        "1",
        "--save_every",
        "1",
        "--data_cache_dir",
        str(out.parent / "cache"),
        "--output_dir",
        str(out),
    ]


def test_a_checkpoint_directory_fine_tunes_from_its_weights_then_evals_and_exports(
    hf_dir, tmp_path
):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    model_dir, data = hf_dir
    want = hf_loss(model_dir, data)
    assert want > 8, (
        want
    )  # uniform over 512 ids is 6.24: a run that drew its own weights would not give this
    out = tmp_path / "run"
    res = run_cli(train_args(model_dir, data, out), output_dir=out)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [step1] = read_metrics(out)
    assert rel_err(step1["loss"], want) <= TOL, (step1["loss"], want)

    res = run_cli(
        ["eval", "--checkpoint", str(out), "--data", str(data), "--rows", "1"], output_dir=None
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [line] = [r for r in read_metrics(out) if "eval_loss" in r]
    assert rel_err(line["eval_loss"], want) <= TOL, (line, want)

    hf = tmp_path / "hf"
    res = run_cli(["export", "--checkpoint", str(out), "--out", str(hf)])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert (
        rel_err(hf_loss(hf, data), want) <= TOL
    )  # the model and the tokenizer (the checkpoint directory's)
    got, ref = (
        load_file(str(hf / "model.safetensors")),
        load_file(str(model_dir / "model.safetensors")),
    )
    assert max(rel_err(got[k], ref[k], "max") for k in ref if k in got) <= 1e-6
    vocab = [AutoTokenizer.from_pretrained(str(d)).get_vocab() for d in (hf, model_dir)]
    assert vocab[0] == vocab[1]
    assert torch.equal(got["lm_head.weight"], ref["lm_head.weight"])


def test_plan_and_rehearse_take_a_checkpoint_directory(hf_dir, tmp_path):
    """`plan` reads its geometry; `rehearse` checks a config of it (the model, the data against its
    tokenizer and vocabulary) before it asks for a GPU: here it is refused for the missing GPU
    (CPU), or with --cpu for a bad --layers, never for the model."""
    import yaml

    model_dir, data = hf_dir
    res = run_cli(
        [
            "plan",
            "--model",
            str(model_dir),
            "--seq_len",
            "4096",
            "--gpus",
            "2",
            "--gpu_mem_gb",
            "80",
            "--out",
            str(tmp_path / "plan"),
        ]
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    cfg = yaml.safe_load((tmp_path / "plan" / "run.yaml").read_text())
    assert cfg["model"]["name"] == str(model_dir) and cfg["train"]["seq_len"] == 4096
    run_yaml = str(tmp_path / "plan" / "run.yaml")
    extra = ["--data", str(data), "--output_dir", str(tmp_path / "reh")]
    res = run_cli(["rehearse", "--config", run_yaml, *extra])
    assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr.strip().splitlines()[-1], (
        res.stderr[-2000:]
    )
    res = run_cli(["rehearse", "--cpu", "--config", run_yaml, "--layers", "9", *extra])
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "--layers 9" in last and str(model_dir) not in last, last
