"""The memory levers a plan is made of, and the one mapping between them and the run config.

lv = Levers.from_run_config(cfg, placement)      # what plan_memory reads
RunConfig(**lv.run_config_fields(), ...)         # what `ds-longctx plan` writes into run.yaml
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union, get_args

from ds_longctx.config.kernels import KernelsConfig
from ds_longctx.levers.lora import DEFAULT_TARGETS
from ds_longctx.levers.placement import PlacementPlan, check_cacheable, resolve_placement

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

# dpo: each completion's tokens where none is given (`plan --completion_len`, `rehearse
# --completion_len`), at most a quarter of the row (default_completion_len)
DEFAULT_COMPLETION_LEN = 4096


def default_completion_len(seq_len: int) -> int:
    """A dpo row's completion length where none is given: DEFAULT_COMPLETION_LEN, at most seq_len //
    4."""
    return min(DEFAULT_COMPLETION_LEN, seq_len // 4)


FUSED_OPS = get_args(KernelsConfig.model_fields["fused_ops"].annotation)  # the run config's choices


@dataclass(frozen=True)
class Levers:
    """The memory levers a run can pull (see `plan/search.choose` for how each is picked); defaults
    as the run config's. `from_run_config` / `run_config_fields` are the only mapping between the
    two.

    tile_tokens None means min(T, hidden): DeepSpeed/ArcticTraining TiledMLP's automatic ceil(T/H)
    shards. lora_rank > 0: LoRA adapters of that rank on `lora_targets` (levers/lora.py's rule), the
    base frozen. Where each layer's checkpoint lives is a placement plan (levers/placement.py):
    `placement` as given, or made
    from the counts (the first `offload_layers` offloaded, the last `attention_cache_layers`
    cached); the memory terms read that plan (`placement_for`).
    """

    chunked_loss: bool = True
    loss_chunk_rows: int = 4096
    tiled_mlp: bool = False
    tiled_layer: bool = (
        False  # the whole layer's token-wise work in tiles (levers/tiled_layer.py; the MLP's too)
    )
    tile_tokens: Optional[int] = None
    offload_layers: int = 0
    optimizer_offload: bool = False
    optimizer_offload_ratio: float = (
        1.0  # with optimizer_offload: the host's share (DeepSpeed partial offload)
    )
    offload_params: bool = (
        False  # the bf16 parameter partitions in host memory (DeepSpeed offload_param)
    )
    attention_cache_layers: int = 0
    placement: Optional[PlacementPlan] = None
    pinned_pool: bool = (
        False  # offloaded checkpoints in our exact-size pool (no power-of-two rounding)
    )
    lora_rank: int = 0
    lora_targets: Union[str, tuple] = DEFAULT_TARGETS
    fused_ops: str = (
        "auto"  # the run config's kernels.fused_ops; a plan is for a GPU, where auto is compile
    )
    attn_bwd_head_groups: int = (
        1  # the attention backward over this many KV-head groups (parallel/attention.py)
    )
    partial_offload: bool = (
        True  # the search may put a share of the optimizer on the host (False: the user fixed it)
    )
    nvme_optimizer: bool = False  # the offloaded optimizer's fp32 state on NVMe (ZeRO-Infinity)
    nvme_params: bool = False  # the offloaded bf16 parameters on NVMe (ZeRO-Infinity)
    objective: str = "sft"  # train.objective: its terms are plan/preference_terms.py's
    completion_len: int = 0  # dpo: tokens of each completion (chosen, rejected) of a row

    def __post_init__(self):
        if self.fused_ops not in FUSED_OPS:
            raise ValueError(
                f"Levers: fused_ops={self.fused_ops!r} is not one of {', '.join(FUSED_OPS)}"
            )
        if self.placement is not None and (self.offload_layers or self.attention_cache_layers):
            raise ValueError(
                f"Levers: give a placement ({self.placement.spec()}) or the counts offload_layers="
                f"{self.offload_layers} / attention_cache_layers={self.attention_cache_layers}, "
                "not both"
            )

    def placement_for(
        self, num_layers: int, attention_layers: Optional[tuple] = None
    ) -> PlacementPlan:
        """The per-layer plan these levers mean for a model of `num_layers` layers
        (`attention_layers`: which are full attention, where a cache can go; None: all)."""
        if self.placement is not None:
            if len(self.placement) != num_layers:
                raise ValueError(
                    f"placement {self.placement.spec()} has {len(self.placement)} entries, the "
                    f"model {num_layers} layers"
                )
            check_cacheable(self.placement, attention_layers)
            return self.placement
        return resolve_placement(
            self.offload_layers,
            self.attention_cache_layers,
            True,
            None,
            num_layers,
            cacheable=attention_layers,
        )

    @classmethod
    def from_run_config(cls, cfg: RunConfig, placement: Optional[PlacementPlan] = None) -> "Levers":
        """The levers of a run config (`ds_longctx.config.RunConfig`); its placement plan, once
        resolved for the model (run/placement_plan.run_placement), is passed in: counts stay 0 here,
        the plan says it all."""
        mem, targets = cfg.memory, cfg.lora.target_modules
        return cls(
            chunked_loss=mem.chunked_loss,
            loss_chunk_rows=mem.loss_chunk_rows,
            tiled_mlp=mem.tiled_mlp,
            tiled_layer=mem.tiled_layer,
            tile_tokens=mem.tile_tokens,
            optimizer_offload=cfg.optimizer.offload,
            optimizer_offload_ratio=cfg.optimizer.offload_ratio,
            placement=placement,
            offload_params=cfg.optimizer.offload_params,
            pinned_pool=mem.pinned_pool,
            nvme_optimizer=mem.nvme_optimizer,
            nvme_params=mem.nvme_params,
            fused_ops=cfg.kernels.fused_ops,
            attn_bwd_head_groups=mem.attn_bwd_head_groups,
            lora_rank=cfg.lora.rank,
            lora_targets=targets if isinstance(targets, str) else tuple(targets),
            objective=cfg.train.objective,
            completion_len=default_completion_len(cfg.train.seq_len)
            if cfg.train.objective == "dpo"
            else 0,
        )

    def run_config_fields(self) -> dict:
        """The run-config keys that carry these levers (`RunConfig(**fields, ...)`): counts when the
        plan is the counts' (first offloaded, last cached), else the explicit per-layer
        placement."""
        out = {
            "chunked_loss": self.chunked_loss,
            "loss_chunk_rows": self.loss_chunk_rows,
            "tiled_mlp": self.tiled_mlp,
            "tiled_layer": self.tiled_layer,
            "tile_tokens": self.tile_tokens,
            "optimizer_offload": self.optimizer_offload,
            "activation_checkpointing": True,
            "optimizer_offload_ratio": self.optimizer_offload_ratio
            if self.optimizer_offload
            else 1.0,
            "pinned_pool": self.pinned_pool,
            "torch_adam": not self.optimizer_offload,  # offloaded Adam is DeepSpeedCPUAdam
            "lora_rank": self.lora_rank,
            "lora_target_modules": self.lora_targets,
        }
        if self.fused_ops != "auto":
            out["fused_ops"] = self.fused_ops
        if self.offload_params:
            out["offload_params"] = True
        if self.attn_bwd_head_groups != 1:
            out["attn_bwd_head_groups"] = self.attn_bwd_head_groups
        for key in ("nvme_optimizer", "nvme_params"):
            if getattr(self, key):
                out[key] = True
        if self.objective != "sft":
            out["objective"] = self.objective
        if self.placement is not None:
            out["placement"] = self.placement.spec()
        else:
            out.update(
                offload_layers=self.offload_layers,
                attention_cache_layers=self.attention_cache_layers,
            )
        return out
