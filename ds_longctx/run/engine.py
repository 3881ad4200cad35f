"""Apply the levers in one order around the model and wrap `deepspeed.initialize` (ZeRO-3).

Order (each step says why it comes where it does):
 1. checks (`run/preflight.validate`): sp_size against world size and heads, attention backend, model class,
    the placement plan: all before anything is allocated, so bad input fails in seconds naming the fix.
 2. process groups (`ParallelState.build`): zero.Init and the Ulysses exchange need them.
 3. the model (`run/model.build_partitioned_model`): YaRN on the config from the target seq_len, built under
    `deepspeed.zero.Init`, weights drawn per parameter name.
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
    made after 9.
 9. `deepspeed.initialize(model, config)` with the trainable parameters: ZeRO-3 over all W ranks, gradients
    averaged over W (the loss head's sp factor makes that the mean over the dp = W / sp replicas). Then the
    optimizer's state (`run/optimizer_state.py`, `optimizer.state_at_build`), before the pool: DeepSpeed leaves the
    Adam moments to step 1's optimizer step, and step 1 should hold what every step holds (`ds-longctx train` makes
    it itself, after a resume could bring it).

Steps 4-8 are `apply_levers`, the one home of this order: `build_engine` and the HF Trainer integration
(`integrations/hf_trainer.py`, where the Trainer does step 9) both call it; `sharded_loss` is the step both run
on a full batch (slice, document boundaries, attention-cache step, loss head).
"""

from __future__ import annotations

# deepspeed is imported where the engine is built: importing this module (apply_levers, sharded_loss) does not load it.
import logging
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR
from torch.profiler import record_function

from ds_longctx.config import RunConfig
from ds_longctx.levers import attention_cache, gpu_budget
from ds_longctx.levers.fused_ops import apply_fused_ops, resolve_fused_ops
from ds_longctx.levers.lora import apply_lora, trainable_parameters
from ds_longctx.levers.loss_head import LossHead
from ds_longctx.levers.moe import MoeLever, apply_moe
from ds_longctx.levers.offload import cache_region_bytes, plan_pool, reserve_pool
from ds_longctx.levers.placement import ON_HOST, Place, PlacementPlan, apply_placement, decoder_layers
from ds_longctx.levers.tiled_layer import apply_tiled_layer
from ds_longctx.levers.tiled_mlp import apply_tiled_mlp
from ds_longctx.parallel import attention, gated_delta, kernel_rules, ulysses, ulysses_linear
from ds_longctx.parallel.parallel_state import ParallelState, init_distributed
from ds_longctx.parallel.sharding import shard_batch, trained_counts
from ds_longctx.parallel.shared_prefix import shared_layout
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.plan.lr_schedule import lr_factor
from ds_longctx.run.model import build_partitioned_model
from ds_longctx.run.moe_checks import router_aux_coef, untiled_warning
from ds_longctx.run.optimizer_state import at_start as make_optimizer_state
from ds_longctx.run.placement_plan import run_placement
from ds_longctx.run.preference_step import pair_forward_backward
from ds_longctx.run.preflight import validate

log = logging.getLogger("ds_longctx")


def _build_stage(stage: str, t0: float, rank: int) -> None:
    """One progress line per build stage on rank 0: seconds since the build began, host RSS now and at its
    peak so far (ru_maxrss: the planner's host model is checked against these), GPU memory allocated."""
    if rank != 0:
        return

    rss, peak = psutil.Process().memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gpu = f", GPU allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB" if torch.cuda.is_available() else ""
    log.info("build %s: %.1f s, host RSS %.2f GiB (peak %.2f GiB)%s", stage, time.perf_counter() - t0,
             rss / 2**30, peak / 2**30, gpu)


@dataclass
class StepResult:
    loss: float      # the step's loss (train.loss_average) over every micro-batch and replica
    tokens: int      # trained tokens of the step over every micro-batch and replica
    extra: dict = field(default_factory=dict)   # more of the step's metrics (objective dpo: its rewards)


