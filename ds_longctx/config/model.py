"""`model` section: which model, in which dtype, with which RoPE scaling (owner: run/model.py, levers/rope.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from ds_longctx.config.base import Section

SHIPPED_MODELS_DIR = Path(__file__).parents[1] / "models"


def shipped_models() -> list:
    """Names of the model geometries shipped in `ds_longctx/models/` (random-init configs)."""
    return sorted(p.stem for p in SHIPPED_MODELS_DIR.glob("*.json"))


class ModelConfig(Section):
    """Which model, in which dtype, with which RoPE scaling."""

    name: str = Field("qwen3-tiny", json_schema_extra={"flat": "model"}, description=(
        f"A shipped geometry (random init: {', '.join(shipped_models())}), an HF config.json file (random init from "
        f"it, as the shipped ones: plan or train a model whose weights are not here), or a local HF checkpoint "
        f"directory."))
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 on GPU, fp32 on CPU."""
    rope_scaling: Union[Literal["auto", "none", "yarn"], dict] = "auto"
    """auto: YaRN when seq_len exceeds the model's trained length (levers/rope.py); none; yarn; or explicit
    rope_parameters."""
    router_aux_loss_coef: Optional[float] = Field(None, ge=0, allow_inf_nan=False)
    """A mixture of experts: the coefficient of its load-balancing loss, added to the loss over each micro-batch's
    whole sequences (levers/moe_aux.py); null: the model config's own (Qwen3-30B-A3B: 0.001); 0: none. Refused for a
    model without experts."""

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v in shipped_models():
            return v
        try:
            return _local_model(v)
        except OSError as e:  # unreadable, a name too long
            raise ValueError(f"model={v!r}: {e.strerror or e}; pass a shipped geometry {shipped_models()}, an HF "
                             f"config.json file or a local HF checkpoint directory") from None


def _local_model(v: str) -> str:
    """`v` if it names an HF config.json file or a directory holding one, else ValueError naming the fix."""
    p = Path(v)
    if p.is_dir() and (p / "config.json").is_file():
        return v
    if p.is_file() and p.suffix == ".json":
        try:
            ok = isinstance(json.loads(p.read_text()).get("model_type"), str)
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"model={v!r} is a file but not an HF config.json (a JSON object with a model_type); "
                             f"pass a config.json, a shipped geometry {shipped_models()} or a checkpoint directory")
        return v
    raise ValueError(f"model={v!r} is neither a shipped geometry {shipped_models()}, an HF config.json file nor a "
                     f"directory with a config.json; pass one of those names or a local HF checkpoint path")
