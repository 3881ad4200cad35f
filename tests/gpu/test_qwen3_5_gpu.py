"""CUDA + FLA only: Qwen3.5's gated DeltaNet kernels (parallel/gated_delta.py's FLA backend) against
the torch path in fp32, documents kept apart, and the hybrid model through the engine on GPUs
against plain HF.

Tolerances: the FLA kernels on bf16 inputs against the torch path in fp32 on the same inputs,
relative Frobenius error: output 2e-2, input grads 5e-2 (bf16 chunk kernels). The engine: bf16
against plain HF in fp32 on the same weights, loss 2e-2 (as tests/gpu/test_gpu.py bounds the dense
model).
"""

import pytest
import torch
import torch.nn.functional as F

from ds_longctx.parallel import gated_delta
from tests.distributed.test_ulysses import run, sample
from tests.helpers import gpu_env, gpus_here, rel_err, tiny_model

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        not gated_delta.fla_available(), reason="flash-linear-attention not installed"
    ),
]
N = gpus_here() if torch.cuda.is_available() else 0
DOCS = [
    0,
    1000,
    1001,
    3000,
    4096,
]  # cu_seqlens: a one-token document, lengths not multiples of the 64-token chunk


def _inputs(s: int, hk: int, hv: int, d: int):
    g = torch.Generator(device="cuda").manual_seed(s)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()

    q, k, v = rand(1, s, hk, d), rand(1, s, hk, d), rand(1, s, hv, d)
    gate = (-F.softplus(torch.randn(1, s, hv, device="cuda", generator=g) - 4.6)).requires_grad_()
    beta = torch.rand(1, s, hv, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    return q, k, v, gate, beta


def _run(backend: str, fn, inputs, dout):
    gated_delta.select_linear(backend, announce=False)
    xs = [
        t.detach().float().requires_grad_() if backend == "torch" else t.detach().requires_grad_()
        for t in inputs
    ]
    out = fn(*xs)
    out.backward(dout.to(out.dtype))
    return out.detach().float(), [x.grad.float() for x in xs]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_fla_delta_rule_matches_the_torch_path(packed):
    q, k, v, gate, beta = _inputs(4096, 2, 6, 128)  # Qwen3.5-27B's heads per rank at SP=8
    cu = torch.tensor(DOCS, dtype=torch.int32, device="cuda") if packed else None
    dout = torch.randn(1, 4096, 6, 128, device="cuda")
    ref, ref_grads = _run(
        "torch", lambda *t: gated_delta.gated_delta_rule(*t, cu), (q, k, v, gate, beta), dout
    )
    got, grads = _run(
        "fla", lambda *t: gated_delta.gated_delta_rule(*t, cu), (q, k, v, gate, beta), dout
    )
    assert rel_err(got, ref) < 2e-2
    for name, a, b in zip(("q", "k", "v", "g", "beta"), grads, ref_grads):
        assert rel_err(a, b) < 5e-2, name


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_fla_conv1d_matches_the_torch_path(packed):
    x = torch.randn(1, 4096, 1280, device="cuda").to(torch.bfloat16).requires_grad_()
    w = (torch.randn(1280, 4, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    cu = torch.tensor(DOCS, dtype=torch.int32, device="cuda") if packed else None
    dout = torch.randn(1, 4096, 1280, device="cuda")
    ref, ref_grads = _run("torch", lambda a, b: gated_delta.causal_conv1d(a, b, cu), (x, w), dout)
    got, grads = _run("fla", lambda a, b: gated_delta.causal_conv1d(a, b, cu), (x, w), dout)
    assert rel_err(got, ref) < 2e-2 and all(rel_err(a, b) < 5e-2 for a, b in zip(grads, ref_grads))


def test_hybrid_engine_on_gpus_matches_plain_hf(tmp_path):
    """qwen3.5-tiny through the engine on N GPUs (SP = N, bf16, FLA kernels, packed documents)
    against plain HF in fp32 on the same weights, each document alone."""
    lens = [20, 29, 15]
    got = run(
        tmp_path, N, N, length=64, packed=lens, env=gpu_env(), model="qwen3.5-tiny", dtype="bf16"
    )
    model = tiny_model(model="qwen3.5-tiny", attn="eager", device="cuda")
    ids, start, parts = sample(0).cuda(), 0, []
    for n in lens:
        doc = ids[start : start + n][None]
        parts.append(float(model(input_ids=doc, labels=doc).loss) * (n - 1))
        start += n
    ref = sum(parts) / sum(n - 1 for n in lens)
    assert torch.isfinite(torch.tensor(got["loss"])) and rel_err(got["loss"], ref) < 2e-2


def test_fa4_with_the_attention_kept_at_head_dim_256_gives_cudnns_loss_and_grads(tmp_path):
    """Qwen3.5's full-attention layers have heads of 256: qwen3.5-tiny at that head_dim through the
    engine (bf16, SP = the GPUs here), FlashAttention 4 with the full layer's attention output kept
    (`cache`, no recompute) against cuDNN SDPA recomputing it: the same loss and grads within bf16
    noise (test_attention_gpu's dense bounds). What `auto` needs before it picks FA4 and the cache
    at 256 (parallel/kernel_rules.FA4_VERIFIED_HEAD_DIMS)."""
    import json

    from ds_longctx.parallel import attention
    from tests.helpers import ROOT

    if not attention.fa4_available():
        pytest.skip("FlashAttention 4 not installed")
    spec = json.loads((ROOT / "ds_longctx/models/qwen3.5-tiny.json").read_text())
    spec["head_dim"] = 256
    model = tmp_path / "qwen3.5-tiny-d256.json"
    model.write_text(json.dumps(spec))
    kw = dict(dtype="bf16", length=4096, env=gpu_env(), model=str(model))
    ref = run(tmp_path, N, N, attn_backend="sdpa_cudnn", placement="keep:4", **kw)
    got = run(
        tmp_path, N, N, attn_backend="fa4", placement="keep:3,cache:1", read_placement=True, **kw
    )
    assert got["applied"][3] == "cache"
    assert rel_err(got["loss"], ref["loss"]) <= 5e-3
    errs = sorted(((rel_err(got["grads"][n], g), n) for n, g in ref["grads"].items()), reverse=True)
    assert errs[0][0] <= 5e-2, errs[:6]


def _plan_train_check(tmp_path, args: list, steps: int):
    """`ds-longctx plan ARGS` for this GPU, `ds-longctx train` on it: the loss finite, the GPU peak
    within ±10% of the plan, the host within ±15%, the FLA kernels named in the log
    (tests/gpu/test_moe_gpu.py's plan_and_train)."""
    from tests.gpu.test_moe_gpu import plan_and_train

    text, gpu, host, rows, log = plan_and_train(tmp_path, args, steps=steps)
    peak = max(r["peak_gpu_bytes"] for r in rows) / 1e9
    rss = max(r["host_rss_bytes"] for r in rows) / 1e9
    print(
        f"{args}: GPU peak {peak:.1f} GB (plan {gpu:.1f}), host {rss:.1f} GB (plan {host:.1f}), "
        f"{rows[-1]['seconds']:.2f} s/step, losses {[round(r['loss'], 4) for r in rows]}"
    )
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert "linear attention: fla" in log, log[-3000:]
    assert abs(peak / gpu - 1) <= 0.10, (peak, gpu)
    assert abs(rss / host - 1) <= 0.15, (rss, host)
    return text


def test_qwen3_5_4b_at_131072_tokens_runs_as_planned(tmp_path):
    _plan_train_check(tmp_path, ["--model", "qwen3.5-4b", "--seq_len", "131072"], steps=3)


def test_qwen3_5_4b_at_its_longest_length_runs_as_planned(tmp_path):
    text = _plan_train_check(tmp_path, ["--model", "qwen3.5-4b", "--find_max_len"], steps=1)
    assert "longest seq_len that fits" in text


@pytest.mark.parametrize("config", ["qwen3.5-4b_1m_8x80gb", "qwen3.5-4b_1m_8x141gb"])
def test_the_committed_1m_configs_rehearse_inside_the_bars(tmp_path, config):
    """Each distinct rank role, 4 layers run (of each kind the placement has) and extrapolated: GPU
    within ±10% of the plan and under its budget, host within ±15%; the predicted step printed."""
    import json

    from tests.helpers import ROOT, run_cli

    out = tmp_path / "rehearsal.jsonl"
    res = run_cli(
        [
            "rehearse",
            "--config",
            str(ROOT / "ds_configs" / config / "run.yaml"),
            "--rank",
            "roles",
            "--layers",
            "4",
            "--out",
            str(out),
        ],
        env=gpu_env(),
        timeout=7200,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for r in (json.loads(line) for line in out.read_text().splitlines()):
        print(
            f"{config} rank {r['rank']}: predicted {r['predicted_seconds_per_step']:.1f} s/step, "
            f"GPU {r['gpu_vs_plan']:+.1%}, host {r['host_vs_plan']:+.1%}"
        )
        assert r["status"] == "ok" and r["finite"], r
        assert abs(r["gpu_vs_plan"]) <= 0.10 and abs(r["host_vs_plan"]) <= 0.15, r
        assert r["peak_gpu_bytes"] <= r["gpu_budget_bytes"], r
