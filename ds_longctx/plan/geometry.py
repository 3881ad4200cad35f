"""The shapes memory depends on, read from an HF `config.json` (no torch, no transformers).

geom = ModelGeometry.from_name_or_path("qwen3-8b")   # a shipped name, a checkpoint dir, or a
config.json geom.num_params, geom.layer_params                   # 8,190,735,360 and one decoder
layer's
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional, Union

from ds_longctx import families
from ds_longctx.config.model import SHIPPED_MODELS_DIR, read_config_json, resolve_model
from ds_longctx.levers.rope import trained_context_of
from ds_longctx.parallel import kernel_rules
from ds_longctx.plan import hf_fields, layer_types
from ds_longctx.plan.layer_types import HybridShape
from ds_longctx.plan.moe_geometry import MoeShape, moe_shape

_DENSE_TYPES = families.types_of(families.DENSE)
_HYBRID_TYPES = families.types_of(families.HYBRID)
_MOE_TYPES = families.types_of(families.MOE)


@dataclass(frozen=True)
class ModelGeometry:
    """The shapes that memory depends on, read straight from an HF `config.json`."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_position_embeddings: int
    qk_norm: bool = True  # Qwen3's per-head RMSNorm on q and k (Llama/Mistral have none)
    attention_bias: bool = (
        False  # biases on q/k/v (Qwen2 always; Llama / Mistral with attention_bias)
    )
    o_bias: bool = False  # a bias on o_proj (Llama / Mistral with attention_bias; Qwen2 has none)
    mlp_bias: bool = False  # biases on gate/up/down (Llama's mlp_bias)
    # the config's RoPE (rope_scaling, else rope_parameters): default, yarn, llama3, ...
    rope_type: str = "default"
    trained_context: int = 0  # YaRN's O (levers/rope.trained_context_of)
    moe: Optional[MoeShape] = (
        None  # the sparse layers of a mixture of experts (plan/moe_geometry.py); None: dense
    )
    hybrid: Optional[HybridShape] = (
        None  # Qwen3.5's layer types and linear-layer widths (plan/layer_types.py)
    )
    sliding_window: Optional[int] = (
        None  # the window every layer attends within (Mistral's); None: full attention
    )

    @classmethod
    def from_config(cls, cfg: dict, name: str = "", source: str = "") -> "ModelGeometry":
        """From a parsed HF config dict (dense Qwen3 / Qwen2 / Llama / Mistral). Every field memory
        depends on is checked here, before any planning: a missing, null, non-integer or
        non-positive size, or KV heads that do not split the query heads, is a ValueError naming the
        config (`source`, else `name`) and the field."""
        where = source or name or "the model config"
        if not isinstance(cfg, dict):
            raise ValueError(
                f"{where}: an HF config.json is a JSON object, got a {type(cfg).__name__}; pass a "
                f"model's config.json"
            )
        mtype = cfg.get("model_type")
        if not isinstance(mtype, str):
            raise ValueError(
                f'{where} has no model_type (got {mtype!r}); add "model_type": one of '
                f"{list(_DENSE_TYPES) + list(_HYBRID_TYPES)}, the families the planner models"
            )
        moe = moe_shape(
            cfg, mtype, where, _DENSE_TYPES
        )  # refuses an MoE family not modelled, naming those that are
        if families.of(mtype) is None:
            raise ValueError(
                f"{where}: model_type={mtype!r} is not modelled; the planner knows dense "
                f"{list(_DENSE_TYPES)}, hybrid {list(_HYBRID_TYPES)} and the mixtures of experts "
                f"{list(_MOE_TYPES)}"
            )
        if mtype in _HYBRID_TYPES:  # a composite (VL) config: its text model
            cfg = layer_types.text_config(cfg)

        family = cfg["model_type"]  # a hybrid's text model: qwen3_5_text

        def size(
            key: str, fallback=None
        ):  # absent or null: as transformers reads it (plan/hf_fields.py)
            v = hf_fields.field(cfg, family, key, fallback, where)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                state = "is missing" if v is None else f"= {v!r} is not a positive integer"
                raise ValueError(
                    f"{where}: {key} {state}; an HF config.json of a {mtype} model gives it as a "
                    f"whole number >= 1 (fix the config)"
                )
            return v

        heads, hidden = size("num_attention_heads"), size("hidden_size")
        layers = hf_fields.check_layer_count(size("num_hidden_layers"), where)
        hf_fields.check_layer_types(cfg, layers, where)
        kv_heads = size(
            "num_key_value_heads", heads
        )  # the planner's fallback: one KV head per head (MHA)
        kernel_rules.check_attention_heads(heads, kv_heads, where)
        head_dim = size(
            "head_dim", kernel_rules.head_dim({"hidden_size": hidden, "num_attention_heads": heads})
        )
        max_pos = size("max_position_embeddings")
        rope = hf_fields.rope_parameters(cfg, where)
        hybrid = HybridShape.from_config(cfg, layers, where) if mtype in _HYBRID_TYPES else None
        bias = hf_fields.flag(cfg, "attention_bias", where)
        fam = families.of(mtype)
        return cls(
            name=name or mtype,
            hidden=hidden,
            intermediate=size("intermediate_size"),
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            hybrid=hybrid,
            head_dim=head_dim,
            vocab=size("vocab_size"),
            tied_embeddings=hf_fields.flag(cfg, "tie_word_embeddings", where),
            max_position_embeddings=max_pos,
            rope_type=str(rope["rope_type"]),
            trained_context=trained_context_of(mtype, max_pos, rope),
            qk_norm=fam.qk_norm,
            attention_bias=fam.qkv_bias or bias,
            o_bias=not fam.qkv_bias and bias,
            mlp_bias=hf_fields.flag(cfg, "mlp_bias", where),
            moe=moe,
            sliding_window=None if hybrid else hf_fields.sliding_window(cfg, family, layers, where),
        )

    @classmethod
    def from_name_or_path(cls, name_or_path: Union[str, Path]) -> "ModelGeometry":
        """A shipped name (`qwen3-8b`, also as a Hub id `Qwen/Qwen3-8B`), a checkpoint dir with
        config.json, or a JSON file. A path that does not exist is refused, not read as the shipped
        geometry of its last part."""
        text = str(name_or_path)
        try:
            p = resolve_model(text).config
        except OSError as e:  # unreadable, a name too long
            raise ValueError(
                f"model {text!r}: {e.strerror or e}; pass an HF config.json, its checkpoint "
                f"directory or a shipped geometry"
            ) from None
        name = p.stem if p.parent == SHIPPED_MODELS_DIR else text
        try:
            cfg = read_config_json(p)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"model {text!r}: {p} is not a JSON config ({e}); pass an HF config.json, its "
                f"checkpoint directory or a shipped geometry"
            ) from None
        return cls.from_config(
            cfg, name=name, source=str(p) if p.parent != SHIPPED_MODELS_DIR else ""
        )

    @property
    def linear_heads(self) -> Optional[tuple]:
        """(key heads, value heads) of the gated DeltaNet layers (the sp-size rule reads them), None
        if none."""
        return self.hybrid.linear_heads if self.hybrid is not None else None

    @property
    def attention_layers(self) -> Optional[tuple]:
        """Per layer: whether it is full attention (where an attention cache can go); None: every
        layer is."""
        return (
            None
            if self.hybrid is None
            else tuple(self.hybrid.is_full(i) for i in range(self.layers))
        )

    @cached_property
    def layer_params(self) -> int:
        """q/k/v/o + gate/up/down + 2 RMSNorm (+ q_norm/k_norm of head_dim) (+ the q/k/v, o_proj and
        gate/up/down biases the config has). A mixture of experts: its largest layer's, a sparse one
        (experts and router in place of gate/up/down). A hybrid model: its largest layer's
        (plan/layer_types.py)."""
        if self.hybrid is not None:
            return max(
                sum(layer_types.layer_numels(self, kind)) for kind in set(self.hybrid.layer_types)
            )
        H = self.hidden
        mlp = 3 * H * self.intermediate + ((2 * self.intermediate + H) if self.mlp_bias else 0)
        if self.moe is not None and self.moe.sparse_layers:
            mlp = max(
                mlp if len(self.moe.sparse_layers) < self.layers else 0, self.moe.block_params(H)
            )
        return self.mixer_params() + mlp + H  # + the second norm

    def mixer_params(self, kind: str = layer_types.FULL_ATTENTION) -> int:
        """One layer's token mixer: q/k/v/o (+ biases, q_norm/k_norm) and its input norm; a hybrid
        model's layer of `kind` (plan/layer_types.py). Its grads are what the mixer's backward makes
        (plan/memory_terms.py)."""
        if self.hybrid is not None:
            return sum(layer_types.mixer_numels(self, kind)) + self.hidden
        H, d, q, kv = (
            self.hidden,
            self.head_dim,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        )
        attn = (
            H * (q + 2 * kv)
            + q * H
            + ((q + 2 * kv) if self.attention_bias else 0)
            + (H if self.o_bias else 0)
        )
        return attn + H + (2 * d if self.qk_norm else 0)

    @property
    def mlp_params(self) -> int:
        """One layer's MLP (a sparse layer's experts and router) and its second norm: the layer less
        its mixer."""
        if self.hybrid is not None:
            kinds = set(self.hybrid.layer_types)
            return max(sum(layer_types.layer_numels(self, k)) - self.mixer_params(k) for k in kinds)
        return self.layer_params - self.mixer_params()

    def linears(self) -> dict:
        """{module name: (in, out)} of every Linear, in module order, as HF's dense causal LMs name
        them (the output layer is `lm_head`): what levers/lora.target_names reads to count adapters
        without a model."""
        H, inter, q, kv = (
            self.hidden,
            self.intermediate,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        )
        shapes = {
            "self_attn.q_proj": (H, q),
            "self_attn.k_proj": (H, kv),
            "self_attn.v_proj": (H, kv),
            "self_attn.o_proj": (q, H),
            "mlp.gate_proj": (H, inter),
            "mlp.up_proj": (H, inter),
            "mlp.down_proj": (inter, H),
        }
        mlp = {k: v for k, v in shapes.items() if k.startswith("mlp.")}
        kinds = self.hybrid.layer_types if self.hybrid is not None else (None,) * self.layers
        per_kind = {
            kind: shapes if kind is None else {**layer_types.mixer_linears(self, kind), **mlp}
            for kind in set(kinds)
        }
        sparse = (
            self.moe.is_sparse if self.moe is not None else (lambda i: False)
        )  # experts are 3-D, not Linears
        out = {
            f"model.layers.{i}.{part}": shape
            for i, kind in enumerate(kinds)
            for part, shape in per_kind[kind].items()
            if not (part.startswith("mlp.") and sparse(i))
        }
        out["lm_head"] = (H, self.vocab)
        return out

    def param_numels(self) -> list:
        """Each parameter's element count in `model.parameters()` order (HF's module registration
        order: the embedding; per layer q/k/v/o (+ biases), q_norm/k_norm, gate/up/down, the two
        norms; the final norm; lm_head unless tied): what DeepSpeed's ZeRO-3 sub-groups are cut from
        (zero_buffers.optimizer_split)."""
        H, inter, d = self.hidden, self.intermediate, self.head_dim
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        b, m = self.attention_bias, self.mlp_bias
        attn = [
            H * q,
            *([q] if b else []),
            H * kv,
            *([kv] if b else []),
            H * kv,
            *([kv] if b else []),
            q * H,
            *([H] if self.o_bias else []),
            *([d, d] if self.qk_norm else []),
        ]
        mlp = [
            H * inter,
            *([inter] if m else []),
            H * inter,
            *([inter] if m else []),
            inter * H,
            *([H] if m else []),
        ]
        emb = self.vocab * self.hidden
        if self.hybrid is not None:
            layers = [
                n for kind in self.hybrid.layer_types for n in layer_types.layer_numels(self, kind)
            ]
        elif self.moe is None:
            layers = (attn + mlp + [H, H]) * self.layers
        else:  # a sparse layer's experts and router in place of gate/up/down (plan/moe_geometry.py)
            sparse = self.moe.block_numels(H)
            layers = [
                n
                for i in range(self.layers)
                for n in attn + (sparse if self.moe.is_sparse(i) else mlp) + [H, H]
            ]
        return [emb, *layers, H, *([] if self.tied_embeddings else [emb])]

    @cached_property  # the planner's search asks it thousands of times
    def num_params(self) -> int:
        """L·P_layer + embedding V·H + final norm H + lm_head V·H unless tied (Qwen3-8B:
        8,190,735,360)."""
        if self.moe is not None or self.hybrid is not None:  # layers of two kinds
            return sum(self.param_numels())
        emb = self.vocab * self.hidden
        return (
            self.layers * self.layer_params
            + emb
            + self.hidden
            + (0 if self.tied_embeddings else emb)
        )


def as_geometry(geom) -> ModelGeometry:
    """A ModelGeometry as is, or one read from a shipped name / config path."""
    return geom if isinstance(geom, ModelGeometry) else ModelGeometry.from_name_or_path(geom)
