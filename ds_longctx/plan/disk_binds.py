"""What binds a plan with the disk tier: the GPU working set, the host or the disk, in words.

what_binds("qwen3-8b", 8_000_000, 8, 80, 2000, nvme_gb=16000)   # "the GPU working set: at 8,000,000
..."
"""

from __future__ import annotations

from ds_longctx.plan.geometry import as_geometry
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.planner import GB
from ds_longctx.plan.search import _every_lever


def what_binds(geom, seq_len: int, gpus: int, gpu_mem_gb: float, host_mem_gb: float, **kw) -> str:
    """What stops `seq_len` from fitting, in words: the GPU working set (every lever on, every
    checkpoint off the GPU), else the host, else the disk (kw: choose's; nvme_gb the disk's GB)."""
    headroom, nodes, base = kw.get("headroom", 0.9), kw.get("nodes", 1), kw.get("base") or Levers()
    best = _every_lever(as_geometry(geom), seq_len, gpus, kw.get("sp_size"), base, nodes, {})
    gpu_budget = headroom * gpu_mem_gb * GB
    if best.gpu_peak_bytes > gpu_budget:
        return (
            f"the GPU working set: at {seq_len:,} tokens every lever on (sp={best.sp_size}, every "
            "checkpoint "
            f"off the GPU) needs {best.gpu_peak_bytes / GB:.1f} GB/GPU > {gpu_budget / GB:.1f} GB, "
            f"its peak in {best.peak_phase} (the per-rank "
            f"{'attention' if best.peak_phase == 'attn_bwd' else 'layer'} "
            f"backward of T={best.local_tokens:,} tokens)"
        )
    disk = headroom * kw.get("nvme_gb", 0.0) * GB
    return (
        f"host memory ({headroom * host_mem_gb:.1f} GB)"
        + (f" and the disk ({disk / GB:.1f} GB)" if disk else "")
        + f" at {seq_len:,} tokens"
    )
