"""The run config: the sections composed into one model, and the three spellings of a key.

    cfg = RunConfig.load("run.yaml", seq_len=4096)          # a file (YAML or JSON) + overrides
    cfg = RunConfig.from_cli(["--config", "run.yaml", "--memory.offload_layers", "auto"])
    cfg.train.seq_len, cfg.memory.offload_layers               # read by section
    print(RunConfig.help_text())                              # every field, its doc and default

Spellings (a file, the command line and `RunConfig(**kwargs)` take all three, mixed):
    sectioned   {"memory": {"offload_layers": 4}}     (what `dump` writes)
    dotted      {"memory.offload_layers": 4}          --memory.offload_layers 4
    flat        {"offload_layers": 4}                 --offload_layers 4
                (the keys README and old files use)
Every flat key maps to exactly one section field (`FLAT`, config/keys.py); the same field given
twice with different values is refused, and so is an unknown key, naming the nearest known one. One
legacy key is translated: `activation_offload` (a bool beside `offload_layers`): false means no
layer offloaded, true alone means all. The DeepSpeed JSON is derived from this object
(plan/ds_config.py) and never read back.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from ds_longctx.config.checkpoint import CheckpointConfig
from ds_longctx.config.config_file import read_config_file, yaml_text
from ds_longctx.config.data import DataConfig
from ds_longctx.config.eval import EvalConfig
from ds_longctx.config.kernels import KernelsConfig
from ds_longctx.config.keys import (
    DOTTED,
    FLAT,
    LEGACY,
    SECTIONS,
    field_of,
    fold,
    is_optional_key,
    is_text_key,
    key_annotation,
    type_name,
    unknown_key,
)
from ds_longctx.config.logs import LoggingConfig
from ds_longctx.config.lora import LoraConfig
from ds_longctx.config.memory import MemoryConfig, drop_unset_disk_keys
from ds_longctx.config.model import ModelConfig
from ds_longctx.config.optimizer import OptimizerConfig
from ds_longctx.config.parallel import ParallelConfig
from ds_longctx.config.train import TrainConfig, drop_other_objective_keys, objective_problem
from ds_longctx.parallel.parallel_state import check_planned_world, check_sp_size


def lever_conflict(
    *,
    lora_rank: int = 0,
    tiled_layer: bool = False,
    offload_ratio: float = 1.0,
    offload_params: bool = False,
    flags: bool = False,
) -> Optional[str]:
    """The one home of which levers do not go together: the run config's validator, `ds-longctx
    plan`'s arguments (plan/write.py) and the planner (plan_memory) ask here. Returns the refusal,
    naming the values and the fix, or None. `flags`: spelled as `ds-longctx plan`'s switches
    (`--lora_rank 16`; the fix: drop one), else as run-config keys (`lora_rank=16`; the fix: the key
    to set)."""

    def name(key, value=True):
        if flags:
            return f"--{key}" + ("" if value is True else f" {value:g}")
        return key if value is True else f"{key}={value:g}"

    def fix(*keys):
        return "drop one of them" if flags else "set " + ", or ".join(keys)

    lora, ratio = name("lora_rank", lora_rank), name("optimizer_offload_ratio", offload_ratio)
    if tiled_layer and lora_rank:
        return (
            f"{name('tiled_layer')} with {lora}: the tiled layer computes from the base weights "
            "and would skip "
            f"the adapters; " + fix("tiled_layer: false (tiled_mlp: true works with LoRA)")
        )
    if offload_ratio < 1 and lora_rank:
        return (
            f"{ratio} with {lora}: the adapters' optimizer state is small, split it no further; "
            + fix("optimizer_offload_ratio: 1", "optimizer_offload: false")
        )
    if offload_params and (lora_rank or offload_ratio < 1):
        return (
            f"{name('offload_params')} with {lora if lora_rank else ratio}: parameter offload is "
            f"planned and built for a whole trained model with its whole optimizer on one side; "
            + fix(
                "offload_params: false",
                "lora_rank: 0" if lora_rank else "optimizer_offload_ratio: 1",
            )
        )
    return None


class RunConfig(BaseModel):
    """Everything one training run needs, in sections. Field docs are the user documentation
    (`--help`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    kernels: KernelsConfig = Field(default_factory=KernelsConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        folded = fold(data)
        train = folded.get("train", {})
        if train.get("epochs") is not None and "steps" in train:
            raise ValueError(
                f"steps={train['steps']} and epochs={train['epochs']} both say how long to train; "
                f"keep one"
            )
        return folded

    @model_validator(mode="after")
    def _across_sections(self, info: ValidationInfo) -> "RunConfig":
        """Rules between two sections (each section checks its own). Given the launch's world size
        (validation context `world_size`, and `per_node`: `from_cli`, `load`), the world the config
        was planned for and sp_size are checked against it first: a wrong world or sp_size also
        breaks the seq_len rule, and the process count is the thing to name."""
        seq, sp, par = self.train.seq_len, self.parallel.sp_size, self.parallel
        if (world := (info.context or {}).get("world_size")) is not None:
            per_node = (info.context or {}).get("per_node") or world
            # the world a plan was made for first
            check_planned_world(par.nodes, par.gpus_per_node, world, per_node)
            check_sp_size(sp, world)
        if seq < sp:
            raise ValueError(
                f"seq_len={seq} is shorter than sp_size={sp}: each rank needs at least one token; "
                f"raise seq_len or lower sp_size"
            )
        if seq % sp:
            lo = seq - seq % sp
            raise ValueError(
                f"seq_len={seq} is not divisible by sp_size={sp}; use seq_len={lo} or {lo + sp} "
                f"(packed data of any length is padded per batch instead)"
            )
        if self.data.layout == "pack" and self.train.micro_batch != 1:
            raise ValueError(
                "data_layout='pack' needs micro_batch=1 (packed rows go to a varlen kernel one "
                f"row at a time), got micro_batch={self.train.micro_batch}; set micro_batch: 1 or "
                f"data_layout: concat"
            )
        if msg := objective_problem(self.train, self.data, self.eval.data):
            raise ValueError(msg)
        if self.lora.rank and self.lora.dropout and self.memory.tiled_mlp:
            raise ValueError(
                f"lora_dropout={self.lora.dropout} with tiled_mlp: the tiled MLP recomputes each "
                "tile "
                "without replaying the RNG, so the dropout masks would differ; set lora_dropout: "
                f"0 or tiled_mlp: false"
            )
        ratio = self.optimizer.offload_ratio
        if ratio < 1 and not self.optimizer.offload:
            raise ValueError(
                f"optimizer_offload_ratio={ratio} splits an offloaded optimizer; set "
                f"optimizer_offload: true, or leave optimizer_offload_ratio at 1"
            )
        if msg := lever_conflict(
            lora_rank=self.lora.rank,
            tiled_layer=self.memory.tiled_layer,
            offload_ratio=ratio,
            offload_params=self.optimizer.offload_params,
        ):
            raise ValueError(msg)
        if self.train.epochs is not None and self.data.source == "synthetic":
            raise ValueError(
                f"epochs={self.train.epochs:g} counts passes over the data's rows, and "
                f"data='synthetic' draws new rows forever; give steps instead"
            )
        if self.eval.data is not None and self.eval.buckets > seq:
            raise ValueError(
                f"eval_buckets={self.eval.buckets} is more than seq_len={seq} positions: a bucket "
                f"needs at least one; use eval_buckets <= {seq}"
            )
        return self

    # ---------------------------------------------------------------- reading by key
    def get(self, key: str):
        """The value of a flat or dotted key (`seq_len`, `train.seq_len`)."""
        where = field_of(key)
        if where is None:
            raise KeyError(f"{key!r} is a legacy key with no value of its own (see offload_layers)")
        return getattr(getattr(self, where[0]), where[1])

    def flat(self) -> dict:
        """{flat key: value} of every field (checkpoint meta compares runs by these)."""
        return {key: self.get(key) for key in FLAT}

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        path: Union[str, Path],
        world_size: Optional[int] = None,
        per_node: Optional[int] = None,
        **overrides,
    ) -> "RunConfig":
        """Read YAML (.yaml/.yml) or JSON; `overrides` (any spelling) win over the file.
        `world_size`: the processes the run is launched on, checked against sp_size first (None: not
        known here)."""
        try:
            if Path(path).is_dir():
                raise ValueError(
                    f"config {path} is a directory; give its run.yaml (or another .yaml / .json "
                    "file)"
                )
            data = read_config_file(path)  # a ValueError naming the file, the line and the fix
        except OSError as e:  # missing, unreadable, a name too long
            raise ValueError(
                f"config {path}: {e.strerror or e}; give the path of a run config (.yaml or .json; "
                f"`ds-longctx plan --out DIR` writes DIR/run.yaml)"
            ) from None
        if data is None:  # an empty file would train the default toy model without a word
            raise ValueError(
                f"config {path} is empty; give at least model and train.seq_len (a generated "
                f"run.yaml: `ds-longctx plan --out DIR`)"
            )
        if not isinstance(data, dict):
            raise ValueError(
                f"config {path} must hold a mapping of keys, got {type(data).__name__}"
            )
        try:
            merged = fold(paths_beside(fold(data), Path(path).parent), overrides)
        except ValueError as e:  # an unknown or doubled key: the constructor's ValidationError
            raise ValidationError.from_exception_data(
                cls.__name__,
                [{"type": "value_error", "loc": (), "input": data, "ctx": {"error": e}}],
            ) from None
        # else the default toy model trains, without a word
        if merged.get("model", {}).get("name") is None:
            raise ValueError(
                f"config {path} names no model; add `model: qwen3-8b` (a shipped geometry, an HF "
                f"config.json or a checkpoint directory) to it, or pass --model"
            )
        return cls.model_validate(merged, context={"world_size": world_size, "per_node": per_node})

    @classmethod
    def from_cli(
        cls, argv: list, world_size: Optional[int] = None, per_node: Optional[int] = None
    ) -> "RunConfig":
        """`[--config FILE] [--key value ...]` with flat or dotted keys; values are parsed as YAML
        scalars (`--lr 1e-4`, `--x true`) except for text fields (paths, names: `--tokenizer 123`
        stays a string; `null` unsets an optional one: `--placement null`); a boolean key given bare
        (`--resume`) means true. A key is given once: twice, in any spellings (`--lr` and
        `--optimizer.lr`), is refused naming both. `world_size`: as in `load`."""
        config_path: Optional[str] = None
        overrides: dict = {}
        given: dict = {}  # field (or `config`, or a legacy key) -> the option as written
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--") or arg == "--":
                raise ValueError(
                    f"unexpected argument {arg!r}; options are --key value (every key: ds-longctx "
                    f"train --help)"
                )
            key, eq, val = arg[2:].partition("=")
            key = key.replace("-", "_")
            if key != "config" and key not in FLAT and key not in DOTTED and key not in LEGACY:
                raise unknown_key(key, prefix="--")
            if not eq:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if (
                    key != "config"
                    and key_annotation(key) is bool
                    and (nxt is None or nxt.startswith("--"))
                ):
                    val = "true"  # a bare flag: `--resume`
                elif nxt is None:
                    raise ValueError(f"option --{key} needs a value")
                else:
                    val, i = nxt, i + 1
            field = key if key == "config" else (field_of(key) or key)
            if field in given:
                name = field if isinstance(field, str) else ".".join(field)
                raise ValueError(
                    f"{name} is given twice on the command line: {given[field]} and --{key} {val}; "
                    f"keep one"
                )
            given[field] = f"--{key} {val}"
            if key == "config":
                config_path = val
            elif is_text_key(key):
                # --tokenizer null unsets it
                overrides[key] = None if val == "null" and is_optional_key(key) else val
            else:
                overrides[key] = yaml.safe_load(val)
            i += 1
        if config_path is not None:
            # else the defaults (the toy model) would train without a word
            if not config_path.strip():
                raise ValueError(
                    f"--config {config_path!r} names no file; give the path of a run config (.yaml "
                    f"or .json), or leave --config out"
                )
            return cls.load(config_path, world_size, per_node, **overrides)
        return cls.model_validate(
            overrides, context={"world_size": world_size, "per_node": per_node}
        )

    def dump(self, path: Union[str, Path]) -> None:
        """Write as YAML (.yaml) or JSON in sections, loadable by `load`. `train.overwrite` is
        written false: it is this command's permission, and a file that ran again must not replace a
        run unasked; with `epochs`, `steps` is left out."""
        data = self.model_dump()
        data["train"]["overwrite"] = False
        # the steps an epoch count came to are the run's to work out again
        if self.train.epochs is not None:
            del data["train"]["steps"]
        drop_unset_disk_keys(data["memory"])
        drop_other_objective_keys(data["train"])
        if str(path).endswith((".yaml", ".yml")):
            Path(path).write_text(yaml_text(data))
        else:
            Path(path).write_text(json.dumps(data, indent=2) + "\n")

    # ---------------------------------------------------------------- documentation
    @classmethod
    def help_text(cls, width: int = 100) -> str:
        """Every field by section: its flat and dotted key, type, default and doc (what `--help`
        prints)."""
        lines = [
            "run config: a YAML/JSON file (--config FILE) and/or --key value overrides. A key is "
            "flat "
            "(--seq_len 4096) or dotted by section (--train.seq_len 4096); a file may use either, "
            "or nest sections (as run.yaml does).",
            "",
        ]
        flat_of = {where: flat for flat, where in FLAT.items()}
        for sec, scls in SECTIONS.items():
            lines.append(f"{sec}:  {(scls.__doc__ or '').strip().splitlines()[0]}")
            for name, f in scls.model_fields.items():
                flat = flat_of[(sec, name)]
                default = f.get_default(call_default_factory=True)
                lines.append(
                    f"  --{flat}  (--{sec}.{name})  {type_name(f.annotation)}, default {default!r}"
                )
                doc = " ".join((f.description or "").split())
                lines += textwrap.wrap(
                    doc, width=width, initial_indent="      ", subsequent_indent="      "
                )
            lines.append("")
        lines.append(
            "legacy: --activation_offload true|false (with offload_layers: false = 0 layers, true "
            "= all unless offload_layers says how many)"
        )
        return "\n".join(lines)


PATH_KEYS = (("model", "name"), ("data", "source"), ("data", "tokenizer"), ("eval", "data"))


def paths_beside(sections: dict, config_dir: Path) -> dict:
    """A relative model, data or tokenizer path in a config file names the path beside the file
    where one exists there (a plan's run.yaml runs from its own directory or from anywhere else);
    otherwise it stays as written: a shipped geometry, `synthetic`, a Hub id, a path from the
    working directory."""
    if config_dir.resolve() == Path.cwd().resolve():
        return sections
    for section, key in PATH_KEYS:
        value = sections.get(section, {}).get(key)
        if (
            isinstance(value, str)
            and value
            and not os.path.isabs(value)
            and (config_dir / value).exists()
        ):
            sections[section][key] = os.path.normpath(config_dir / value)
    return sections
