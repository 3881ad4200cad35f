"""DeepSpeed ZeRO-3's layout as the planner counts it: optimizer sub-groups, torch's power-of-two
pinned blocks, and the ZeRO-3 settings plan/ds_config.py writes from here so plan and run agree.
Rules read off DeepSpeed's runtime/zero/stage3.py: docs/design/plan.md.
"""

from __future__ import annotations

import functools

from ds_longctx.plan.geometry import ModelGeometry

# ds_config.py's reduce_bucket_size (elements); tests/plan/test_zero_buffers.py checks the two
# agree.
REDUCE_BUCKET_ELEMS = 50_000_000
# stage3_param_persistence_threshold: smaller parameters stay whole on every GPU.
PARAM_PERSISTENCE_ELEMS = 100_000
# Sub-groups per rank under partial offload; the GPU/host split falls at their boundaries.
OFFLOAD_SUB_GROUPS = 40
# DeepSpeed's default sub_group_size, used by a full optimizer offload.
DS_SUB_GROUP_ELEMS = 1_000_000_000


def pow2(n: int) -> int:
    """n rounded up to a power of two (torch's CachingHostAllocator block sizes for pinned
    memory)."""
    return 1 << max(int(n) - 1, 0).bit_length()


@functools.lru_cache(maxsize=256)
def offload_sub_group_elems(geom: ModelGeometry, world: int) -> int:
    """DeepSpeed's sub_group_size for partial offload: one rank's partition in about
    OFFLOAD_SUB_GROUPS groups."""
    return max(1, -(-sum(-(-n // world) for n in geom.param_numels()) // OFFLOAD_SUB_GROUPS))


@functools.lru_cache(maxsize=256)
def sub_groups(geom: ModelGeometry, world: int, sub_group_elems: int) -> tuple:
    """Sizes in elements of one rank's ZeRO-3 optimizer sub-groups (`_create_fp16_sub_groups`)."""
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
    """(GPU elements, host elements) of one rank's optimizer partition, partial offload `ratio`."""
    groups = sub_groups(geom, world, sub_group_elems or offload_sub_group_elems(geom, world))
    on_gpu = sum(groups[: int((1 - ratio) * len(groups))])
    return on_gpu, sum(groups) - on_gpu


def held_pinned_blocks(sizes, on_gpu: int) -> int:
    """Bytes torch's pinned host cache holds after pinning `sizes` in order and freeing the first
    `on_gpu` after their copy; a freed block is reused by the next pin of its size."""
    free, held = {}, 0
    for i, n in enumerate(sizes):
        b = pow2(n)
        if free.get(b):
            free[b] -= 1
        else:
            held += b
        if i < on_gpu:
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
    """(bf16 bytes, fp32 bytes, note) of the gradient buffers ZeRO-3 pins per rank under optimizer
    offload: one flat bf16 block and one fp32 block per sub-group (LoRA: one).
    Calibrated: see docs/calibration.md#pinned-blocks."""
    groups = [part_t] if lora else sub_groups(geom, world, sub_group_elems)
    fp32 = held_pinned_blocks([4 * n for n in groups], int((1 - ratio) * len(groups)))
    return pow2(2 * part_t), fp32, f"{len(groups)} sub-group(s)"
