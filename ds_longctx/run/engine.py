"""Build the engine (`build_engine`): checks, process groups, the model under zero.Init, the levers
(`run/lever_order.py`), `deepspeed.initialize` (ZeRO-3), the optimizer's state. A step runs
`run/batch_loss.py`. Why this order: docs/design/run.md."""

from __future__ import annotations

# deepspeed is imported where the engine is built: importing this module does not load it.
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
from ds_longctx.levers.disk_tier import private_swap_dirs
from ds_longctx.levers.lora import trainable_parameters
from ds_longctx.levers.offload import reserve_pool
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import ParallelState, init_distributed
from ds_longctx.parallel.sharding import shard_batch
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.plan.lr_schedule import lr_factor
from ds_longctx.plan.shape import RunShape
from ds_longctx.run.batch_loss import sharded_loss, step_weights
from ds_longctx.run.lever_order import AppliedLevers, apply_levers
from ds_longctx.run.model import build_partitioned_model
from ds_longctx.run.optimizer_state import at_start as make_optimizer_state
from ds_longctx.run.preference_step import pair_forward_backward, policy_forward_backward
from ds_longctx.run.preflight import validate

log = logging.getLogger("ds_longctx")


def _build_stage(stage: str, t0: float, rank: int) -> None:
    """One progress line per build stage on rank 0: seconds, host RSS now and at peak, GPU memory
    allocated."""
    if rank != 0:
        return

    rss, peak = (
        psutil.Process().memory_info().rss,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )
    gpu = (
        f", GPU allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB"
        if torch.cuda.is_available()
        else ""
    )
    log.info(
        "build %s: %.1f s, host RSS %.2f GiB (peak %.2f GiB)%s",
        stage,
        time.perf_counter() - t0,
        rss / 2**30,
        peak / 2**30,
        gpu,
    )


@dataclass
class StepResult:
    loss: float  # the step's loss (train.loss_average) over every micro-batch and replica
    tokens: int  # trained tokens of the step over every micro-batch and replica
    extra: dict = field(
        default_factory=dict
    )  # more of the step's metrics (objective dpo: its rewards)


@dataclass
class SliceLosses:
    """Per-token losses of this rank's slice of a batch: token i is index start + i of its row, 0.0
    where `valid` is False."""

    loss: torch.Tensor  # [b, L/sp] fp32
    valid: torch.Tensor  # [b, L/sp] bool: a supervised token (not padding, not an ignored label)
    # [b, L/sp] bool: the label's logit is the max (greedy decoding emits it), False where invalid
    hit: torch.Tensor
    start: int  # index in the row of this slice's first token
    length: int  # tokens per row before padding (L)


