"""Probe: a custom autograd Function recomputed by non-reentrant checkpoint while the CUDA allocator
records its history, one recording mode per process (why run/memory_snapshot.py records with
context="alloc"):

    for m in all/python all/all alloc/python state/python none; do
        python benchmarks/probe_memory_snapshot.py $m
    done

On torch 2.11 (H200) context="all" fails (SystemError from Function.apply, as
pytorch/pytorch#179536), "alloc", "state" and no context run:
benchmarks/results/sessions/2026-11-30/memory_snapshot_probe_2026-11-30.txt."""

import sys

import torch
from torch.utils.checkpoint import checkpoint

MODES = {
    "all/python": dict(context="all", stacks="python"),
    "all/all": dict(context="all", stacks="all"),
    "alloc/python": dict(context="alloc", stacks="python"),
    "state/python": dict(context="state", stacks="python"),
    "all/cpp": dict(context="all", stacks="cpp"),
    "none": dict(context=None),
}


class Lin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


mode = sys.argv[1]
torch.cuda.memory._record_memory_history(enabled="all", max_entries=100000, **MODES[mode])
w = torch.randn(64, 64, device="cuda", requires_grad=True)
x = torch.randn(8, 64, device="cuda", requires_grad=True)
try:
    y = checkpoint(lambda a: Lin.apply(torch.relu(Lin.apply(a, w)), w), x, use_reentrant=False)
    y.sum().backward()
    print(f"{mode}: ok (torch {torch.__version__})")
except Exception as e:
    print(f"{mode}: {type(e).__name__}: {str(e)[:120]} (torch {torch.__version__})")
