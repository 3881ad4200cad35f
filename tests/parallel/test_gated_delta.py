"""The gated DeltaNet's mixers on CPU (parallel/gated_delta.py) against transformers' own torch
code, documents one by one; the sp sizes a hybrid model allows; the kernel refusals; the Ulysses
wrapper's install / uninstall pair (parallel/ulysses_linear.py). The SP numerics through the engine:
tests/distributed/test_ulysses_linear.py."""

import json
import time

import pytest
import torch
import torch.nn.functional as F

from ds_longctx.config import SHIPPED_MODELS_DIR
from ds_longctx.parallel import gated_delta, kernel_rules, ulysses, ulysses_linear
from ds_longctx.parallel.parallel_state import ParallelState, check_sp_size, valid_sp_sizes
from ds_longctx.plan.geometry import ModelGeometry
from tests.helpers import rel_err, run_cli, tiny_model

DOCS = [
    (0, 40),
    (40, 41),
    (41, 150),
]  # a one-token document, and one longer than the 64-token chunk


def _inputs(s=150, hk=2, hv=4, dk=16, dv=8):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, s, hk, dk, generator=g), torch.randn(1, s, hk, dk, generator=g)
    v = torch.randn(1, s, hv, dv, generator=g)
    return (
        q,
        k,
        v,
        -F.softplus(torch.randn(1, s, hv, generator=g)),
        torch.rand(1, s, hv, generator=g),
    )


def test_delta_rule_and_conv_equal_transformers_per_document():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    q, k, v, g, beta = _inputs()
    ref, _ = hf.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert rel_err(gated_delta.gated_delta_rule(q, k, v, g, beta), ref) < 1e-6
    cu = torch.tensor([a for a, _ in DOCS] + [DOCS[-1][1]], dtype=torch.int32)
    # the documents one by one through transformers' token-by-token recurrence (no chunking at all)
    ref = torch.cat(
        [
            hf.torch_recurrent_gated_delta_rule(
                *(t[:, a:e] for t in (q, k, v)),
                g=g[:, a:e],
                beta=beta[:, a:e],
                use_qk_l2norm_in_kernel=True,
            )[0]
            for a, e in DOCS
        ],
        dim=1,
    )
    assert rel_err(gated_delta.gated_delta_rule(q, k, v, g, beta, cu), ref) < 1e-6
    x, w = torch.randn(1, 150, 12), torch.randn(12, 4)

    def conv(t):  # transformers' fallback: F.conv1d with K-1 left padding, SiLU
        return F.silu(
            F.conv1d(t.transpose(1, 2), w[:, None], padding=3, groups=12)[..., : t.shape[1]]
        ).transpose(1, 2)

    assert rel_err(gated_delta.causal_conv1d(x, w), conv(x)) < 1e-6
    assert (
        rel_err(
            gated_delta.causal_conv1d(x, w, cu), torch.cat([conv(x[:, a:e]) for a, e in DOCS], 1)
        )
        < 1e-6
    )


def test_sp_sizes_of_a_hybrid_model():
    q27 = ModelGeometry.from_name_or_path(
        "qwen3.5-27b"
    )  # 24 q / 4 KV heads; linear 16 key / 48 value heads
    assert q27.linear_heads == (16, 48)
    assert valid_sp_sizes(8, q27.heads, q27.kv_heads, linear_heads=q27.linear_heads) == [1, 2, 4, 8]
    # 8 q / 2 KV heads allow sp 8 (KV replicated); 2 key / 4 value linear heads do not: the linear
    # rule refuses it
    assert valid_sp_sizes(8, 8, 2, linear_heads=(2, 4)) == [1, 2, 4]
    with pytest.raises(
        ValueError, match=r"sp_size=8 must divide linear_num_value_heads=4 .*try one of \[1, 2, 4\]"
    ):
        check_sp_size(8, 8, 8, 2, linear_heads=(2, 4))
    with pytest.raises(
        ValueError, match="neither divides linear_num_key_heads=4 nor is a multiple"
    ):
        check_sp_size(6, 6, 12, 6, linear_heads=(4, 12))  # 6 > 4 key heads, not a multiple of them


