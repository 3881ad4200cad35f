"""Which run-config keys a resume may change: the one home of that rule.

    saved = saved_values(meta["run"], tag_dir / "run.yaml")
    refused, changed = compare(saved, cfg)  # the checkpoint's values against this run's
    stored_values(cfg)                      # what checkpoint/save.save stores in meta.json's `run`

FIXED keys make the model, its numerics, the data order or the optimizer state's layout: a change is
refused before anything is loaded (checkpoint/resume.py check_run_dir), naming each key with both
values. MAY_CHANGE keys are this run's to set: the step count, saving, logging, evaluation, the
memory levers (optimizer and parameter offload included), the lr and its schedule; a change is
applied after the checkpoint's load (run/resume_changes.py) and listed in one log line. NOT_COMPARED
keys say where and whether to resume; sp_size, micro_batch and grad_accum make the layout and the
global batch, which checkpoint/layout.py checks with the world size. Every key is in exactly one
class.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ds_longctx.config.config_file import read_config_file
from ds_longctx.config.keys import FLAT

if TYPE_CHECKING:
    from ds_longctx.config.run import RunConfig

# key -> why a change is refused where the reason is not the general one (the weights, numerics or
# data order)
FIXED = {
    "model": "",
    "dtype": "",
    "rope_scaling": "",
    "router_aux_loss_coef": "",
    "attn_backend": "",
    "linear_attn_backend": "",
    "seq_len": "",
    "seed": "",
    "shuffle": "",
    "data": "",
    "data_split": "",
    "data_layout": "",
    "tokenizer": "",
    "text_field": "",
    "text_unit": "",
    "add_eos": "",
    "skip_bad_rows": "",
    "data_format": "",
    "train_on": "",
    "truncate": "",
    "lora_rank": "",
    "lora_alpha": "",
    "lora_dropout": "",
    "lora_target_modules": "",
    "lora_init": "",
    "objective": "",
    "beta": "",
    "loss_type": "",
    "ref_model": "",
    "epsilon": "",
    "epsilon_high": "",
    "scale_rewards": "",
    "max_completion_length": "",
    "shared_prompt": "",
    "torch_adam": (
        "the saved Adam state is carried into another implementation only for optimizer_offload"
    ),
    "optimizer_offload_ratio": "the optimizer state is saved in the old split's sub-groups "
    "(a partial offload sets their size) and is not carried into another split",
}
MAY_CHANGE = (
    "steps",
    "epochs",
    "loss_average",
    "lr",
    "warmup_steps",
    "lr_schedule",
    "min_lr",
    "weight_decay",
    "grad_clip",
    "optimizer_state_at_build",
    "save_every",
    "keep_checkpoints",
    "log_every",
    "report_to",
    "memory_snapshot_steps",
    "eval_data",
    "eval_every",
    "eval_rows",
    "eval_buckets",
    "eval_answer_loss",
    "eval_recall",
    "data_cache_dir",
    "tokenize_num_proc",
    "fused_ops",
    "chunked_loss",
    "loss_chunk_rows",
    "activation_checkpointing",
    "offload_layers",
    "attention_cache_layers",
    "placement",
    "pinned_pool",
    "nvme_path",
    "nvme_gb",
    "nvme_optimizer",
    "nvme_params",
    "tiled_mlp",
    "tiled_layer",
    "tile_tokens",
    "attn_bwd_head_groups",
    "gpu_budget_gb",
    "run_ahead_layers",
    "optimizer_offload",
    "offload_params",
    "collective_timeout_s",
    "sp_across_nodes",
    "nodes",
    "gpus_per_node",
)
# the layout and the global batch: checked together by checkpoint/layout_change.check_layout
NOT_COMPARED = (
    "output_dir",
    "overwrite",
    "resume",
    "resume_tag",
    "sp_size",
    "micro_batch",
    "grad_accum",
    "allow_batch_change",
)
# the keys whose change is set on the optimizer after the load: DeepSpeed restores its param groups
# (lr, weight_decay) and the scheduler's step from the checkpoint
OPTIMIZER_KEYS = ("steps", "epochs", "lr", "warmup_steps", "lr_schedule", "min_lr", "weight_decay")


def _check_classes() -> None:
    keys = [*FIXED, *MAY_CHANGE, *NOT_COMPARED]
    if sorted(keys) != sorted(FLAT):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise TypeError(
            f"config/resume_keys.py: every run-config key belongs to one class; unclassified "
            f"{sorted(set(FLAT) - set(keys))}, unknown {sorted(set(keys) - set(FLAT))}, twice "
            f"{twice}"
        )


_check_classes()


def stored_values(cfg: RunConfig) -> dict:
    """{flat key: value} of every compared key: what a checkpoint keeps to compare a resume
    against."""
    return {k: cfg.get(k) for k in (*FIXED, *MAY_CHANGE, "micro_batch", "grad_accum")}


def saved_values(stored: dict, run_yaml: Path) -> dict:
    """A checkpoint's values: meta.json's `run` (`stored`), and for the keys that its version did
    not store there, its run.yaml's (a dump in sections), where the checkpoint has one."""
    dump = read_config_file(run_yaml) if run_yaml.is_file() else None
    dumped = {
        flat: dump[sec][name]
        for flat, (sec, name) in FLAT.items()
        if isinstance(dump, dict) and isinstance(dump.get(sec), dict) and name in dump[sec]
    }
    return {**dumped, **stored}


def dotted(key: str) -> str:
    return ".".join(FLAT[key])


def compare(saved: dict, cfg: RunConfig) -> tuple[list, list]:
    """(refused, changed): [(flat key, checkpoint's value, this run's)] of the FIXED and of the
    MAY_CHANGE keys that differ; `saved`: `saved_values`. A FIXED key that a checkpoint holds
    nowhere held its default (its version did not have it yet); such a MAY_CHANGE key is not listed
    (its value then is unknown)."""
    default = type(cfg)()
    refused = [(k, saved.get(k, default.get(k)), cfg.get(k)) for k in FIXED]
    changed = [(k, saved[k], cfg.get(k)) for k in MAY_CHANGE if k in saved]
    return [r for r in refused if r[1] != r[2]], [c for c in changed if c[1] != c[2]]


def _show(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v)


def resume_refusal(refused: list, where: str) -> str:
    """The refusal of a resume that changes FIXED keys (`compare`'s first list) of checkpoint
    `where`."""
    what = ", ".join(
        f"{dotted(k)} {_show(a)} -> {_show(b)}" + (f" ({FIXED[k]})" if FIXED[k] else "")
        for k, a, b in refused
    )
    return (
        f"resume: this run changes {what} from checkpoint {where}; resume with the checkpoint's "
        f"values (its run.yaml) or start a new output_dir"
    )


def changed_line(changed: list, step: int) -> str:
    """The one log line of what a resume at `step` changes (`compare`'s second list)."""
    return f"resume: changed since step {step}: " + ", ".join(
        f"{k} {_show(a)} -> {_show(b)}" for k, a, b in changed
    )
