"""plan/hf_fields.py: a config.json read as transformers reads it. The planner's parameters, heads
and head_dim of a config that leaves keys out (or nulls them) are those of the model transformers
builds from it, family by family, or the config is refused as transformers refuses it; a sliding
window is refused where the kernels would ignore it."""

from __future__ import annotations

import json

import pytest

from ds_longctx import families
from ds_longctx.config import RunConfig
from ds_longctx.plan import write as plan_write
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.run.preflight import validate

# 32 heads of hidden / heads = 8: every family's default KV heads divide them, and Qwen3's head_dim
# 128 is not 8
BASE = {
    "hidden_size": 256,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "vocab_size": 100,
}
EXTRA = {
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_5_text": {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
}
FAMILIES = list(families.FAMILIES)  # every record, against the installed transformers


def hf_model(cfg: dict):
    """transformers' model of `cfg` on the meta device (no memory), or the exception transformers
    raises."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            return config, AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - whichever transformers raises: the geometry must refuse too
        return None, e


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "left",
    [
        ("head_dim",),
        ("num_key_value_heads",),
        ("head_dim", "num_key_value_heads"),
        ("max_position_embeddings",),
    ],
)
def test_keys_left_out_or_null_are_read_as_transformers_reads_them(family, left):
    """max_position_embeddings is left out throughout. Before: head_dim and num_key_value_heads left
    out were hidden / heads and one KV head per head in every family, so a Qwen3 config without them
    was planned at head_dim 8 and 32 KV heads, and `train` built transformers' head_dim 128 (or
    refused its default of 32 KV heads)."""
    for value in ("absent", None):
        cfg = {"model_type": family, **BASE, **EXTRA.get(family, {})}
        cfg |= {k: value for k in left} if value is None else {}
        config, model = hf_model(cfg)
        if (
            config is None
        ):  # transformers cannot build it: neither can the planner, and it says which key
            with pytest.raises(
                ValueError, match=r"is null, which transformers' \w+ config cannot build"
            ):
                ModelGeometry.from_config(cfg)
            continue
        g = ModelGeometry.from_config(cfg)
        text = config.get_text_config()
        assert (g.kv_heads, g.head_dim) == (
            text.num_key_value_heads,
            getattr(text, "head_dim", None) or 8,
        ), value
        assert g.num_params == sum(p.numel() for p in model.parameters()), value
        assert (
            g.max_position_embeddings == text.max_position_embeddings
        )  # left out: the family's default


def test_every_default_is_the_installed_transformers_one():
    from transformers import AutoConfig

    for family, fam in families.FAMILIES.items():
        defaults = fam.defaults
        config = AutoConfig.for_model(family, **BASE, use_sliding_window=True)
        for key, value in defaults.items():
            assert getattr(config, key) == value, (family, key)


@pytest.mark.parametrize(
    "change,says",
    [
        (
            {"tie_word_embeddings": "false"},
            "tie_word_embeddings = 'false' is not a JSON boolean; write true or false",
        ),
        ({"attention_bias": 0}, "attention_bias = 0 is not a JSON boolean"),
        ({"head_dim": 0}, "head_dim = 0 is not a positive integer"),
        (
            {"rope_scaling": {"rope_type": "yarn"}},
            "rope_type 'yarn' with factor = None: give its scaling factor as a number >= 1",
        ),
        (
            {"rope_scaling": {"type": "linear", "factor": "four"}},
            "rope_type 'linear' with factor = 'four'",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": "32k",
                }
            },
            "rope original_max_position_embeddings = '32k' is not a positive integer",
        ),
        (
            {"layer_types": ["full_attention", "chunked_attention"] * 2},
            "layer types ['chunked_attention', 'full_attention']: ds_longctx runs full causal "
            "attention (and gated DeltaNet) layers; give "
            "full_attention for every layer in layer_types",
        ),
        # a traceback (sorting names with numbers) or a list of letters before
        (
            {"layer_types": [1] + ["full_attention"] * 3},
            "layer_types = [1, 'full_attention', 'full_attention', "
            "'full_attention'] is not a list of num_hidden_layers=4 names",
        ),
        (
            {"layer_types": "full_attention"},
            "layer_types = 'full_attention' is not a list of num_hidden_layers=4 names",
        ),
        (
            {"model_type": "qwen3_5_text", "partial_rotary_factor": None},
            "partial_rotary_factor = None is not a number in (0, 1]",
        ),  # a traceback before
        (
            {"model_type": "qwen3_5_text", "partial_rotary_factor": 2.0},
            "partial_rotary_factor = 2.0 is not a number",
        ),
    ],
)
def test_odd_fields_are_refused_as_transformers_or_the_engine_refuses_them(change, says, tmp_path):
    """Before: tie_word_embeddings "false" (a string, true to Python) and head_dim 0 planned, then
    `train` ended in a transformers traceback; a yarn rope without a factor or Qwen3's sliding
    layers planned, then `train` refused."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3", **BASE, **change}))
    with pytest.raises(ValueError, match="^" + str(path)) as e:
        ModelGeometry.from_name_or_path(path)
    assert says in str(e.value)


