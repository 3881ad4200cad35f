"""Mixture-of-experts layers under Ulysses SP and ZeRO-3: the routing, the experts' kernel, the
load-balancing loss over the whole sequence (levers/moe_aux.py), and the sparse block over token
tiles. The family's record (families.py: router rule, expert_layout) says what a block holds.

    set_experts_kernel(hf_config)  # before the model is built: transformers' grouped_mm
    # every sparse block; None for a model without one:
    moe = apply_moe(model, coef=0.001, tile_tokens=2048)
    # per micro-batch (run/batch_loss.sharded_loss, LossHead):
    moe.aux.begin(valid, weight)  ...  moe.aux.finish(group)
    remove_moe(model)

Design notes: docs/design/levers.md, section `moe.py`.
"""

from __future__ import annotations

# transformers is imported where the experts' kernel is looked up, not at import.
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ds_longctx import families
from ds_longctx.levers.moe_aux import LoadBalance, with_aux_grad
from ds_longctx.levers.tiled_mlp import TiledRows, _check_tile_tokens, _gathered, restore_forwards
from ds_longctx.parallel.patching import own_forward

log = logging.getLogger("ds_longctx")

EXPERTS_IMPLEMENTATION = "grouped_mm"  # transformers' ExpertsInterface key every run asks for
_PATCH_ATTR = "_ds_longctx_moe"


def moe_family(config) -> Optional[families.Family]:
    """The MoE family (families.py) of an HF config or a model, None for any other."""
    text = getattr(config, "config", config).get_text_config()
    fam = families.of(getattr(text, "model_type", None))
    return fam if fam is not None and fam.kind == families.MOE else None


def _expert_names(fam: families.Family) -> list:
    """The experts module's parameter names of the family's sparse block, in order."""
    return [n.removeprefix("experts.") for n in fam.expert_layout if n.startswith("experts.")]


def set_experts_kernel(hf_config) -> bool:
    """Ask transformers for its grouped experts kernel on a config with experts (before the model is
    built); returns whether the config has experts."""
    text = hf_config.get_text_config()
    if moe_family(hf_config) is None or not getattr(text, "num_experts", 0):
        return False
    text._experts_implementation = EXPERTS_IMPLEMENTATION
    return True


def expert_kernel(experts: nn.Module, fam: families.Family) -> str:
    """Which kernel transformers runs for `experts` (its `experts_implementation`; for grouped_mm,
    whether torch's grouped GEMM runs for these weights' device and dtype or transformers falls back
    to its per-expert loop)."""
    impl = getattr(getattr(experts, "config", None), "_experts_implementation", None) or "eager"
    if impl != "grouped_mm":
        return (
            f"{impl} (transformers' experts_implementation; the loop over experts)"
            if impl == "eager"
            else impl
        )
    from transformers.integrations import moe as hf_moe

    can = getattr(hf_moe, "_can_use_grouped_mm", None)
    w = getattr(experts, _expert_names(fam)[0])
    if can is None:
        return "grouped_mm (transformers chooses the kernel)"
    x = torch.empty(0, _shape(w)[-1], device=w.device, dtype=w.dtype)
    if can(
        x,
        w,
        torch.zeros(max(getattr(experts, "num_experts", 1), 1), dtype=torch.int32, device=w.device),
    ):
        fn = "torch.nn.functional.grouped_mm" if hasattr(F, "grouped_mm") else "torch._grouped_mm"
        return f"grouped_mm ({fn})"
    return (
        "grouped_mm asked for; transformers runs its per-expert fallback loop "
        f"(grouped_mm_fallback): no grouped GEMM for {w.device.type} / {w.dtype} in this torch"
    )


