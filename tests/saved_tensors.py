"""What autograd saves for a backward, counted by storage: the tests that hold a lever's or a
layer's saved memory to the planner's count."""

from __future__ import annotations

import torch


def saved_bytes(fn, *args, exclude=(), numel: int | None = None, **kwargs) -> int:
    """Bytes of the distinct storages autograd saves while fn(*args, **kwargs) runs, less those of
    `exclude` (tensors: the inputs, the parameters); with `numel`, only tensors of that many
    elements."""
    own = {t.untyped_storage().data_ptr() for t in exclude}
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in own and (numel is None or t.numel() == numel):
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return sum(saved.values())
