"""`model` section: which model, in which dtype, with which RoPE scaling (owner: run/model.py,
levers/rope.py)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from ds_longctx.config.base import Section

SHIPPED_MODELS_DIR = Path(__file__).parents[1] / "models"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as on the Hugging Face Hub


def shipped_models() -> list:
    """Names of the model geometries shipped in `ds_longctx/models/` (random-init configs)."""
    return sorted(p.stem for p in SHIPPED_MODELS_DIR.glob("*.json"))


class ModelConfig(Section):
    """Which model, in which dtype, with which RoPE scaling."""

    name: str = Field(
        "qwen3-tiny",
        json_schema_extra={"flat": "model"},
        description=(
            f"A shipped geometry (random init: {', '.join(shipped_models())}), an HF config.json "
            "file (random init from "
            "it, as the shipped ones: plan or train a model whose weights are not here), or a "
            "local HF checkpoint "
            f"directory; a local one comes before a preset of the same name (`resolve_model`)."
        ),
    )
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 on GPU, fp32 on CPU."""
    rope_scaling: Union[Literal["auto", "none", "yarn"], dict] = "auto"
    """auto: YaRN when seq_len exceeds the model's trained length (levers/rope.py); none; yarn; or
    explicit rope_parameters."""
    router_aux_loss_coef: Optional[float] = Field(None, ge=0, allow_inf_nan=False)
    """A mixture of experts: the coefficient of its load-balancing loss, added to the loss over each
    micro-batch's whole sequences (levers/moe_aux.py); null: the model config's own (Qwen3-30B-A3B:
    0.001); 0: none. Refused for a
    model without experts."""

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        try:
            src = resolve_model(v)
        except OSError as e:  # unreadable, a name too long
            raise ValueError(
                f"model={v!r}: {e.strerror or e}; pass a shipped geometry {shipped_models()}, an "
                f"HF config.json file or a local HF checkpoint directory"
            ) from None
        if src.hub:
            raise ValueError(
                f"model={v!r} is a Hub id, which a run does not download: `hf download {v} "
                "--local-dir "
                f"DIR` and pass DIR (or {src.name}, the preset of its shape with random weights)"
            )
        if src.kind == "file":
            _check_config_file(v, src.config)
        return src.name


CONFIG_FILE_MAX = (
    16 * 2**20
)  # bytes: a config.json is kilobytes; a larger file (weights) is not read


def read_config_json(p: Path):
    """The JSON value of the config file `p` (any name, as from_pretrained takes it); ValueError
    where it is larger than CONFIG_FILE_MAX or not JSON text."""
    size = p.stat().st_size
    if size > CONFIG_FILE_MAX:
        raise ValueError(
            f"{p} is {size:,} bytes: larger than any config.json ({CONFIG_FILE_MAX:,} at most)"
        )
    return json.loads(p.read_text(encoding="utf-8"))


def _check_config_file(v: str, p: Path) -> None:
    """A config file given as the model is JSON with a model_type; else ValueError naming the
    fix."""
    try:
        ok = isinstance(read_config_json(p).get("model_type"), str)
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(
            f"model={v!r} is a file but not an HF config.json (a JSON object with a model_type); "
            f"pass a config.json, a shipped geometry {shipped_models()} or a checkpoint directory"
        )


@dataclass(frozen=True)
class ModelSource:
    """What a model name means (`resolve_model`). kind: shipped (a preset, random init), file (a
    config.json, random init) or directory (a checkpoint, weights loaded); config: its config.json;
    hub: a Hub id read as the preset of its shape; note: which of a local model and a preset of one
    name was taken."""

    name: str
    kind: Literal["shipped", "file", "directory"]
    config: Path
    hub: bool = False
    note: Optional[str] = None

    @property
    def label(self) -> str:
        """The name for a log line: with the note where the name was ambiguous."""
        return self.name if self.note is None else f"{self.name} ({self.note})"


def resolve_model(name: str) -> ModelSource:
    """The one reading of a model name (plan, train, rehearse). A local config.json file, or a
    directory holding one, comes first, as in transformers' from_pretrained: a bare name that is
    also a shipped preset (`qwen3-8b` with ./qwen3-8b/config.json here) is the local one, and the
    note says so. Else a bare name is the preset of that name (any case), a Hub id (`Qwen/Qwen3-8B`)
    the preset of its last part (hub=True: its shape, not its weights). ValueError naming the fix;
    OSError where a path cannot be looked at."""
    p = Path(name)
    preset, bare = (
        SHIPPED_MODELS_DIR / f"{p.name.lower()}.json",
        "/" not in name and os.sep not in name,
    )
    if p.is_file() or (p / "config.json").is_file():
        note = (
            (
                f"the local {'file' if p.is_file() else 'folder'} here, not the shipped preset "
                f"{preset.stem}; pass {preset} for the preset"
            )
            if bare and preset.is_file()
            else None
        )
        return ModelSource(
            name, *(("file", p) if p.is_file() else ("directory", p / "config.json")), note=note
        )
    if preset.is_file() and (bare or _HUB_ID.fullmatch(name)):
        return ModelSource(preset.stem, "shipped", preset, hub=not bare)
    shipped = shipped_models()
    if p.is_dir():
        raise ValueError(
            f"model={name!r} is a directory without a config.json; pass an HF checkpoint directory "
            f"(config.json beside its weights), a config.json file or a shipped geometry {shipped}"
        )
    there = "is not a regular file" if p.exists() else "does not exist"
    raise ValueError(
        f"model={name!r} is neither a shipped geometry {shipped} nor a directory / file holding an "
        f"HF config.json"
        + (f" ({p} {there})" if not bare or p.exists() else "")
        + "; pass one of those"
    )


def random_init(model: str) -> bool:
    """True for a model without weights (a shipped geometry or a config.json file, as
    `resolve_model` reads the name): built and drawn, not loaded."""
    return resolve_model(model).kind != "directory"
