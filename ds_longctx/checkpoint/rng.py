"""Each rank's RNG states in a checkpoint (`rng_rank<r:05d>.pt`): torch, python, numpy and every
CUDA device, as tensors and numbers, which a weights-only load reads. Format-1 files held numpy's
state tuple pickled with numpy's globals; `set_rng_state` restores both, `numpy_state` converts the
tuple."""

from __future__ import annotations

import random

import numpy as np
import torch


def numpy_state(state) -> dict:
    """numpy's legacy RNG state tuple ('MT19937', key, pos, has_gauss, gauss) as tensors and
    numbers."""
    name, key, pos, has_gauss, gauss = state
    return {
        "bit_generator": str(name),
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def rng_state() -> dict:
    """This process's RNG states (torch, python, numpy, every CUDA device) in what a weights-only
    load reads."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": numpy_state(np.random.get_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore `rng_state`'s states (format 1's numpy tuple too)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["bit_generator"],
            n["key"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["gauss"],
        )
        if isinstance(n, dict)
        else n
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_file(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"
