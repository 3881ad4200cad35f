"""The levers applied to a partitioned model in one order (`apply_levers`, steps 4-8 of
`run/engine.py`), for `build_engine` and the HF Trainer alike. Why this order:
docs/design/run.md."""

from __future__ import annotations

# deepspeed is not imported here: importing this module does not load it.
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ds_longctx.config import RunConfig
from ds_longctx.levers import gpu_budget
from ds_longctx.levers.fused_ops import apply_fused_ops, resolve_fused_ops
from ds_longctx.levers.lora import apply_lora
from ds_longctx.levers.loss_head import LossHead
from ds_longctx.levers.moe import MoeLever, apply_moe
from ds_longctx.levers.offload import cache_region_bytes, plan_pool
from ds_longctx.levers.placement import ON_HOST, Place, PlacementPlan
from ds_longctx.levers.placement_apply import apply_placement, decoder_layers
from ds_longctx.levers.tiled_layer import apply_tiled_layer
from ds_longctx.levers.tiled_mlp import apply_tiled_mlp
from ds_longctx.parallel import attention, gated_delta, kernel_rules, ulysses, ulysses_linear
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.plan.shape import RunShape
from ds_longctx.run.moe_checks import router_aux_coef, untiled_warning
from ds_longctx.run.placement_plan import planned_for_gpu, run_placement

log = logging.getLogger("ds_longctx")


@dataclass
class AppliedLevers:
    """What `apply_levers` put on a model: the attention function, the placement read back, the loss
    head, the decoder layers and the MoE lever."""

    attn: ulysses.UlyssesAttention
    placement: PlacementPlan
    head: LossHead
    layers: list
    moe: Optional[MoeLever] = (
        None  # a mixture of experts' sparse blocks and their load balance (levers/moe.py)
    )


def _attention_levers(
    cfg: RunConfig, model: nn.Module, state: ParallelState, text
) -> ulysses.UlyssesAttention:
    """Step 5: the attention kernel, Ulysses attention, fused token-wise kernels."""
    attention.select(
        cfg.kernels.attn_backend, announce=state.rank == 0, head_dim=attention.model_head_dim(text)
    )
    attention.set_head_groups(cfg.memory.attn_bwd_head_groups)
    attn = ulysses.register(model, state)
    if (
        kernel_rules.linear_heads(text) is not None
    ):  # a hybrid model: Ulysses around its gated DeltaNet layers too
        gated_delta.select_linear(cfg.kernels.linear_attn_backend, announce=state.rank == 0)
        ulysses_linear.install(model, state, attn)
    fused, why = resolve_fused_ops(cfg.kernels.fused_ops, torch.cuda.is_available())
    if state.rank == 0:
        log.info("fused ops: %s (%s)", fused, why)
    if fused != "none":
        apply_fused_ops(model, fused)
    return attn


def _tiled_levers(
    cfg: RunConfig, model: nn.Module, state: ParallelState, text, shape: RunShape | None
) -> Optional[MoeLever]:
    """Step 6: tiled MLP or tiled layer."""
    tile = cfg.memory.tile_tokens or text.hidden_size
    moe = apply_moe(model, router_aux_coef(cfg, text), tile if cfg.memory.tiled_mlp else None)
    if moe is not None and moe.untiled and state.rank == 0:
        log.warning(untiled_warning(cfg, moe.untiled, state.world_size, shape))
    if cfg.memory.tiled_mlp and not cfg.memory.tiled_layer:
        apply_tiled_mlp(model, tile, required=moe is None)
    if cfg.memory.tiled_layer:
        apply_tiled_layer(model, cfg.memory.tile_tokens or text.hidden_size)
    return moe


def _plan_pinned_pool(
    cfg: RunConfig, model: nn.Module, state: ParallelState, text, placement: PlacementPlan
) -> None:
    """The pinned pool of the pool-offloaded checkpoints and attention caches, allocated once after
    deepspeed.initialize."""
    dtype, local = model.get_input_embeddings().weight.dtype, -(-cfg.train.seq_len // state.sp_size)
    pooled = (
        [i for i, place in enumerate(placement.layers) if place in ON_HOST]
        if cfg.memory.pinned_pool
        else []
    )
    region = cache_region_bytes(
        cfg.train.micro_batch,
        local * state.sp_size,
        text.num_attention_heads // state.sp_size,
        attention.model_head_dim(text),
        torch.empty((), dtype=dtype).element_size(),
    )
    caches = {i: region for i, place in enumerate(placement.layers) if place == Place.CACHE_OFFLOAD}
    if pooled or caches:
        plan_pool(
            pooled,
            cfg.train.micro_batch,
            local,
            text.hidden_size,
            dtype,
            pin=torch.cuda.is_available(),
            cache_regions=caches,
        )


def engine_placement(
    cfg: RunConfig, num_layers: int, world_size: int, shape: RunShape | None
) -> PlacementPlan:
    """Step 7's plan: the shape's, planned for gpu_budget_gb, unless `offload_layers: auto` asks
    this GPU's memory (no budget); None: planned here."""
    gpu_gb = gpu_budget.planning_gpu_gb(cfg.memory.gpu_budget_gb)
    if shape is not None and (gpu_gb == cfg.memory.gpu_budget_gb or not planned_for_gpu(cfg)):
        return shape.placement
    geom = None if shape is None else shape.geometry
    return run_placement(cfg, num_layers, world_size, gpu_gb, geom)


def apply_levers(
    cfg: RunConfig,
    model: nn.Module,
    state: ParallelState,
    ds_config: dict,
    shape: RunShape | None = None,
) -> AppliedLevers:
    """Steps 4-8 on a model from `run/model.build_partitioned_model`; `ds_config` is the JSON it
    will be wrapped with. Needs `state`'s process groups. `shape`: the run's (its placement is used
    unless `offload_layers: auto` is planned for this GPU); None: planned here."""
    text = model.config.get_text_config()
    apply_lora(model, cfg.lora, cfg.train.seed)  # 4
    attn = _attention_levers(cfg, model, state, text)  # 5
    moe = _tiled_levers(cfg, model, state, text, shape)  # 6
    # 7. needs 6's final layer code and the DeepSpeed JSON's activation_checkpointing block
    plan = engine_placement(cfg, text.num_hidden_layers, state.world_size, shape)
    placement = apply_placement(
        model, plan, ds_config, pinned_pool=cfg.memory.pinned_pool, nvme_path=cfg.memory.nvme_path
    )
    _plan_pinned_pool(cfg, model, state, text, placement)
    head = LossHead(
        model, state, cfg.memory.chunked_loss, cfg.memory.loss_chunk_rows, moe and moe.aux
    )
    # the GPU budget the plan was made for (both entry points: this engine and the HF Trainer's)
    gpu_budget.apply(cfg.memory.gpu_budget_gb, state.rank)
    layers = decoder_layers(model)
    gpu_budget.bound_run_ahead(layers, cfg.memory.run_ahead_layers)
    return AppliedLevers(attn, placement, head, layers, moe)
