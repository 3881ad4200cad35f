"""Build the model, apply the levers in one order, wrap `deepspeed.initialize` (ZeRO-3).

Order (each step says why it comes where it does):
 1. validate: sp_size against world size and heads, attention backend, model class: all before anything
    is allocated, so bad input fails in seconds with a message that names the fix.
 2. process groups (`parallel_state`): zero.Init and the Ulysses exchange need them.
 3. YaRN rope scaling from the target seq_len (`rope.apply_rope_scaling`) on the config, then the
    model under `deepspeed.zero.Init`: parameters are born partitioned (an 8B model never exists whole
    on one rank), then re-drawn deterministically per parameter name (`init_weights`): zero.Init draws
    differently per layout, ours does not, so runs of any world size / sp_size start from the same weights.
 4. Ulysses attention (`ulysses.register`): swaps the attention function, before DeepSpeed wraps the model.
 5. tiled MLP (`tiled_mlp.apply_tiled_mlp`): the MLP over sequence tiles; before 6 so the checkpoint
    recompute runs the tiled code too.
 6. activation checkpointing of every decoder layer (after 4: the recompute replays the exchange), then
    CPU offload of the first `offload_layers` checkpoints through DeepSpeed's checkpointing (`offload.py`),
    then the attention cache on the last `attention_cache_layers` (`attention_cache.py`: their recompute
    returns the kept attention output; after offload, whose layers it must not touch).
 7. loss head (`LossHead`): chunked lm_head + cross-entropy on the local slice, token-weighted over the
    SP group; the lm_head weight is a ZeRO-3 external parameter of the loss module.
 8. `deepspeed.initialize(model, config)`: ZeRO-3 over all W ranks, gradients averaged over W (the
    loss head's sp factor makes that the mean over the dp = W / sp replicas).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ds_longctx.parallel import attention

from ds_longctx.parallel import ulysses
from ds_longctx.levers.chunked_loss import chunked_cross_entropy, plain_cross_entropy
from ds_longctx.config import SHIPPED_MODELS_DIR, RunConfig
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.levers.attention_cache import apply_attention_cache, resolve_attention_cache_layers
from ds_longctx.levers.offload import apply_activation_offload, decoder_layers, offloaded_layer_indices, resolve_offload_layers
from ds_longctx.levers.rope import apply_rope_scaling
from ds_longctx.levers.tiled_mlp import apply_tiled_mlp
from ds_longctx.parallel.parallel_state import ParallelState, build_parallel_state, check_sp_size
from ds_longctx.parallel.sharding import IGNORE_INDEX, shard_batch

log = logging.getLogger("ds_longctx")


# ----------------------------------------------------------------------------- distributed start
def init_distributed(timeout_s: Optional[float] = None) -> None:
    """Start torch.distributed through DeepSpeed (nccl on GPU, gloo on CPU). No-op if already started.
    `timeout_s`: the process-group timeout (RunConfig.collective_timeout_s); None keeps DeepSpeed's default."""
    if dist.is_initialized():
        return
    import deepspeed
    if not torch.cuda.is_available():
        # the shared-memory comm op JIT-compiles for ~66 s on CPU and is not needed with gloo
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if "RANK" not in os.environ:  # plain `python`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", **timeout)


# ----------------------------------------------------------------------------- model config
def load_hf_config(model: str, seq_len: Optional[int] = None):
    """The HF config of a shipped geometry name or a checkpoint directory (cheap: no weights)."""
    from transformers import AutoConfig
    path = SHIPPED_MODELS_DIR / f"{model}.json"
    if path.is_file():
        from transformers import Qwen3Config
        cfg = Qwen3Config.from_dict(json.loads(path.read_text()))
    else:
        cfg = AutoConfig.from_pretrained(model)
    cfg.use_cache = False
    return cfg


def model_class(hf_config):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    except KeyError:
        raise ValueError(f"model type {hf_config.model_type!r} has no causal-LM class in transformers; "
                         f"ds_longctx trains causal LMs (Qwen3, Llama, ...)") from None


