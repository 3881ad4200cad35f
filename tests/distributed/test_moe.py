"""A mixture of experts (the shipped qwen3-moe-tiny: 4 experts, top-2, router_aux_loss_coef 0.01)
through the engine on CPU over gloo (ZeRO-3, Ulysses SP): the loss (cross-entropy + coef x the
load-balancing loss) and every gradient against plain HF's on the full sequence, fp32, rel <= 1e-5,
at SP=1 and SP=2, untiled and tiled.

One input covers the cases that move the aux: three packed documents (HF's reference runs each
document alone; its load-balancing loss is `load_balancing_loss_func` over the routers of the whole
row, as for a packed row), 63 tokens (SP=2 pads one token, which must not count in the aux) and a
29-token document across the slice border. The tiled run also recomputes its lower layer through
DeepSpeed's reentrant checkpoint (the first forward runs without grad: the aux gradient comes from
the recompute) and keeps the upper layer's attention output."""

import pytest
import torch

from tests.distributed.test_ulysses import check, run, sample

pytestmark = pytest.mark.slow
LENS = [20, 29, 14]


def reference(rows: list, doc_lens: list = None, model_name: str = "qwen3-moe-tiny"):
    """HF's own loss with output_router_logits over a step's micro-batches (one row each): the
    documents' token-weighted CE over every row, + coef x the mean over the rows of
    load_balancing_loss_func over each row's routers (a packed row's: every document's); its loss,
    gradients and the first row's aux."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from ds_longctx.levers.moe import set_experts_kernel
    from ds_longctx.run.model import init_weights, load_hf_config, model_class

    cfg = load_hf_config(model_name)
    cfg._attn_implementation = "eager"
    set_experts_kernel(cfg)
    model = model_class(cfg)(cfg)
    init_weights(model, 0, cfg.initializer_range)
    model.train()
    ce, n, auxes = 0.0, 0, []
    for ids in rows:
        routers, start = [], 0
        for L in doc_lens or [len(ids)]:
            doc = ids[start : start + L][None]
            out = model(input_ids=doc, labels=doc, output_router_logits=True)
            doc_ce = (
                out.loss - cfg.router_aux_loss_coef * out.aux_loss
            )  # HF adds the document's own aux: taken out
            ce = ce + doc_ce * (L - 1)  # HF's token mean of the document, back to its sum
            n += L - 1
            routers.append(out.router_logits)
            start += L
        per_layer = tuple(
            torch.cat(layer) for layer in zip(*routers)
        )  # [row tokens, E] per sparse layer
        auxes.append(load_balancing_loss_func(per_layer, cfg.num_experts, cfg.num_experts_per_tok))
    aux = auxes[0]
    loss = ce / n + cfg.router_aux_loss_coef * sum(auxes) / len(auxes)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}, aux.item()


def test_moe_loss_and_grads_match_plain_hf_at_sp1_and_sp2_tiled_or_not(tmp_path):
    ids = sample(0, sum(LENS))
    ref_loss, ref_grads, aux = reference([ids], LENS)
    assert aux > 1.0  # the load-balancing term is there (E · Σ f·P >= 1 for top-2 of 4)
    runs = {
        "sp1": run(tmp_path, 1, 1, length=sum(LENS), packed=LENS, model="qwen3-moe-tiny"),
        "sp2": run(tmp_path, 2, 2, length=sum(LENS), packed=LENS, model="qwen3-moe-tiny"),
        # tiled, under DeepSpeed's (reentrant) checkpoint of the lower layer and the upper one's
        # attention cache
        "sp2_tiled": run(
            tmp_path,
            2,
            2,
            length=sum(LENS),
            packed=LENS,
            model="qwen3-moe-tiny",
            tiled_mlp=True,
            tile_tokens=7,
            placement="offload:1,cache:1",
            chunked_loss=True,
            loss_chunk_rows=5,
        ),
    }
    for name, got in runs.items():
        assert got["tokens"] == sum(L - 1 for L in LENS), name
        check(got, ref_loss, ref_grads)


def test_mixtral_at_sp2_tiled_matches_plain_hf(tmp_path):
    """mixtral-tiny (router before the experts, always renormalised, fp32 routing weights) through
    the same engine, SP=2 and tiled: plain HF's loss and gradients."""
    ids = sample(0, sum(LENS))
    ref_loss, ref_grads, _ = reference([ids], LENS, "mixtral-tiny")
    got = run(
        tmp_path,
        2,
        2,
        length=sum(LENS),
        packed=LENS,
        model="mixtral-tiny",
        tiled_mlp=True,
        tile_tokens=7,
    )
    assert got["tokens"] == sum(L - 1 for L in LENS)
    check(got, ref_loss, ref_grads)


def test_moe_over_two_micro_batches_weighs_each_aux_once(tmp_path):
    """grad_accum 2 at SP=2: the step's CE over both rows' tokens + coef x the mean of the two rows'
    aux losses."""
    got = run(tmp_path, 2, 2, length=64, micro=2, model="qwen3-moe-tiny")
    ref_loss, ref_grads, _ = reference([sample(0), sample(1)])
    check(got, ref_loss, ref_grads)
