"""plan/moe_geometry.py and the MoE terms of the planner: Qwen3-MoE's parameters counted as
transformers builds them, the MoE families not modelled refused (by `plan` and by `train`, exit 2,
before any worker), the sparse block's terms whole and tiled, the levers an MoE refuses."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import ds_longctx
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.planner import Levers, plan_memory
from ds_longctx.plan.write import main as plan_main
from tests.helpers import run_cli

MODELS = Path(ds_longctx.__file__).parent / "models"


@pytest.mark.parametrize(
    "name", ["qwen3-moe-tiny", "qwen3-30b-a3b", "mixtral-tiny", "mixtral-8x7b"]
)
def test_parameters_are_transformers_own_in_its_order(name):
    """Every parameter of transformers' Qwen3MoeForCausalLM / MixtralForCausalLM (built on the meta
    device: nothing allocated), in `parameters()` order; 30B-A3B: 30,532,122,624 in all."""
    import torch

    from ds_longctx.run.model import load_hf_config, model_class

    cfg = load_hf_config(name)
    with torch.device("meta"):
        model = model_class(cfg)(cfg)
    g = ModelGeometry.from_name_or_path(name)
    assert g.param_numels() == [p.numel() for p in model.parameters()]
    assert g.num_params == sum(p.numel() for p in model.parameters())
    assert g.layer_params == sum(p.numel() for p in model.model.layers[-1].parameters())
    assert set(g.linears()) == {
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }


def test_30b_a3b_geometry():
    g = ModelGeometry.from_name_or_path("qwen3-30b-a3b")
    m = g.moe
    assert (g.layers, g.hidden, g.heads, g.kv_heads, g.head_dim, g.vocab) == (
        48,
        2048,
        32,
        4,
        128,
        151936,
    )
    assert (m.experts, m.top_k, m.expert_intermediate, len(m.sparse_layers)) == (128, 8, 768, 48)
    assert g.num_params == 30_532_122_624 and g.trained_context == 32768


def test_mixtral_8x7b_geometry_plans():
    """Mixtral's expert width is intermediate_size, every layer sparse, its router always
    renormalised (fp32 weights): 46,702,792,704 parameters; it plans 512k tokens on 8 x 141 GB."""
    g = ModelGeometry.from_name_or_path("mixtral-8x7b")
    m = g.moe
    assert (m.experts, m.top_k, m.expert_intermediate, len(m.sparse_layers)) == (8, 2, 14336, 32)
    assert (m.norm_topk_prob, m.weight_bytes, g.sliding_window, g.qk_norm) == (True, 4, None, False)
    assert g.num_params == 46_702_792_704
    argv = ["--model", "mixtral-8x7b", "--gpus", "8", "--gpu_mem_gb", "141"]
    assert plan_main(argv + ["--seq_len", str(1 << 19)]) == 0


def test_mixed_dense_and_sparse_layers(tmp_path):
    """decoder_sparse_step / mlp_only_layers: HF's rule for which layers are sparse; the counts stay
    HF's."""
    cfg = json.loads((MODELS / "qwen3-moe-tiny.json").read_text())
    cfg.update(num_hidden_layers=4, mlp_only_layers=[3], decoder_sparse_step=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    g = ModelGeometry.from_name_or_path(tmp_path)
    assert g.moe.sparse_layers == (1,)
    assert g.num_params == sum(g.param_numels())
    assert (
        "model.layers.3.mlp.gate_proj" in g.linears()
        and "model.layers.1.mlp.gate_proj" not in g.linears()
    )


PHIMOE = {
    "model_type": "phimoe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    "cfg,named",
    [
        (PHIMOE, "model_type='phimoe' is a mixture of experts (num_local_experts=4)"),
        (
            {
                **PHIMOE,
                "model_type": "deepseek_v3",
                "num_local_experts": None,
                "n_routed_experts": 8,
            },
            "model_type='deepseek_v3' is a mixture of experts (n_routed_experts=8)",
        ),
        (
            {**PHIMOE, "model_type": "qwen3", "num_local_experts": None, "num_experts": 8},
            "model_type='qwen3' is a mixture of experts (num_experts=8)",
        ),
    ],
)
def test_other_moe_families_are_refused_naming_the_supported_ones(tmp_path, cfg, named):
    (tmp_path / "config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if v is not None})
    )
    with pytest.raises(ValueError) as e:
        ModelGeometry.from_name_or_path(tmp_path)
    supported = "supports the MoE families ['qwen3_moe', 'mixtral']"
    assert named in str(e.value) and supported in str(e.value)


def test_plan_and_train_refuse_phimoe_with_exit_2_before_any_worker(tmp_path, capsys):
    path = tmp_path / "phimoe.json"
    path.write_text(json.dumps(PHIMOE))
    assert plan_main(["--model", str(path), "--seq_len", "1024", "--gpus", "2"]) == 2
    says = "ds_longctx does not model; it supports the MoE families ['qwen3_moe', 'mixtral']"
    assert says in capsys.readouterr().err.strip().splitlines()[-1]
    out = tmp_path / "out"
    train = run_cli(
        ["train", "--nproc", "2", "--model", str(path), "--output_dir", str(out)], timeout=120
    )
    assert train.returncode == 2, train.stderr[-2000:]
    assert says in train.stderr.splitlines()[-1]
    assert "worker" not in train.stderr.lower() and not out.exists()


def test_moe_terms_whole_and_tiled_and_the_levers_an_moe_refuses():
    g = ModelGeometry.from_name_or_path("qwen3-30b-a3b")
    whole = plan_memory(g, 1 << 20, 8, 8, Levers())
    tiled = plan_memory(g, 1 << 20, 8, 8, Levers(tiled_mlp=True, tile_tokens=2048))
    T, k, H, width = 131072, 8, 2048, 768
    assert whole.term("moe_experts_saved").gpu_bytes == T * k * (2 * H + 8 * width)
    assert whole.term("moe_bwd_grads").gpu_bytes == 6 * T * k * H
    assert tiled.term("moe_tile_wgrad").gpu_bytes == 6 * g.moe.block_params(H)
    assert (
        tiled.gpu_peak_bytes < whole.gpu_peak_bytes - 20e9
    )  # the untiled block: ~28 GB at its backward
    assert (
        whole.term("gathered_layers").gpu_bytes == 2 * 2 * g.layer_params
    )  # all 128 experts of two layers
    with pytest.raises(ValueError, match="tiled_layer: qwen3-30b-a3b is a mixture of experts"):
        plan_memory(g, 1 << 20, 8, 8, replace(Levers(), tiled_layer=True, tiled_mlp=True))


def test_lora_on_experts_is_refused_in_one_message_and_attention_adapters_plan():
    """LoRA's default targets name gate/up/down: on a model whose every layer is sparse, refused
    naming the fix; attention targets plan adapters on q/k/v/o alone (experts and router frozen)."""
    g = ModelGeometry.from_name_or_path("qwen3-30b-a3b")
    with pytest.raises(
        ValueError,
        match=r"lora_target_modules \['gate_proj', 'up_proj', 'down_proj'\]: a mixture of "
        r"experts' experts and router take no LoRA adapters here .* use "
        r"--lora_target_modules q_proj,k_proj,v_proj,o_proj \(or all-linear\)",
    ):
        plan_memory(g, 1 << 17, 8, 8, Levers(lora_rank=16))
    from ds_longctx.plan.memory_terms import adapters

    q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
    per_layer = 16 * ((g.hidden + q) * 2 + (g.hidden + kv) * 2)  # r·(in + out) of q, o and of k, v
    assert adapters(g, 16, ("q_proj", "k_proj", "v_proj", "o_proj"))[0] == per_layer * g.layers
    assert (
        adapters(g, 16, "all-linear")[0] == per_layer * g.layers
    )  # all-linear: the attention's (no Linear else)
    plan_memory(
        g,
        1 << 17,
        8,
        8,
        Levers(lora_rank=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    )
