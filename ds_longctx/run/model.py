"""The model a run trains: its HF config, its class, and the model itself, partitioned at birth.

hf_cfg = load_hf_config("qwen3-8b")        # a shipped geometry or a checkpoint directory
model = build_partitioned_model(cfg, hf_cfg, ds_config)     # zero.Init, YaRN, weights drawn
"""

from __future__ import annotations

# transformers and deepspeed are imported inside the functions that use them (seconds each at
# import).
import contextlib
import json
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn

from ds_longctx import families
from ds_longctx.config.model import random_init, read_config_json, resolve_model
from ds_longctx.levers.moe import set_experts_kernel
from ds_longctx.levers.rope import apply_rope_scaling
from ds_longctx.parallel import fake_world
from ds_longctx.plan import layer_types

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def load_hf_config(model: str):
    """The HF config of a shipped geometry, a config.json or a checkpoint directory; ValueError
    naming a file transformers cannot read."""
    from huggingface_hub.errors import (
        StrictDataclassError,
    )  # transformers' typed config fields (a null, a string)
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    src = resolve_model(model)
    try:
        if src.kind == "shipped":  # its family's config class (Qwen3Config, Qwen3MoeConfig, ...)
            d = json.loads(src.config.read_text())
            cfg = CONFIG_MAPPING[d["model_type"]].from_dict(d)
        elif src.kind == "file":
            d = layer_types.text_config(read_config_json(src.config))
            cfg = AutoConfig.for_model(d.pop("model_type"), **d)
        else:
            cfg = AutoConfig.from_pretrained(src.config.parent, trust_remote_code=False)
            if families.text_key(cfg.model_type):  # a composite (VL): its text model trains
                cfg = cfg.get_text_config()
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        where = str(src.config)
        first = " ".join(x.strip() for x in str(e).strip().splitlines())[
            :240
        ]  # hub's errors span lines
        raise ValueError(
            f"model={model!r}: transformers cannot read {where} ({type(e).__name__}: {first}); fix "
            f"or replace that config.json"
        ) from None
    cfg.use_cache = False
    return cfg


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # and their sharded `.index.json` forms


def weights_problem(model: str):
    """Why checkpoint directory `model` cannot give `from_pretrained` its weights (None: it can): no
    weight file, or a shard its index names missing."""
    if random_init(model):
        return None
    d = Path(model)
    for name in WEIGHT_FILES:
        index = d / f"{name}.index.json"
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                return (
                    f"{index} is not a weight index ({type(e).__name__}: {e}); restore it from the "
                    "model's source"
                )
            missing = sorted(s for s in shards if not (d / s).is_file())
            return (
                (
                    f"{index} names {len(missing)} shard(s) missing from {d} "
                    f"({', '.join(missing[:3])}); copy them there"
                )
                if missing
                else None
            )
        if (d / name).is_file():
            return None
    if any(d.glob("*.safetensors")):
        return None
    return (
        f"model={model!r} holds a config.json but no weights (no {' / '.join(WEIGHT_FILES)}, no "
        "*.safetensors); "
        f"copy the weights there, or pass {d / 'config.json'} to train from random init"
    )


def model_class(hf_config):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    except KeyError:
        raise ValueError(
            f"model type {hf_config.model_type!r} has no causal-LM class in transformers; "
            f"ds_longctx trains causal LMs (Qwen3, Llama, ...)"
        ) from None


def init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Draw every parameter from a generator seeded by (seed, parameter name): the same weights at
    any world size, sp_size or partitioning. Rules: docs/design/run.md."""
    import deepspeed

    owner = {
        f"{m_name}.{p_name}".lstrip("."): type(m).__name__
        for m_name, m in model.named_modules()
        for p_name, _ in m.named_parameters(recurse=False)
    }
    # rank 0 draws and the gather's exit hands each rank its slice; a rehearsal's fake world moves
    # no data, so there every rank draws the same values itself (else it keeps torch's module init:
    # N(0, 1)
    # embeddings)
    only_rank0 = dist.is_initialized() and dist.get_rank() != 0 and not fake_world.active()
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0, enabled=hasattr(p, "ds_id")):
            if only_rank0 and hasattr(p, "ds_id"):
                continue
            with torch.no_grad():
                if p.dim() == 1:
                    p.fill_(layer_types.vector_init(name, owner.get(name, "")))
                else:
                    g = torch.Generator(device=p.device).manual_seed(
                        seed * 7919 + zlib.crc32(name.encode())
                    )
                    p.copy_(
                        torch.randn(
                            p.shape, generator=g, device=p.device, dtype=torch.float32
                        ).mul_(std)
                    )


@contextlib.contextmanager
def _without_hf_init(cls):
    """`cls(config)` without transformers' per-module `_init_weights` (put back after). Why:
    docs/design/run.md."""
    owner = next(c for c in cls.__mro__ if "_init_weights" in c.__dict__)
    saved = owner.__dict__["_init_weights"]
    owner._init_weights = lambda self, module: None
    try:
        yield
    finally:
        owner._init_weights = saved


def build_partitioned_model(
    cfg: RunConfig, hf_cfg, ds_config: dict, stage=lambda name: None
) -> nn.Module:
    """The HF causal LM for `cfg`: YaRN from seq_len, built under `deepspeed.zero.Init`, shipped
    geometries drawn by `init_weights`. `stage(name)` is told each step's end."""
    import deepspeed

    dtype = torch.bfloat16 if ds_config["bf16"]["enabled"] else torch.float32
    cls = model_class(hf_cfg)
    hf_cfg._attn_implementation = "sdpa"
    set_experts_kernel(
        hf_cfg
    )  # a mixture of experts: transformers' grouped_mm experts (levers/moe.py)
    hf_cfg.dtype = dtype
    # YaRN before the model exists: the rotary embedding reads rope_parameters at construction
    apply_rope_scaling(hf_cfg, cfg.train.seq_len, cfg.model.rope_scaling)
    is_path = not random_init(cfg.model.name)
    # dtype=None: zero.Init then takes it from ds_config (passing one is ignored on CPU by a
    # DeepSpeed precedence bug in Init._set_dtype, which would silently give bf16 weights on CPU)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=None, enabled=not is_path):
        if is_path:
            from transformers.integrations import HfDeepSpeedConfig

            _keep = HfDeepSpeedConfig(ds_config)  # noqa: F841  makes from_pretrained load partitioned
            model = cls.from_pretrained(
                resolve_model(cfg.model.name).config.parent, config=hf_cfg, dtype=dtype
            )
        else:
            with _without_hf_init(cls):
                model = cls(hf_cfg).to(dtype)
    stage("model under zero.Init")
    if not is_path:
        init_weights(model, cfg.train.seed, getattr(hf_cfg, "initializer_range", 0.02))
        stage("init_weights")
    return (
        model.train()
    )  # SP must never run in eval mode by accident (accelerate's SP disables itself in eval)
