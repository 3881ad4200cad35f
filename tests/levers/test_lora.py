"""LoRA on one process: which parameters train, the target rule and its errors, the config's errors,
the per-name draw, LoRA + tiled MLP against the untiled model, and the chunked loss skipping a
frozen lm_head's grad. (SP=2 under ZeRO-3, base unchanged after training, export:
tests/distributed/test_lora.py.)"""

import pytest
import torch
from pydantic import ValidationError

import ds_longctx.levers.chunked_loss as chunked_loss
from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.levers.lora import (
    DEFAULT_TARGETS,
    apply_lora,
    is_adapter,
    model_linears,
    target_names,
    trainable_parameters,
)
from ds_longctx.levers.tiled_mlp import apply_tiled_mlp
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.planner import Levers, plan_memory
from ds_longctx.run.preflight import validate
from tests.helpers import rel_err, tiny_model

pytest.importorskip("peft")
TINY = ModelGeometry.from_name_or_path("qwen3-tiny")


def lora_cfg(**kw):
    return RunConfig(**{"lora_rank": 4, **kw}).lora


def adapted(seed=0, **kw):
    model = tiny_model()
    apply_lora(model, lora_cfg(**kw), seed)
    return model


def test_only_the_adapters_train_and_the_model_keeps_its_class():
    model = tiny_model()
    linears, output = model_linears(model)
    n = apply_lora(model, lora_cfg(), seed=0)
    train = [name for name, p in model.named_parameters() if p.requires_grad]
    # an A and a B for each of the 7 projections of both layers; every base weight frozen
    assert len(train) == 2 * 7 * 2 and all(is_adapter(name) for name in train)
    assert all(not p.requires_grad for name, p in model.named_parameters() if not is_adapter(name))
    assert (
        n
        == sum(p.numel() for p in trainable_parameters(model))
        == sum(4 * (i + o) for name, (i, o) in linears.items() if name != output)
    )
    # what the loss head reads is still the trunk and a plain lm_head (levers/loss_head.py)
    assert (
        type(model).__name__ == "Qwen3ForCausalLM"
        and type(model.base_model).__name__ == "Qwen3Model"
    )
    assert type(model.get_output_embeddings()) is torch.nn.Linear and output == "lm_head"
    # the planner counts the same adapters from the geometry alone: grads of A params, bf16, one GPU
    assert plan_memory(TINY, 64, 1, 1, Levers(lora_rank=4)).term("grads_bf16").gpu_bytes == 2 * n


def test_geometry_names_the_models_linears():
    assert TINY.linears() == model_linears(tiny_model())[0]


@pytest.mark.parametrize(
    "targets,suffixes,count",
    [
        (["q_proj", "v_proj"], {"q_proj", "v_proj"}, 4),
        (["mlp.down_proj"], {"down_proj"}, 2),
        ("all-linear", set(DEFAULT_TARGETS), 14),  # every Linear but lm_head
        (list(DEFAULT_TARGETS), set(DEFAULT_TARGETS), 14),
    ],
)
def test_target_rule(targets, suffixes, count):
    linears, output = model_linears(tiny_model())
    names = target_names(linears, targets, output)
    assert len(names) == count and {n.rpartition(".")[2] for n in names} == suffixes
    assert names == [n for n in linears if n in names]  # module order
    model = tiny_model()
    apply_lora(model, lora_cfg(lora_target_modules=targets), 0)
    wrapped = {
        n.removesuffix(".lora_A.default.weight")
        for n, _ in model.named_parameters()
        if ".lora_A." in n
    }
    assert wrapped == set(names)


@pytest.mark.parametrize(
    "targets,needle",
    [
        (
            "q_prj",
            "'q_prj' matches no Linear of the model; its Linears end in down_proj, gate_proj, "
            "k_proj, o_proj",
        ),
        ("q_proj,lm_head", "'lm_head' matches the output layer 'lm_head'"),
    ],
)
def test_targets_the_model_lacks_are_refused_before_start(targets, needle):
    with pytest.raises(ValueError, match=needle):
        validate(RunConfig(lora_rank=4, lora_target_modules=targets), 1)
    validate(
        RunConfig(lora_rank=0, lora_target_modules=targets), 1
    )  # LoRA off: the targets are not read


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(lora_rank=-1), "lora_rank=-1 must be >= 0 (0 turns LoRA off); try 8 or 16"),
        (dict(lora_alpha=0), "lora_alpha=0.0 must be > 0"),
        (dict(lora_dropout=1.0), "lora_dropout=1.0 must be in [0, 1); try 0.0 or 0.05"),
        (dict(lora_target_modules=[]), "lora_target_modules is empty"),
        (dict(lora_target_modules="q_proj,,v_proj"), "entry '' is not a module-name suffix"),
        (
            dict(lora_target_modules=["all-linear", "q_proj"]),
            "give it alone or list suffixes without it",
        ),
        (
            dict(lora_rank=4, lora_dropout=0.1, tiled_mlp=True),
            "set lora_dropout: 0 or tiled_mlp: false",
        ),
        (dict(lora_init="ones"), "lora.init"),
    ],
)
def test_bad_lora_config_names_the_fix(kwargs, needle):
    with pytest.raises(ValidationError) as e:
        RunConfig(**kwargs)
    assert needle in format_validation_error(e.value)


