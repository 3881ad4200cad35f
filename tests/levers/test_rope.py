"""YaRN: our inverse frequencies against transformers' own, the factor rule, and the config
mutation."""

import json
import logging
from pathlib import Path

import pytest
import torch

import ds_longctx
from ds_longctx.levers.rope import (
    apply_rope_scaling,
    trained_context,
    yarn_inv_freq,
    yarn_rope_parameters,
)
from tests.helpers import rel_err

MODELS = Path(ds_longctx.__file__).parent / "models"


def config(name: str):
    from transformers import Qwen3Config

    return Qwen3Config.from_dict(json.loads((MODELS / f"{name}.json").read_text()))


@pytest.mark.parametrize("seq_len, factor", [(131_072, 4.0), (1_048_576, 32.0)])
def test_yarn_inv_freq_matches_transformers_qwen3_8b(seq_len, factor):
    """Qwen's documented YaRN (original_max_position_embeddings 32768) at Qwen3-8B geometry."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = config("qwen3-8b")
    params = yarn_rope_parameters(cfg, seq_len, original_max_position_embeddings=32768)
    assert params == {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": 32768,
        "rope_theta": 1e6,
    }
    cfg.rope_parameters = params
    ref_inv_freq, ref_attention = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    inv_freq, attention = yarn_inv_freq(128, 1e6, factor, 32768)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == ref_inv_freq.shape == (64,)
    assert rel_err(inv_freq, ref_inv_freq, norm="elementwise") <= 1e-6
    assert abs(attention - ref_attention) <= 1e-6 * ref_attention
    # the blend is really there: the fastest frequency is kept, the slowest divided by the factor
    theta = 1e6 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert rel_err(inv_freq[:1], theta[:1], norm="elementwise") <= 1e-6
    assert rel_err(inv_freq[-1:], theta[-1:] / factor, norm="elementwise") <= 1e-6


def test_tiny_model_built_after_auto_uses_our_yarn():
    from transformers import Qwen3ForCausalLM

    cfg = config("qwen3-tiny")  # max_position_embeddings 2048, head_dim 16, theta 1e6
    applied = apply_rope_scaling(cfg, 8192, "auto")
    assert applied == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
        "rope_theta": 1e6,
    }
    assert cfg.max_position_embeddings == 8192
    rotary = Qwen3ForCausalLM(cfg).model.rotary_emb
    inv_freq, attention = yarn_inv_freq(16, 1e6, 4.0, 2048)
    assert rel_err(rotary.inv_freq, inv_freq, norm="elementwise") <= 1e-6
    assert abs(rotary.attention_scaling - attention) <= 1e-6 * attention
    assert apply_rope_scaling(cfg, 8192, "auto") == applied  # applying twice: the same


def test_a_null_head_dim_is_derived_for_transformers_yarn():
    """Mixtral's published config leaves head_dim null; transformers 5.17's YaRN multiplies it
    undefaulted, so YaRN writes the derived width (hidden / heads) that the attention uses."""
    from transformers import MixtralConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = MixtralConfig.from_dict(json.loads((MODELS / "mixtral-8x7b.json").read_text()))
    assert cfg.head_dim is None
    params = apply_rope_scaling(cfg, 131_072, "yarn")
    assert cfg.head_dim == 4096 // 32
    ref_inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    inv_freq, _ = yarn_inv_freq(128, params["rope_theta"], params["factor"], 32768)
    assert rel_err(inv_freq, ref_inv_freq, norm="elementwise") <= 1e-6


@pytest.mark.parametrize(
    "seq_len, orig, factor",
    [
        (100_000, 32768, 3.125),  # 3.0518 rounded up to a multiple of 1/8
        (131_072, 40960, 3.25),  # O = max_position_embeddings given explicitly (3.2 -> 3.25)
        (1_048_576, 40960, 25.625),
        (32769, 32768, 1.125),
    ],
)
def test_factor_rounds_up_to_an_eighth(seq_len, orig, factor):
    cfg = config("qwen3-8b")
    params = yarn_rope_parameters(cfg, seq_len, orig)
    assert params["factor"] == factor and params["original_max_position_embeddings"] == orig
    assert factor * orig >= seq_len and factor * orig - seq_len <= orig / 8
    apply_rope_scaling(cfg, seq_len, "auto", original_max_position_embeddings=orig)
    assert cfg.max_position_embeddings == max(40960, int(factor * orig))


def test_qwen3_default_is_its_published_32768():
    """The Qwen3 rule lives in rope.trained_context: O = 32768 when max_position_embeddings is
    40960, so 131,072 tokens get Qwen's documented factor 4 (not 3.25 from 40960); other geometries
    keep max_position_embeddings."""
    cfg = config("qwen3-8b")
    assert trained_context(cfg) == 32768
    assert yarn_rope_parameters(cfg, 131_072)["factor"] == 4.0
    assert apply_rope_scaling(cfg, 1_048_576, "auto")["factor"] == 32.0
    assert trained_context(config("qwen3-tiny")) == 2048


def test_fits_in_trained_context():
    cfg = config("qwen3-tiny")
    before = cfg.to_dict()
    assert yarn_rope_parameters(cfg, 2048) is None
    assert apply_rope_scaling(cfg, 2048, "auto") is None
    assert cfg.to_dict() == before
    forced = apply_rope_scaling(cfg, 1024, "yarn")  # "yarn" always: factor 1, a no-op YaRN
    assert forced["factor"] == 1.0 and cfg.max_position_embeddings == 2048
    no_op = 1e6 ** (-torch.arange(0, 16, 2) / 16)
    assert rel_err(yarn_inv_freq(16, 1e6, 1.0, 2048)[0], no_op, norm="elementwise") <= 1e-6


def test_none_leaves_config_unchanged_and_warns(caplog):
    cfg = config("qwen3-tiny")
    before = cfg.to_dict()
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        assert apply_rope_scaling(cfg, 8192, "none") is None
    assert cfg.to_dict() == before
    assert "seq_len=8192 exceeds the trained context 2048" in caplog.text


def test_explicit_dict_is_validated_and_completed(caplog):
    cfg = config("qwen3-8b")
    qwen_card = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    with caplog.at_level(logging.INFO, logger="ds_longctx"):
        applied = apply_rope_scaling(cfg, 131_072, qwen_card)
    assert applied == {**qwen_card, "rope_theta": 1e6} and "rope_theta" not in qwen_card
    assert cfg.rope_parameters == applied and cfg.max_position_embeddings == 131_072
    assert trained_context(cfg) == 32768
    assert "factor 4.0" in caplog.text and "explicit" in caplog.text


@pytest.mark.parametrize(
    "mode, match",
    [
        (
            {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 2048},
            "factor=0.5",
        ),
        ({"rope_type": "yarn", "factor": 4.0}, r"missing \['original_max_position_embeddings'\]"),
        ({"factor": 4.0}, "no 'rope_type'"),
        ({"rope_type": "yarnn", "factor": 4.0}, "rope_type='yarnn'"),
        ("yarnn", "mode='yarnn'"),
    ],
)
def test_bad_input_errors_name_the_value(mode, match):
    cfg = config("qwen3-tiny")
    before = cfg.to_dict()
    with pytest.raises(ValueError, match=match):
        apply_rope_scaling(cfg, 8192, mode)
    assert cfg.to_dict() == before


def test_bad_numbers_error():
    cfg = config("qwen3-tiny")
    with pytest.raises(ValueError, match="seq_len=0"):
        apply_rope_scaling(cfg, 0, "auto")
    with pytest.raises(ValueError, match="factor=0.5"):
        yarn_inv_freq(16, 1e6, 0.5, 2048)
    with pytest.raises(ValueError, match="head_dim=15"):
        yarn_inv_freq(15, 1e6, 4.0, 2048)


def test_other_scaling_already_set_is_not_overridden():
    cfg = config("qwen3-tiny")
    cfg.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="already uses rope_type='linear'"):
        apply_rope_scaling(cfg, 8192, "auto")
