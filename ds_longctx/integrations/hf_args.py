"""The HF Trainer's arguments from a run config: `training_kwargs` maps the run config onto
TrainingArguments / SFTConfig fields (`owned_fields`), refusing a clashing value with the run-config
key to change. `integrations/hf_trainer.training_args` builds the arguments from it. Imports neither
torch nor transformers.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

# the HF Trainer's name for each optimizer.schedule (what its logs say; `create_scheduler` steps
# ours)
SCHEDULES = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr", "linear": "linear"}


def owned_fields(cfg: RunConfig, ds: dict) -> dict:
    """TrainingArguments fields that come from the run config: {field: (value, the run-config key to
    change)}."""
    opt = ds["optimizer"]["params"]
    return {
        "deepspeed": (ds, "the run config (training_args passes its DeepSpeed JSON)"),
        "per_device_train_batch_size": (cfg.train.micro_batch, "train.micro_batch"),
        "per_device_eval_batch_size": (cfg.train.micro_batch, "train.micro_batch"),
        "gradient_accumulation_steps": (ds["gradient_accumulation_steps"], "train.grad_accum"),
        "learning_rate": (opt["lr"], "optimizer.lr"),
        "weight_decay": (opt["weight_decay"], "optimizer.weight_decay"),
        "adam_beta1": (opt["betas"][0], "none (plan/ds_config.py)"),
        "adam_beta2": (opt["betas"][1], "none (plan/ds_config.py)"),
        "adam_epsilon": (opt["eps"], "none (plan/ds_config.py)"),
        "max_grad_norm": (ds["gradient_clipping"], "optimizer.grad_clip"),
        "warmup_steps": (cfg.optimizer.warmup_steps, "optimizer.warmup_steps"),
        "lr_scheduler_type": (
            SCHEDULES[cfg.optimizer.schedule],
            "optimizer.schedule (the Trainer steps "
            "plan/lr_schedule.py's schedule: LongCtxTrainerMixin.create_scheduler)",
        ),
        "bf16": (ds["bf16"]["enabled"], "model.dtype"),
        "fp16": (False, "model.dtype"),
        "seed": (cfg.train.seed, "train.seed"),
        "max_steps": (cfg.train.steps, "train.steps"),
        "gradient_checkpointing": (False, "memory.* (the placement plan checkpoints the layers)"),
    }


def report_to(ours: str) -> str:
    """The Trainer's report_to for logging.report_to (auto: tensorboard where it imports, as
    `ds-longctx train`)."""
    if ours != "auto":
        return ours

    return "tensorboard" if importlib.util.find_spec("tensorboard") is not None else "none"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


SKIP_PREPARE = {
    "skip_prepare_dataset": True
}  # an SFTConfig's dataset_kwargs for rows_dataset's ready rows


def training_kwargs(cfg: RunConfig, ds: dict, args_cls, kwargs: dict) -> dict:
    """The keyword arguments `training_args` gives `args_cls` (see there); raises ValueError on a
    clash."""
    owned = owned_fields(cfg, ds)
    clash = [
        f"{k}={_short(kwargs[k])} (the run config says {_short(v)}; change {where})"
        for k, (v, where) in owned.items()
        if k in kwargs and kwargs[k] != v
    ]
    if clash:
        raise ValueError(f"training_args: {'; '.join(clash)}")
    save = cfg.checkpoint.save_every
    out = {
        "output_dir": cfg.train.output_dir,
        "logging_steps": cfg.logging.log_every,
        "save_strategy": "steps" if save else "no",
        **({"save_steps": save} if save else {}),
        "report_to": report_to(cfg.logging.report_to),
    }
    if "max_length" in getattr(args_cls, "__dataclass_fields__", {}):  # TRL's SFTConfig
        out.update(max_length=cfg.train.seq_len, dataset_kwargs=dict(SKIP_PREPARE))
    out.update(kwargs)
    out.update({k: v for k, (v, _) in owned.items()})
    out["accelerator_config"] = {
        **dict(kwargs.get("accelerator_config") or {}),
        "use_configured_state": True,
    }
    return out
