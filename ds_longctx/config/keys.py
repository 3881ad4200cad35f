"""The run config's keys: its sections, the three spellings of a key (sectioned, dotted, flat;
module doc of config/run.py), the legacy key, and the refusal of an unknown one naming the nearest
known keys.

    FLAT["offload_layers"] == DOTTED["memory.offload_layers"] == ("memory", "offload_layers")
    fold({"offload_layers": 4}, {"memory": {"tiled_mlp": True}})
    # -> {"memory": {"offload_layers": 4, ...}}
"""

from __future__ import annotations

import difflib
from typing import Union, get_args, get_origin

from pydantic import BaseModel

from ds_longctx.config.checkpoint import CheckpointConfig
from ds_longctx.config.data import DataConfig
from ds_longctx.config.eval import EvalConfig
from ds_longctx.config.kernels import KernelsConfig
from ds_longctx.config.logs import LoggingConfig
from ds_longctx.config.lora import LoraConfig
from ds_longctx.config.memory import MemoryConfig
from ds_longctx.config.model import ModelConfig
from ds_longctx.config.optimizer import OptimizerConfig
from ds_longctx.config.parallel import ParallelConfig
from ds_longctx.config.train import TrainConfig

SECTIONS = {
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "parallel": ParallelConfig,
    "kernels": KernelsConfig,
    "memory": MemoryConfig,
    "lora": LoraConfig,
    "optimizer": OptimizerConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "eval": EvalConfig,
}
LEGACY = (
    "activation_offload",
    "tensorboard",
    "logging.tensorboard",
)  # keys of older files, read by `_fold_one`


def _flat_keys() -> dict:
    """{flat key: (section, field)} for every field; raises if two fields claim one flat key."""
    out: dict = {}
    for sec, cls in SECTIONS.items():
        for name, f in cls.model_fields.items():
            flat = (f.json_schema_extra or {}).get("flat", name)
            if flat in out or flat in LEGACY:
                raise TypeError(f"flat key {flat!r} is claimed by {sec}.{name} and {out.get(flat)}")
            out[flat] = (sec, name)
    return out


FLAT = _flat_keys()
DOTTED = {f"{sec}.{name}": (sec, name) for sec, name in FLAT.values()}


# the HF Trainer's / TRL's names of settings this config spells otherwise: an unknown key that is
# one of them is pointed at ours, not at the key spelled most like it (`save_steps` is closest to
# `steps` by spelling)
HF_NAMES = {
    "save_steps": "save_every",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    "learning_rate": "lr",
    "max_steps": "steps",
    "max_grad_norm": "grad_clip",
    "max_seq_length": "seq_len",
    "max_length": "seq_len",
    "per_device_train_batch_size": "micro_batch",
    "gradient_checkpointing": "activation_checkpointing",
    "save_total_limit": "keep_checkpoints",
    "resume_from_checkpoint": "resume",
    "model_name_or_path": "model",
    "dataset_text_field": "text_field",
    "attn_implementation": "attn_backend",
    "lora_r": "lora_rank",
    "bf16": "dtype",
}


def nearest_keys(key: str, most: int = 4) -> list[str]:
    """The known keys (flat or dotted, one spelling per field) spelled most like `key`, closest
    first, at most `most`; for an HF Trainer / TRL name, ours alone and whose name it is; for a
    known key under the wrong section (`train.lr`), its own dotted key first."""
    bare = key.strip("'\"").lstrip("-")
    if bare in HF_NAMES:
        return [f"{HF_NAMES[bare]} (the HF Trainer's {bare})"]
    pool = [*FLAT, *DOTTED, *LEGACY]
    leaf = bare.rpartition(".")[2]
    near = difflib.get_close_matches(
        key, pool, n=2 * most, cutoff=0.5
    ) or difflib.get_close_matches(key.rpartition(".")[2], pool, n=1, cutoff=0.0)
    if "." in bare and leaf in FLAT:  # the right key in the wrong section
        near = [".".join(FLAT[leaf]), *near]
    out, fields = [], set()
    for k in near:
        field = FLAT.get(k) or DOTTED.get(k) or k
        if field not in fields:
            fields.add(field)
            out.append(k)
    return out[:most]


