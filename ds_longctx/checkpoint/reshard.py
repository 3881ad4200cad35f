"""A checkpoint resumed at another world size, sp size or dp size: each rank cuts its own ZeRO-3
partitions of the fp32 masters and Adam moments out of the universal form (checkpoint/universal.py)
into the new engine.

    # collective only in that every rank does it; reads its slices:
    load_universal(engine, tag_dir, manifest)

The partitions are cut as DeepSpeed's own universal load cuts them; docs/design/checkpoint.md."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ds_longctx.checkpoint import universal
from ds_longctx.checkpoint.layout import CheckpointError
from ds_longctx.checkpoint.universal import KEYS, partition, read_slices

log = logging.getLogger("ds_longctx")


def _zero3(engine):
    """The engine's ZeRO-3 optimizer, or a CheckpointError saying why this layout cannot take a
    resharded load."""
    zo = engine.ds.optimizer
    if not hasattr(zo, "fp32_partitioned_groups_flat") or not hasattr(zo, "param_names"):
        raise CheckpointError(
            f"reshard: the engine's optimizer is {type(zo).__name__}, not DeepSpeed 0.19.8's "
            f"ZeRO-3 optimizer; resume at the checkpoint's own layout"
        )
    if getattr(zo, "swap_optimizer", False):
        raise CheckpointError(
            "reshard: the optimizer is swapped to NVMe, which a resharded load does not fill; "
            "resume at the checkpoint's layout, or with memory.nvme_optimizer false"
        )
    return zo


def _rank_slices(tag_dir: Path, name: str, numel: int, rank: int, world: int) -> dict:
    """{key: this rank's partition of parameter `name`'s flat key}, each zero-padded to the
    partition size."""
    part = partition(numel, world)
    start, stop = min(rank * part, numel), min((rank + 1) * part, numel)
    out = {k: torch.zeros(part, dtype=torch.float32) for k in KEYS}
    if stop > start:
        for k, piece in read_slices(tag_dir, name, start, stop).items():
            out[k][: stop - start] = piece
    return out


def load_universal(engine, tag_dir: Path, manifest: dict) -> None:
    """Fill `engine`'s ZeRO-3 optimizer (fp32 masters, exp_avg, exp_avg_sq, step) and bf16
    partitions from the universal form of `tag_dir`, this rank's slices only (its files checked
    before: `universal_problem`); a parameter the checkpoint lacks, or one of another shape, is a
    CheckpointError naming it."""
    zo = _zero3(engine)
    params = {p["name"]: p for p in manifest["params"]}
    wanted = [zo.param_names[p] for group in zo.fp16_groups for p in group]
    missing = [n for n in wanted if n not in params]
    if missing:
        raise CheckpointError(
            f"reshard: {str(tag_dir)!r} has no {', '.join(missing[:3])}"
            f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}: the model or its "
            f"trainable parameters changed since it was saved; resume with the model it was saved "
            f"with"
        )
    step = torch.tensor(float(manifest["optimizer_step"]))
    for gi, group in enumerate(zo.fp16_groups):
        fp32 = zo.fp32_partitioned_groups_flat[gi]
        pieces = {k: [] for k in KEYS}
        for p in group:
            name = zo.param_names[p]
            numel, shape = params[name]["numel"], tuple(params[name]["shape"])
            if tuple(p.ds_shape) != shape:
                raise CheckpointError(
                    f"reshard: {name} is {list(p.ds_shape)} in this model and {list(shape)} in "
                    f"{str(tag_dir)!r}; resume with the model it was saved with"
                )
            pg = zo._get_param_partition_group(p)
            rank, world = dist.get_rank(group=pg), dist.get_world_size(group=pg)
            for key, piece in _rank_slices(tag_dir, name, numel, rank, world).items():
                pieces[key].append(piece)
        for key, parts in pieces.items():
            flat = torch.cat(parts) if parts else torch.zeros(0)
            if flat.numel() != fp32.numel():
                raise CheckpointError(
                    f"reshard: sub-group {gi} holds {fp32.numel()} elements on this rank and the "
                    f"partitions cut for it {flat.numel()}; DeepSpeed's layout is not the one this "
                    f"loader knows (0.19.8)"
                )
            if key == "fp32":
                fp32.data.copy_(flat.to(fp32.device))
            else:
                zo.optimizer.state.setdefault(fp32, {})[key] = flat.to(fp32.device)
        zo.optimizer.state[fp32]["step"] = _step_like(zo.optimizer.state[fp32].get("step"), step)
    _refresh_bf16(zo)


def _step_like(current, step: torch.Tensor):
    """The optimizer's step counter in the type it keeps (torch's Adam: a tensor; DeepSpeed's CPU
    Adam: an int)."""
    if current is None or torch.is_tensor(current):
        return step.clone().to(current.device if torch.is_tensor(current) else "cpu")
    return int(step.item())


def _refresh_bf16(zo) -> None:
    """The bf16 (or fp32) model partitions copied from the fp32 masters and re-pointed, as
    DeepSpeed's loads do."""
    for gi, fp32 in enumerate(zo.fp32_partitioned_groups_flat):
        if fp32.numel() > 0:
            zo.fp16_partitioned_groups_flat[gi].data.copy_(fp32.data)
    for gi, flat in enumerate(zo.fp16_partitioned_groups_flat):
        for part, new in zip(
            zo.fp16_partitioned_groups[gi], zo.unflatten(flat, zo.fp16_partitioned_groups[gi])
        ):
            part.data = new.data


