"""ds_longctx under the HF `Trainer` and TRL's `SFTTrainer`: Ulysses SP, the attention kernel, the
chunked loss, tiled MLP, the placement plan and the planner's DeepSpeed config.

    from ds_longctx.integrations import hf_trainer as longctx
    cfg = longctx.run_config(sys.argv[1:])                         # --config F [--key value ...]
    args = longctx.training_args(cfg, SFTConfig, logging_steps=1)  # instead of SFTConfig(...)
    model = longctx.build_model(cfg)                               # instead of from_pretrained(...)
    trainer = longctx.trainer(SFTTrainer, cfg, model=model, args=args, train_dataset=..., ...)
    trainer.train()
    longctx.finish()                                               # every rank done, exit 0

`launch/trl_sft.py` is a complete script. Loss and data order match `ds-longctx train` step for
step; a TrainingArguments field that contradicts the run config is refused. What `trainer` changes
and what is not supported: docs/design/integrations.md."""

from __future__ import annotations

# torch, transformers, accelerate and the run layer are imported inside the functions that use them:
# importing this module (a training script's first lines) loads none of them.
import atexit
import functools
import logging
import os
import weakref
from typing import TYPE_CHECKING

from ds_longctx.checkpoint.files import weights_only_loads
from ds_longctx.integrations.hf_args import SKIP_PREPARE, training_kwargs
from ds_longctx.integrations.hf_loss import LongCtxLossMixin
from ds_longctx.integrations.step_clock import step_clock
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import ParallelState, init_distributed, leave
from ds_longctx.run.argv import parse_config
from ds_longctx.run.stops import watch_launcher

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def run_config(argv: list) -> RunConfig:
    """The run config from `python -m ds_longctx.train`'s arguments (a bad value exits 2); under a
    launcher, this process ends itself when the launcher dies."""
    watch_launcher()
    return parse_config(list(argv))


def start_processes(cfg: RunConfig) -> None:
    """The process group (the run's collective timeout) and accelerate's PartialState on it, as
    DeepSpeed's. Idempotent."""
    import torch
    from accelerate import PartialState

    from ds_longctx.run.ranks import default_group_timeout

    default_group_timeout(cfg.parallel.collective_timeout_s)
    if not torch.distributed.is_initialized():
        init_distributed(cfg.parallel.collective_timeout_s)
        atexit.register(_end_processes)
    before = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = (
        "true"  # PartialState marks itself DeepSpeed's (as the Trainer's does)
    )
    try:
        PartialState(backend="nccl" if torch.cuda.is_available() else "gloo")
    finally:
        if before is None:
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = before


def finish() -> None:
    """The last line of a script: every rank past a barrier, the groups torn down, exit 0 without
    Python's teardown (parallel_state.leave)."""
    leave(0)


