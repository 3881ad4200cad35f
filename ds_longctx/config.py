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

SHIPPED_MODELS_DIR = Path(__file__).parent / "models"
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
    data: str = Field("synthetic", description="`synthetic` (key-value retrieval with long-range structure) or a "
                      "path to token data.")
    attn_backend: str = Field("auto", description="Attention kernel: auto (flash-attn if installed and not on "
                              "Hopper, else SDPA with cuDNN on Hopper, flash elsewhere), sdpa (SDPA, kernel picked "
                              "as auto), sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math, flash_attn.")
    dtype: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 on GPU, fp32 on CPU.")
    torch_adam: bool = Field(True, description="Use torch's AdamW inside DeepSpeed (no JIT build); False uses "
                             "DeepSpeed's fused Adam (GPU) / CPU Adam (optimizer offload), built on first use.")
    log_every: int = Field(1, ge=1, description="Progress-bar refresh interval in steps.")

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
        if isinstance(self.offload_layers, int) and self.offload_layers < 0:
            raise ValueError(f"offload_layers={self.offload_layers} must be >= 0, 'all' or 'auto'")
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
        """`[--config FILE] [--key value ...]`; values are parsed as YAML scalars (`--lr 1e-4`, `--x true`)."""
        import yaml
        config_path: Optional[str] = None
        overrides: dict = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--"):
                raise ValueError(f"unexpected argument {arg!r}; options are --key value (keys: {cls.keys()})")
            key, eq, val = arg[2:].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"option --{key} needs a value")
                val = argv[i + 1]
                i += 1
            key = key.replace("-", "_")
            if key == "config":
                config_path = val
            else:
                if key not in cls.model_fields:
                    raise ValueError(f"unknown option --{key}; known keys: {cls.keys()}")
                overrides[key] = val if key in ("model", "output_dir", "data") else yaml.safe_load(val)
            i += 1
        return cls.load(config_path, **overrides) if config_path else cls(**overrides)

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
