"""Partial optimizer offload (optimizer_offload_ratio): the planner splits one rank's optimizer
partition between GPU and host where DeepSpeed ZeRO-3 does, the terms move with the split, and the
run config, ds_config and `ds-longctx plan` carry the ratio (refusing what cannot work). The
reference is DeepSpeed's rule written out here from stage3.py (`_create_fp16_sub_groups` and the
sub-group-to-device loop) over the parameters of real HF models built on the meta device."""

import pytest

from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.planner import Levers, plan_memory
from ds_longctx.plan.zero_buffers import (
    DS_SUB_GROUP_ELEMS,
    held_pinned_blocks,
    optimizer_split,
    sub_groups,
)
from tests.helpers import run_cli


def hf_numels(config) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [p.numel() for p in model.parameters()]


def deepspeed_split(numels: list, world: int, ratio: float, sub_group_size: int) -> tuple:
    """stage3.py: parameters in order, partition ceil(numel / W) each; a sub-group closes when it
    reaches sub_group_size or at the last parameter; sub-group i goes to the host iff i >= int((1 -
    ratio) * n)."""
    groups, cur = [], 0
    for i, n in enumerate(numels):
        cur += -(-n // world)
        if cur >= sub_group_size or i == len(numels) - 1:
            groups.append(cur)
            cur = 0
    host = [i >= int((1 - ratio) * len(groups)) for i in range(len(groups))]
    return sum(g for g, h in zip(groups, host) if not h), sum(g for g, h in zip(groups, host) if h)


def configs():
    from transformers import AutoConfig, LlamaConfig

    from ds_longctx.run.model import load_hf_config

    yield "qwen3-8b", load_hf_config("qwen3-8b")
    yield "qwen3-tiny", load_hf_config("qwen3-tiny")
    # another family: biases on the attention projections, no q/k norm, tied embeddings
    yield (
        "llama-bias-tied",
        LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=1000,
            attention_bias=True,
            tie_word_embeddings=True,
        ),
    )
    # biases on the MLP too
    yield (
        "llama-mlp-bias",
        LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=1000,
            mlp_bias=True,
        ),
    )
    # Qwen2: biases on q/k/v but none on o_proj, and no attention_bias key in its config
    yield (
        "qwen2",
        AutoConfig.for_model(
            "qwen2",
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=1000,
        ),
    )
    yield (
        "mistral",
        AutoConfig.for_model(
            "mistral",
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=1000,
        ),
    )


