"""plan/geometry.py: the shapes memory depends on, read from a shipped name, a checkpoint directory
or a config.json, every size checked as it is read (the parameter counts themselves:
test_planner.py, test_zero_buffers.py)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import ds_longctx
from ds_longctx.plan.geometry import ModelGeometry

Q8 = ModelGeometry.from_name_or_path("qwen3-8b")
TINY = ModelGeometry.from_name_or_path("qwen3-tiny")
MODELS = Path(ds_longctx.__file__).parent / "models"


def test_geometry_reads_the_shipped_json():
    assert (
        Q8.hidden,
        Q8.intermediate,
        Q8.layers,
        Q8.heads,
        Q8.kv_heads,
        Q8.head_dim,
        Q8.vocab,
    ) == (4096, 12288, 36, 32, 8, 128, 151936)
    assert not Q8.tied_embeddings and Q8.max_position_embeddings == 40960
    assert ModelGeometry.from_name_or_path("Qwen/Qwen3-8B") == Q8
    assert ModelGeometry.from_name_or_path("qwen3-0.6b").tied_embeddings


def test_geometry_from_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text((MODELS / "qwen3-tiny.json").read_text())
    assert replace(ModelGeometry.from_name_or_path(tmp_path), name="qwen3-tiny") == TINY


def test_unknown_model_names_the_shipped_ones():
    with pytest.raises(ValueError, match="qwen3-8b"):
        ModelGeometry.from_name_or_path("no-such-model")


LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    "change,says",
    [
        (
            {"num_key_value_heads": 3},
            "num_attention_heads=8 with num_key_value_heads=3",
        ),  # 8 % 3: no whole groups
        (
            {"num_key_value_heads": 16},
            "num_key_value_heads one of [1, 2, 4, 8]",
        ),  # more KV heads than heads
        ({"num_key_value_heads": 0}, "num_key_value_heads = 0 is not a positive integer"),
        ({"hidden_size": -4096}, "hidden_size = -4096 is not a positive integer"),
        ({"hidden_size": "4096"}, "hidden_size = '4096' is not a positive integer"),
        ({"hidden_size": 256.0}, "hidden_size = 256.0 is not a positive integer"),
        ({"num_hidden_layers": True}, "num_hidden_layers = True"),
        ({"num_hidden_layers": 0}, "num_hidden_layers = 0"),
        ({"vocab_size": None}, "vocab_size is missing"),
        ({"intermediate_size": None}, "intermediate_size is missing"),
        ({"num_attention_heads": 0}, "num_attention_heads = 0"),
        ({"model_type": None}, "has no model_type"),
        ({"model_type": "gemma2"}, "config.json: model_type='gemma2' is not modelled"),
    ],
)
def test_a_config_json_the_model_cannot_have_is_refused_naming_the_file_and_the_field(
    tmp_path, change, says
):
    """Every size memory depends on is checked as the geometry is read (the planner's and the
    engine's rule for the heads is one: kernel_rules.check_attention_heads), so no plan is made of
    negative or impossible shapes."""
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape(says)) as e:
        ModelGeometry.from_name_or_path(tmp_path)
    assert str(path) in str(e.value)


def test_geometry_of_absent_or_null_optional_fields_and_of_broken_files(tmp_path, monkeypatch):
    """Legal in HF: num_key_value_heads null or absent (one KV head per head),
    max_position_embeddings absent (the config class's default). max_position_embeddings null:
    refused, as transformers refuses it. Not JSON, or JSON that
    is not an object: refused naming the file. A path that does not exist is not read as the shipped
    geometry of its last part (the Hub spelling `org/name` of a shipped one still is)."""
    for kv in ({"num_key_value_heads": None}, {}):
        cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"} | kv
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        g = ModelGeometry.from_name_or_path(tmp_path)
        assert (g.heads, g.kv_heads, g.max_position_embeddings, g.trained_context) == (
            8,
            8,
            2048,
            2048,
        )
    (tmp_path / "config.json").write_text(json.dumps(LLAMA | {"max_position_embeddings": None}))
    with pytest.raises(ValueError) as e:
        ModelGeometry.from_name_or_path(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'config.json'}: max_position_embeddings is null, which transformers' llama "
        f"config cannot build; give it as a whole number >= 1, or leave the key out for its "
        f"default (fix the config)"
    )
    for text, says in (
        ('{"model_type": "llama",', "is not a JSON config"),
        ("[1, 2]", "is a JSON object, got a list"),
    ):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match=says):
            ModelGeometry.from_name_or_path(tmp_path / "config.json")
    with pytest.raises(ValueError, match="does not exist"):
        ModelGeometry.from_name_or_path(tmp_path / "nowhere" / "Qwen3-8B")
    assert ModelGeometry.from_name_or_path("Qwen/Qwen3-8B") == ModelGeometry.from_name_or_path(
        "qwen3-8b"
    )
    (
        tmp_path / "qwen3-4b"
    ).mkdir()  # a folder of that name (no config.json) where plan runs: still the shipped one
    monkeypatch.chdir(tmp_path)
    assert ModelGeometry.from_name_or_path("qwen3-4b").name == "qwen3-4b"


def test_qwen2_is_planned_with_its_q_k_v_biases_and_no_o_bias():
    """Qwen2 (trained by the engine, its layer tiled like Qwen3's) is planned too: biases on q/k/v,
    none on o_proj, no q/k norm; its parameters as the HF model holds them
    (tests/plan/test_zero_buffers.py checks the order)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "qwen2",
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    g = ModelGeometry.from_config(cfg.to_dict())
    assert g.num_params == sum(p.numel() for p in model.parameters())
    assert (g.attention_bias, g.o_bias, g.qk_norm) == (True, False, False)
