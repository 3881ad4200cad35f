"""A hybrid model's geometry per layer type (plan/layer_types.py) against real transformers
Qwen3_5ForCausalLM models, and what the levers do with the layer types: the placement's caches, YaRN
on the partial rotary, the random init, the planner's phases."""

import json

import pytest
import torch

from ds_longctx.config import SHIPPED_MODELS_DIR
from ds_longctx.levers.placement import Place, PlacementPlan, resolve_placement
from ds_longctx.levers.rope import apply_rope_scaling, yarn_inv_freq
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.linear_terms import GATED_DELTA_PEAK_BYTES, NORM_SAVED_BYTES
from ds_longctx.plan.planner import plan_memory
from ds_longctx.run.model import load_hf_config, model_class
from tests.helpers import tiny_model
from tests.saved_tensors import saved_bytes


def test_tiny_geometry_is_the_real_model():
    """Every parameter's size in `parameters()` order, the count, and every Linear (LoRA's targets)
    of qwen3.5-tiny."""
    g = ModelGeometry.from_name_or_path("qwen3.5-tiny")
    model = tiny_model(model="qwen3.5-tiny")
    assert [p.numel() for p in model.parameters()] == g.param_numels()
    assert g.num_params == sum(p.numel() for p in model.parameters())
    assert g.linears() == {
        n: (m.in_features, m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    assert g.hybrid.layer_types == tuple(model.config.layer_types) and g.attention_layers == (
        False,
    ) * 3 + (True,)
    assert g.layer_params == max(
        sum(p.numel() for p in layer.parameters()) for layer in model.model.layers
    )


@pytest.mark.parametrize("name", ["qwen3.5-4b", "qwen3.5-27b"])
def test_shipped_geometries_count_the_real_models_parameters(name):
    cfg = load_hf_config(name)
    with torch.device("meta"):
        model = model_class(cfg)(cfg)
    g = ModelGeometry.from_name_or_path(name)
    assert g.num_params == sum(p.numel() for p in model.parameters())
    assert g.param_numels() == [p.numel() for p in model.parameters()]


def test_a_composite_config_is_read_as_its_text_model(tmp_path):
    """A Qwen3.5 checkpoint's config.json (`qwen3_5` with `text_config`, the vision tower beside it)
    plans as its text model."""
    text = json.loads((SHIPPED_MODELS_DIR / "qwen3.5-4b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "qwen3_5", "text_config": text, "vision_config": {"depth": 2}})
    )
    assert (
        ModelGeometry.from_name_or_path(str(path)).param_numels()
        == ModelGeometry.from_name_or_path("qwen3.5-4b").param_numels()
    )
    assert type(load_hf_config(str(path))).__name__ == "Qwen3_5TextConfig"


def test_caches_go_on_full_attention_layers_only():
    cacheable = ModelGeometry.from_name_or_path("qwen3.5-4b").attention_layers  # every 4th layer
    plan = resolve_placement(4, 2, True, None, 32, cacheable=cacheable)
    assert plan.indices(Place.CACHE) == [27, 31] and plan.offloaded == 4
    assert resolve_placement(0, "all", True, None, 32, cacheable=cacheable).cached == 8
    with pytest.raises(ValueError, match=r"caches layers \[30\], which have no softmax attention"):
        resolve_placement(0, 0, True, "keep:30,cache:1,cache:1", 32, cacheable=cacheable)
    with pytest.raises(
        ValueError, match="only 8 layers after the 0 offloaded have softmax attention"
    ):
        resolve_placement(0, 9, True, None, 32, cacheable=cacheable)
    with pytest.raises(ValueError, match=r"caches layers \[2\].*full-attention layers only: \[3\]"):
        plan_memory(
            "qwen3.5-tiny", 64, 1, 1, Levers(placement=PlacementPlan.parse("keep:2,cache:1,keep:1"))
        )


def test_yarn_on_the_partial_rotary():
    """YaRN at 1M tokens for Qwen3.5-4B (trained context 262,144): transformers' rotary of the full
    layers equals our YaRN over the rotated 64 of 256 head dims, with the mrope sections carried."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    cfg = load_hf_config("qwen3.5-4b")
    params = apply_rope_scaling(cfg, 1 << 20, "auto")
    assert params["factor"] == 4.0 and params["mrope_section"] == [11, 11, 10]
    rotary = Qwen3_5TextRotaryEmbedding(cfg)
    ours, temperature = yarn_inv_freq(256 // 4, 1e7, 4.0, 262144)
    assert torch.allclose(
        rotary.inv_freq, ours, rtol=1e-6
    ) and rotary.attention_scaling == pytest.approx(temperature)


def test_random_init_of_the_hybrid_vectors():
    """Zero-centred norms 0 (scale 1), the gated norm's weight 1, dt_bias softplus^-1(0.01), A_log
    0."""
    model = tiny_model(model="qwen3.5-tiny")
    lin = model.model.layers[0].linear_attn
    assert torch.all(model.model.layers[0].input_layernorm.weight == 0.0)
    assert torch.all(model.model.layers[3].self_attn.q_norm.weight == 0.0)
    assert torch.all(lin.norm.weight == 1.0) and torch.all(lin.A_log == 0.0)
    assert torch.nn.functional.softplus(lin.dt_bias).tolist() == pytest.approx([0.01] * 4)


def test_the_plan_has_a_phase_for_the_linear_layers():
    """Qwen3.5-4B at 1M tokens on 8 GPUs: the linear layers' phases are in the plan (one of them its
    peak), and the delta rule's kernel term is the measured peak scaled per value head (4 per rank,
    32 over sp 8; measured at 6), less the bench's own output and output grad (2 x 128 bf16 per
    token and head, held elsewhere in a layer)."""
    p = plan_memory("qwen3.5-4b", 1 << 20, 8, 8, Levers(offload_layers=13))
    phases = dict(p.phase_bytes)
    assert {"lin_mlp_bwd", "lin_bwd"} <= set(phases) and p.peak_phase in ("lin_mlp_bwd", "lin_bwd")
    assert p.term("lin_rule_bwd").gpu_bytes == round(
        GATED_DELTA_PEAK_BYTES * 4 / 6 - (1 << 20) * 4 * 2 * 128 * 2
    )
    dense = plan_memory("qwen3-8b", 1 << 20, 8, 8, Levers(offload_layers=13))
    assert "lin_bwd" not in dict(dense.phase_bytes)


def test_the_top_linear_layers_phases_hold_nothing_of_the_layers_above_it():
    """Qwen3.5-4B's top layer (31) is a full-attention one: its backward has freed its checkpoint
    and its kept attention output before the top linear layer (30) runs its own, so the linear
    phases count neither; the full layer's phases and the loss do. A dense model has no such
    terms."""
    g = ModelGeometry.from_name_or_path("qwen3.5-4b")
    spec = PlacementPlan.from_counts(
        g.layers, 13, 2, cacheable=g.attention_layers
    )  # layers 27 and 31 cached
    p = plan_memory(g, 1 << 20, 8, 8, Levers(placement=spec))
    E, cache = (
        (1 << 17) * g.hidden * 2,
        p.term("attention_cache").gpu_bytes,
    )  # the one cached layer below 30
    assert p.term("checkpoints").gpu_bytes == (g.layers - 13 - 1) * E
    above, above_cache = p.term("checkpoints_above_linear"), p.term("attention_cache_above_linear")
    assert above.gpu_bytes == E and above_cache.gpu_bytes == cache
    for t in (above, above_cache):
        assert "lin_bwd" not in t.phases and "lin_mlp_bwd" not in t.phases
        assert {"loss", "mlp_bwd", "attn_bwd"} <= set(t.phases)
    dense = plan_memory("qwen3-8b", 1 << 20, 8, 8, Levers(offload_layers=13))
    assert not {"checkpoints_above_linear", "attention_cache_above_linear"} & {
        t.name for t in dense.terms
    }


def test_the_gated_norm_and_out_proj_save_what_the_plan_counts():
    """HF's gated RMSNorm and out_proj on the delta rule's output (bf16, [T, hv·dv]) save
    NORM_SAVED_BYTES per element for the top linear layer's backward (lin_norm_saved): counted here
    from autograd's saved tensors."""
    model = tiny_model(model="qwen3.5-tiny", dtype=torch.bfloat16)
    lin = model.model.layers[0].linear_attn
    T, hv, dv = 256, lin.num_v_heads, lin.head_v_dim
    out = torch.randn(T * hv, dv, dtype=torch.bfloat16, requires_grad=True)
    z = torch.randn(T * hv, dv, dtype=torch.bfloat16, requires_grad=True)

    def norm_then_proj(o, zz):
        return lin.out_proj(lin.norm(o, zz).reshape(T, hv * dv))

    assert (
        saved_bytes(norm_then_proj, out, z, exclude=(out, z), numel=T * hv * dv)
        == T * hv * dv * NORM_SAVED_BYTES
    )


def test_the_top_linear_layers_norm_backward_is_a_phase_of_its_own():
    """Between the top linear layer's MLP backward and its mixer's: the mixer's saved tensors and
    the norms' eager units (plan/layer_units.py), no MLP tensor and not the delta rule's kernel; a
    dense model has no such phase."""
    p = plan_memory("qwen3.5-4b", 362_496, 1, 1, Levers(tiled_mlp=True, offload_layers=19))
    held = {t.name for t in p.terms if "lin_norm_bwd" in t.phases}
    assert {
        "lin_conv_in",
        "lin_rule_saved",
        "lin_norm_saved",
        "hidden_norm_bwd",
        "tied_lm_head_grad_held",
    } <= held
    assert not held & {
        "mlp_tile",
        "hidden_mlp_bwd",
        "layer_grads_bf16",
        "lin_rule_bwd",
        "checkpoints_above_linear",
    }
    assert "lin_norm_bwd" not in dict(
        plan_memory("qwen3-8b", 1 << 20, 8, 8, Levers(offload_layers=13)).phase_bytes
    )