def init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Draw every parameter from a generator seeded by (seed, parameter name): the same weights whatever
    the world size, sp_size or ZeRO partitioning (on one device type). Norm weights 1, biases 0, matrices
    N(0, std) as transformers' `_init_weights` does for Qwen3/Llama."""
    import deepspeed
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0, enabled=hasattr(p, "ds_id")):
            if dist.is_initialized() and dist.get_rank() != 0 and hasattr(p, "ds_id"):
                continue
            with torch.no_grad():
                if p.dim() == 1:
                    p.fill_(1.0 if "norm" in name else 0.0)
                else:
                    g = torch.Generator(device=p.device).manual_seed(seed * 7919 + zlib.crc32(name.encode()))
                    p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(std))


def _build_stage(stage: str, t0: float, rank: int) -> None:
    """One progress line per build stage on rank 0: seconds since the build began, host RSS now and at its
    peak so far (ru_maxrss: the planner's host model is checked against these), GPU memory allocated."""
    if rank != 0:
        return
    import resource
    import time

    import psutil
    rss, peak = psutil.Process().memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gpu = f", GPU allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB" if torch.cuda.is_available() else ""
    log.info("build %s: %.1f s, host RSS %.2f GiB (peak %.2f GiB)%s", stage, time.perf_counter() - t0,
             rss / 2**30, peak / 2**30, gpu)


# ----------------------------------------------------------------------------- loss head
class LMHeadLoss(nn.Module):
    """lm_head + cross-entropy sum on the local slice, chunked or plain (chunked_loss.py).

    The lm_head weight is registered as a ZeRO-3 *external* parameter of this module, so DeepSpeed gathers
    it only while the loss runs (not for the whole forward) and the chunked Function can take it as input.
    """

    def __init__(self, lm_head: nn.Module, chunked: bool, chunk_rows: int):
        super().__init__()
        self._lm_head = [lm_head]  # a list: not a submodule, its params stay owned by the model
        self.chunked, self.chunk_rows = chunked, chunk_rows
        weight = lm_head.weight
        if hasattr(weight, "ds_id"):
            import deepspeed
            deepspeed.zero.register_external_parameter(self, weight)

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weight = self._lm_head[0].weight  # [V, H]
        if self.chunked:
            return chunked_cross_entropy(hidden, weight, labels, chunk_size=self.chunk_rows)
        return plain_cross_entropy(hidden, weight, labels)


class LossHead(nn.Module):
    """HF causal LM + loss on the local slice. forward -> (loss to backprop, detached loss, token count).

    The loss to backprop is sp * sum(CE on this slice) / tokens(whole SP group). DeepSpeed averages
    gradients over all W = sp * dp ranks, so the sp factor turns that average into the mean over the dp
    replicas of each sequence's token-mean loss gradient (see parallel_state.py for why DeepSpeed is not
    told about SP).
    """

    def __init__(self, model: nn.Module, state: ParallelState, chunked: bool = True, chunk_rows: int = 4096):
        super().__init__()
        self.model = model
        self.state = state
        self.loss = LMHeadLoss(model.get_output_embeddings(), chunked, chunk_rows)

    def forward(self, input_ids, position_ids, shift_labels):
        hidden = self.model.base_model(input_ids=input_ids, position_ids=position_ids,
                                       use_cache=False).last_hidden_state  # [b, s/sp, H]
        loss_sum = self.loss(hidden.flatten(0, 1), shift_labels.flatten())  # [b*s/sp, H] -> fp32 scalar
        n_tokens = (shift_labels != IGNORE_INDEX).sum()
        group_sum = loss_sum.detach().clone()
        if self.state.sp_group is not None:
            both = torch.stack([n_tokens.to(group_sum.dtype), group_sum])
            dist.all_reduce(both, group=self.state.sp_group)
            n_group, group_sum = both[0], both[1]
        else:
            n_group = n_tokens.to(group_sum.dtype)
        n_group = n_group.clamp(min=1)
        return loss_sum * self.state.sp_size / n_group, group_sum / n_group, n_group


# ----------------------------------------------------------------------------- engine
@dataclass
class StepResult:
    loss: float      # token-mean loss of this step, averaged over dp replicas
    tokens: int      # supervised tokens in this step over all replicas


