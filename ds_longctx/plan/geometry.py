"""The shapes memory depends on, read from an HF `config.json` (no torch, no transformers).

    geom = ModelGeometry.from_name_or_path("qwen3-8b")   # a shipped name, a checkpoint dir, or a config.json
    geom.num_params, geom.layer_params                   # 8,190,735,360 and one decoder layer's
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from ds_longctx.config.model import SHIPPED_MODELS_DIR
from ds_longctx.parallel import kernel_rules

_DENSE_TYPES = ("qwen3", "llama", "mistral")


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
    attention_bias: bool = False

    @classmethod
    def from_config(cls, cfg: dict, name: str = "") -> "ModelGeometry":
        """From a parsed HF config dict (dense Qwen3 / Llama / Mistral)."""
        mtype = cfg.get("model_type", "qwen3")
        if mtype not in _DENSE_TYPES:
            raise ValueError(f"model_type={mtype!r} is not modelled; the planner knows dense {list(_DENSE_TYPES)}")
        heads = cfg["num_attention_heads"]
        return cls(name=name or mtype, hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"],
                   layers=cfg["num_hidden_layers"], heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=kernel_rules.head_dim(cfg), vocab=cfg["vocab_size"],
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   max_position_embeddings=cfg.get("max_position_embeddings", 0), qk_norm=mtype == "qwen3",
                   attention_bias=bool(cfg.get("attention_bias", False)))

    @classmethod
    def from_name_or_path(cls, name_or_path: Union[str, Path]) -> "ModelGeometry":
        """A shipped name (`qwen3-8b`, also `Qwen/Qwen3-8B`), a checkpoint dir with config.json, or a JSON file."""
        p = Path(name_or_path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            p = SHIPPED_MODELS_DIR / f"{Path(str(name_or_path)).name.lower()}.json"
        if not p.is_file():
            shipped = sorted(f.stem for f in SHIPPED_MODELS_DIR.glob("*.json"))
            raise ValueError(f"model {str(name_or_path)!r} is neither a shipped geometry {shipped} nor a "
                             f"directory / file holding an HF config.json")
        name = p.stem if p.parent == SHIPPED_MODELS_DIR else str(name_or_path)
        return cls.from_config(json.loads(p.read_text()), name=name)

    @property
    def layer_params(self) -> int:
        """q/k/v/o + gate/up/down + 2 RMSNorm (+ q_norm/k_norm of head_dim) (+ q/k/v/o biases)."""
        H, d, q, kv = self.hidden, self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = H * (q + 2 * kv) + q * H + ((q + 2 * kv + H) if self.attention_bias else 0)
        return attn + 3 * H * self.intermediate + 2 * H + (2 * d if self.qk_norm else 0)

    def linears(self) -> dict:
        """{module name: (in, out)} of every Linear, in module order, as HF's dense causal LMs name them (the
        output layer is `lm_head`): what levers/lora.target_names reads to count adapters without a model."""
        H, I, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"self_attn.q_proj": (H, q), "self_attn.k_proj": (H, kv), "self_attn.v_proj": (H, kv),
                  "self_attn.o_proj": (q, H), "mlp.gate_proj": (H, I), "mlp.up_proj": (H, I), "mlp.down_proj": (I, H)}
        out = {f"model.layers.{i}.{part}": shape for i in range(self.layers) for part, shape in shapes.items()}
        out["lm_head"] = (H, self.vocab)
        return out

    def param_numels(self) -> list:
        """Each parameter's element count in `model.parameters()` order (HF's module registration order: the
        embedding; per layer q/k/v/o (+ biases), q_norm/k_norm, gate/up/down, the two norms; the final norm;
        lm_head unless tied): what DeepSpeed's ZeRO-3 sub-groups are cut from (zero_buffers.optimizer_split)."""
        H, I, d, q, kv = self.hidden, self.intermediate, self.head_dim, self.heads * self.head_dim, \
            self.kv_heads * self.head_dim
        b = self.attention_bias
        layer = [H * q, *([q] if b else []), H * kv, *([kv] if b else []), H * kv, *([kv] if b else []),
                 q * H, *([H] if b else []), *([d, d] if self.qk_norm else []), H * I, H * I, I * H, H, H]
        emb = self.vocab * self.hidden
        return [emb, *layer * self.layers, H, *([] if self.tied_embeddings else [emb])]

    @property
    def num_params(self) -> int:
        """L·P_layer + embedding V·H + final norm H + lm_head V·H unless tied (Qwen3-8B: 8,190,735,360)."""
        emb = self.vocab * self.hidden
        return self.layers * self.layer_params + emb + self.hidden + (0 if self.tied_embeddings else emb)


def as_geometry(geom) -> ModelGeometry:
    """A ModelGeometry as is, or one read from a shipped name / config path."""
    return geom if isinstance(geom, ModelGeometry) else ModelGeometry.from_name_or_path(geom)
