"""The disk tier in the search: where a plan fits the GPU but not the host, what moves to nvme_path.

    onto_disk(plan, (gpu_budget, host_budget, disk_budget), knobs)   # (plan, notes) or None

Order, cheapest step time first: the fewest offloaded checkpoints onto disk (their I/O overlaps
compute), then with the optimizer state on disk too (its I/O is in the optimizer step), then the
parameters (read every pass).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.plan.planner import GB, MemoryPlan, plan_memory


def _with(plan: MemoryPlan, d: int, nvme_opt: bool, nvme_params: bool, knobs) -> MemoryPlan:
    """`plan` with its first `d` off-GPU checkpoints on disk and the optimizer / parameters as
    asked."""
    lv, L = plan.levers, plan.geom.layers
    layout = PlacementPlan.from_counts(L, plan.placement.off_gpu, 0, disk=d)
    lv = replace(
        lv,
        offload_layers=0,
        attention_cache_layers=0,
        placement=layout,
        nvme_optimizer=nvme_opt,
        nvme_params=nvme_params,
    )
    return plan_memory(plan.geom, plan.seq_len, plan.gpus, plan.sp_size, lv, **knobs)


def onto_disk(plan: MemoryPlan, budgets: tuple, knobs) -> Optional[tuple]:
    """The least moved to disk with which `plan` (fits the GPU, not the host) fits all three
    budgets."""
    gpu_budget, host_budget, disk_budget = budgets
    lv, k = plan.levers, plan.placement.off_gpu
    steps = [(False, False)]
    if lv.optimizer_offload and lv.optimizer_offload_ratio >= 1 and not lv.lora_rank:
        steps.append((True, False))
        if lv.offload_params:
            steps.append((True, True))
    for nvme_opt, nvme_params in steps:

        def at(d, o=nvme_opt, p=nvme_params):
            return _with(plan, d, o, p, knobs)

        if at(k).host_peak_bytes > host_budget:
            continue
        lo, hi = -1, k  # at(hi) fits the host; find the fewest d that does (host falls as d grows)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if at(mid).host_peak_bytes <= host_budget else (mid, hi)
        new = at(hi)
        if new.gpu_peak_bytes > gpu_budget or new.disk_bytes > disk_budget:
            return None
        return new, _notes(new, nvme_opt, nvme_params, host_budget)
    return None


def _notes(plan: MemoryPlan, nvme_opt: bool, nvme_params: bool, host_budget: float) -> tuple:
    n = plan.placement.on_disk
    moved = ["the optimizer state"] if nvme_opt else []
    moved += ["the bf16 parameters"] if nvme_params else []
    notes = (
        f"disk tier: host memory binds ({host_budget / GB:.1f} GB); {n} of "
        f"{plan.placement.off_gpu} offloaded "
        f"checkpoints on disk (layers 0-{n - 1}), the fewest that fit the host"
        + (f", with {' and '.join(moved)} on NVMe (ZeRO-Infinity)" if moved else "")
        + f": {plan.disk_bytes / GB:.1f} GB on nvme_path",
    )
    return notes
