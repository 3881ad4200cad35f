"""The model families ds_longctx trains: one frozen record per family, torch-free.

    fam = families.of("qwen3_5")  # a composite config's type finds its text family
    fam.kind, fam.text_key, fam.defaults  # "hybrid", "text_config", {...}

Plan, levers, parallel and run ask this table. Adding a family: docs/architecture.md. A hybrid
kind brings layer types (plan/layer_types.py) and linear heads that SP splits too; an MoE kind its
router rule, expert width key and sparse block's parameter names (levers/moe.py reads them).
tests/plan/test_hf_fields.py holds `defaults` to the installed transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

DENSE, HYBRID, MOE = "dense", "hybrid", "moe"
KINDS = (DENSE, HYBRID, MOE)
# LoRA's default targets: attention and MLP Linears
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the window rules of transformers' attention (hf_fields.sliding_window)
WINDOW_NONE = "none"  # only a `layer_types` sliding entry
WINDOW_ALWAYS = "always"  # every layer (Mistral)
WINDOW_FLAG = "flag"  # every layer with use_sliding_window
WINDOW_FROM_LAYER = "from_layer"  # use_sliding_window past max_window_layers
# the routers' rule (levers/moe.route): softmax over the experts, top-k, then
ROUTE_NORM_FLAG = "norm_topk_prob"  # renormalised where the config says so, in the logits' dtype
ROUTE_RENORM = "renormalize"  # always renormalised, kept in fp32 (Mixtral)


def _frozen(d: Optional[dict] = None) -> Mapping:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Family:
    """What differs between model families; every field is read by one module."""

    model_type: str  # the text model's model_type
    kind: str  # DENSE, HYBRID or MOE
    # transformers' config-class defaults that differ from the planner's fallback
    defaults: Mapping = field(default_factory=_frozen)
    null_is_fallback: tuple = ()  # keys whose null transformers derives
    renamed: Mapping = field(default_factory=_frozen)  # planner's name -> attribute_map's
    composite_types: tuple = ()  # model_types that wrap this text model
    text_key: Optional[str] = None  # the composites' key of the text config
    qk_norm: bool = False  # a per-head RMSNorm on q and k
    qkv_bias: bool = False  # q/k/v biases always, o_proj none
    window_rule: str = WINDOW_NONE
    max_window_layers: int = 28  # transformers' default (WINDOW_FROM_LAYER)
    # max_position_embeddings -> the context its publisher's YaRN recipe scales from
    published_original: Mapping = field(default_factory=_frozen)
    # calls AttentionInterface though unflagged (transformers 5.25's Qwen3.5)
    interface_unflagged: bool = False
    # the MoE keys transformers defaults; without decoder_sparse_step every layer is sparse
    moe_defaults: Mapping = field(default_factory=_frozen)
    expert_layout: tuple = ()  # the sparse block's parameter names, in order
    router: str = ROUTE_NORM_FLAG
    expert_width_key: str = "moe_intermediate_size"  # the config key of one expert's width
    lora_targets: tuple = LORA_TARGETS


_QWEN_WINDOW = {"max_position_embeddings": 32768, "sliding_window": 4096}
_QWEN3_CARD = _frozen({40960: 32768})  # Qwen3 and Qwen3-30B-A3B cards

FAMILIES = MappingProxyType(
    {
        f.model_type: f
        for f in (
            Family(
                "qwen3",
                DENSE,
                defaults=_frozen({"head_dim": 128, "num_key_value_heads": 32, **_QWEN_WINDOW}),
                null_is_fallback=("num_key_value_heads",),
                qk_norm=True,
                window_rule=WINDOW_FROM_LAYER,
                published_original=_QWEN3_CARD,
            ),
            Family(
                "qwen2",
                DENSE,
                defaults=_frozen({"num_key_value_heads": 32, **_QWEN_WINDOW}),
                null_is_fallback=("num_key_value_heads",),
                qkv_bias=True,
                window_rule=WINDOW_FROM_LAYER,
            ),
            Family(
                "llama",
                DENSE,
                defaults=_frozen({"max_position_embeddings": 2048}),
                null_is_fallback=("head_dim", "num_key_value_heads"),
            ),
            Family(
                "mistral",
                DENSE,
                defaults=_frozen(
                    {
                        "num_key_value_heads": 8,
                        "max_position_embeddings": 131072,
                        "sliding_window": 4096,
                    }
                ),
                null_is_fallback=("head_dim",),
                window_rule=WINDOW_ALWAYS,
            ),
            Family(
                "qwen3_moe",
                MOE,
                defaults=_frozen({"num_key_value_heads": 4, **_QWEN_WINDOW}),
                renamed=_frozen({"num_experts": "num_local_experts"}),
                qk_norm=True,
                window_rule=WINDOW_FLAG,
                published_original=_QWEN3_CARD,
                moe_defaults=_frozen(
                    {
                        "decoder_sparse_step": 1,
                        "mlp_only_layers": (),
                        "norm_topk_prob": False,
                        "router_aux_loss_coef": 0.001,
                    }
                ),
                expert_layout=("experts.gate_up_proj", "experts.down_proj", "gate.weight"),
            ),
            Family(
                "mixtral",
                MOE,
                defaults=_frozen(
                    {
                        "num_key_value_heads": 8,
                        "max_position_embeddings": 131072,
                        "sliding_window": None,
                    }
                ),
                null_is_fallback=("head_dim",),
                renamed=_frozen({"num_experts": "num_local_experts"}),
                window_rule=WINDOW_ALWAYS,
                moe_defaults=_frozen({"router_aux_loss_coef": 0.001}),
                expert_layout=("gate.weight", "experts.gate_up_proj", "experts.down_proj"),
                router=ROUTE_RENORM,
                expert_width_key="intermediate_size",
            ),
            Family(
                "qwen3_5_text",
                HYBRID,
                defaults=_frozen(
                    {"head_dim": 256, "num_key_value_heads": 4, "max_position_embeddings": 32768}
                ),
                composite_types=("qwen3_5",),
                text_key="text_config",
                qk_norm=True,
                interface_unflagged=True,
            ),
        )
    }
)
# every model_type a config.json may carry -> its family
_BY_TYPE = {t: f for f in FAMILIES.values() for t in (*f.composite_types, f.model_type)}


def of(model_type: Optional[str]) -> Optional[Family]:
    """The family of a model_type (a composite's too), or None."""
    return _BY_TYPE.get(model_type)  # type: ignore[arg-type]


def types_of(kind: str) -> tuple:
    """Every model_type of `kind`, composites before their text type."""
    return tuple(t for t, f in _BY_TYPE.items() if f.kind == kind)


def text_key(model_type: Optional[str]) -> Optional[str]:
    """The key a composite config holds its text config under; None for a text config."""
    fam = of(model_type)
    return fam.text_key if fam and model_type in fam.composite_types else None