def test_command_line_spellings():
    cfg = RunConfig.from_cli(
        [
            "--lora_rank",
            "8",
            "--lora_alpha",
            "32",
            "--lora_target_modules",
            "q_proj,v_proj",
            "--lora.dropout",
            "0.05",
        ]
    )
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (
        8,
        32.0,
        0.05,
        ["q_proj", "v_proj"],
    )
    assert (
        RunConfig.from_cli(["--lora_target_modules", "all-linear"]).lora.target_modules
        == "all-linear"
    )
    assert RunConfig().lora.rank == 0 and RunConfig().lora.target_modules == list(DEFAULT_TARGETS)


def test_lora_off_changes_nothing():
    model = tiny_model()
    assert apply_lora(model, RunConfig().lora, 0) == 0
    assert all(p.requires_grad for p in model.parameters()) and not any(
        is_adapter(n) for n, _ in model.named_parameters()
    )


def test_adapters_are_drawn_per_name_and_zero_b_starts_at_the_base():
    a, b, other = adapted(0), adapted(0), adapted(1)
    pa, pb, po = (dict(m.named_parameters()) for m in (a, b, other))
    for name, p in pa.items():
        if not is_adapter(name):
            continue
        assert torch.equal(p, pb[name]), name
        if ".lora_B." in name:
            assert not p.any(), name  # PEFT's convention: B = 0
        else:
            assert not torch.equal(p, po[name]) and p.abs().max() <= p.shape[1] ** -0.5
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).logits, tiny_model()(input_ids=ids).logits)
        assert (
            rel_err(adapted(0, lora_init="random_b")(input_ids=ids).logits, a(input_ids=ids).logits)
            > 1e-3
        )


def loss_and_adapter_grads(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    "targets", ["all-linear", "gate_proj,up_proj,down_proj"], ids=["all", "mlp_only"]
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_with_tiled_mlp_gives_the_untiled_grads(targets, checkpointing):
    # an MLP with adapters takes the tiled MLP's per-tile path; with the MLP's adapters alone,
    # nothing before them needs a grad: the embedding output's requires_grad (apply_lora) keeps the
    # tiles in the graph
    ids = torch.randint(0, 512, (2, 37), generator=torch.Generator().manual_seed(0))
    ref, tiled = (adapted(lora_init="random_b", lora_target_modules=targets) for _ in range(2))
    assert apply_tiled_mlp(tiled, 7) == 2
    for m in (
        (ref, tiled) if checkpointing else ()
    ):  # reentrant: a layer whose input needs no grad is cut off
        if hasattr(m, "activation_checkpointing_enable"):  # the name since transformers 5.2x
            m.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": True}
            )
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    ref_loss, ref_grads = loss_and_adapter_grads(ref, ids)
    loss, grads = loss_and_adapter_grads(tiled, ids)
    assert rel_err(loss, ref_loss) <= 1e-6
    assert set(grads) == set(ref_grads) and all(g is not None for g in grads.values())
    for (
        name,
        g,
    ) in (
        ref_grads.items()
    ):  # fp32 sums over 7-token tiles in another order: ~1e-6 (1.05e-6 for layer 1's
        assert rel_err(grads[name], g) <= 5e-6, (
            name
        )  # k_proj adapter with transformers 5.24); a wrong grad is ~1e-1
        assert g.abs().sum() > 0, name


def test_chunked_loss_computes_no_grad_for_a_frozen_lm_head(monkeypatch):
    def never(*args):
        raise AssertionError("weight gradient accumulated for a frozen lm_head")

    monkeypatch.setattr(chunked_loss, "_accumulate_grad_weight", never)
    hidden = torch.randn(10, 64, requires_grad=True)
    weight = torch.randn(512, 64)  # frozen: requires_grad False
    labels = torch.randint(0, 512, (10,))
    loss = chunked_loss.chunked_cross_entropy(hidden, weight, labels, chunk_size=3)
    loss.backward()
    ref = torch.nn.functional.cross_entropy(hidden.detach() @ weight.t(), labels, reduction="sum")
    assert rel_err(loss, ref) <= 1e-6 and hidden.grad is not None and weight.grad is None