@dataclass
class AppliedLevers:
    """What `apply_levers` put on a model: the Ulysses attention function, the placement read back from the layers,
    the loss head (model + chunked loss), the decoder layers (whose attention caches start each step) and a mixture of
    experts' lever."""
    attn: ulysses.UlyssesAttention
    placement: PlacementPlan
    head: LossHead
    layers: list
    moe: Optional[MoeLever] = None  # a mixture of experts' sparse blocks and their load balance (levers/moe.py)


def step_weights(batches: list, state: ParallelState, average: str,
                 device: Optional[torch.device] = None) -> tuple[list, int]:
    """(per micro-batch, the weight of each of its rows; the step's trained tokens over every replica). The loss to
    backprop is sum over rows of weight x the row's CE sum on this rank's slice; DeepSpeed averages gradients over
    the W = sp x dp ranks, so weight = W / N makes the step's gradient that of (CE summed over every trained token
    of the step) / N: N the step's trained tokens (`average` tokens), or N = the row's trained tokens x the step's
    rows that train any (sequences). A row or a whole step without trained tokens weighs 0. Collective over dp, on
    `device` (the engine's: nccl reduces CUDA tensors only; default the batches' own)."""
    counts = [trained_counts(b.input_ids, b.labels, b.position_ids).double() for b in batches]  # [b] each
    sums = torch.stack([torch.cat(counts).sum(), (torch.cat(counts) > 0).sum().double()])  # tokens, rows
    sums = sums if device is None else sums.to(device)
    if state.dp_group is not None:
        dist.all_reduce(sums, group=state.dp_group)
    tokens, rows = float(sums[0]), float(sums[1])
    w = state.world_size
    if average == "tokens":
        weights = [[w / max(tokens, 1.0)] * len(c) for c in counts]
    else:
        weights = [[w / (float(n) * rows) if n > 0 else 0.0 for n in c] for c in counts]
    return weights, int(tokens)


def sharded_loss(run, levers: AppliedLevers, state: ParallelState, device: torch.device, input_ids: torch.Tensor,
                 position_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                 row_weights: Optional[list] = None, micro_batches: int = 1, seq: Optional[torch.Tensor] = None,
                 n_seq: int = 0, branch: Optional[torch.Tensor] = None):
    """`run(input_ids, position_ids, shift_labels)` on this rank's slice of one full batch `[b, L]` of its dp replica
    (every SP rank passes the same batch): returns what the loss head returns (loss to backprop, group token-mean
    loss, group tokens). Sets the documents' cu_seqlens on the Ulysses attention, starts the attention caches' step
    and a mixture of experts' load balance (its counted rows: not the SP padding; its weight: one of the step's
    `micro_batches`) first; fails if the model's attention did not go through Ulysses."""
    shard = shard_batch(input_ids, state.sp_size, state.sp_rank, labels=labels, position_ids=position_ids)
    attn = levers.attn
    attn.cu_seqlens, attn.max_seqlen = shard.cu_seqlens, shard.max_seqlen
    attn.shared = None if branch is None else shared_layout(position_ids[0], branch[0], shard.pad)
    attention_cache.new_step(levers.layers)
    if levers.moe is not None:
        b, n = shard.input_ids.shape
        valid = (torch.arange(n) + state.sp_rank * n < input_ids.shape[1]).expand(b, n) if shard.pad else None
        levers.moe.aux.begin(None if valid is None else valid.to(device), state.sp_size / micro_batches)
    calls_before = attn.calls
    extra = {} if row_weights is None else {"row_weights": row_weights}
    if seq is not None:  # preference rows: each trained token's sequence id, sharded and shifted as the labels are
        seq = shard_batch(input_ids, state.sp_size, state.sp_rank, labels=seq, position_ids=position_ids).shift_labels
        extra = {"seq": seq.to(device), "n_seq": n_seq}
    with record_function("ds_longctx.forward"):
        out = run(shard.input_ids.to(device), shard.position_ids.to(device), shard.shift_labels.to(device), **extra)
    if attn.calls == calls_before:
        model = levers.head.model
        raise RuntimeError(f"{type(model).__name__} did not call the Ulysses attention function: its "
                           f"attention is not routed through transformers' AttentionInterface")
    return out