def _end_processes() -> None:
    """At exit: tear the process group down while the interpreter still runs (gloo's threads can
    abort the process in its teardown)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def trainer_ds_config(cfg: RunConfig, geom=None) -> dict:
    """The DeepSpeed JSON the Trainer runs with. `geom`: the model's (`RunShape.geometry`), else
    read where needed."""
    import torch
    import torch.distributed as dist

    from ds_longctx.plan.ds_config import hf_trainer_ds_config

    return hf_trainer_ds_config(cfg, dist.get_world_size(), torch.cuda.is_available(), geom)


def training_args(cfg: RunConfig, args_cls=None, **kwargs):
    """`args_cls(**kwargs)` for `cfg`, the owned fields from `cfg` (`hf_args.training_kwargs`).
    Starts the process group first."""
    start_processes(cfg)
    if args_cls is None:
        from transformers import TrainingArguments as args_cls
    return args_cls(**training_kwargs(cfg, trainer_ds_config(cfg), args_cls, kwargs))


_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # build_model's model -> shape


def build_model(cfg: RunConfig, stage=lambda name: None):
    """The run's model as `ds-longctx train` builds it, after the engine's checks; the trainer
    applies the levers to the run shape those checks built."""
    import torch.distributed as dist

    from ds_longctx.run import model as run_model
    from ds_longctx.run.preflight import rope_coverage, validate

    start_processes(cfg)
    shape = validate(cfg, dist.get_world_size())
    rope_coverage(cfg, shape.hf_config)
    ds = trainer_ds_config(cfg, shape.geometry)
    model = run_model.build_partitioned_model(cfg, shape.hf_config, ds, stage=stage)
    _SHAPES[model] = shape
    return model


def tokenizer(cfg: RunConfig):
    """The run's tokenizer as `ds-longctx train` loads it, checked against the model's vocabulary;
    None where the run has none."""
    from ds_longctx.data.tokenize import load_tokenizer
    from ds_longctx.run.model import load_hf_config

    return load_tokenizer(cfg, load_hf_config(cfg.model.name).get_text_config().vocab_size)


def __getattr__(name: str):
    """`rows_dataset` from hf_data, imported on first use (hf_data imports torch)."""
    if name == "rows_dataset":
        from ds_longctx.integrations.hf_data import rows_dataset

        return rows_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=None)
def trainer_class(trainer_cls: type) -> type:
    """`LongCtx<Name>`: `LongCtxTrainerMixin` in front of `trainer_cls`."""
    return type("LongCtx" + trainer_cls.__name__, (LongCtxTrainerMixin, trainer_cls), {})


def trainer(trainer_cls: type, run_config: RunConfig, **kwargs):
    """`trainer_cls(**kwargs)` with ds_longctx's levers; `kwargs["args"]` from `training_args`.
    Dataset rules: docs/design/integrations.md."""
    from ds_longctx.integrations.hf_data import needs_preparing

    args = kwargs.get("args")
    given = [kwargs.get(k) for k in ("train_dataset", "eval_dataset")]
    if getattr(args, "dataset_kwargs", None) == SKIP_PREPARE and any(
        needs_preparing(d) for d in given
    ):
        args.dataset_kwargs = {}
    if (
        hasattr(args, "completion_only_loss")
        and args.completion_only_loss is None
        and any("completion_mask" in (getattr(d, "column_names", None) or ()) for d in given)
    ):
        args.completion_only_loss = True
    return trainer_class(trainer_cls)(run_config=run_config, **kwargs)


def check_trainer(tr, cfg: RunConfig) -> None:
    """Refuse a Trainer this integration cannot make right, naming the fix."""
    fix = "build args with ds_longctx.integrations.hf_trainer.training_args(run_config, ...)"
    if not tr.is_deepspeed_enabled or tr.accelerator.state.deepspeed_plugin.zero_stage != 3:
        raise ValueError(f"ds_longctx's Trainer integration runs under DeepSpeed ZeRO-3; {fix}")
    ds = tr.accelerator.state.deepspeed_plugin.deepspeed_config
    if ds.get("sequence_parallel_size", 1) != cfg.parallel.sp_size:
        raise ValueError(
            f"the DeepSpeed config has sequence_parallel_size={ds.get('sequence_parallel_size')}, "
            f"the run config sp_size={cfg.parallel.sp_size}; {fix}"
        )
    if tr.args.gradient_checkpointing:
        raise ValueError(
            f"gradient_checkpointing=True: the placement plan checkpoints the layers; {fix}"
        )
    if getattr(tr.args, "activation_offloading", False):
        raise ValueError(
            "activation_offloading=True (TRL's): the placement plan offloads checkpoints instead; "
            "set it False and use the run config's memory.offload_layers"
        )
    if hasattr(tr.model, "peft_config"):
        raise ValueError(
            "the model already carries PEFT adapters (a peft_config): ds_longctx puts them in "
            "itself, "
            "from the run config's lora section (lora.rank, lora.target_modules); drop peft_config"
        )
    pc = getattr(tr.accelerator, "parallelism_config", None)
    if pc is not None and (pc.sp_size > 1 or pc.cp_size > 1):
        raise ValueError(
            f"accelerate's parallelism_config (sp_size={pc.sp_size}, cp_size={pc.cp_size}) would "
            "split the sequence a second time; drop it: the run config's parallel.sp_size sets "
            "ds_longctx's SP"
        )


def _log_to_stderr() -> None:
    """ds_longctx's build lines on stderr as `ds-longctx train` prints them, unless the script
    already has a handler."""
    logger = logging.getLogger("ds_longctx")
    if logger.hasHandlers():
        return
    rank = int(os.environ.get("RANK", "0"))
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[ds_longctx] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)


class LongCtxTrainerMixin(LongCtxLossMixin):
    """In front of a Trainer class: ds_longctx's levers, data order and SP loss."""

    def __init__(self, *args, run_config: RunConfig, **kwargs):
        super().__init__(*args, **kwargs)
        from ds_longctx.levers.loss_head import route_forward
        from ds_longctx.run.lever_order import apply_levers

        check_trainer(self, run_config)
        _log_to_stderr()
        text = self.model.config.get_text_config()
        self.longctx_config = run_config
        self.longctx_state = ParallelState.build(
            run_config.parallel.sp_size,
            text.num_attention_heads,
            text.num_key_value_heads,
            kernel_rules.linear_heads(text),
        )
        self.longctx = apply_levers(
            run_config,
            self.model,
            self.longctx_state,
            self.accelerator.state.deepspeed_plugin.deepspeed_config,
            _SHAPES.get(self.model),  # None (a model built elsewhere): planned there
        )
        route_forward(self.model, self.longctx.head)
        self.longctx_clock = step_clock()
        self.longctx_clock.snapshot = (
            run_config.logging.memory_snapshot_steps,
            self.args.output_dir,
        )
        self.add_callback(self.longctx_clock)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """plan/lr_schedule.py's schedule over the Trainer's steps."""
        from torch.optim.lr_scheduler import LambdaLR

        from ds_longctx.plan.lr_schedule import lr_factor

        if self.lr_scheduler is None:
            opt = self.optimizer if optimizer is None else optimizer
            self.lr_scheduler = LambdaLR(
                opt, lr_factor(self.longctx_config.optimizer, num_training_steps)
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def train(self, *args, **kwargs):
        """The Trainer's train with every torch.load weights-only."""
        with weights_only_loads():
            return super().train(*args, **kwargs)

    def log(self, logs, *args, **kwargs):
        """The Trainer's log, with `seconds` and `peak_gpu_bytes` beside a training loss."""
        if "loss" in logs:
            logs = {**logs, **self.longctx_clock.read()}
        return super().log(logs, *args, **kwargs)

    # ---------------------------------------------------------------- data
    def _longctx_rows(self, dataset, description: str):
        """(dataset, collate): our rows stacked as they are; other rows with their masks folded into
        labels, then the trainer's collator."""
        from ds_longctx.integrations import hf_data

        if hf_data.is_rows_dataset(dataset):
            return dataset, hf_data.collate_rows
        if hf_data.needs_preparing(dataset):
            raise ValueError(
                f"the {description} dataset has no input_ids (columns {dataset.column_names}): TRL "
                "tokenizes it only when its preparation runs; build the trainer with "
                "longctx.trainer, "
                f"which gives such a dataset to TRL, or pass dataset_kwargs={{}} to training_args"
            )
        collate = self._get_collator_with_removed_columns(
            self.data_collator, description=description
        )
        return dataset, functools.partial(
            hf_data.masked_collate, collate, hf_data.applied_masks(self.args)
        )

    def _reject_skip_prepare_without_labels(self, datasets, data_collator) -> None:
        """Nothing to refuse: `_longctx_rows` folds mask columns into labels."""

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        from ds_longctx.integrations import hf_data

        dataset, collate = self._longctx_rows(self.train_dataset, "training")
        cfg = self.longctx_config
        return hf_data.train_loader(
            dataset,
            collate,
            self.longctx_state,
            cfg.train.micro_batch,
            cfg.train.seed,
            cfg.data.shuffle,
            self.args.dataloader_num_workers,
            cfg.train.grad_accum,
        )

    def get_eval_dataloader(self, eval_dataset=None):
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        from ds_longctx.integrations import hf_data

        dataset, collate = self._longctx_rows(
            eval_dataset if eval_dataset is not None else self.eval_dataset, "evaluation"
        )
        return hf_data.eval_loader(
            dataset,
            collate,
            self.longctx_state,
            self.args.eval_batch_size,
            self.args.dataloader_num_workers,
        )

    def get_test_dataloader(self, test_dataset):
        return self.get_eval_dataloader(test_dataset)

    def get_total_train_batch_size(self, args) -> int:
        """Sequences per optimizer step: micro_batch x accumulation x dp."""
        return (
            self._train_batch_size * args.gradient_accumulation_steps * self.longctx_state.dp_size
        )