class LongCtxEngine:
    """A DeepSpeed ZeRO-3 engine with Ulysses SP around a HF causal LM. Build with `build_engine(cfg)`."""

    def __init__(self, cfg: RunConfig, ds_engine, module: LossHead, state: ParallelState,
                 attn: ulysses.UlyssesAttention, ds_config: dict, device: torch.device):
        self.cfg, self.ds, self.module, self.state = cfg, ds_engine, module, state
        self.attn, self.ds_config, self.device = attn, ds_config, device

    @property
    def model(self) -> nn.Module:
        return self.module.model

    def forward_backward(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                         labels: Optional[torch.Tensor] = None) -> StepResult:
        """Loss and gradients for one full batch `[b, L]` of this dp replica (every SP rank passes the same)."""
        st = self.state
        shard = shard_batch(input_ids, st.sp_size, st.sp_rank, labels=labels, position_ids=position_ids)
        self.attn.cu_seqlens, self.attn.max_seqlen = shard.cu_seqlens, shard.max_seqlen
        calls_before = self.attn.calls
        loss, group_loss, n = self.ds(shard.input_ids.to(self.device), shard.position_ids.to(self.device),
                                      shard.shift_labels.to(self.device))
        if self.attn.calls == calls_before:
            raise RuntimeError(f"{type(self.model).__name__} did not call the Ulysses attention function: its "
                               f"attention is not routed through transformers' AttentionInterface")
        self.ds.backward(loss)
        stats = torch.stack([group_loss.detach().float(), n.float()])
        if st.dp_group is not None:
            dist.all_reduce(stats, group=st.dp_group)
            stats[0] /= st.dp_size
        return StepResult(loss=float(stats[0]), tokens=int(stats[1]))

    def step(self) -> None:
        self.ds.step()

    def train_step(self, input_ids, position_ids=None, labels=None) -> StepResult:
        res = self.forward_backward(input_ids, position_ids, labels)
        self.step()
        return res


def auto_offload_layers(cfg: RunConfig, world_size: int) -> int:
    """The fewest layers whose checkpoints must leave the GPU for this run to fit (plan_search.py)."""
    from ds_longctx.plan.search import fewest_offload_layers
    from ds_longctx.plan.planner import ModelGeometry
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
    if not total:
        return 0
    return fewest_offload_layers(ModelGeometry.from_name_or_path(cfg.model), cfg.seq_len, world_size,
                                 cfg.sp_size, gpu_mem_gb=total / 1e9, chunk_rows=cfg.loss_chunk_rows,
                                 tiled_mlp=cfg.tiled_mlp, tile_tokens=cfg.tile_tokens,
                                 optimizer_offload=cfg.optimizer_offload,
                                 attention_cache_layers=int(cfg.attention_cache_layers))


def validate(cfg: RunConfig, world_size: int):
    """Every check that needs no allocation. Returns the HF config."""
    hf_cfg = load_hf_config(cfg.model)
    text = hf_cfg.get_text_config()
    check_sp_size(cfg.sp_size, world_size, text.num_attention_heads, text.num_key_value_heads)
    attention.resolve_backend(cfg.attn_backend)
    ulysses.check_wrappable_class(model_class(hf_cfg), hf_cfg)
    n_layers = text.num_hidden_layers
    cache, off = cfg.attention_cache_layers, cfg.offload_layers if cfg.activation_offload else 0
    if isinstance(cache, int) and cache > n_layers:
        raise ValueError(f"attention_cache_layers={cache} is more than the model's {n_layers} layers; use "
                         f"0..{n_layers} or 'all'")
    if cache == "all" and off == "auto":
        raise ValueError("attention_cache_layers='all' (every layer not offloaded) with offload_layers='auto' (the "
                         "fewest that fit, counting the cache) is circular; give attention_cache_layers a number")
    if isinstance(cache, int) and cache and (off == "all" or (isinstance(off, int) and cache + off > n_layers)):
        raise ValueError(f"attention_cache_layers={cache} (the last layers) overlaps offload_layers={off} (the "
                         f"first layers) of {n_layers}: DeepSpeed's offloading checkpoint has no selective policy; "
                         f"keep attention_cache_layers + offload_layers <= {n_layers}, or attention_cache_layers: all")
    return hf_cfg


