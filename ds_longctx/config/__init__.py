"""The run config: one pydantic model, the only place a setting is defined.

Load it from YAML or JSON (`RunConfig.load(path)`), override any key on the command line as
`--key value` (`RunConfig.from_cli(argv)`). Unknown keys are refused (`extra="forbid"`). The DeepSpeed
JSON is derived from this object by `ds_config.build_ds_config` and never read back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SHIPPED_MODELS_DIR = Path(__file__).parents[1] / "models"
# command-line values kept as strings (paths, names: `--tokenizer 123`, `--resume_tag 300` are not numbers)
STRING_KEYS = ("model", "output_dir", "data", "tokenizer", "text_field", "data_split", "data_cache_dir", "resume_tag")
ATTN_BACKENDS = ("auto", "sdpa", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flash_attn")


def shipped_models() -> list[str]:
    """Names of the model geometries shipped in `ds_longctx/models/` (random-init configs)."""
    return sorted(p.stem for p in SHIPPED_MODELS_DIR.glob("*.json"))


class RunConfig(BaseModel):
    """Everything one training run needs. Field docs are the user documentation (`ds-longctx train --help`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: str = Field("qwen3-tiny", description="A shipped geometry (random init; see `shipped_models()`: "
                       "qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b) or a local HF checkpoint directory.")
    seq_len: int = Field(256, gt=0, description="Tokens per sequence (one sequence per rank group per step).")
    sp_size: int = Field(1, ge=1, description="Ulysses sequence-parallel degree: ranks that share one sequence. "
                         "Must divide the world size; data parallelism is world_size / sp_size.")
    micro_batch: int = Field(1, ge=1, description="Sequences per SP group per step (1 for long context).")
    steps: int = Field(3, ge=1, description="Optimizer steps to run.")
    seed: int = Field(0, description="Seed for random init and synthetic data; identical for any world size / sp_size.")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant, with `warmup_steps` linear warm-up).")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clipping (0 disables).")
    output_dir: str = Field("runs/latest", description="Where metrics.jsonl (one JSON line per step) is written.")
    data: str = Field("synthetic", description="`synthetic` (key-value retrieval with long-range structure), a local "
                      ".txt / .jsonl / .json / .parquet file or a directory of them (one format), or a `datasets` "
                      "hub name (needs a reachable hub). See data.py.")
    attn_backend: str = Field("auto", description="Attention kernel: auto (flash-attn if installed and not on "
                              "Hopper, else SDPA with cuDNN on Hopper, flash elsewhere), sdpa (SDPA, kernel picked "
                              "as auto), sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math, flash_attn.")
    dtype: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 on GPU, fp32 on CPU.")
    torch_adam: bool = Field(True, description="Use torch's AdamW inside DeepSpeed (no JIT build); False uses "
                             "DeepSpeed's fused Adam (GPU) / CPU Adam (optimizer offload), built on first use.")
    log_every: int = Field(1, ge=1, description="Progress-bar refresh interval in steps.")

    # ---- data (data.py): files or a hub dataset -> token rows of exactly seq_len
    tokenizer: Optional[str] = Field(None, description="Local tokenizer directory for text data (default: the model "
                                     "directory when it holds a tokenizer). Its size must not exceed the model's "
                                     "vocab_size. Not needed when the data has an `input_ids` column.")
    data_layout: Literal["concat", "pack", "document"] = Field("concat", description="concat: documents joined end "
                                                              "to end (EOS between) and cut into rows of exactly "
                                                              "seq_len (PG-19 style); pack: whole documents packed "
                                                              "into rows, position ids restart per document and "
                                                              "attention stays inside each (needs a varlen "
                                                              "attention kernel); document: one document per row, "
                                                              "its first seq_len tokens (every document must be "
                                                              "that long).")
    text_field: str = Field("text", description="Column holding the text in JSONL / Parquet / hub data.")
    text_unit: Literal["document", "line", "paragraph"] = Field("document", description=".txt files: one document "
                                                                "per file, per line, or per blank-line paragraph.")
    data_split: str = Field("train", description="Split to read (hub datasets; local files are one 'train' split).")
    data_cache_dir: Optional[str] = Field(None, description="Cache for the converted and tokenized data (datasets' "
                                          "cache_dir); default: HF_DATASETS_CACHE.")
    add_eos: bool = Field(True, description="Append the EOS token (the tokenizer's, else the model config's) to "
                          "every document.")
    shuffle: bool = Field(True, description="Visit rows in a new order each epoch, drawn from (seed, epoch); "
                          "false: file order.")
    tokenize_num_proc: int = Field(1, ge=1, description="Processes for tokenization (datasets.map num_proc).")

    # ---- checkpoints and run control (checkpoint.py)
    save_every: int = Field(0, ge=0, description="Save a DeepSpeed checkpoint every N steps and at the last step "
                            "(0: only when stopped by SIGTERM). Written atomically under output_dir/checkpoints.")
    keep_checkpoints: int = Field(2, ge=0, description="Keep the newest N checkpoints, delete older ones (0: keep all).")
    resume: bool = Field(False, description="Continue from the latest checkpoint in output_dir: weights, optimizer, "
                         "RNG and data order; metrics.jsonl is appended to. Needs the same world size and sp_size.")
    resume_tag: Optional[str] = Field(None, description="With resume: a checkpoint tag under output_dir/checkpoints "
                                      "(e.g. step300) instead of the latest.")
    collective_timeout_s: float = Field(600.0, gt=0, description="Process-group timeout in seconds: a collective "
                                        "waiting longer for a dead or hung rank fails and ends the job.")
    tensorboard: bool = Field(True, description="Also log to output_dir/tensorboard when torch.utils.tensorboard "
                              "imports (no hard dependency).")

    # ---- memory levers (applied in engine.py's documented order)
    chunked_loss: bool = Field(True, description="lm_head + cross-entropy over row chunks: the L x V logits never "
                               "exist in full (chunked_loss.py). False: plain lm_head then F.cross_entropy.")
    loss_chunk_rows: int = Field(4096, gt=0, description="Rows per chunk of the chunked loss.")
    activation_checkpointing: bool = Field(True, description="Keep only each decoder layer's input; recompute the "
                                           "layer in backward.")
    activation_offload: bool = Field(False, description="Move the kept layer inputs to pinned host memory "
                                     "(through DeepSpeed's activation checkpointing, offload.py).")
    offload_layers: Union[int, Literal["all", "auto"]] = Field("all", description="Which layers' checkpoints "
                                                               "leave the GPU when activation_offload: all, auto "
                                                               "(the planner's fewest that fit) or the first N.")
    attention_cache_layers: Union[int, Literal["all"]] = Field(0, description="The last N layers keep their "
                                                               "attention output through the checkpoint, so the "
                                                               "recompute skips attention (attention_cache.py); "
                                                               "all = every layer not offloaded. Costs one more "
                                                               "checkpoint-sized tensor per layer.")
    tiled_mlp: bool = Field(False, description="Run each MLP over sequence tiles with recompute (tiled_mlp.py).")
    tile_tokens: Optional[int] = Field(None, gt=0, description="Tokens per MLP tile (default: hidden size).")
    optimizer_offload: bool = Field(False, description="Keep the fp32 master weights, gradients and Adam state in "
                                    "pinned host memory (DeepSpeed offload_optimizer: cpu, DeepSpeedCPUAdam).")
    rope_scaling: Union[Literal["auto", "none", "yarn"], dict] = Field("auto", description="auto: YaRN when "
                                                                       "seq_len exceeds the model's trained length "
                                                                       "(rope.py); none; yarn; or explicit "
                                                                       "rope_parameters.")

    @field_validator("attn_backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend={v!r} is unknown; use one of {list(ATTN_BACKENDS)}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v in shipped_models():
            return v
        p = Path(v)
        if p.is_dir() and (p / "config.json").is_file():
            return v
        raise ValueError(f"model={v!r} is neither a shipped geometry {shipped_models()} nor a directory with a "
                         f"config.json; pass one of those names or a local HF checkpoint path")

    @model_validator(mode="after")
    def _seq_vs_sp(self) -> "RunConfig":
        if self.seq_len < self.sp_size:
            raise ValueError(f"seq_len={self.seq_len} is shorter than sp_size={self.sp_size}: each rank needs at "
                             f"least one token; raise seq_len or lower sp_size")
        if self.activation_offload and not self.activation_checkpointing:
            raise ValueError("activation_offload=true needs activation_checkpointing=true (it offloads the "
                             "checkpointed layer inputs); set activation_checkpointing: true")
        if isinstance(self.attention_cache_layers, int) and self.attention_cache_layers < 0:
            raise ValueError(f"attention_cache_layers={self.attention_cache_layers} must be >= 0 or 'all'")
        if self.attention_cache_layers and not self.activation_checkpointing:
            raise ValueError(f"attention_cache_layers={self.attention_cache_layers!r} keeps attention outputs "
                             f"through activation checkpointing; set activation_checkpointing: true or "
                             f"attention_cache_layers: 0")
        if isinstance(self.offload_layers, int) and self.offload_layers < 0:
            raise ValueError(f"offload_layers={self.offload_layers} must be >= 0, 'all' or 'auto'")
        if self.data_layout == "pack" and self.micro_batch != 1:
            raise ValueError(f"data_layout='pack' needs micro_batch=1 (packed rows go to a varlen kernel one row at a "
                             f"time), got micro_batch={self.micro_batch}; set micro_batch: 1 or data_layout: concat")
        if self.resume_tag is not None and not self.resume:
            raise ValueError(f"resume_tag={self.resume_tag!r} is set but resume is false; add --resume true or drop "
                             f"resume_tag")
        if self.seq_len % self.sp_size:
            lo = self.seq_len - self.seq_len % self.sp_size
            raise ValueError(f"seq_len={self.seq_len} is not divisible by sp_size={self.sp_size}; use seq_len="
                             f"{lo} or {lo + self.sp_size} (packed data of any length is padded per batch instead)")
        return self

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: Union[str, Path], **overrides) -> "RunConfig":
        """Read YAML (.yaml/.yml) or JSON; `overrides` win over the file."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            import yaml
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"config {path} must hold a mapping of keys, got {type(data).__name__}")
        return cls(**{**data, **overrides})

    @classmethod
    def from_cli(cls, argv: list[str]) -> "RunConfig":
        """`[--config FILE] [--key value ...]`; values are parsed as YAML scalars (`--lr 1e-4`, `--x true`); a
        boolean key given bare (`--resume`) means true."""
        import yaml
        config_path: Optional[str] = None
        overrides: dict = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--"):
                raise ValueError(f"unexpected argument {arg!r}; options are --key value (keys: {cls.keys()})")
            key, eq, val = arg[2:].partition("=")
            key = key.replace("-", "_")
            if not eq:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if cls._is_bool(key) and (nxt is None or nxt.startswith("--")):
                    val = "true"  # a bare flag: `--resume`
                elif nxt is None:
                    raise ValueError(f"option --{key} needs a value")
                else:
                    val, i = nxt, i + 1
            if key == "config":
                config_path = val
            else:
                if key not in cls.model_fields:
                    raise ValueError(f"unknown option --{key}; known keys: {cls.keys()}")
                overrides[key] = val if key in STRING_KEYS else yaml.safe_load(val)
            i += 1
        return cls.load(config_path, **overrides) if config_path else cls(**overrides)

    @classmethod
    def _is_bool(cls, key: str) -> bool:
        field = cls.model_fields.get(key)
        return field is not None and field.annotation is bool

    @classmethod
    def keys(cls) -> list[str]:
        return list(cls.model_fields)

    def dump(self, path: Union[str, Path]) -> None:
        """Write as YAML (.yaml) or JSON, loadable by `load`."""
        data = self.model_dump()
        if str(path).endswith((".yaml", ".yml")):
            import yaml
            Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
        else:
            Path(path).write_text(json.dumps(data, indent=2) + "\n")


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, without pydantic's URLs: what a user reads before anything runs."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {loc!r}; known keys: {RunConfig.keys()}"
        lines.append(f"{loc}: {msg}" if e["type"] != "extra_forbidden" else msg)
    return "invalid run config:\n  " + "\n  ".join(lines)
