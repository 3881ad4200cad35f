"""A gated DeltaNet layer's token mixing against a full-attention layer's, forward + backward on one
GPU, at what one rank runs under Ulysses (the planner's time model reads these rows).

    python benchmarks/bench_linear_attention.py --seq_lens 131072,1048576 --out $OUT

Shapes (defaults: Qwen3.5-27B at SP=8): the linear layer's --linear_heads key,value heads per rank
(16 / 48 over 8: 2 and 6) of dim 128, its depthwise conv1d over c' = 2·hk'·dk + hv'·dv channels
(kernel 4); the full layer's --heads / --kv_heads per rank (24 / 4 over 8: 3 and 1, the KV head
replicated) of dim 256. One sequence of S tokens, bf16. Rows (one JSON line each, the keys of
benchmarks/results/attention.jsonl, appended to `<out>/attention_linear_<date>.jsonl`, which
results_merge.py folds into attention.jsonl), each fwd and bwd timed alone with CUDA events (median
of --reps after a warm-up; the first FLA call compiles for up to minutes under tilelang) and its
peak memory:
    fla_gated_delta   FLA's chunk_gated_delta_rule (q/k L2-normalised in the kernel), what
                      parallel/gated_delta.py runs
    fla_conv1d        FLA's causal conv1d with SiLU
    torch_conv1d      the torch conv1d path (the fallback; the conv's cost without a kernel)
    sdpa_cudnn, fa4   the full-attention layer's kernels (benchmarks/bench_attention.py's
                      `at_length`)
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from bench_attention import (
    at_length,
    tflops,
    timed,
)  # benchmarks/ is sys.path[0] when this file runs
from harness import git_commit, raw_dir


def _fwd_bwd(fn, inputs: tuple, reps: int) -> dict:
    """fwd_ms, bwd_ms (from a saved forward) and the peak GB of one forward + backward of
    `fn(*inputs)`."""
    import torch

    torch.cuda.reset_peak_memory_stats()
    out = fn(*inputs)
    grad = torch.randn_like(out)
    torch.autograd.grad(out, inputs, grad, retain_graph=True)
    peak = torch.cuda.max_memory_allocated() / 1e9
    fwd_ms = timed(lambda: fn(*inputs), reps)
    bwd_ms = timed(lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), reps)
    return {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "peak_gb": round(peak, 2)}


def linear_rows(S: int, hk: int, hv: int, d: int, reps: int) -> list:
    """The gated delta rule and the conv1d (FLA and torch) at S tokens, hk / hv heads of d."""
    import torch
    import torch.nn.functional as F

    from ds_longctx.parallel import gated_delta

    g = torch.Generator(device="cuda").manual_seed(S)

    def rand(*shape):
        return torch.randn(
            *shape, device="cuda", dtype=torch.bfloat16, generator=g
        ).requires_grad_()

    q, k, v = rand(1, S, hk, d), rand(1, S, hk, d), rand(1, S, hv, d)
    gate = (-F.softplus(torch.randn(1, S, hv, device="cuda", generator=g))).requires_grad_()
    beta = torch.rand(1, S, hv, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    rows = []
    gated_delta.select_linear("fla", announce=False)
    rows.append(
        {
            "backend": "fla_gated_delta",
            **_fwd_bwd(gated_delta.gated_delta_rule, (q, k, v, gate, beta), reps),
        }
    )
    del q, k, v, gate, beta
    c = 2 * hk * d + hv * d
    x, w = rand(1, S, c), rand(c, 4)
    rows.append({"backend": "fla_conv1d", **_fwd_bwd(gated_delta.causal_conv1d, (x, w), reps)})
    gated_delta.select_linear("torch", announce=False)
    rows.append({"backend": "torch_conv1d", **_fwd_bwd(gated_delta.causal_conv1d, (x, w), reps)})
    del x, w
    torch.cuda.empty_cache()
    return [dict(r, seq_len=S, heads=hv, kv_heads=hk, head_dim=d, causal=True) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq_lens", default="131072,1048576")
    ap.add_argument(
        "--linear_heads", default="2,6", help="key,value heads per rank (Qwen3.5-27B at SP=8)"
    )
    ap.add_argument("--linear_head_dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=3, help="the full layer's query heads per rank")
    ap.add_argument("--kv_heads", type=int, default=1)
    ap.add_argument("--head_dim", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument(
        "--commit", default=None, help="the tree's commit (a device copy can carry a stale .git)"
    )
    a = ap.parse_args()

    import torch

    hk, hv = (int(x) for x in a.linear_heads.split(","))
    rows = []
    for S in (int(x) for x in a.seq_lens.split(",")):
        rows += linear_rows(S, hk, hv, a.linear_head_dim, a.reps)
        for r in at_length(S, a.heads, a.kv_heads, a.head_dim, a.reps):
            r.update(
                heads=a.heads,
                kv_heads=a.kv_heads,
                head_dim=a.head_dim,
                causal=True,
                fwd_tflops=round(tflops(2.0 * S * S * a.heads * a.head_dim, r["fwd_ms"]), 1),
                bwd_tflops=round(tflops(5.0 * S * S * a.heads * a.head_dim, r["bwd_ms"]), 1),
            )
            rows.append(r)
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(a.commit),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "bf16",
    }
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = (
        out_dir / f"attention_linear_{meta['date']}.jsonl"
    )  # results_merge reads attention_*.jsonl
    lines = [
        f"{'backend':<16}{'seq_len':>10}{'heads':>7}{'fwd ms':>10}{'bwd ms':>10}{'fwd+bwd ms':>12}"
    ]
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps({**meta, **r}) + "\n")
            lines.append(
                f"{r['backend']:<16}{r['seq_len']:>10,}{r['heads']:>7}{r['fwd_ms']:>10.1f}{r['bwd_ms']:>10.1f}"
                f"{r['fwd_ms'] + r['bwd_ms']:>12.1f}"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
