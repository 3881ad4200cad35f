"""Tiled layer against the plain HF model (no patch): loss and every param grad, Qwen3 and Llama,
fp32 and bf16, tile sizes that divide nothing; what the layer saves for backward, counted; the
refusals."""

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from ds_longctx.levers import fused_ops
from ds_longctx.levers.tiled_layer import apply_tiled_layer, remove_tiled_layer
from ds_longctx.levers.tiled_mlp import apply_tiled_mlp
from tests.helpers import rel_err, tiny_model
from tests.saved_tensors import saved_bytes

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def tiny_llama(seed: int = 0):
    """A second family: Llama (no q/k norms, its own modeling module and rotary), 2 layers, GQA."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attention_bias=True,
        attn_implementation="sdpa",
        use_cache=False,
    )
    return LlamaForCausalLM(cfg).train()


MODELS = {"qwen3": lambda: tiny_model(), "llama": tiny_llama}


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,s,tile", [(1, 37, 5), (2, 24, 7), (1, 16, 16), (1, 16, 1000)])
def test_tiled_layer_equals_the_plain_model(family, dtype, b, s, tile):
    ref = MODELS[family]().to(dtype)
    model = copy.deepcopy(ref)
    assert apply_tiled_layer(model, tile) == 2
    ids = torch.randint(
        0, ref.config.vocab_size, (b, s), generator=torch.Generator().manual_seed(s)
    )
    want_loss, want = loss_and_grads(ref, ids)
    got_loss, got = loss_and_grads(model, ids)
    assert set(got) == set(want)  # every param got a grad, none extra
    assert rel_err(got_loss, want_loss) <= TOL[dtype]
    for n in want:
        assert rel_err(got[n], want[n]) <= TOL[dtype] * (5 if dtype == torch.bfloat16 else 1), n
    assert remove_tiled_layer(model) == 2
    again_loss, _ = loss_and_grads(model, ids)
    assert rel_err(again_loss, want_loss) <= TOL[dtype]


def test_under_checkpointing_and_with_the_other_levers():
    """With transformers' (non-reentrant) checkpointing on every layer, fused ops (compiled HF math)
    and tiled MLP applied first, as the engine orders them: the plain model's loss and grads."""
    ref = tiny_model()
    model = copy.deepcopy(ref)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fused_ops.apply_fused_ops(model, "compile")
    apply_tiled_mlp(model, 6)
    apply_tiled_layer(model, 6)
    ids = torch.randint(0, 512, (1, 29), generator=torch.Generator().manual_seed(0))
    want_loss, want = loss_and_grads(ref, ids)
    got_loss, got = loss_and_grads(model, ids)
    assert rel_err(got_loss, want_loss) <= 1e-5
    for n in want:
        assert rel_err(got[n], want[n]) <= 1e-4, n
    fused_ops.remove_fused_ops(model)


class OwnForwardLinear(nn.Linear):
    """A Linear subclass with its own forward, as LoRA's and quantized Linears are."""

    def forward(self, x):
        return super().forward(x)


def test_the_layer_saves_its_inputs_not_its_token_wise_tensors():
    """One layer, fp32, no loss head in the count: untiled it saves (norm upcasts, normed copies,
    q/k pre- and post-norm, MLP intermediates) many hidden-sized tensors; tiled, its input x, the
    rotary rows, q/k/v for attention, the attention output for o_proj and h for the MLP tiles."""
    ref = tiny_model()
    layer = ref.model.layers[0]
    n, H = 512, ref.config.hidden_size
    hq, hkv, d = ref.config.num_attention_heads, ref.config.num_key_value_heads, ref.config.head_dim
    x = torch.randn(1, n, H, requires_grad=True)
    pos = torch.arange(n)[None]
    emb = ref.model.rotary_emb(x, pos)

    def count(model_layer):
        return saved_bytes(
            model_layer,
            x,
            exclude=(x,),
            position_embeddings=emb,
            position_ids=pos,
            attention_mask=None,
        )

    plain = count(layer)
    apply_tiled_layer(ref, 64)
    tiled = count(layer)
    E = n * H * 4  # one fp32 hidden tensor
    # tiled: cos + sin rows (2·n·d), the attention's q/k/v and output (SDPA saves them:
    # n·(hq+2hkv)·d + n·hq·d
    # + its logsumexp), o_proj's input (the same output, reshaped: one storage), h for the MLP tiles
    # (E)
    expect = (2 * n * d + n * (hq + 2 * hkv) * d + n * hq * d + E // 4 // H * hq) * 4 + E
    assert tiled <= expect * 1.25, (tiled, expect)
    assert plain >= tiled + 8 * E, (
        plain,
        tiled,
        E,
    )  # HF's layer: > 8 more hidden tensors (MLP: 4·n·I alone)


def test_refused_where_it_cannot_run():
    model = tiny_model()
    model.model.layers[1].self_attn.k_proj.__class__ = OwnForwardLinear
    with pytest.raises(
        ValueError, match=r"tiled_layer: Qwen3DecoderLayer's self_attn.k_proj are not plain"
    ):
        apply_tiled_layer(model, 8)
    assert not any(
        "_ds_longctx_tiled_layer" in m.__dict__ for m in model.modules()
    )  # nothing half-patched
    with pytest.raises(ValueError, match="tile_tokens=0"):
        apply_tiled_layer(tiny_model(), 0)
    model = tiny_model()
    apply_tiled_layer(model, 8)
    with pytest.raises(RuntimeError, match="already applied"):
        apply_tiled_layer(model, 8)


def test_checked_before_any_work_on_a_meta_model():
    """run/preflight's check: every layer of the class on the meta device; another layer shape
    (GPT-2's ln_1 / attn / ln_2 / mlp) is refused by name, and LoRA by the run config."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen3ForCausalLM

    from ds_longctx.config import RunConfig
    from ds_longctx.levers.tiled_layer import check_tiled_layer
    from tests.helpers import tiny_config

    assert check_tiled_layer(Qwen3ForCausalLM, tiny_config("sdpa")) == 2
    with pytest.raises(
        ValueError, match="tiled_layer: GPT2Block has no input_layernorm, post_attention_layernorm"
    ):
        check_tiled_layer(GPT2LMHeadModel, GPT2Config(n_layer=2, n_embd=32, n_head=2))
    from transformers import Gemma2Config, Gemma2ForCausalLM

    gemma = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    # Gemma 2 has every part the tiles use, and two more norms around its MLP: the pre-norm form
    # would be wrong
    with pytest.raises(
        ValueError,
        match="Gemma2DecoderLayer has post_feedforward_layernorm, pre_feedforward_layernorm",
    ):
        check_tiled_layer(Gemma2ForCausalLM, gemma)
    with pytest.raises(ValueError, match="tiled_layer with lora_rank=8"):
        RunConfig(tiled_layer=True, lora_rank=8)