def _agreed(problem, what: str, fix: str = "") -> None:
    """Every rank's `problem` (None: fine) gathered; a CheckpointError on every rank when any has
    one."""
    found = [problem]
    if dist.is_initialized():
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, problem)
    bad = [(r, p) for r, p in enumerate(found) if p is not None]
    if bad:
        raise CheckpointError(
            f"{what} (rank {bad[0][0]}: {bad[0][1]})" + (f"; {fix}" if fix else "")
        )


def resume_resharded(engine, tag_dir: Path, meta: dict, seed: int) -> None:
    """Load checkpoint `tag_dir` into `engine` built for another layout (collective): rank 0 writes
    its universal form when it has none (`ds-longctx checkpoint reshard` does it ahead), every rank
    checks its share of the files, then takes its partitions; DeepSpeed's step counters are set, and
    each rank's RNG is re-derived from the seed and the step (the old ranks' states belong to other
    ranks)."""

    rank, step = engine.state.rank, int(meta["step"])
    made = None
    try:  # every rank stops with rank 0's reason, not in a collective that never ends
        # a replacement of it cut short is ended first
        if rank == 0 and not universal.recover_universal(tag_dir):
            log.info(
                "reshard: writing the universal form of %s (`ds-longctx checkpoint reshard` does "
                "this ahead of a job)",
                tag_dir,
            )
            universal.write_universal(tag_dir, meta, show=True)
    except Exception as e:
        made = str(e) if isinstance(e, (CheckpointError, OSError)) else f"{type(e).__name__}: {e}"
    _agreed(made, f"resume: checkpoint {str(tag_dir)!r} could not be resharded")
    manifest = universal.read_manifest(tag_dir, step)
    world = dist.get_world_size() if dist.is_initialized() else 1
    _agreed(
        universal.universal_problem(tag_dir, manifest, (rank, world), show=rank == 0),
        f"resume: the universal form of {str(tag_dir)!r} could not be loaded",
        universal.rewrite(tag_dir),
    )
    load_universal(engine, tag_dir, manifest)
    ds = engine.ds
    ds.global_steps = step
    ds.global_samples = int(meta.get("samples", 0))
    ds.micro_steps = step * ds.gradient_accumulation_steps()
    derive_rng(seed, step, rank)


def derive_rng(seed: int, step: int, rank: int) -> None:
    """torch, python, numpy and CUDA RNG of `rank` after `step` steps, from the run's seed alone."""

    s = (seed * 1_000_003 + step) * 65_537 + rank
    torch.manual_seed(s)  # CUDA's generators too
    random.seed(s)
    np.random.seed(s % 2**32)
