"""When nothing fits: `NoFit`, the refusal `search.choose` raises, and the "Fix:" lines it carries.

`no_fit_error` writes the message from the plan with every lever on; `fix_lines` tries each change
of hardware or flags through a `fits` callable the search hands in (this module runs no search of
its own) and names those with which a plan fits; `hardware` is the machine in words, as plans and
refusals name it. No torch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from ds_longctx.parallel.parallel_state import local_kv_heads
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.planner import GB, MAX_HEADROOM, MemoryPlan


class NoFit(ValueError):
    """Raised by `choose`: nothing fits. Carries the longest length that does and what to change."""

    def __init__(self, message: str, seq_len: int, max_len: int, best: Optional[MemoryPlan]):
        super().__init__(message)
        self.seq_len, self.max_len, self.best = seq_len, max_len, best


def hardware(gpus: int, gpu_mem_gb: float, host_mem_gb: float, nodes: int = 1) -> str:
    """The machine in words, as plans and refusals name it."""
    each = f"{gpus} x {gpu_mem_gb:g} GB GPUs + {host_mem_gb:g} GB host"
    return each if nodes == 1 else f"{nodes} nodes of {each} each"


def no_fit_error(
    fits,
    best: MemoryPlan,
    seq_len: int,
    max_len: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float,
    base: Levers,
) -> NoFit:
    """The refusal of `seq_len` tokens: what `best` (every lever on) needs, the longest length that
    fits (`max_len`), and each change of hardware or flags with which `fits` finds a plan
    (`fix_lines`)."""
    geom, gpus, nodes, sp, lv = best.geom, best.gpus, best.nodes, best.sp_size, best.levers
    ratio = base.optimizer_offload_ratio
    offloaded = ("the optimizer" if ratio >= 1 else f"{ratio:g} of the optimizer") + (
        " and the parameters" if lv.offload_params else ""
    )
    machine = hardware(gpus, gpu_mem_gb, host_mem_gb, nodes)
    lines = [
        f"{geom.name} at seq_len={seq_len:,} does not fit {machine} (x headroom {headroom:g}). "
        "Every lever on "
        f"(sp_size={sp}, tiled {'layer' if lv.tiled_layer else 'MLP'}, the attention backward "
        f"over {lv.attn_bwd_head_groups} KV-head group(s), all {geom.layers} checkpoints and "
        f"{offloaded} offloaded) needs {best.gpu_peak_bytes / GB:.1f} GB/GPU and "
        f"{best.host_peak_bytes / GB:.1f} GB host"
        f"{best.over_budget(headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB)}. Longest "
        f"length that fits: {max_len:,} tokens."
    ]
    lines += fix_lines(fits, geom, gpus, nodes, gpu_mem_gb, host_mem_gb, headroom, base, sp)
    lines.append(
        f"Fix: shorten to <= {max_len:,} tokens." if max_len else "No length fits this hardware."
    )
    return NoFit("\n".join(lines), seq_len=seq_len, max_len=max_len, best=best)


def fix_lines(
    fits,
    geom,
    gpus: int,
    nodes: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float,
    base: Levers,
    sp: int,
) -> list:
    """The "Fix:" lines of a refusal: each change of hardware or flags with which `fits(gpus,
    gpu_budget, host_budget, nodes, base)` finds a plan."""
    return _hardware_fixes(fits, gpus, nodes, gpu_mem_gb, host_mem_gb, headroom) + _flag_fixes(
        fits, geom, gpus, gpu_mem_gb, host_mem_gb, headroom, base, sp
    )


def _hardware_fixes(
    fits, gpus: int, nodes: int, gpu_mem_gb: float, host_mem_gb: float, headroom: float
) -> list:
    """Larger GPUs, more host RAM, more GPUs, more nodes, or the same GPUs over more nodes."""
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    lines = []
    if (need_gpu := _least(lambda b: fits(gpus, b, host_budget))) is not None:
        lines.append(
            f"Fix: GPUs of >= {math.ceil(need_gpu / headroom / GB)} GB (same count and host)."
        )  # up: fits
    if (need_host := _least(lambda b: fits(gpus, gpu_budget, b))) is not None:
        lines.append(f"Fix: >= {math.ceil(need_host / headroom / GB)} GB host RAM (same GPUs).")
    more = next(
        (n for n in (2 * gpus, 4 * gpus, 8 * gpus) if fits(n, gpu_budget, host_budget * n / gpus)),
        None,
    )
    if more and nodes == 1:  # host RAM is assumed to grow with the GPU count
        lines.append(f"Fix: {more} GPUs of this size, host RAM scaled with them.")
    if m := next(
        (m for m in (2 * nodes, 4 * nodes, 8 * nodes) if fits(gpus, gpu_budget, host_budget, m)),
        None,
    ):
        lines.append(
            f"Fix: {m} nodes like these (--nodes {m}: ZeRO-3 partitions over {m * gpus} GPUs)."
        )
    # the same GPUs spread over more nodes, each node's host holding fewer processes (the most per
    # node that fits)
    spread = next(
        (
            n
            for n in sorted((d for d in range(1, gpus) if gpus % d == 0), reverse=True)
            if fits(n, gpu_budget, host_budget, nodes * gpus // n)
        ),
        None,
    )
    if spread:
        lines.append(
            f"Fix: the same {nodes * gpus} GPUs, {spread} per node (--gpus {spread} --nodes "
            f"{nodes * gpus // spread}: each node's host holds its own processes)."
        )
    return lines


def _flag_fixes(
    fits,
    geom,
    gpus: int,
    gpu_mem_gb: float,
    host_mem_gb: float,
    headroom: float,
    base: Levers,
    sp: int,
) -> list:
    """A flag to drop or raise: the asked head groups, the headroom, a whole-optimizer offload."""
    gpu_budget, host_budget = headroom * gpu_mem_gb * GB, headroom * host_mem_gb * GB
    lines = []
    if base.attn_bwd_head_groups > 1 and fits(
        gpus, gpu_budget, host_budget, b=replace(base, attn_bwd_head_groups=1)
    ):
        # the asked groups held sp down (or ruled the search's own groups out)
        lines.append(
            f"Fix: drop --attn_bwd_head_groups {base.attn_bwd_head_groups} (the search picks the "
            f"groups and sp_size itself; at sp_size={sp} every rank attends "
            f"{local_kv_heads(geom.kv_heads, sp)} KV heads)."
        )
    if headroom < MAX_HEADROOM and fits(
        gpus, MAX_HEADROOM * gpu_mem_gb * GB, MAX_HEADROOM * host_mem_gb * GB
    ):
        lines.append(
            f"Fix: --headroom {MAX_HEADROOM:g} (now {headroom:g}; the most of the budget a plan "
            "may fill)."
        )
    if (
        not base.partial_offload
        and base.optimizer_offload_ratio >= 1
        and fits(gpus, gpu_budget, host_budget, b=replace(base, partial_offload=True))
    ):
        # the whole optimizer on the host, as asked, is what breaks it
        lines.append(
            "Fix: drop --optimizer_offload_ratio 1 (the search then keeps a share of the optimizer "
            "on the GPU where the whole of it breaks the host budget)."
        )
    return lines


def _least(ok, hi: float = 1e14, tol: float = 0.5 * GB) -> Optional[float]:
    """The smallest budget b in (0, hi] (to within tol) with ok(b), for ok monotone in b; None if
    ok(hi) fails."""
    if not ok(hi):
        return None
    lo = 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
