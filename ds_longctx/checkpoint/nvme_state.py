"""The optimizer state of a ZeRO-Infinity run (`memory.nvme_optimizer`) restored after DeepSpeed's
load, so a resume continues exactly.

    problem = resume_problem(cfg, tag_dir, meta, reshard)   # preflight: None, or the refusal
    path, client = engine.ds.load_checkpoint(...)
    restore(engine.ds, tag_dir)            # after the load, before the first step

With `offload_optimizer: nvme` DeepSpeed's load skips the ZeRO optimizer files and only copies the
checkpoint's swap files back. `restore` loads this rank's ZeRO file as DeepSpeed's own ZeRO-3 load
does (master weights, Adam moments and step counts of the sub-groups kept in memory; step counts of
the swapped ones), then registers each swapped sub-group's moments with the swapper and reads them
from the copied files. A swap file that is missing stops the load. A run without the NVMe optimizer
is left alone. Refused before the engine: swap files resumed without it, a checkpoint saved without
it resumed with it, either at another layout, and (`swapped`) an export of swap files. Why and
measured: docs/levers.md (the disk tier).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from ds_longctx.plan.ds_config import optimizer_on_nvme

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

SWAP_DIR = "offloaded_tensors"  # DeepSpeed's copy of the swap files in a tag directory


def swapped(tag_dir: Path) -> bool:
    """Whether checkpoint `tag_dir` keeps optimizer state (master weights too) in swap files."""
    swap_dir = tag_dir / SWAP_DIR
    return swap_dir.is_dir() and any(p.is_file() for p in swap_dir.rglob("*"))


def resume_problem(cfg: RunConfig, tag_dir: Path, meta: dict, reshard: bool) -> Optional[str]:
    """Why a resume of `cfg` from `tag_dir` cannot carry the optimizer state exactly across the
    NVMe optimizer's on/off or a layout change (`reshard`), or None. Reads no tensor."""
    in_files = swapped(tag_dir)
    ckpt = f"resume: checkpoint {str(tag_dir)!r}"
    if optimizer_on_nvme(cfg) and not (tag_dir / SWAP_DIR).is_dir():
        return (
            f"{ckpt} was saved without memory.nvme_optimizer, and a resume with it reads only "
            f"NVMe swap files ({SWAP_DIR}/, DeepSpeed {meta.get('deepspeed', '?')}), not the "
            f"saved ZeRO optimizer state; resume with --nvme_optimizer false"
        )
    if in_files and not optimizer_on_nvme(cfg):
        return (
            f"{ckpt} holds its optimizer state in NVMe swap files ({SWAP_DIR}/), which only a "
            f"resume with the NVMe optimizer reads; resume with --optimizer_offload true "
            f"--nvme_optimizer true and an --nvme_path"
        )
    if reshard and (in_files or optimizer_on_nvme(cfg)):
        run = meta["run"]
        return (
            f"{ckpt}: a resume at another layout does not carry the NVMe optimizer's state; resume "
            f"at the saved layout (world_size {run.get('world_size')}, sp_size "
            f"{run.get('sp_size')})" + (", or with --nvme_optimizer false" if not in_files else "")
        )
    return None


def swaps(ds_engine) -> bool:
    """Whether `ds_engine`'s ZeRO optimizer keeps its state on NVMe."""
    return bool(getattr(ds_engine.optimizer, "swap_optimizer", False))


def restore(ds_engine, tag_dir: Path) -> int:
    """After `ds_engine.load_checkpoint` of `tag_dir`: the optimizer state of the NVMe run, as saved
    (module doc). Returns the swapped sub-groups restored; 0 and nothing done without NVMe."""
    if not swaps(ds_engine):
        return 0
    zo = ds_engine.optimizer
    states = ds_engine._get_all_zero_checkpoints(str(tag_dir.parent), tag_dir.name)
    if states is None:
        raise RuntimeError(f"no ZeRO optimizer files in {tag_dir}")
    rank = dist.get_rank(group=zo.dp_process_group) if dist.is_initialized() else 0
    zo.checkpoint_event_prologue()
    # DeepSpeed's ZeRO-3 load: in-memory sub-groups whole, the step counts of swapped ones
    zo._rigid_load_state_dict(states[rank], load_optimizer_states=True)
    del states
    restored = 0
    for i, p in enumerate(zo.fp32_partitioned_groups_flat):
        if not zo._swappable_optimizer_subgroup(i):
            continue
        numel = int(zo.fp16_partitioned_groups_flat_numel[i])
        state = zo.optimizer.state.get(p, {})
        # a swapped moment is saved empty; one of full size registers its swap file
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == 0:
                state[key] = torch.empty(numel, dtype=value.dtype, device=value.device)
        _check_files(zo, p, tag_dir)
        zo._optimizer_states_and_gradient_swap_in(i)
        zo._release_swap_buffers(i)
        restored += 1
    if zo.persistent_parameters:  # gathered whole on every rank: partitioned to be regathered
        zo.persistent_parameters[0].partition(zo.persistent_parameters)
    zo.checkpoint_event_epilogue()
    return restored


def _check_files(zo, param, tag_dir: Path) -> None:
    """Every swap file of `param` (master weights, moments) is where DeepSpeed's load copied it."""
    info = zo.optimizer_swapper._get_param_swap_info(param)
    missing = [p for p in info.get_swap_paths() if not os.path.isfile(p)] if info else []
    if info is None or missing:
        raise RuntimeError(
            f"the NVMe optimizer state of sub-group {getattr(param, 'ds_id', '?')} is not in "
            f"{tag_dir / 'offloaded_tensors'} (missing {missing or 'its swap record'})"
        )