def test_cli_refuses_an_sp_size_the_linear_heads_cannot_take(tmp_path):
    """A hybrid config.json whose attention heads allow sp=8 but whose 4 linear value heads do not:
    exit 2 naming the
    rule, before any worker starts."""
    cfg = json.loads((SHIPPED_MODELS_DIR / "qwen3.5-tiny.json").read_text())
    cfg.update(num_attention_heads=8, head_dim=16)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    t = time.perf_counter()
    res = run_cli(
        ["train", "--nproc", "8", "--sp_size", "8", "--model", str(path), "--seq_len", "64"],
        timeout=120,
    )
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert (
        "sp_size=8 must divide linear_num_value_heads=4" in last and "try one of [1, 2, 4]" in last
    ), last
    assert "torch.distributed.run" not in res.stderr and time.perf_counter() - t < 60


def test_kernel_refusals():
    refusal = kernel_rules.fla_triton_refusal("3.6.0", hopper=True, tilelang=False)
    assert (
        "wrong gradients" in refusal
        and "install tilelang" in refusal
        and "Triton >= 3.7.1" in refusal
    )
    assert kernel_rules.fla_triton_refusal("3.6.0", hopper=True, tilelang=True) is None
    assert kernel_rules.fla_triton_refusal("3.7.1", hopper=True, tilelang=False) is None
    assert kernel_rules.fla_triton_refusal("3.3.1", hopper=True, tilelang=False) is None
    assert kernel_rules.fla_triton_refusal("3.6.0", hopper=False, tilelang=False) is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="linear_attn_backend='fla' needs a CUDA GPU"):
            gated_delta.resolve_linear_backend("fla")
        assert gated_delta.resolve_linear_backend("auto").backend == "torch"


def test_install_and_uninstall_restore_every_forward():
    model = tiny_model(model="qwen3.5-tiny")
    layers = ulysses_linear.linear_modules(model)
    before = [
        (m.forward, m.conv1d.forward, dict(m.__dict__), dict(m.conv1d.__dict__)) for m in layers
    ]
    attn = ulysses.register(model, ParallelState.single())
    mixing = ulysses_linear.install(model, ParallelState.single(), attn)
    assert len(layers) == 3 and all("forward" in m.__dict__ for m in layers)
    ids = torch.arange(20)[None]
    model(input_ids=ids, labels=ids)
    assert mixing.calls == 3 and attn.calls == 1
    assert ulysses_linear.uninstall(model) == 3
    ulysses.unregister(model)
    after = [
        (m.forward, m.conv1d.forward, dict(m.__dict__), dict(m.conv1d.__dict__)) for m in layers
    ]
    assert after == before  # the class forwards again, no attribute left behind
    assert (
        ulysses_linear.install(tiny_model(), ParallelState.single(), attn) is None
    )  # dense Qwen3: nothing to wrap


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (
            dict(tiled_layer=True),
            "Qwen3_5DecoderLayer has no self_attn.*set memory.tiled_layer: false",
        ),
        (
            dict(attention_cache_layers=2),
            "only 1 layers after the 0 offloaded have softmax attention",
        ),
        (
            dict(placement="keep:2,cache:1,keep:1"),
            r"caches layers \[2\], which have no softmax attention",
        ),
        pytest.param(
            dict(linear_attn_backend="fla"),
            "linear_attn_backend='fla' needs a CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CPU only"),
        ),
    ],
)
def test_the_runs_checks_refuse_what_a_hybrid_model_cannot_run(kwargs, needle):
    from ds_longctx.config import RunConfig
    from ds_longctx.run.preflight import validate

    with pytest.raises(ValueError, match=needle):
        validate(RunConfig(model="qwen3.5-tiny", seq_len=64, **kwargs), 1)
