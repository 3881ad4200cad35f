"""levers/moe.py and moe_aux.py in one process, fp32, against plain HF Qwen3-MoE and Mixtral (the
shipped qwen3-moe-tiny and mixtral-tiny: 4 experts, top-2): the loss with the load-balancing term
and every gradient, untiled and tiled; the aux's row mask against transformers' own
`load_balancing_loss_func`; what the block saves against plan/moe_terms.py; the kernel logged; a
block the tiles cannot compute runs untiled, named. Multi-process SP:
tests/distributed/test_moe.py."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from ds_longctx.levers.moe import (
    apply_moe,
    moe_family,
    remove_moe,
    set_experts_kernel,
    tile_problem,
)
from tests.helpers import rel_err
from tests.saved_tensors import saved_bytes

TOL = 1e-5
# one tiny geometry per MoE family: Qwen3-MoE's router renormalises by its flag, Mixtral's always
TINY = ["qwen3-moe-tiny", "mixtral-tiny"]


def moe_model(seed: int = 0, dtype=torch.float32, name: str = "qwen3-moe-tiny"):
    from ds_longctx.run.model import init_weights, load_hf_config, model_class

    cfg = load_hf_config(name)
    cfg._attn_implementation = "eager"
    set_experts_kernel(cfg)
    model = model_class(cfg)(cfg)
    init_weights(model, seed, cfg.initializer_range)
    return model.to(dtype).train()


IDS = torch.randint(0, 512, (1, 61), generator=torch.Generator().manual_seed(0))


def hf_reference(aux: bool = True, name: str = "qwen3-moe-tiny"):
    """Plain HF: loss = CE + coef x aux (output_router_logits), its gradients."""
    model = moe_model(name=name)
    out = model(input_ids=IDS, labels=IDS, output_router_logits=aux)
    out.loss.backward()
    return out.loss.item(), {n: p.grad for n, p in model.named_parameters()}


def lever_run(tile, name: str = "qwen3-moe-tiny"):
    """The lever on the same model: HF's CE (no router logits asked) + LoadBalance's coef x aux; its
    gradients."""
    model = moe_model(name=name)
    lever = apply_moe(model, model.config.router_aux_loss_coef, tile)
    lever.aux.begin(None, 1.0)
    loss = model(input_ids=IDS, labels=IDS).loss + lever.aux.finish(None)
    loss.backward()
    return model, lever, loss.item(), {n: p.grad for n, p in model.named_parameters()}


def worst(grads, ref):
    return max((rel_err(g, ref[n]), n) for n, g in grads.items())


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("tile", [None, 7, 16], ids=["untiled", "tile7", "tile16"])
def test_loss_and_grads_equal_plain_hf_with_its_aux_loss(tile, name):
    """Untiled, and tiled with tiles that divide nothing (61 rows): HF's loss and every gradient;
    the routers' own gradient is not HF's without the aux term (the test sees the term)."""
    ref_loss, ref = hf_reference(name=name)
    model, lever, loss, grads = lever_run(tile, name)
    assert rel_err(loss, ref_loss) <= TOL
    assert worst(grads, ref)[0] <= TOL, worst(grads, ref)
    assert lever.untiled == {} and remove_moe(model) == 2
    assert all("forward" not in m.__dict__ for m in model.modules())  # every forward restored
    _, no_aux = hf_reference(aux=False, name=name)
    assert (
        rel_err(grads["model.layers.1.mlp.gate.weight"], no_aux["model.layers.1.mlp.gate.weight"])
        > 1e-3
    )


def test_counted_rows_are_hfs_attention_mask():
    """Rows begin() leaves out (SP padding) are left out as HF leaves out attention-masked rows."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = moe_model()
    mask = torch.ones(1, IDS.shape[1], dtype=torch.long)
    mask[:, -5:] = 0
    with torch.no_grad():
        logits = model(input_ids=IDS, output_router_logits=True).router_logits
        want = load_balancing_loss_func(logits, 4, 2, mask)
        lever = apply_moe(model, 0.5, None)
        lever.aux.begin(mask.bool(), 1.0)
        model(input_ids=IDS)
        got = lever.aux.finish(None) / 0.5
    assert rel_err(got, want) <= 1e-6
    assert (
        rel_err(got, load_balancing_loss_func(logits, 4, 2)) > 1e-4
    )  # the masked rows would count


@pytest.mark.parametrize("name", TINY)
def test_saved_bytes_are_the_planners(name):
    """What one bf16 sparse block saves for its backward (storages beyond its parameters and input)
    is plan/moe_terms.block_bytes' router + dispatch + experts, to 64 bytes (a few [E] buffers)."""
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.moe_terms import block_bytes

    model = moe_model(dtype=torch.bfloat16, name=name)
    lever = apply_moe(model, 0.01, None)
    lever.aux.begin(None, 1.0)
    block = model.model.layers[0].mlp
    x = torch.randn(1, 256, 64, dtype=torch.bfloat16, requires_grad=True)
    got = saved_bytes(block, x, exclude=(*block.parameters(), x))
    router, dispatch, experts, _ = block_bytes(ModelGeometry.from_name_or_path(name), 256)
    assert abs(got - (router + dispatch + experts)) <= 64, (got, router + dispatch + experts)


def test_the_expert_kernel_is_logged_once(caplog):
    model = moe_model()
    apply_moe(model, 0.01, 7)
    with caplog.at_level(logging.INFO, logger="ds_longctx"):
        model(input_ids=IDS)
        model(input_ids=IDS)
    lines = [r.getMessage() for r in caplog.records if "MoE experts" in r.getMessage()]
    assert lines == ["MoE experts: grouped_mm (torch.nn.functional.grouped_mm) (2 sparse blocks)"]


def test_a_block_the_tiles_cannot_compute_runs_untiled_and_says_why():
    """A block with a parameter beyond router and experts (as a shared expert would be): untiled,
    named, same loss."""
    model = moe_model()
    for layer in model.model.layers:
        layer.mlp.register_parameter("extra", nn.Parameter(torch.zeros(1)))
    assert "beyond the router and the experts" in tile_problem(
        model.model.layers[0].mlp, moe_family(model)
    )
    lever = apply_moe(model, 0.01, 7)
    assert sorted(lever.untiled) == [0, 1]
    lever.aux.begin(None, 1.0)
    loss = model(input_ids=IDS, labels=IDS).loss + lever.aux.finish(None)
    assert rel_err(loss.item(), hf_reference()[0]) <= TOL


@pytest.mark.parametrize("name", TINY)
def test_the_familys_expert_layout_is_the_blocks_parameters(name):
    """families.py's expert_layout names the sparse block's parameters in order, sized as the
    planner's MoeShape.block_numels."""
    from ds_longctx.plan.geometry import ModelGeometry

    model = moe_model(name=name)
    block = model.model.layers[0].mlp
    params = list(block.named_parameters())
    assert tuple(n for n, _ in params) == moe_family(model).expert_layout
    assert tile_problem(block, moe_family(model)) is None
    g = ModelGeometry.from_name_or_path(name)
    assert [p.numel() for _, p in params] == g.moe.block_numels(g.hidden)


def test_a_dense_model_has_no_moe_lever():
    from tests.helpers import tiny_model

    assert apply_moe(tiny_model(), 0.01, 7) is None