def build_engine(cfg: RunConfig, hf_config=None) -> LongCtxEngine:
    """Steps 1-8 of the module docstring. Call under torchrun / deepspeed (or plain python for 1 rank)."""
    import time

    import deepspeed

    t0 = time.perf_counter()
    # 1. validate (world size from the launcher's environment, before any process group exists)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    hf_cfg = validate(cfg, world) if hf_config is None else hf_config
    # 2. process groups
    init_distributed()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    state = build_parallel_state(cfg.sp_size)
    _build_stage("2/8 process groups", t0, state.rank)
    attention.select(cfg.attn_backend, announce=state.rank == 0)
    ds_config = build_ds_config(cfg, state.world_size, on_gpu)
    dtype = torch.bfloat16 if ds_config["bf16"]["enabled"] else torch.float32
    # 3. model, partitioned at birth, then deterministic weights
    cls = model_class(hf_cfg)
    hf_cfg._attn_implementation = "sdpa"
    hf_cfg.dtype = dtype
    # YaRN before the model exists: the rotary embedding reads rope_parameters at construction
    # (Qwen3 publishes its YaRN recipe against 32768 positions, not max_position_embeddings=40960)
    apply_rope_scaling(hf_cfg, cfg.seq_len, cfg.rope_scaling,
                       original_max_position_embeddings=32768 if hf_cfg.model_type == "qwen3" and
                       hf_cfg.max_position_embeddings == 40960 else None)
    is_path = Path(cfg.model).is_dir()
    # dtype=None: zero.Init then takes it from ds_config (passing one is ignored on CPU by a DeepSpeed
    # precedence bug in Init._set_dtype, which would silently give bf16 weights on CPU)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=None, enabled=not is_path):
        if is_path:
            from transformers.integrations import HfDeepSpeedConfig
            _keep = HfDeepSpeedConfig(ds_config)  # noqa: F841  makes from_pretrained load partitioned
            model = cls.from_pretrained(cfg.model, config=hf_cfg, dtype=dtype)
        else:
            model = cls(hf_cfg).to(dtype)
    _build_stage("3/8 model under zero.Init", t0, state.rank)
    if not is_path:
        init_weights(model, cfg.seed, getattr(hf_cfg, "initializer_range", 0.02))
        _build_stage("3/8 init_weights", t0, state.rank)
    model.train()  # SP must never run in eval mode by accident (see KNOWN.md)
    # 4. Ulysses attention
    attn = ulysses.register(model, state)
    # 5. tiled MLP: patches each MLP's forward; under the checkpoint below, the layer recompute calls the
    #    tiled forward too, so the four intermediate-width tensors never exist for the whole slice
    if cfg.tiled_mlp:
        apply_tiled_mlp(model, cfg.tile_tokens or hf_cfg.get_text_config().hidden_size)
    # 6. activation checkpointing, then offload of the first N layers' checkpoints through DeepSpeed's
    #    checkpoint (needs 5's final layer code and the DeepSpeed JSON's activation_checkpointing block)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        n_layers = len(decoder_layers(model))
        if cfg.activation_offload:
            auto = auto_offload_layers(cfg, state.world_size) if cfg.offload_layers == "auto" else None
            apply_activation_offload(model, ds_config, resolve_offload_layers(cfg.offload_layers, n_layers, auto))
        if cfg.attention_cache_layers:
            apply_attention_cache(model, resolve_attention_cache_layers(
                cfg.attention_cache_layers, n_layers, len(offloaded_layer_indices(model))))
    # 7. loss head: chunked lm_head + CE on the local slice
    module = LossHead(model, state, cfg.chunked_loss, cfg.loss_chunk_rows)
    # 8. DeepSpeed
    _build_stage("7/8 levers and loss head", t0, state.rank)
    ds_engine, *_ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()],
                                         config=ds_config)
    _build_stage("8/8 deepspeed.initialize", t0, state.rank)
    return LongCtxEngine(cfg, ds_engine, module, state, attn, ds_config, device)