def test_a_sliding_window_the_kernels_would_ignore_is_refused_by_plan_and_train(tmp_path, capsys):
    """Mistral applies its sliding_window (4096 where the key is absent) to every layer, Qwen3-MoE
    with use_sliding_window too; the attention here is full causal. Before, both planned and trained
    past the window, silently with full attention."""
    cfg = {"model_type": "mistral", **BASE, "num_key_value_heads": 8}
    for change, window in (
        ({}, 4096),
        ({"sliding_window": 1024}, 1024),
        ({"sliding_window": None}, None),
    ):
        assert ModelGeometry.from_config(cfg | change).sliding_window == window
    moe = {"model_type": "qwen3_moe", **BASE, **EXTRA["qwen3_moe"]}
    assert ModelGeometry.from_config(moe).sliding_window is None
    assert ModelGeometry.from_config(moe | {"use_sliding_window": True}).sliding_window == 4096
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    says = "attends within a sliding window of 4,096 tokens"
    argv = ["--model", str(tmp_path), "--gpus", "1", "--gpu_mem_gb", "141"]
    assert plan_write.main(argv + ["--seq_len", "8192"]) == 2
    err = capsys.readouterr().err
    assert (
        says in err
        and 'Set "sliding_window": null in its config.json' in err
        and "seq_len <= 4,096" in err
    )
    assert (
        plan_write.main(argv + ["--find_max_len"]) == 2
        and "past 4,096 tokens" in capsys.readouterr().err
    )
    assert plan_write.main(argv + ["--seq_len", "4096"]) == 0
    with pytest.raises(ValueError, match=says):
        validate(RunConfig(model=str(tmp_path / "config.json"), seq_len=8192), 1)
    validate(RunConfig(model=str(tmp_path / "config.json"), seq_len=4096), 1)


@pytest.mark.parametrize(
    "family, change",
    [
        ("qwen3", {"max_window_layers": 2}),
        ("qwen2", {"max_window_layers": 2}),
        ("qwen3_moe", EXTRA["qwen3_moe"]),
        ("qwen3", {"layer_types": ["full_attention", "sliding_attention"] * 2}),
    ],
)
def test_qwens_sliding_layers_train_within_their_window_and_are_refused_past_it_by_plan_and_train(
    tmp_path, capsys, family, change
):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": family,
                **BASE,
                "num_key_value_heads": 8,
                "use_sliding_window": True,
                "sliding_window": 1024,
                **change,
            }
        )
    )
    argv = ["--model", str(path), "--gpus", "1", "--gpu_mem_gb", "141"]
    assert plan_write.main(argv + ["--seq_len", "1024"]) == 0
    validate(RunConfig(model=str(path), seq_len=1024), 1)
    capsys.readouterr()
    assert plan_write.main(argv + ["--seq_len", "2048"]) == 2
    plan_says = capsys.readouterr().err.strip().splitlines()[-1].removeprefix("ds-longctx plan: ")
    with pytest.raises(ValueError) as e:
        validate(RunConfig(model=str(path), seq_len=2048), 1)
    assert (
        str(e.value)
        == plan_says
        == (
            f"model {path} attends within a sliding window of 1,024 tokens in some or all layers "
            "(its config's "
            "sliding_window, 4096 where the key is absent: Mistral's every layer, Qwen's with "
            "use_sliding_window), and "
            "ds_longctx's attention is full causal, the same only within the window: at "
            "seq_len=2,048 > 1,024 it would "
            'train unlike its config. Set "sliding_window": null in its config.json to train it '
            f"with full attention, or use seq_len <= 1,024"
        )
    )


def test_a_field_transformers_refuses_by_type_is_a_refusal_of_train_not_a_traceback(tmp_path):
    """transformers 5 types its config fields (huggingface_hub's strict dataclasses); a string or
    null where it wants a number ended `train` in a StrictDataclassFieldValidationError
    traceback."""
    for key, value in (("rms_norm_eps", "tiny"),):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({"model_type": "qwen3", **BASE, key: value}))
        with pytest.raises(
            ValueError,
            match=rf"transformers cannot read {path} \(StrictDataclassFieldValidationError: "
            rf"Validation error for field '{key}': TypeError: .*fix or replace",
        ):
            validate(RunConfig(model=str(path), seq_len=64), 1)


@pytest.mark.parametrize("model", ["qwen3-moe-tiny", "mixtral-tiny", "qwen3.5-tiny"])
def test_a_config_saved_by_the_installed_transformers_plans_and_trains(model, tmp_path):
    """transformers 5.25's save_pretrained writes Qwen3-MoE's expert count as num_local_experts (its
    attribute_map reads num_experts there); the plan refused "num_experts is missing"."""
    from ds_longctx.run.model import load_hf_config
    from tests.helpers import read_metrics, run_cli

    saved = load_hf_config(model)
    saved.save_pretrained(tmp_path / "m")
    config = tmp_path / "m" / "config.json"
    g = ModelGeometry.from_name_or_path(str(config))
    assert (
        g.layers == saved.num_hidden_layers
        and g.num_params == ModelGeometry.from_name_or_path(model).num_params
    )
    if g.moe is not None:
        assert g.moe.experts == saved.num_experts == 4
        renamed = families.of(saved.model_type).renamed["num_experts"]
        assert (
            type(saved).attribute_map.get("num_experts", renamed) == renamed
        )  # the name transformers maps to
    assert (
        plan_write.main(
            [
                "--model",
                str(config),
                "--seq_len",
                "1024",
                "--gpus",
                "1",
                "--out",
                str(tmp_path / "plan"),
            ]
        )
        == 0
    )
    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "1",
            "--model",
            str(config),
            "--seq_len",
            "64",
            "--steps",
            "1",
            "--dtype",
            "fp32",
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(read_metrics(out)) == 1
