"""How DeepSpeed ZeRO-3 lays out what the planner counts of it: its optimizer sub-groups (where a partial offload
splits, what the pinned gradient buffers are cut into), torch's power-of-two pinned blocks, and the ZeRO-3 settings
plan/ds_config.py writes from here so plan and run agree (reduce bucket, parameter persistence, sub-group size).
Each rule is read off DeepSpeed 0.19.8's runtime/zero/stage3.py; plan/planner.py turns them into memory terms.
"""

from __future__ import annotations

import functools

from ds_longctx.plan.geometry import ModelGeometry

# ds_config.py's reduce_bucket_size (elements); tests/plan/test_zero_buffers.py checks the two agree.
REDUCE_BUCKET_ELEMS = 50_000_000
# ZeRO-3 keeps parameters of at most this many elements whole on every GPU (stage3_param_persistence_threshold, which
# plan/ds_config.py writes from here): with offload_params they are what stays on the GPU between uses.
PARAM_PERSISTENCE_ELEMS = 100_000
# DeepSpeed ZeRO-3 sub-groups per rank under partial optimizer offload: the GPU/host split falls at sub-group
# boundaries, so more groups make `ratio` finer (DeepSpeed's default sub_group_size 1e9 gives ~5 per rank for an 8B
# model on 2 GPUs, 1 for a small one). plan/ds_config.py writes `offload_sub_group_elems`; `optimizer_split` splits
# where DeepSpeed then does.
OFFLOAD_SUB_GROUPS = 40
# DeepSpeed's default sub_group_size (runtime/zero/config.py), what a full optimizer offload runs with.
DS_SUB_GROUP_ELEMS = 1_000_000_000


def pow2(n: int) -> int:
    """n rounded up to a power of two (torch's CachingHostAllocator block sizes for pinned memory)."""
    return 1 << max(int(n) - 1, 0).bit_length()


@functools.lru_cache(maxsize=256)  # pure in (geometry, world); the search asks thousands of times
def offload_sub_group_elems(geom: ModelGeometry, world: int) -> int:
    """DeepSpeed's sub_group_size for partial offload: one rank's partition in about OFFLOAD_SUB_GROUPS groups."""
    return max(1, -(-sum(-(-n // world) for n in geom.param_numels()) // OFFLOAD_SUB_GROUPS))


@functools.lru_cache(
    maxsize=256
)  # pure in its arguments; a tuple, so no caller can change the cached value
def sub_groups(geom: ModelGeometry, world: int, sub_group_elems: int) -> tuple:
    """One rank's optimizer partition cut into DeepSpeed ZeRO-3's sub-groups (stage3.py `_create_fp16_sub_groups`:
    parameters in order, each a ceil(numel/W) partition, a sub-group closed once it reaches sub_group_size elements
    or at the last parameter): their sizes in elements."""
    groups, size = [], 0
    numels = geom.param_numels()
    for i, n in enumerate(numels):
        size += -(-n // world)
        if size >= sub_group_elems or i == len(numels) - 1:
            groups.append(size)
            size = 0
    return tuple(groups)


def optimizer_split(
    geom: ModelGeometry, world: int, ratio: float, sub_group_elems: int | None = None
) -> tuple:
    """(elements on the GPU, elements on the host) of one rank's optimizer partition under DeepSpeed ZeRO-3 partial
    offload, cut where DeepSpeed cuts (`sub_groups`; the first int((1 - ratio)·n) of the n sub-groups stay on the
    GPU). ratio 1: all on the host."""
    groups = sub_groups(geom, world, sub_group_elems or offload_sub_group_elems(geom, world))
    on_gpu = sum(groups[: int((1 - ratio) * len(groups))])
    return on_gpu, sum(groups) - on_gpu


def held_pinned_blocks(sizes, on_gpu: int) -> int:
    """Bytes torch's pinned host cache (CachingHostAllocator) holds after DeepSpeed pins one block per sub-group in
    order (`sizes`, bytes each) and frees the first `on_gpu` ones right after copying them to the GPU. A block is
    rounded up to a power of two (`pow2`) and a freed one is kept in the cache for the next request of its size: the
    next sub-group's pin reuses it, so the GPU sub-groups cost about one block, not one each. Nothing is returned to
    the system; what is held is every block the cache had to make."""
    free, held = {}, 0
    for i, n in enumerate(sizes):
        b = pow2(n)
        if free.get(b):
            free[b] -= 1
        else:
            held += b
        if (
            i < on_gpu
        ):  # copied to the GPU, then freed: the variable is rebound before the next sub-group's pin
            free[b] = free.get(b, 0) + 1
    return held


def offload_pinned_grads(
    geom: ModelGeometry,
    world: int,
    part_t: int,
    lora: bool,
    sub_group_elems: int,
    ratio: float = 1.0,
) -> tuple:
    """(bf16 bytes, fp32 bytes, note) of the two gradient buffers DeepSpeed ZeRO-3 pins per rank under optimizer
    offload, as torch's pinned allocator holds them (every block rounded up to a power of two, `pow2`):
    - the model-dtype (bf16) grad partition, one flat block of the rank's whole partition (stage3.py:
      grad_partitions_flat_buffer, on the optimizer's device, which is the CPU with any offload ratio;
      `get_accelerator().pin_memory`);
    - one fp32 grad buffer per optimizer sub-group, each its own pinned block (stage3.py, the optimizer-state init:
      subgroup_gradient_buffer). Under partial offload (`ratio` < 1) the first int((1 - ratio)·n) sub-groups are the
      GPU's: each one's pinned buffer is copied to the GPU and freed into torch's pinned cache, and the next
      sub-group's pin takes that block back (`held_pinned_blocks`), so they cost about one block in all
      (calibrated: see docs/calibration.md#pinned-blocks).
      Sub-groups at `sub_group_elems` (DeepSpeed's default for a full offload; ds_config.py sets it for a partial
      one); LoRA's adapters: one sub-group.
    The fp32 master and Adam's m / v are not pinned (a CPU clone; DeepSpeedCPUAdam's zeros_like): exact sizes."""
    groups = [part_t] if lora else sub_groups(geom, world, sub_group_elems)
    fp32 = held_pinned_blocks([4 * n for n in groups], int((1 - ratio) * len(groups)))
    return pow2(2 * part_t), fp32, f"{len(groups)} sub-group(s)"
