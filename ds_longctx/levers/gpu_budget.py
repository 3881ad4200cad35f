"""The GPU memory a run may use: the CUDA caching allocator capped at the budget the plan was made
for.

    # run config; `ds-longctx plan` writes its --gpu_mem_gb here; null: the whole GPU
    memory.gpu_budget_gb: 64

Design notes: docs/design/levers.md, section `gpu_budget.py`. Calibration:
`docs/calibration.md#gpu-budget`.
"""

from __future__ import annotations

# torch is imported inside the functions that use it: config/memory.py and the planner import this
# module.
import collections
import logging

from ds_longctx.parallel.units import GB  # the project's GB; the planner takes it from here

log = logging.getLogger("ds_longctx")

# the CUDA context's memory outside the allocator; the planner's cuda_context term is this figure
CUDA_CONTEXT_GIB = 1.5
CUDA_CONTEXT_BYTES = int(CUDA_CONTEXT_GIB * 2**30)


def allocator_fraction(
    budget_gb: float, total_bytes: int, context_bytes: int = CUDA_CONTEXT_BYTES
) -> float | None:
    """The fraction of the card's memory (`torch.cuda.get_device_properties().total_memory`) the
    allocator may reserve for a budget of `budget_gb` GB per GPU; None when the budget is the whole
    card or more (no cap)."""
    if budget_gb * GB - context_bytes <= 0:
        raise ValueError(
            f"memory.gpu_budget_gb={budget_gb:g} leaves nothing for tensors once the CUDA context "
            f"({context_bytes / GB:.2f} GB) is counted; give the GPU's memory in GB (1e9 bytes), "
            "e.g. 80"
        )
    if budget_gb * GB >= total_bytes:
        return None
    return (budget_gb * GB - context_bytes) / total_bytes


def planning_gpu_gb(budget_gb: float | None) -> float | None:
    """The GPU memory a run is planned for, GB: its gpu_budget_gb, else this process's CUDA device's
    memory; None without either (a CPU run: nothing to plan)."""
    import torch

    if budget_gb is not None or not torch.cuda.is_available():
        return budget_gb
    return torch.cuda.get_device_properties(0).total_memory / GB


def apply(budget_gb: float | None, rank: int = 0) -> float | None:
    """Cap this process's allocator on its current CUDA device at `budget_gb` (see the module doc);
    returns the fraction set, None when nothing was capped (no budget, no GPU, or a budget of the
    whole card)."""
    import torch

    if budget_gb is None or not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(dev).total_memory
    frac = allocator_fraction(budget_gb, total)
    if frac is None:
        if rank == 0:
            log.info(
                "GPU budget %.1f GB >= this GPU's %.1f GB: the allocator is not capped",
                budget_gb,
                total / GB,
            )
        return None
    torch.cuda.set_per_process_memory_fraction(frac, dev)
    if rank == 0:
        log.info(
            "GPU budget %.1f GB (memory.gpu_budget_gb): the allocator may reserve %.1f GB of this "
            "GPU's %.1f GB (the rest is the CUDA context's)",
            budget_gb,
            frac * total / GB,
            total / GB,
        )
    return frac


def out_of_budget(budget_gb: float | None, step: int) -> str:
    """The message for an out-of-memory error at step `step` (1-based; 0: making the optimizer state
    before step 1, `run/optimizer_state.py`) under `budget_gb`."""
    where = (
        f"the {budget_gb:g} GB budget per GPU (memory.gpu_budget_gb)"
        if budget_gb is not None
        else "the GPU's memory"
    )
    what = f"step {step}" if step else "making the optimizer state before step 1"
    return (
        f"stopped: {what} ran out of {where}: the live tensors need more than the plan counted. "
        "Plan again with a smaller --gpu_mem_gb (`ds-longctx plan ... --gpu_mem_gb N`) so more "
        "checkpoints and the "
        f"optimizer go to the host, or lower train.seq_len; the allocator's report is above"
    )


def bound_run_ahead(layers: list, depth: int) -> list:
    """Make the host wait, before it enqueues a decoder layer's forward (the first pass or a
    checkpoint recompute), for the GPU to reach the start of the layer `depth` layers back (module
    doc). Returns the hook handles; no-op (empty) without CUDA or with depth 0."""
    import torch

    if depth <= 0 or not torch.cuda.is_available():
        return []
    started = collections.deque()

    def before_layer(module, args):
        ev = torch.cuda.Event()
        ev.record()
        started.append(ev)
        while len(started) > depth:
            started.popleft().synchronize()

    return [layer.register_forward_pre_hook(before_layer) for layer in layers]
