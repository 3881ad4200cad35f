"""A DPO row's attention against the SFT row's of the same length (one GPU): forward + backward
milliseconds.

    python benchmarks/bench_shared_prefix.py --seq_len 262144 --completion_len 4096 --out $OUT

Shapes: one rank of Qwen3-8B under SP=8 (4 query / 1 KV head, head_dim 128), bf16, through the
attention the engine runs (`ulysses.UlyssesAttention._attend`, the backend `auto` picks). Layouts:
`sft` the row as one causal
document; `shared` a DPO row (prompt S - 2C, chosen C, rejected C) with queries once and keys /
values over [P, C, P, R] (parallel/shared_prefix.py); `virtual` the same row with the queries
gathered too (each completion after its own prompt, the fallback). The planner counts shared/sft = 1
- 2·C²/S² and virtual/sft near 2 (plan/preference_terms.py); the ratios printed are the measured
  ones. Appends one JSON line per layout to
`<out>/shared_prefix_<date>.jsonl`.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from bench_attention import timed
from harness import git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs


def layouts(S: int, C: int) -> dict:
    """{name: SharedLayout or None} of the three layouts of a row of S tokens with completions of
    C."""
    import torch

    from ds_longctx.parallel.shared_prefix import shared_layout

    P = S - 2 * C
    branch = torch.cat([torch.zeros(P), torch.ones(C), torch.full((C,), 2)]).long()
    pos = torch.cat([torch.arange(P + C), torch.arange(P, P + C)])
    lay = shared_layout(pos, branch)
    return {"sft": None, "shared": lay, "virtual": lay}


def run(S: int, C: int, reps: int) -> list:
    import torch

    from ds_longctx.parallel import attention, ulysses
    from ds_longctx.parallel.parallel_state import ParallelState

    choice = attention.select("auto", announce=False, head_dim=128)
    h, hk, d = 4, 1, 128
    g = torch.Generator(device="cuda").manual_seed(S)
    q, k, v = (
        torch.randn(1, n, S, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for n in (h, hk, hk)
    )
    dout = torch.randn(1, S, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    attn = ulysses.UlyssesAttention(ParallelState.single(), h, hk)
    rows = []
    for name, lay in layouts(S, C).items():
        attn.shared = lay
        keys = attention.SEPARATE_KEYS
        if name == "virtual":
            attention.SEPARATE_KEYS = ()  # the fallback: queries gathered too
        try:
            ms = timed(lambda: attn._attend(q, k, v, d**-0.5, None).backward(dout), reps)
        finally:
            attention.SEPARATE_KEYS = keys
        rows.append({"layout": name, "seq_len": S, "completion_len": C, "fwd_bwd_ms": ms})
    for r in rows:
        r.update(backend=choice.backend, vs_sft=r["fwd_bwd_ms"] / rows[0]["fwd_bwd_ms"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seq_len", type=int, default=262144)
    p.add_argument("--completion_len", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    p.add_argument(
        "--commit", default=None, help="the commit this tree is (a device copy's .git is stale)"
    )
    a = p.parse_args()
    import torch

    rows = run(a.seq_len, a.completion_len, a.reps)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"shared_prefix_{datetime.date.today():%Y%m%d}.jsonl"
    with path.open("a") as f:
        for r in rows:
            r.update(device=torch.cuda.get_device_name(), commit=git_commit(a.commit))
            f.write(json.dumps(r) + "\n")
    print(
        f"{'layout':<8} {'ms':>10} {'vs sft':>7}  ({rows[0]['backend']}, S={a.seq_len:,}, "
        f"C={a.completion_len:,})"
    )
    for r in rows:
        print(f"{r['layout']:<8} {r['fwd_bwd_ms']:>10.1f} {r['vs_sft']:>7.3f}")
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
