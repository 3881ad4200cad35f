"""A hybrid model's shapes per layer type: Qwen3.5's gated DeltaNet (`linear_attention`) and gated
full attention (`full_attention`) layers, read from an HF config.json (no torch). plan/geometry.py
holds one `HybridShape` per hybrid model and asks this module for every per-layer count.
Dimensions and parameter order: docs/design/plan.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds_longctx import families
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.kernel_rules import FULL_ATTENTION, LINEAR_ATTENTION

# Norms that scale by (1 + weight) (transformers' Qwen3_5RMSNorm): a weight of 0 is the identity
# scale
ZERO_CENTRED_NORMS = ("Qwen3_5RMSNorm",)
# The gated DeltaNet's vectors in a random-init run: A = 1, dt = 0.01 (why: docs/design/plan.md).
DELTANET_VECTORS = {"dt_bias": math.log(math.expm1(0.01)), "A_log": 0.0}


def vector_init(name: str, module_class: str) -> float:
    """The value a random-init run fills a 1-D parameter with (run/model.init_weights): norm weights
    1 (0 for a zero-centred norm), the gated DeltaNet's own vectors as DELTANET_VECTORS, biases
    0."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in DELTANET_VECTORS:
        return DELTANET_VECTORS[leaf]
    if "norm" in name:
        return 0.0 if module_class in ZERO_CENTRED_NORMS else 1.0
    return 0.0


def text_config(cfg: dict) -> dict:
    """The text model's config of a hybrid config.json: a composite `qwen3_5` one's `text_config`
    (its model_type `qwen3_5_text`), a text one as is."""
    key = families.text_key(cfg.get("model_type"))
    if key is None:
        return cfg
    text = cfg.get(key)
    if not isinstance(text, dict):
        raise ValueError(
            f"a {cfg.get('model_type')} config.json carries its text model under {key!r}; this one "
            f"has none (fix the config)"
        )
    return dict(text, model_type=text.get("model_type") or f"{cfg['model_type']}_text")


@dataclass(frozen=True)
class HybridShape:
    """What a hybrid model adds to the dense geometry: which layers are which, and the linear
    layers' widths."""

    layer_types: tuple  # per decoder layer: kernel_rules.FULL_ATTENTION or LINEAR_ATTENTION
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    partial_rotary: float  # the share of the full layers' head_dim that rotary rotates
    output_gate: bool = True  # the full layers' sigmoid gate on the attention output

    @classmethod
    def from_config(cls, cfg: dict, layers: int, where: str) -> "HybridShape":
        """From a text config dict (transformers' Qwen3_5TextConfig defaults where a key is absent);
        a size that is not a positive integer is a ValueError naming `where` and the key."""

        def size(key: str, default: int) -> int:
            v = cfg.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"{where}: {key} = {v!r} is not a positive integer; an HF config.json of a "
                    f"hybrid model gives it as a whole number >= 1 (fix the config)"
                )
            return v

        kinds = (
            kernel_rules.layer_types(cfg)
            if cfg.get("layer_types")
            else tuple(
                LINEAR_ATTENTION if (i + 1) % size("full_attention_interval", 4) else FULL_ATTENTION
                for i in range(layers)
            )
        )  # transformers' default: every full_attention_interval-th layer full
        if len(kinds) != layers or not set(kinds) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ValueError(
                f"{where}: layer_types has {len(kinds)} entries of {sorted(set(kinds))} for "
                f"num_hidden_layers={layers}; give one of {list(kernel_rules.LAYER_KINDS)} per "
                "layer"
            )
        hk, hv = size("linear_num_key_heads", 16), size("linear_num_value_heads", 32)
        kernel_rules.check_linear_heads(hk, hv, where)
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        prf = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
            raise ValueError(
                f"{where}: partial_rotary_factor = {prf!r} is not a number in (0, 1], the share of "
                f"head_dim that rotary rotates (Qwen3.5: 0.25; fix the config)"
            )
        return cls(
            layer_types=kinds,
            linear_key_heads=hk,
            linear_value_heads=hv,
            linear_key_dim=size("linear_key_head_dim", 128),
            linear_value_dim=size("linear_value_head_dim", 128),
            conv_kernel=size("linear_conv_kernel_dim", 4),
            partial_rotary=float(prf),
        )

    @property
    def conv_dim(self) -> int:
        """c = 2·hk·dk + hv·dv: the q, k and v channels the depthwise conv1d runs over."""
        return (
            2 * self.linear_key_heads * self.linear_key_dim
            + self.linear_value_heads * self.linear_value_dim
        )

    @property
    def value_width(self) -> int:
        return self.linear_value_heads * self.linear_value_dim

    @property
    def linear_heads(self) -> tuple:
        return self.linear_key_heads, self.linear_value_heads

    def is_full(self, i: int) -> bool:
        return self.layer_types[i] == FULL_ATTENTION

    @property
    def full_layers(self) -> int:
        return self.layer_types.count(FULL_ATTENTION)

    @property
    def linear_layers(self) -> int:
        return self.layer_types.count(LINEAR_ATTENTION)


def mixer_numels(g, kind: str) -> list:
    """The token mixer's parameter sizes of one layer of `kind`, in registration order (module
    doc)."""
    h = g.hybrid
    H, d, q, kv = g.hidden, g.head_dim, g.heads * g.head_dim, g.kv_heads * g.head_dim
    if kind == FULL_ATTENTION:
        return [H * q * (2 if h.output_gate else 1), H * kv, H * kv, q * H, d, d]
    hv, c = h.linear_value_heads, h.conv_dim
    return [
        hv,
        hv,
        c * h.conv_kernel,
        h.linear_value_dim,
        h.value_width * H,
        H * c,
        H * h.value_width,
        H * hv,
        H * hv,
    ]


def layer_numels(g, kind: str) -> list:
    """One decoder layer's parameter sizes in `model.parameters()` order: mixer, MLP (gate, up,
    down), two norms."""
    H, inter = g.hidden, g.intermediate
    return [*mixer_numels(g, kind), H * inter, H * inter, inter * H, H, H]


def mixer_linears(g, kind: str) -> dict:
    """{name under the layer: (in, out)} of the token mixer's Linears (LoRA's targets,
    levers/lora.py)."""
    h, H = g.hybrid, g.hidden
    if kind == FULL_ATTENTION:
        q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
        return {
            "self_attn.q_proj": (H, q * (2 if h.output_gate else 1)),
            "self_attn.k_proj": (H, kv),
            "self_attn.v_proj": (H, kv),
            "self_attn.o_proj": (q, H),
        }
    return {
        "linear_attn.in_proj_qkv": (H, h.conv_dim),
        "linear_attn.in_proj_z": (H, h.value_width),
        "linear_attn.in_proj_b": (H, h.linear_value_heads),
        "linear_attn.in_proj_a": (H, h.linear_value_heads),
        "linear_attn.out_proj": (h.value_width, H),
    }
