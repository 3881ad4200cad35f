"""Instance-level forward patches, as the levers and the Ulysses linear layers make them: a patch
saves the module's own forward (`MISSING`: none, the class's runs) under an attribute of its own and
puts it back on removal."""

from __future__ import annotations

from torch import nn

MISSING = object()  # a module without an instance-level forward: its class's


def own_forward(module: nn.Module):
    """The module's instance-level forward, or MISSING."""
    return module.__dict__.get("forward", MISSING)


def restore_forward(module: nn.Module, previous) -> None:
    """Put back the instance-level forward a patch replaced: `previous`, or none (the class's) for
    MISSING."""
    if previous is MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = previous


def restore_saved(model: nn.Module, attr: str) -> list:
    """Every module of `model` that saved its forward under `attr`: that forward put back and `attr`
    dropped; those modules, in `model.modules()` order."""
    restored = []
    for m in model.modules():
        if attr in m.__dict__:
            restore_forward(m, m.__dict__.pop(attr))
            restored.append(m)
    return restored