@dataclass
class SliceLosses:
    """Per-token losses of this rank's slice of a batch (`eval_batch`): token i of the slice is index start + i of
    its row; loss i is the CE of predicting that index's label (the next token), 0.0 where `valid` is False."""
    loss: torch.Tensor    # [b, L/sp] fp32
    valid: torch.Tensor   # [b, L/sp] bool: a supervised token (not padding, not an ignored label)
    hit: torch.Tensor     # [b, L/sp] bool: the label's logit is the max (greedy decoding emits it), False where invalid
    start: int            # index in the row of this slice's first token
    length: int           # tokens per row before padding (L)


class LongCtxEngine:
    """A DeepSpeed ZeRO-3 engine with Ulysses SP around a HF causal LM. Build with `build_engine(cfg)`."""

    def __init__(self, cfg: RunConfig, ds_engine, levers: AppliedLevers, state: ParallelState, ds_config: dict,
                 device: torch.device):
        self.cfg, self.ds, self.levers, self.state = cfg, ds_engine, levers, state
        self.module, self.attn, self.placement, self.layers = levers.head, levers.attn, levers.placement, levers.layers
        self.ds_config, self.device = ds_config, device
        self.sample_offset = 0  # where step 0 starts in the sample stream (checkpoint/layout.py; a resume sets it)

    @property
    def model(self) -> nn.Module:
        return self.module.model

    def forward_backward(self, batches: list) -> StepResult:
        """Loss and gradients of one optimizer step of this dp replica: its grad_accum micro-batches (`Batch`es of
        `[b, L]`, the same on every SP rank), each backpropagated with the row weights of `step_weights`;
        DeepSpeed's step after each but the last (the caller makes that one, `step`)."""
        st = self.state
        if self.cfg.train.objective == "dpo":
            return StepResult(*pair_forward_backward(self, batches, self.pair_logps))
        weights, n_step = step_weights(batches, st, self.cfg.train.loss_average, self.device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for k, (batch, w) in enumerate(zip(batches, weights)):
            loss, _, _ = sharded_loss(self.ds, self.levers, st, self.device, batch.input_ids, batch.position_ids,
                                      batch.labels, row_weights=w, micro_batches=len(batches))
            with record_function("ds_longctx.backward"):
                self.ds.backward(loss, scale_wrt_gas=False)  # the weights already sum the micro-batches
            total += loss.detach().double()
            if k < len(batches) - 1:
                self.step()  # a micro-step: DeepSpeed accumulates, the optimizer waits for the boundary
        if dist.is_initialized() and st.world_size > 1:
            dist.all_reduce(total)  # every rank's share of the step's loss
        return StepResult(loss=float(total) / st.world_size, tokens=n_step)

    def pair_logps(self, batch) -> tuple:
        """(log-probs [2P] of a preference batch's sequences over the SP group, their trained tokens [2P]) through
        the DeepSpeed engine: the policy's, differentiable (under no_grad: the reference pass)."""
        return sharded_loss(self.ds, self.levers, self.state, self.device, batch.input_ids, batch.position_ids,
                            batch.labels, seq=batch.seq, n_seq=2 * len(batch.pairs), branch=batch.branch)

    def eval_batch(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                   labels: Optional[torch.Tensor] = None) -> SliceLosses:
        """Per-token losses of this rank's slice of one full batch `[b, L]` (every SP rank passes the same),
        forward only: under no_grad (no activation kept, no checkpoint, no recompute; the loss is the forward-only
        chunked per-token CE) and in eval mode for the call, train mode restored after.

        What eval mode changes here, and why it is wanted: transformers skips the decoder layers' checkpoint
        functions (torch's or DeepSpeed's offloading one: nothing to recompute without a backward), and the
        attention-cache slots stay idle (they act only while training), so no layer keeps anything. It changes
        no number: the model has no dropout (the Ulysses function refuses attention dropout) and our attention
        and sharding ignore the mode (unlike accelerate's SP, which turns itself off in eval mode). The module
        is called directly rather than through the DeepSpeed engine, whose forward only adds backward hooks;
        ZeRO-3's parameter gathering lives in hooks on the module itself and runs under no_grad too (its
        prefetch trace resets at every top-level forward; an eval forward is a prefix of the training one).
        """
        st = self.state
        shard = shard_batch(input_ids, st.sp_size, st.sp_rank, labels=labels, position_ids=position_ids)
        self.attn.cu_seqlens, self.attn.max_seqlen, self.attn.shared = shard.cu_seqlens, shard.max_seqlen, None
        was_training = self.module.training
        self.ds.eval()
        try:
            with torch.no_grad(), record_function("ds_longctx.eval"):
                loss, hit = self.module(shard.input_ids.to(self.device), shard.position_ids.to(self.device),
                                        shard.shift_labels.to(self.device), per_token=True)  # [b, L/sp] x 2
        finally:
            self.ds.train(was_training)
        n = shard.input_ids.shape[1]
        return SliceLosses(loss=loss, valid=shard.shift_labels.to(self.device) != IGNORE_INDEX, hit=hit,
                           start=st.sp_rank * n, length=input_ids.shape[1])

    def step(self) -> None:
        with record_function("ds_longctx.optimizer"):
            self.ds.step()

    def train_step(self, batches: list) -> StepResult:
        res = self.forward_backward(batches)
        self.step()
        return res

    def grad_norm(self) -> Optional[float]:
        """The gradient norm of the last optimizer step, before clipping (None where DeepSpeed has none)."""
        norm = self.ds.get_global_grad_norm()
        return None if norm is None else float(norm)


def build_engine(cfg: RunConfig, hf_config=None, optimizer_state: bool = True) -> LongCtxEngine:
    """Steps 1-9 of the module docstring. Call under torchrun / deepspeed (or plain python for 1 rank).
    `optimizer_state=False` leaves the optimizer's state to the caller (`run/train_loop.py` makes it after a resume,
    whose checkpoint brings it: made here first, it would exist twice while the checkpoint's loads)."""
    import deepspeed


    t0 = time.perf_counter()
    # 1. checks (world size from the launcher's environment, before any process group exists)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    hf_cfg = validate(cfg, world) if hf_config is None else hf_config
    text = hf_cfg.get_text_config()
    # 2. process groups
    init_distributed()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    state = ParallelState.build(cfg.parallel.sp_size, text.num_attention_heads, text.num_key_value_heads,
                                kernel_rules.linear_heads(text))
    _build_stage("2/9 process groups", t0, state.rank)
    ds_config = build_ds_config(cfg, state.world_size, on_gpu)
    # 3. the model, partitioned at birth, then deterministic weights
    model = build_partitioned_model(cfg, hf_cfg, ds_config,
                                    stage=lambda name: _build_stage(f"3/9 {name}", t0, state.rank))
    # 4-8. LoRA, attention kernel + Ulysses (+ fused ops), tiled MLP, placement plan, loss head
    levers = apply_levers(cfg, model, state, ds_config)
    _build_stage("8/9 levers and loss head", t0, state.rank)
    # 9. DeepSpeed: the optimizer gets the trainable parameters only (the adapters under LoRA)
    schedule = lr_factor(cfg.optimizer, cfg.train.steps)
    ds_engine, *_ = deepspeed.initialize(model=levers.head, model_parameters=trainable_parameters(levers.head),
                                         config=ds_config, lr_scheduler=lambda opt: LambdaLR(opt, schedule))
    _build_stage("9/9 deepspeed.initialize", t0, state.rank)
    if optimizer_state and make_optimizer_state(cfg, ds_engine.optimizer, state.rank):  # not in step 1's step
        _build_stage("optimizer state", t0, state.rank)
    if reserve_pool():  # after DeepSpeed's host-side build buffers are gone (the planner's build phase)
        _build_stage("pinned pool", t0, state.rank)
    return LongCtxEngine(cfg, ds_engine, levers, state, ds_config, device)


def apply_levers(cfg: RunConfig, model: nn.Module, state: ParallelState, ds_config: dict) -> AppliedLevers:
    """Steps 4-8 of the module docstring on a model built by `run/model.build_partitioned_model` (partitioned by
    zero.Init), in that order; `ds_config` is the DeepSpeed JSON the model will be wrapped with (its
    activation_checkpointing block routes offloaded layers). Needs the process groups of `state`."""
    text = model.config.get_text_config()
    # 4. LoRA: adapters on the partitioned base, drawn per name; the base frozen
    apply_lora(model, cfg.lora, cfg.train.seed)
    # 5. the attention kernel (once, logged), then Ulysses attention and the fused token-wise kernels
    attention.select(cfg.kernels.attn_backend, announce=state.rank == 0, head_dim=attention.model_head_dim(text))
    attention.set_head_groups(cfg.memory.attn_bwd_head_groups)
    attn = ulysses.register(model, state)
    if kernel_rules.linear_heads(text) is not None:  # a hybrid model: Ulysses around its gated DeltaNet layers too
        gated_delta.select_linear(cfg.kernels.linear_attn_backend, announce=state.rank == 0)
        ulysses_linear.install(model, state, attn)
    fused, why = resolve_fused_ops(cfg.kernels.fused_ops, torch.cuda.is_available())
    if state.rank == 0:
        log.info("fused ops: %s (%s)", fused, why)
    if fused != "none":
        apply_fused_ops(model, fused)
    # 6. tiled MLP: patches each MLP's forward; under the checkpoint below, the layer recompute calls the
    #    tiled forward too, so the four intermediate-width tensors never exist for the whole slice. A mixture of
    #    experts' sparse blocks: the router (its load-balancing loss over the SP group) and, tiled, router + experts
    #    per tile (levers/moe.py); its dense MLPs, if any, take the tiled MLP
    tile = cfg.memory.tile_tokens or text.hidden_size
    moe = apply_moe(model, router_aux_coef(cfg, text), tile if cfg.memory.tiled_mlp else None)
    if moe is not None and moe.untiled and state.rank == 0:
        log.warning(untiled_warning(cfg, moe.untiled, state.world_size))
    if cfg.memory.tiled_mlp and not cfg.memory.tiled_layer:
        apply_tiled_mlp(model, tile, required=moe is None)
    # 6b. tiled layer: the norms, projections, rotary and MLP of every layer in tiles (the MLP's with them)
    if cfg.memory.tiled_layer:
        apply_tiled_layer(model, cfg.memory.tile_tokens or text.hidden_size)
    # 7. the placement plan: computed once, applied in one place (needs 6's final layer code and the DeepSpeed
    #    JSON's activation_checkpointing block for offloaded layers)
    gpu_gb = gpu_budget.planning_gpu_gb(cfg.memory.gpu_budget_gb)
    plan = run_placement(cfg, text.num_hidden_layers, state.world_size, gpu_gb)
    placement = apply_placement(model, plan, ds_config, pinned_pool=cfg.memory.pinned_pool)
    # the pinned pool: the pool-offloaded checkpoints (memory.pinned_pool) and every offloaded attention cache, in host
    # memory allocated and pinned once (reserve_pool, after deepspeed.initialize), not on a step's path
    dtype, local = model.get_input_embeddings().weight.dtype, -(-cfg.train.seq_len // state.sp_size)
    pooled = [i for i, place in enumerate(placement.layers) if place in ON_HOST] if cfg.memory.pinned_pool else []
    region = cache_region_bytes(cfg.train.micro_batch, local * state.sp_size, text.num_attention_heads // state.sp_size,
                                attention.model_head_dim(text), torch.empty((), dtype=dtype).element_size())
    caches = {i: region for i, place in enumerate(placement.layers) if place == Place.CACHE_OFFLOAD}
    if pooled or caches:
        plan_pool(pooled, cfg.train.micro_batch, local, text.hidden_size, dtype, pin=torch.cuda.is_available(),
                  cache_regions=caches)
    # 8. loss head: chunked lm_head + CE on the local slice
    head = LossHead(model, state, cfg.memory.chunked_loss, cfg.memory.loss_chunk_rows, moe and moe.aux)
    # the GPU budget the plan was made for (both entry points: this engine and the HF Trainer's)
    gpu_budget.apply(cfg.memory.gpu_budget_gb, state.rank)
    layers = decoder_layers(model)
    gpu_budget.bound_run_ahead(layers, cfg.memory.run_ahead_layers)
    return AppliedLevers(attn, placement, head, layers, moe)