@pytest.mark.parametrize(
    "name,config", list(configs()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_the_split_is_deepspeeds(name, config):
    geom = ModelGeometry.from_config(config.to_dict(), name=name)
    numels = hf_numels(config)
    assert (
        geom.param_numels() == numels
    )  # the geometry lists the parameters as the HF model holds them
    total = sum(numels)
    for world in (1, 2, 8):
        for groups_per_rank in (3, 10, 40):
            sub = max(total // world // groups_per_rank, 1)
            for ratio in (0.0, 0.3, 0.5, 0.75, 1.0):
                got = optimizer_split(geom, world, ratio, sub_group_elems=sub)
                assert got == deepspeed_split(numels, world, ratio, sub), (world, sub, ratio)


Q8 = ModelGeometry.from_name_or_path("qwen3-8b")


def test_the_terms_move_with_the_split():
    def plan(**kw):
        return plan_memory(Q8, 131072, 2, 2, Levers(offload_layers=36, **kw), fragmentation=1.0)

    names = ("grads_bf16", "master_fp32", "adam_m_v_fp32")
    on_gpu, off = plan(), plan(optimizer_offload=True)
    half, none = (
        plan(optimizer_offload=True, optimizer_offload_ratio=0.5),
        plan(optimizer_offload=True, optimizer_offload_ratio=0),
    )
    gpu_e, host_e = optimizer_split(Q8, 2, 0.5)
    part = gpu_e + host_e
    for name, nbytes in zip(names[1:], (4, 8)):  # full offload: master and Adam not pinned, exact
        assert (off.term(name).gpu_bytes, off.term(name).host_bytes) == (0, 2 * nbytes * part)
    # full offload, pinned: the bf16 grads one block per rank (8.19 GB -> 8 GiB), the fp32 grads one
    # block per sub-group at DeepSpeed's default 1e9 elements (each just over 1e9, closed at a
    # parameter: 4.0x GB -> 8 GiB, the last one smaller)
    assert (off.term("grads_bf16").gpu_bytes, off.term("grads_bf16").host_bytes) == (0, 2 * 2**33)
    groups = sub_groups(Q8, 2, DS_SUB_GROUP_ELEMS)
    assert (
        sum(groups) == part
        and len(groups) == 4
        and all(1e9 <= n < 1e9 + 50331648 // 2 for n in groups[:-1])
    )
    assert off.term("cpu_adam_grads_fp32").host_bytes == 2 * sum(
        1 << (4 * n - 1).bit_length() for n in groups
    )
    assert off.term("cpu_adam_grads_fp32").host_bytes >= 2 * 4 * part
    for name, nbytes in zip(names[1:], (4, 8)):  # partial: master and Adam split at the sub-groups
        assert (half.term(name).gpu_bytes, half.term(name).host_bytes) == (
            nbytes * gpu_e,
            2 * nbytes * host_e,
        )
        assert (
            none.term(name).gpu_bytes == on_gpu.term(name).gpu_bytes
            and none.term(name).host_bytes == 0
        )
    # with any offload DeepSpeed keeps the whole bf16 grad partition on the CPU (its device is the
    # CPU), pinned, and pins every sub-group's fp32 grad buffer in order, freeing a GPU sub-group's
    # right after its copy to the GPU: torch's pinned cache hands that block to the next pin of its
    # size. Sub-groups at ds_config's sub_group_size for a partial offload (about 40 per rank): on 2
    # ranks the embedding's half alone first (a 2 GiB block), the lm_head's alone last (2 GiB), the
    # layers' between (512 MiB blocks).
    from ds_longctx.plan.zero_buffers import offload_sub_group_elems

    fine = sub_groups(Q8, 2, offload_sub_group_elems(Q8, 2))
    blocks = [1 << (4 * n - 1).bit_length() for n in fine]
    assert blocks[0] == blocks[-1] == 2**31 and set(blocks[1:-1]) == {2**29}
    n_gpu = int(0.5 * len(fine))
    # ratio 0.5: the embedding's block (freed, then taken by the lm_head's), one 512 MiB block
    # passed along the GPU sub-groups and kept by the first host one, and a block for each further
    # host sub-group
    assert half.term("cpu_adam_grads_fp32").host_bytes == 2 * (
        2**31 + (len(fine) - 1 - n_gpu) * 2**29
    )
    # ratio 0: every sub-group on the GPU; the cache ends holding one block of each size it was
    # asked for
    assert none.term("cpu_adam_grads_fp32").host_bytes == 2 * (2**31 + 2**29)
    for p in (half, none):
        assert (p.term("grads_bf16").gpu_bytes, p.term("grads_bf16").host_bytes) == (0, 2 * 2**33)
    assert half.term("cpu_adam_grads_fp32").gpu_bytes == 4 * gpu_e
    assert none.term("cpu_adam_grads_fp32").gpu_bytes == 4 * part
    assert (
        fine[0] == 151936 * 4096 // 2 and 30 <= len(fine) <= 41 and sum(fine) == part
    )  # the embedding alone first
    assert 0.4 < gpu_e / part < 0.6
    # the default sub-groups: about OFFLOAD_SUB_GROUPS per rank, for a small model too
    from ds_longctx.plan.zero_buffers import OFFLOAD_SUB_GROUPS

    tiny = ModelGeometry.from_name_or_path("qwen3-tiny")
    sub = offload_sub_group_elems(tiny, 2)
    assert (
        OFFLOAD_SUB_GROUPS * sub
        >= sum(-(-n // 2) for n in tiny.param_numels())
        > (OFFLOAD_SUB_GROUPS - 1) * sub
    )
    g, h = optimizer_split(tiny, 2, 0.5)
    assert g > 0 and h > 0  # split, not all on one side
    # the GPU peak grows and the host peak shrinks as the host's share falls (the pinned grads stay
    # on the host)
    assert off.gpu_peak_bytes < half.gpu_peak_bytes < none.gpu_peak_bytes
    assert (
        off.host_peak_bytes > half.host_peak_bytes > none.host_peak_bytes > on_gpu.host_peak_bytes
    )


def test_run_config_and_ds_config_carry_the_ratio():
    from ds_longctx.config import RunConfig
    from ds_longctx.plan.ds_config import build_ds_config
    from ds_longctx.plan.zero_buffers import offload_sub_group_elems

    cfg = RunConfig(model="qwen3-8b", optimizer_offload=True, optimizer_offload_ratio=0.25)
    lv = Levers.from_run_config(cfg)
    assert (lv.optimizer_offload, lv.optimizer_offload_ratio) == (True, 0.25)
    assert (
        RunConfig(model="qwen3-8b", **lv.run_config_fields()).optimizer
        == RunConfig(
            model="qwen3-8b", optimizer_offload=True, optimizer_offload_ratio=0.25, torch_adam=False
        ).optimizer
    )
    zero = build_ds_config(cfg, 2, on_gpu=True)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True, "ratio": 0.25}
    assert zero["sub_group_size"] == offload_sub_group_elems(
        ModelGeometry.from_name_or_path("qwen3-8b"), 2
    )
    full = build_ds_config(RunConfig(model="qwen3-8b", optimizer_offload=True), 2, on_gpu=True)[
        "zero_optimization"
    ]
    assert "ratio" not in full["offload_optimizer"] and "sub_group_size" not in full


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(optimizer_offload_ratio=0.5), "set optimizer_offload: true"),
        (
            dict(optimizer_offload=True, optimizer_offload_ratio=0.5, lora_rank=8),
            "set optimizer_offload_ratio: 1",
        ),
        (dict(optimizer_offload=True, optimizer_offload_ratio=1.5), "less than or equal to 1"),
    ],
)
def test_the_run_config_refuses_a_ratio_that_cannot_work(kw, needle):
    from pydantic import ValidationError

    from ds_longctx.config import RunConfig, format_validation_error

    with pytest.raises(ValidationError) as e:
        RunConfig(model="qwen3-tiny", **kw)
    assert needle in format_validation_error(e.value)


def test_plan_writes_the_ratio_when_it_offloads_and_refuses_bad_ones(tmp_path):
    from ds_longctx.config import RunConfig

    res = run_cli(
        [
            "plan",
            "--model",
            "qwen3-8b",
            "--seq_len",
            "262144",
            "--gpus",
            "2",
            "--gpu_mem_gb",
            "80",
            "--optimizer_offload_ratio",
            "0.5",
            "--out",
            str(tmp_path / "p"),
        ]
    )
    assert res.returncode == 0, res.stderr
    cfg = RunConfig.load(tmp_path / "p" / "run.yaml")
    assert cfg.optimizer.offload and cfg.optimizer.offload_ratio == 0.5
    assert (
        "--optimizer_offload_ratio 0.5" in (tmp_path / "p" / "plan.txt").read_text().splitlines()[0]
    )
    assert "(ratio 0.5)" in (tmp_path / "p" / "plan.txt").read_text()
    for args, needle in (
        (["--optimizer_offload_ratio", "2"], "must be in [0, 1]"),
        (["--optimizer_offload_ratio", "0.5", "--lora_rank", "8"], "drop one of them"),
    ):
        res = run_cli(["plan", "--model", "qwen3-8b", "--seq_len", "131072", "--gpus", "2", *args])
        assert res.returncode == 2 and needle in res.stderr, res.stderr


def test_reduce_bucket_matches_the_generated_deepspeed_config():
    from ds_longctx.config import RunConfig
    from ds_longctx.plan.ds_config import build_ds_config
    from ds_longctx.plan.zero_buffers import REDUCE_BUCKET_ELEMS

    ds = build_ds_config(RunConfig(model="qwen3-tiny", seq_len=256), 2, on_gpu=False)
    assert ds["zero_optimization"]["reduce_bucket_size"] == REDUCE_BUCKET_ELEMS


@pytest.mark.parametrize(
    "sizes, on_gpu, held",
    [
        (
            (3, 3, 3, 5, 5),
            0,
            4 + 4 + 4 + 8 + 8,
        ),  # full offload: every block kept, each rounded up to a power of two
        (
            (3, 3, 3, 5, 5),
            3,
            4 + 8 + 8,
        ),  # three GPU sub-groups pass one 4-byte block along; the host's two stay
        ((3, 3, 3, 3), 2, 4 + 4),  # the first host sub-group takes the GPU ones' block back
        (
            (9, 3, 3, 9),
            2,
            16 + 4,
        ),  # a freed block of another size waits for a pin of its size (the last)
        ((9, 3, 3), 3, 16 + 4),  # all on the GPU: one block of each size asked for stays cached
        ((), 0, 0),
    ],
)
def test_pinned_cache_hands_a_freed_gpu_sub_groups_block_to_the_next_pin(sizes, on_gpu, held):
    """DeepSpeed's optimizer-state init (stage3.py initialize_optimizer_states) pins each
    sub-group's fp32 grad buffer in order and, for a GPU sub-group, copies it to the GPU and drops
    the pinned one before the next pin; torch's pinned cache (CachingHostAllocator) keeps a freed
    block and gives it to the next request of its power-of-two size. What the cache holds at the end
    is every block it had to make (worked by hand above); tests/gpu checks torch."""
    assert held_pinned_blocks(list(sizes), on_gpu) == held