def route(gate: nn.Module, x: torch.Tensor, valid: torch.Tensor, aux: LoadBalance, rule: str):
    """transformers' top-k router of the family's `rule` (families.ROUTE_*) on rows x [n, H]:
    (logits [n, E], routing weights [n, k], experts [n, k]), the logits carrying the load-balancing
    gradient and their statistics recorded (moe_aux.py)."""
    logits = with_aux_grad(F.linear(x, gate.weight), valid, aux)  # [n, E]
    probs = F.softmax(logits, dtype=torch.float, dim=-1)  # [n, E] fp32
    top, idx = torch.topk(probs, gate.top_k, dim=-1)  # [n, k]
    aux.record(probs, idx, valid)
    if rule == families.ROUTE_RENORM:
        return logits, top / top.sum(dim=-1, keepdim=True), idx
    if gate.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), idx


def _shape(p: torch.Tensor) -> tuple:
    """A parameter's full shape, also when ZeRO-3 holds it partitioned (its own shape is then
    empty)."""
    return tuple(getattr(p, "ds_shape", p.shape))


def _experts_fn(experts: nn.Module) -> Callable:
    """The experts' forward without entering the module (no hooks per tile): its class's dispatching
    forward."""
    return lambda x, idx, w: type(experts).forward(experts, x, idx, w)


def tile_problem(block: nn.Module, fam: families.Family) -> Optional[str]:
    """Why the tiles cannot compute `block` of MoE family `fam` from its weights (None: they can).
    More: docs/design/levers.md."""
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    if not isinstance(gate, nn.Module) or not isinstance(experts, nn.Module):
        return f"{type(block).__name__} has no gate / experts modules"
    if not (
        isinstance(getattr(gate, "weight", None), nn.Parameter)
        and len(_shape(gate.weight)) == 2
        and hasattr(gate, "top_k")
        and (fam.router != families.ROUTE_NORM_FLAG or hasattr(gate, "norm_topk_prob"))
        and getattr(gate, "bias", None) is None
    ):
        return (
            f"its router {type(gate).__name__} is not a softmax top-k router with one [E, H] weight"
        )
    names = _expert_names(fam)
    if not all(
        isinstance(getattr(experts, n, None), nn.Parameter)
        and len(_shape(getattr(experts, n))) == 3
        for n in names
    ):
        return (
            f"its experts {type(experts).__name__} do not keep {' / '.join(names)} as 3-D "
            "parameters"
        )
    layout = {
        "has_gate": True,
        "has_bias": False,
        "is_transposed": False,
        "is_concatenated": True,
        "_is_expert_parallel": False,
    }
    odd = [k for k, v in layout.items() if getattr(experts, k, v) != v]
    if odd:
        return f"its experts have {', '.join(f'{k}={getattr(experts, k)!r}' for k in odd)}"
    if tuple(n for n, _ in block.named_parameters()) != fam.expert_layout:
        return (
            "the block holds parameters beyond the router and the experts (adapters, a shared "
            "expert)"
        )
    if getattr(block, "jitter_noise", 0):
        return f"its router jitter noise ({block.jitter_noise:g}) scales rows the tiles would not"
    patched = [type(m).__name__ for m in (block, gate, experts) if "forward" in m.__dict__]
    return f"{patched[0]}.forward is patched on the instance" if patched else None


@dataclass
class _Patch:
    """What apply_moe changed on one block, so remove_moe can undo it exactly."""

    forwards: tuple  # ((module, previous instance forward or MISSING), ...)


@dataclass
class MoeLever:
    """What apply_moe put on a model. More: docs/design/levers.md."""

    aux: LoadBalance
    blocks: list
    tile_tokens: Optional[int]
    untiled: dict = field(default_factory=dict)  # {block index: why the tiles cannot compute it}
    kernel: str = ""


def sparse_blocks(model: nn.Module) -> list:
    """Every decoder layer's `mlp` that is a sparse MoE block (has `gate` and `experts`), in module
    order."""
    return [
        m.mlp
        for m in model.modules()
        if isinstance(getattr(m, "mlp", None), nn.Module)
        and isinstance(getattr(m.mlp, "experts", None), nn.Module)
        and isinstance(getattr(m.mlp, "gate", None), nn.Module)
    ]