class LongCtxEngine:
    """A DeepSpeed ZeRO-3 engine with Ulysses SP around a HF causal LM (`build_engine`)."""

    def __init__(
        self,
        cfg: RunConfig,
        ds_engine,
        levers: AppliedLevers,
        state: ParallelState,
        ds_config: dict,
        device: torch.device,
    ):
        self.cfg, self.ds, self.levers, self.state = cfg, ds_engine, levers, state
        self.module, self.attn, self.placement, self.layers = (
            levers.head,
            levers.attn,
            levers.placement,
            levers.layers,
        )
        self.ds_config, self.device = ds_config, device
        self.sample_offset = (
            0  # where step 0 starts in the sample stream (checkpoint/layout.py; a resume sets it)
        )

    @property
    def model(self) -> nn.Module:
        return self.module.model

    def forward_backward(self, batches: list) -> StepResult:
        """Loss and gradients of one optimizer step of this dp replica: its grad_accum micro-batches
        `[b, L]`, weighed by `step_weights`; DeepSpeed's step after each but the last."""
        st = self.state
        if self.cfg.train.objective == "dpo":
            return StepResult(*pair_forward_backward(self, batches, self.pair_logps))
        if self.cfg.train.objective == "grpo":
            return StepResult(*policy_forward_backward(self, batches, self.pair_logps))
        weights, n_step = step_weights(batches, st, self.cfg.train.loss_average, self.device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for k, (batch, w) in enumerate(zip(batches, weights)):
            loss, _, _ = sharded_loss(
                self.ds,
                self.levers,
                st,
                self.device,
                batch.input_ids,
                batch.position_ids,
                batch.labels,
                row_weights=w,
                micro_batches=len(batches),
            )
            with record_function("ds_longctx.backward"):
                self.ds.backward(
                    loss, scale_wrt_gas=False
                )  # the weights already sum the micro-batches
            total += loss.detach().double()
            if k < len(batches) - 1:
                # a micro-step: DeepSpeed accumulates, the optimizer waits for the boundary
                self.step()
        if dist.is_initialized() and st.world_size > 1:
            dist.all_reduce(total)  # every rank's share of the step's loss
        return StepResult(loss=float(total) / st.world_size, tokens=n_step)

    def pair_logps(self, batch) -> tuple:
        """(sequence or token log-probs over the SP group, their trained tokens) of a preference or
        rollout batch; differentiable."""
        return sharded_loss(
            self.ds,
            self.levers,
            self.state,
            self.device,
            batch.input_ids,
            batch.position_ids,
            batch.labels,
            seq=batch.seq,
            n_seq=batch.n_logps(),
            branch=getattr(batch, "branch", None),
        )

    def eval_batch(
        self,
        input_ids: torch.Tensor,
        position_ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
    ) -> SliceLosses:
        """Per-token losses of this rank's slice of one full batch `[b, L]`, forward only under
        no_grad and eval mode. Why: docs/design/run.md."""
        st = self.state
        shard = shard_batch(
            input_ids, st.sp_size, st.sp_rank, labels=labels, position_ids=position_ids
        )
        self.attn.cu_seqlens, self.attn.max_seqlen, self.attn.shared = (
            shard.cu_seqlens,
            shard.max_seqlen,
            None,
        )
        was_training = self.module.training
        self.ds.eval()
        try:
            with torch.no_grad(), record_function("ds_longctx.eval"):
                loss, hit = self.module(
                    shard.input_ids.to(self.device),
                    shard.position_ids.to(self.device),
                    shard.shift_labels.to(self.device),
                    per_token=True,
                )  # [b, L/sp] x 2
        finally:
            self.ds.train(was_training)
        n = shard.input_ids.shape[1]
        return SliceLosses(
            loss=loss,
            valid=shard.shift_labels.to(self.device) != IGNORE_INDEX,
            hit=hit,
            start=st.sp_rank * n,
            length=input_ids.shape[1],
        )

    def step(self) -> None:
        with record_function("ds_longctx.optimizer"):
            self.ds.step()

    def train_step(self, batches: list) -> StepResult:
        res = self.forward_backward(batches)
        self.step()
        return res

    def grad_norm(self) -> Optional[float]:
        """The last optimizer step's gradient norm before clipping, or None."""
        norm = self.ds.get_global_grad_norm()
        return None if norm is None else float(norm)


def build_engine(
    cfg: RunConfig, shape: RunShape | None = None, optimizer_state: bool = True
) -> LongCtxEngine:
    """Steps 1-9 (docs/design/run.md), under a launcher or plain python for 1 rank. `shape`: the
    run's from `run/preflight.preflight` (None: its checks run here). `optimizer_state=False` leaves
    the optimizer's state to the caller."""
    import deepspeed

    t0 = time.perf_counter()
    # 1. checks (world size from the launcher's environment, before any process group exists)
    if shape is None:
        shape = validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    text = shape.text
    # 2. process groups
    init_distributed()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    state = ParallelState.build(
        shape.sp,
        text.num_attention_heads,
        text.num_key_value_heads,
        kernel_rules.linear_heads(text),
    )
    _build_stage("2/9 process groups", t0, state.rank)
    # ZeRO-Infinity's swap files in a directory of this run's own under nvme_path (removed at exit)
    ds_config = private_swap_dirs(build_ds_config(cfg, state.world_size, on_gpu, shape.geometry))
    # 3. the model, partitioned at birth, then deterministic weights
    model = build_partitioned_model(
        cfg,
        shape.hf_config,
        ds_config,
        stage=lambda name: _build_stage(f"3/9 {name}", t0, state.rank),
    )
    # 4-8. LoRA, attention kernel + Ulysses (+ fused ops), tiled MLP, placement plan, loss head
    levers = apply_levers(cfg, model, state, ds_config, shape)
    _build_stage("8/9 levers and loss head", t0, state.rank)
    # 9. DeepSpeed: the optimizer gets the trainable parameters only (the adapters under LoRA)
    schedule = lr_factor(cfg.optimizer, cfg.train.steps)
    ds_engine, *_ = deepspeed.initialize(
        model=levers.head,
        model_parameters=trainable_parameters(levers.head),
        config=ds_config,
        lr_scheduler=lambda opt: LambdaLR(opt, schedule),
    )
    _build_stage("9/9 deepspeed.initialize", t0, state.rank)
    if optimizer_state and make_optimizer_state(
        cfg, ds_engine.optimizer, state.rank
    ):  # not in step 1's step
        _build_stage("optimizer state", t0, state.rank)
    if (
        reserve_pool()
    ):  # after DeepSpeed's host-side build buffers are gone (the planner's build phase)
        _build_stage("pinned pool", t0, state.rank)
    return LongCtxEngine(cfg, ds_engine, levers, state, ds_config, device)
