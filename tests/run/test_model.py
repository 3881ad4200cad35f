"""run/model.py: a model given as an HF config.json file (another family, no weights here) is built
from that config and drawn like a shipped geometry, and trains through `ds-longctx train` (CPU, one
process)."""

from __future__ import annotations

import json
import math

from ds_longctx.run.model import load_hf_config, model_class, random_init
from tests.helpers import read_metrics, run_cli

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}


def test_a_config_file_builds_its_own_family_and_trains(tmp_path):
    cfg = tmp_path / "tiny_llama.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    hf = load_hf_config(str(cfg))
    assert type(hf).__name__ == "LlamaConfig" and model_class(hf).__name__ == "LlamaForCausalLM"
    assert (hf.hidden_size, hf.num_key_value_heads, hf.vocab_size) == (64, 2, 256)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(TINY_LLAMA))
    assert (
        random_init(str(cfg))
        and random_init("qwen3-tiny")
        and not random_init(str(tmp_path / "ckpt"))
    )
    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            "--model",
            str(cfg),
            "--seq_len",
            "256",
            "--steps",
            "2",
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps = read_metrics(out)
    assert [m["step"] for m in steps] == [1, 2] and steps[0]["tokens"] == 256
    # freshly drawn weights (std 0.02) predict about uniformly over the 256-token vocabulary: loss ~
    # ln 256
    assert abs(steps[0]["loss"] - math.log(256)) <= 0.02 * math.log(256), steps[0]
