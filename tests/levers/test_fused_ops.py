"""fused_ops.py on CPU: the routing and its undo, with stand-ins for Liger's Triton functions
written here as the plain math (Liger itself needs CUDA: tests/gpu/test_fused_ops_gpu.py holds its
numerics against the plain HF layer)."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from ds_longctx.levers import fused_ops
from tests.helpers import rel_err, tiny_model


class _RMS(
    torch.autograd.Function
):  # stand-in for LigerRMSNormFunction: Llama casting, not in place
    @staticmethod
    def forward(ctx, x, w, eps, offset, casting, in_place):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xx, ww = x.detach().requires_grad_(), w.detach().requires_grad_()
            x32 = xx.float()
            y = ww * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + ctx.eps)).to(xx.dtype)
            dx, dw = torch.autograd.grad(y, (xx, ww), g)
        return dx, dw, None, None, None, None


class _SiLUMul(torch.autograd.Function):  # stand-in for LigerSiLUMulFunction
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        s = torch.sigmoid(a)
        return g * b * s * (1 + a * (1 - s)), g * a * s


@pytest.fixture
def fake_liger(monkeypatch):
    from transformers.models.qwen3 import modeling_qwen3

    calls = {"rope": 0}
    plain_rope = modeling_qwen3.apply_rotary_pos_emb

    def rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        calls["rope"] += 1
        return plain_rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    mods = {
        "liger_kernel": types.ModuleType("liger_kernel"),
        "liger_kernel.ops": types.ModuleType("liger_kernel.ops"),
        "liger_kernel.ops.rms_norm": types.SimpleNamespace(LigerRMSNormFunction=_RMS),
        "liger_kernel.ops.swiglu": types.SimpleNamespace(LigerSiLUMulFunction=_SiLUMul),
        "liger_kernel.transformers": types.ModuleType("liger_kernel.transformers"),
        "liger_kernel.transformers.rope": types.SimpleNamespace(liger_rotary_pos_emb=rope),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return calls, plain_rope


def test_routes_every_norm_mlp_and_rope_and_undoes_it(fake_liger):
    from transformers.models.qwen3 import modeling_qwen3

    calls, plain_rope = fake_liger
    ref = tiny_model(attn="eager")
    model = copy.deepcopy(ref)
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3)
    )
    want = ref(input_ids=ids, labels=ids)  # before the patch: the rotary function is module-wide
    want.loss.backward()
    assert fused_ops.apply_fused_ops(model, "liger") == ["rms_norm", "rope", "swiglu"]
    assert modeling_qwen3.apply_rotary_pos_emb is not plain_rope
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(
        "forward" in m.__dict__ for m in norms
    )  # 2 per layer + q/k norms + the final norm
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert (
        calls["rope"] == ref.config.num_hidden_layers
    )  # one fused rotary call per attention layer
    assert rel_err(out.loss, want.loss) <= 1e-6
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-5, n
    fused_ops.remove_fused_ops(model)
    assert modeling_qwen3.apply_rotary_pos_emb is plain_rope
    assert not any(
        "forward" in m.__dict__ or fused_ops._PREV in m.__dict__ for m in model.modules()
    )


def test_compile_routes_the_same_math_through_inductor_and_undoes_it():
    """fused_ops=compile on CPU: TorchInductor compiles HF's RMSNorm, SiLU*up and rotary; loss and
    every grad equal the plain model's (fp32; inductor may reorder a sum: rel <= 1e-5)."""
    from transformers.models.qwen3 import modeling_qwen3

    plain_rope = modeling_qwen3.apply_rotary_pos_emb
    ref = tiny_model(attn="eager")
    model = copy.deepcopy(ref)
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3)
    )
    want = ref(input_ids=ids, labels=ids)
    want.loss.backward()
    assert fused_ops.apply_fused_ops(model, "compile") == ["rms_norm", "rope", "swiglu"]
    try:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    finally:
        fused_ops.remove_fused_ops(model)
    assert modeling_qwen3.apply_rotary_pos_emb is plain_rope
    assert rel_err(out.loss, want.loss) <= 1e-6
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-5, n


def test_refused_where_it_cannot_run():
    fused_ops.check_fused_ops("none", on_cuda=False)
    fused_ops.check_fused_ops("compile", on_cuda=False)
    with pytest.raises(ValueError, match="fused_ops='liger' needs a CUDA GPU"):
        fused_ops.check_fused_ops("liger", on_cuda=False)


def test_auto_is_compile_on_cuda_and_none_on_cpu_and_says_why():
    fused_ops.check_fused_ops("auto", on_cuda=False)
    kind, why = fused_ops.resolve_fused_ops("auto", on_cuda=True)
    assert kind == "compile" and "measured fastest" in why and "peers.jsonl" in why
    assert fused_ops.resolve_fused_ops("auto", on_cuda=False) == ("none", "auto: no CUDA GPU")
    assert fused_ops.resolve_fused_ops("liger", on_cuda=True) == ("liger", "asked for")
    from ds_longctx.config import RunConfig

    assert RunConfig().kernels.fused_ops == "auto"


def test_compile_keeps_every_shape_of_a_ragged_tiled_run_compiled():
    """Tiles that do not divide the sequence, a forward without grad (a checkpointed layer's) and
    one with: the compiled RMSNorm meets more shapes and grad modes than TorchDynamo's default limit
    of 8 graphs (hidden, q-head and KV-head norms on full and last tiles, the final norm, in both
    modes). None is left to the eager fallback past the limit (as on the 4B run of
    benchmarks/results/sessions/2026-12-01/planner_runs_2026-12-01c.md): with
    `fail_on_recompile_limit_hit` that fallback raises. Loss and grads are the plain model's."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from ds_longctx.levers.tiled_layer import apply_tiled_layer

    torch._dynamo.reset()
    ref = tiny_model()
    model = copy.deepcopy(ref)
    fused_ops.apply_fused_ops(model, "compile")
    apply_tiled_layer(model, 8)
    ids = torch.randint(
        0, ref.config.vocab_size, (1, 29), generator=torch.Generator().manual_seed(5)
    )
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            with torch.no_grad():
                model(input_ids=ids, labels=ids)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
    finally:
        fused_ops.remove_fused_ops(model)
    assert (
        len(_debug_get_cache_entry_list(fused_ops._rms_math.__code__)) > 8
    )  # past the default limit
    want = ref(input_ids=ids, labels=ids)
    want.loss.backward()
    assert rel_err(out.loss, want.loss) <= 1e-6
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-5, n


def test_a_torch_without_a_per_function_limit_gets_the_process_wide_one_raised(monkeypatch):
    """torch.compile without `recompile_limit=` (older torch, e.g. the device's 2.11 if it lacks
    it): TorchDynamo's process-wide limit is raised to COMPILE_SHAPES instead, never lowered."""
    import torch._dynamo

    compiled = []

    def old_compile(
        fn, *, dynamic=None
    ):  # the signature of a torch.compile with no per-function limit
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", old_compile)
    # the config's own patch restores it (pytest's monkeypatch would delete, which hides the key for
    # good)
    with torch._dynamo.config.patch(recompile_limit=8):
        fused_ops._compiled.__wrapped__(None)
        assert (
            torch._dynamo.config.recompile_limit == fused_ops.COMPILE_SHAPES and len(compiled) == 3
        )
    with torch._dynamo.config.patch(recompile_limit=1000):
        fused_ops._compiled.__wrapped__(None)
        assert torch._dynamo.config.recompile_limit == 1000
