"""Mixture-of-experts shapes read from an HF `config.json` (no torch), and the one refusal of MoE
families not modelled.

    # MoeShape, or None for a dense config; ValueError for another MoE:
    moe = moe_shape(cfg, model_type, where)
    # the sparse block's parameters in the family's `expert_layout` order:
    moe.block_numels(hidden)

Supported: families.py's MoE kind; another config naming experts is refused before planning.
The family's layout: docs/design/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ds_longctx import families
from ds_longctx.plan.hf_fields import check_layer_count, with_old_names

# a config that sets one of these is a mixture of experts
EXPERT_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
)


@dataclass(frozen=True)
class MoeShape:
    """The sparse layers of a mixture of experts: E experts of width I, k active per token, a
    router [E, H]."""

    experts: int  # E
    top_k: int  # k
    expert_intermediate: int  # I (moe_intermediate_size)
    sparse_layers: tuple  # indices of the layers whose MLP is the sparse block
    norm_topk_prob: bool  # the k routing weights renormalised to sum to 1
    router_aux_loss_coef: float  # the config's load-balancing loss coefficient (the run's default)
    layout: tuple  # the block's parameter names in order (families.expert_layout)
    weight_bytes: int = 2  # one routing weight: the logits' bf16, 4 where the router keeps fp32

    def block_numels(self, hidden: int) -> list:
        """The sparse block's parameters in `parameters()` order (`layout`)."""
        E, width, H = self.experts, self.expert_intermediate, hidden
        numels = {
            "experts.gate_up_proj": E * 2 * width * H,
            "experts.down_proj": E * H * width,
            "gate.weight": E * H,
        }
        return [numels[n] for n in self.layout]

    def block_params(self, hidden: int) -> int:
        """E·3·H·I + E·H (Qwen3-30B-A3B: 604,241,920 per layer)."""
        return sum(self.block_numels(hidden))

    def expert_params(self, hidden: int) -> int:
        """The experts alone, E·3·H·I: what one tile's weight-gradient buffers hold
        (levers/moe.py)."""
        return 3 * self.experts * hidden * self.expert_intermediate

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        state = "is missing" if v is None else f"= {v!r} is not a positive integer"
        raise ValueError(
            f"{where}: {key} {state}; an HF config.json of a {cfg.get('model_type')} model gives "
            f"it as a whole number >= 1 (fix the config)"
        )
    return v


def sparse_layers(layers: int, step: int, mlp_only: list) -> tuple:
    """The layers whose MLP is the sparse block: HF's rule, `i not in mlp_only_layers and (i + 1) %
    step == 0`."""
    return tuple(i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0)


def expert_count_key(cfg: dict) -> Optional[tuple]:
    """(key, value) of the first expert key a config sets to a non-zero value, else None."""
    return next(((k, cfg[k]) for k in EXPERT_KEYS if cfg.get(k) not in (None, 0, False)), None)


def moe_shape(cfg: dict, mtype: str, where: str, dense_families: tuple = ()) -> Optional[MoeShape]:
    """The MoE shape of a parsed HF config of family `mtype`; None without experts; ValueError for
    another family that names experts."""
    named = expert_count_key(cfg)
    fam = families.of(mtype)
    if fam is None or fam.kind != families.MOE:
        if named is None:
            return None
        dense = f" and the dense families {list(dense_families)}" if dense_families else ""
        moes = list(families.types_of(families.MOE))
        raise ValueError(
            f"{where}: model_type={mtype!r} is a mixture of experts ({named[0]}={named[1]!r}) that "
            f"ds_longctx does not model; it supports the MoE families {moes}{dense}: "
            f"use one of those"
        )
    defaults = fam.moe_defaults
    cfg = with_old_names(cfg, mtype)  # num_local_experts, as transformers 5.25 writes num_experts
    layers = check_layer_count(_int(cfg, "num_hidden_layers", where), where)
    experts = _int(cfg, "num_experts", where)
    top_k = _int(cfg, "num_experts_per_tok", where)
    if top_k > experts:
        raise ValueError(
            f"{where}: num_experts_per_tok={top_k} is more than num_experts={experts}; a token is "
            f"routed to at most every expert (fix the config)"
        )
    step, only = 1, []  # a family without the keys: every layer sparse
    if "decoder_sparse_step" in defaults:
        step = _int(cfg, "decoder_sparse_step", where, defaults["decoder_sparse_step"])
        only = cfg.get("mlp_only_layers", defaults["mlp_only_layers"]) or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only
    ):
        raise ValueError(
            f"{where}: mlp_only_layers = {only!r} is not a list of layer indices (fix the config)"
        )
    coef = cfg.get("router_aux_loss_coef", defaults["router_aux_loss_coef"])
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
        raise ValueError(
            f"{where}: router_aux_loss_coef = {coef!r} is not a number >= 0 (fix the config)"
        )
    return MoeShape(
        experts=experts,
        top_k=top_k,
        expert_intermediate=_int(cfg, fam.expert_width_key, where),
        sparse_layers=sparse_layers(layers, step, only),
        norm_topk_prob=fam.router == families.ROUTE_RENORM
        or bool(cfg.get("norm_topk_prob", defaults.get("norm_topk_prob"))),
        router_aux_loss_coef=float(coef),
        layout=fam.expert_layout,
        weight_bytes=4 if fam.router == families.ROUTE_RENORM else 2,
    )


EXPERT_PARTS = (
    "gate_proj",
    "up_proj",
    "down_proj",
    "experts",
    "gate",
)  # what a sparse layer's MLP targets would name


def lora_problem(moe: Optional[MoeShape], layers: int, targets) -> Optional[str]:
    """Why LoRA cannot take `targets` on this mixture of experts, or None: experts and router are no
    Linears, so MLP targets on an all-sparse model are refused."""
    if moe is None or isinstance(targets, str) or len(moe.sparse_layers) < layers:
        return None
    named = [t for t in targets if t.rpartition(".")[2] in EXPERT_PARTS]
    if not named:
        return None
    return (
        f"lora_target_modules {named}: a mixture of experts' experts and router take no LoRA "
        "adapters here (the "
        "experts are 3-D tensors, not Linears); LoRA trains adapters on the attention and leaves "
        "the experts and "
        f"the router frozen: use --lora_target_modules q_proj,k_proj,v_proj,o_proj (or all-linear)"
    )