def _block_forward(
    block: nn.Module, untiled: Callable, tile_tokens: int, aux: LoadBalance, first: Callable, rule
):
    gate, experts = block.gate, block.experts
    params = tuple(block.parameters())
    run_experts = _experts_fn(experts)

    def tile(x, valid):  # [t, H], [t] -> [t, H]
        _, weights, idx = route(gate, x, valid, aux, rule)
        return run_experts(x, idx, weights)

    def forward(hidden):  # [b, s, H] -> [b, s, H]
        first()
        lead, H = hidden.shape[:-1], hidden.shape[-1]
        x = hidden.reshape(-1, H)  # [n, H]
        if x.shape[0] <= tile_tokens:
            return untiled(hidden)
        valid = aux.valid_rows(x.shape[0], x.device)  # [n]
        # weights gathered once per pass; a prefetch in flight is refused there
        y = TiledRows.apply(
            tile, params, tile_tokens, lambda: _gathered(params), x, valid
        )  # [n, H]
        return y.reshape(*lead, H)

    return forward


def apply_moe(
    model: nn.Module, coef: float, tile_tokens: Optional[int] = None
) -> Optional[MoeLever]:
    """Route every sparse block's router through `route` (its load-balancing statistics and
    gradient, coefficient `coef`; 0: none) and, with `tile_tokens`, run the blocks the tiles can
    compute (`tile_problem`) over tiles of that many rows. None for a model without sparse blocks.
    Undo with `remove_moe`."""
    blocks = sparse_blocks(model)
    if not blocks:
        return None
    fam = moe_family(model)
    if fam is None:
        mtype = model.config.get_text_config().model_type
        raise ValueError(
            f"model_type={mtype!r} has sparse blocks but is no MoE family of ds_longctx; use "
            f"one of {list(families.types_of(families.MOE))}"
        )
    if tile_tokens is not None:
        _check_tile_tokens(tile_tokens)
    if any(_PATCH_ATTR in b.__dict__ for b in blocks):
        raise RuntimeError("the MoE lever is already applied; call remove_moe(model) first")
    gate0 = blocks[0].gate
    aux = LoadBalance(experts=_shape(gate0.weight)[0], top_k=gate0.top_k, coef=coef)
    lever = MoeLever(aux=aux, blocks=blocks, tile_tokens=tile_tokens)
    for i, block in enumerate(blocks):
        problem = tile_problem(block, fam)
        if problem is not None and tile_tokens is not None:
            lever.untiled[i] = problem
        gate = block.gate

        def first(lv=lever, ex=block.experts):
            if not lv.kernel:
                lv.kernel = expert_kernel(ex, fam)
                log.info("MoE experts: %s (%d sparse blocks)", lv.kernel, len(lv.blocks))

        patched = [(gate, own_forward(gate))]
        gate.forward = lambda x, g=gate: route(
            g,
            x.reshape(-1, x.shape[-1]),
            aux.valid_rows(x.numel() // x.shape[-1], x.device),
            aux,
            fam.router,
        )
        patched.append((block, own_forward(block)))
        if tile_tokens is None or problem is not None:
            own = block.forward
            block.forward = lambda h, own=own, first=first: (first(), own(h))[1]
        else:
            block.forward = _block_forward(
                block, type(block).forward.__get__(block), tile_tokens, aux, first, fam.router
            )
        block.__dict__[_PATCH_ATTR] = _Patch(forwards=tuple(patched))
    tiled = len(blocks) - len(lever.untiled) if tile_tokens is not None else 0
    log.info(
        "MoE: %d sparse blocks, router aux loss coefficient %g, %d tiled%s",
        len(blocks),
        coef,
        tiled,
        f" (tiles of {tile_tokens} tokens)" if tiled else "",
    )
    return lever


def remove_moe(model: nn.Module) -> int:
    """Restore every forward apply_moe replaced; returns how many blocks (0 if none)."""
    return restore_forwards(model, _PATCH_ATTR)