def unknown_key(key: str, prefix: str = "") -> ValueError:
    first, *others = nearest_keys(key)
    also = f" (also close: {', '.join(prefix + k for k in others)})" if others else ""
    return ValueError(
        f"unknown {'option' if prefix else 'key'} {prefix}{key}; nearest: {prefix}{first}{also}; "
        f"every key: ds-longctx train --help"
    )


def field_of(key: str):
    """(section, field) that a flat or dotted key names; None for a legacy key; raises for an
    unknown one."""
    if key in FLAT:
        return FLAT[key]
    if key in DOTTED:
        return DOTTED[key]
    if key in LEGACY:
        return None
    raise unknown_key(repr(key))


def _fold_one(data: dict) -> dict:
    """One source's keys (sectioned, dotted, flat, legacy) -> {section: {field: value}}."""
    out: dict = {s: {} for s in SECTIONS}
    spelled: dict = {}
    legacy_offload = legacy_tb = None

    def put(sec: str, name: str, value, spelling: str) -> None:
        if name in out[sec] and out[sec][name] != value:
            raise ValueError(
                f"{sec}.{name} is given twice: {spelled[(sec, name)]}={out[sec][name]!r} and "
                f"{spelling}={value!r}; keep one"
            )
        out[sec][name], spelled[(sec, name)] = value, spelling

    for key, value in data.items():
        if key in SECTIONS and isinstance(value, (dict, BaseModel)):
            items = value.model_dump() if isinstance(value, BaseModel) else value
            for name, v in items.items():
                if f"{key}.{name}" in LEGACY:
                    legacy_tb = v
                    continue
                if name not in SECTIONS[key].model_fields:
                    raise unknown_key(repr(f"{key}.{name}"))
                put(key, name, v, f"{key}.{name}")
            continue
        if (
            key in SECTIONS and key not in FLAT and key not in DOTTED
        ):  # a section (`model` is a flat key too)
            if (
                value is None
            ):  # `memory:` with nothing under it (YAML's null): an empty section, the defaults
                continue
            raise ValueError(
                f"{key}: {value!r} is not a mapping; the {key} section holds keys, e.g. "
                f"{key}: {{{next(iter(SECTIONS[key].model_fields))}: ...}}"
            )
        where = field_of(key)
        if where is None and key.endswith("tensorboard"):
            legacy_tb = value
            continue
        if where is None:
            legacy_offload = value
            continue
        put(*where, value, key)
    if legacy_offload is not None:  # the old two-field spelling of one lever
        mem = out["memory"]
        if legacy_offload in (False, "false", 0):
            n = mem.get("offload_layers", 0)
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                raise ValueError(
                    f"activation_offload=false with offload_layers={n}: the first says no layer is "
                    f"offloaded, the second {n}; drop activation_offload (offload_layers alone is "
                    f"the lever now) or set offload_layers: 0"
                )
            mem["offload_layers"] = 0
        else:
            mem.setdefault("offload_layers", "all")
    if legacy_tb is not None:  # `tensorboard: true|false` before report_to
        out["logging"].setdefault(
            "report_to", "none" if legacy_tb in (False, "false", 0) else "auto"
        )
    return {s: v for s, v in out.items() if v}


def fold(*sources: dict) -> dict:
    """Sources in increasing precedence (a file, then overrides) -> one sectioned dict."""
    merged: dict = {}
    for src in sources:
        for sec, fields in _fold_one(src).items():
            merged.setdefault(sec, {}).update(fields)
    return merged


def field_info(key: str):
    where = field_of(key)
    return None if where is None else SECTIONS[where[0]].model_fields[where[1]]


def key_annotation(key: str):
    f = field_info(key)
    return bool if f is None else f.annotation


def is_text_key(key: str) -> bool:
    """A field that holds text (str or Optional[str]): command-line values stay strings."""
    ann = key_annotation(key)
    return ann is str or (get_origin(ann) is Union and set(get_args(ann)) == {str, type(None)})


def is_optional_key(key: str) -> bool:
    return get_origin(key_annotation(key)) is Union and type(None) in get_args(key_annotation(key))


def type_name(ann) -> str:
    return (
        ann.__name__
        if isinstance(ann, type)
        else str(ann).replace("typing.", "").replace("NoneType", "None")
    )
