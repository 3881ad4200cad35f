"""The levers applied to a partitioned model in one order (`apply_levers`): steps 4-8 of `run/engine.py`.

`build_engine` and the HF Trainer integration (`integrations/hf_trainer.py`, where the Trainer runs
`deepspeed.initialize`) both call `apply_levers`, the one home of this order:
 4. LoRA (`levers/lora.apply_lora`, when lora_rank > 0): adapters injected in place into the targeted Linears,
    the base frozen. After 3: it wraps the model's Linears, and the base stays as zero.Init partitioned it.
    Before 5-8: the tiled MLP (which sends an MLP with adapters down its per-tile path) and the checkpoint
    recompute must run the adapted Linears, the loss head must find the model's own trunk and lm_head (the
    model class is unchanged), and deepspeed.initialize must partition the new adapters and give the optimizer
    only them (`trainable_parameters`).
 5. the attention kernel, chosen once (`attention.select`), with its backward's head groups
    (`attention.set_head_groups`), then Ulysses attention (`ulysses.register`): swaps
    the attention function, before DeepSpeed wraps the model; a hybrid model's gated DeltaNet layers get their kernel
    (`gated_delta.select_linear`) and the same exchange around their conv1d and delta rule (`ulysses_linear.install`,
    reading the batch's document bounds from the attention function); then fused token-wise kernels if asked
    (`fused_ops.apply_fused_ops`: RMSNorm, SwiGLU, rotary), before 6 so a tiled MLP takes the MLP back and before 7
    so the recompute runs the fused code.
 6. tiled MLP (`tiled_mlp.apply_tiled_mlp`): the MLP over sequence tiles; before 7 so the checkpoint
    recompute runs the tiled code too. Or, with `tiled_layer`, the whole layer's token-wise work in tiles
    (`tiled_layer.apply_tiled_layer`: norms, projections, rotary, MLP; after 5, whose norm / rotary code the
    tiles call).
 7. the placement plan (`levers/placement.py`), computed once (`run/placement_plan.run_placement`: the config, or
    the planner for `auto`) and applied in one place: each decoder layer checkpointed on the GPU, offloaded
    through DeepSpeed's checkpoint, or with its attention output cached (after 5: the recompute replays the
    exchange; after 6: it replays the tiled MLP).
 8. loss head (`levers/loss_head.LossHead`): chunked lm_head + cross-entropy on the local slice,
    token-weighted over the SP group; the lm_head weight is a ZeRO-3 external parameter of the loss module
    (frozen under LoRA: the chunked loss then computes no weight gradient). Then the GPU budget
    (`levers/gpu_budget.py`): the allocator capped at `memory.gpu_budget_gb`, the host at most `run_ahead_layers`
    decoder layers ahead of the GPU; with `pinned_pool`, the pool's one allocation for the offloaded layers (7),
    made after `deepspeed.initialize`.
"""

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
from ds_longctx.run.moe_checks import router_aux_coef, untiled_warning
from ds_longctx.run.placement_plan import run_placement

log = logging.getLogger("ds_longctx")


@dataclass
class AppliedLevers:
    """What `apply_levers` put on a model: the Ulysses attention function, the placement read back from the layers,
    the loss head (model + chunked loss), the decoder layers (whose attention caches start each step) and a mixture of
    experts' lever."""

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
    """Step 5: the attention kernel (once, logged), then Ulysses attention and the fused token-wise kernels."""
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
    cfg: RunConfig, model: nn.Module, state: ParallelState, text
) -> Optional[MoeLever]:
    """Step 6. The tiled MLP patches each MLP's forward; under the checkpoint (7), the layer recompute calls the
    tiled forward too, so the four intermediate-width tensors never exist for the whole slice. A mixture of
    experts' sparse blocks: the router (its load-balancing loss over the SP group) and, tiled, router + experts
    per tile (levers/moe.py); its dense MLPs, if any, take the tiled MLP. The tiled layer: the norms,
    projections, rotary and MLP of every layer in tiles."""
    tile = cfg.memory.tile_tokens or text.hidden_size
    moe = apply_moe(model, router_aux_coef(cfg, text), tile if cfg.memory.tiled_mlp else None)
    if moe is not None and moe.untiled and state.rank == 0:
        log.warning(untiled_warning(cfg, moe.untiled, state.world_size))
    if cfg.memory.tiled_mlp and not cfg.memory.tiled_layer:
        apply_tiled_mlp(model, tile, required=moe is None)
    if cfg.memory.tiled_layer:
        apply_tiled_layer(model, cfg.memory.tile_tokens or text.hidden_size)
    return moe


def _plan_pinned_pool(
    cfg: RunConfig, model: nn.Module, state: ParallelState, text, placement: PlacementPlan
) -> None:
    """The pinned pool: the pool-offloaded checkpoints (memory.pinned_pool) and every offloaded attention cache, in
    host memory allocated and pinned once (reserve_pool, after deepspeed.initialize), not on a step's path."""
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


def apply_levers(
    cfg: RunConfig, model: nn.Module, state: ParallelState, ds_config: dict
) -> AppliedLevers:
    """Steps 4-8 of the module docstring on a model built by `run/model.build_partitioned_model` (partitioned by
    zero.Init), in that order; `ds_config` is the DeepSpeed JSON the model will be wrapped with (its
    activation_checkpointing block routes offloaded layers). Needs the process groups of `state`."""
    text = model.config.get_text_config()
    # 4. LoRA: adapters on the partitioned base, drawn per name; the base frozen
    apply_lora(model, cfg.lora, cfg.train.seed)
    # 5. the attention kernel, Ulysses attention, fused ops
    attn = _attention_levers(cfg, model, state, text)
    # 6. tiled MLP (a mixture of experts' blocks with it) or tiled layer
    moe = _tiled_levers(cfg, model, state, text)
    # 7. the placement plan: computed once, applied in one place (needs 6's final layer code and the DeepSpeed
    #    JSON's activation_checkpointing block for offloaded layers)
    gpu_gb = gpu_budget.planning_gpu_gb(cfg.memory.gpu_budget_gb)
    plan = run_placement(cfg, text.num_hidden_layers, state.world_size, gpu_gb)
    placement = apply_placement(model, plan, ds_config, pinned_pool=cfg.memory.pinned_pool)
    _plan_pinned_pool(cfg, model, state, text, placement)
    # 8. loss head: chunked lm_head + CE on the local slice
    head = LossHead(
        model, state, cfg.memory.chunked_loss, cfg.memory.loss_chunk_rows, moe and moe.aux
    )
    # the GPU budget the plan was made for (both entry points: this engine and the HF Trainer's)
    gpu_budget.apply(cfg.memory.gpu_budget_gb, state.rank)
    layers = decoder_layers(model)
    gpu_budget.bound_run_ahead(layers, cfg.memory.run_ahead_layers)
    return AppliedLevers(attn, placement, head, layers, moe)
