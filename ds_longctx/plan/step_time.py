"""A plan's step time before any GPU runs it: one rank's work counted from the plan's shapes at
measured rates, its collectives through plan/interconnect.py's model. The cost model:
docs/design/plan.md.

    t = predict_step(plan, 80, "h100")    # StepTime: .seconds, .line(); UnknownRate for a rate not known
    step_line(plan, 80, gpu)              # what plan.txt prints (the reason where there is no prediction)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ds_longctx.levers.placement import Place
from ds_longctx.parallel.parallel_state import local_linear_heads
from ds_longctx.plan import interconnect, layer_types
from ds_longctx.plan.cache_placement import ATTENTION_FWD_FLOPS
from ds_longctx.plan.moe_terms import MOE_TOKENWISE_FLOPS, block_fwd_flops
from ds_longctx.plan.planner import MemoryPlan

# FlashAttention 4's causal backward at Ulysses shapes on H200, FLOP/s. calibrated: see
# docs/calibration.md#attention-bwd-flops
ATTENTION_BWD_FLOPS = 618e12
# The token-wise work of a dense Qwen3 layer, FLOP/s.
# calibrated: see docs/calibration.md#tokenwise-flops
DENSE_TOKENWISE_FLOPS = 480e12
# FlashAttention 4's causal forward / backward at head_dim 256, FLOP/s.
# calibrated: see docs/calibration.md#gated-delta-seconds
ATTENTION_D256_FWD_FLOPS = 720e12
ATTENTION_D256_BWD_FLOPS = 368e12
# FLA's gated delta rule and causal conv1d, seconds per token and value head (dk = dv = 128, bf16, H200).
# calibrated: see docs/calibration.md#gated-delta-seconds
GATED_DELTA_FWD_S = 28.17e-3 / (1_048_576 * 6)
GATED_DELTA_BWD_S = 81.90e-3 / (1_048_576 * 6)
CONV1D_FWD_S = 2.33e-3 / (1_048_576 * 6)
CONV1D_BWD_S = 10.42e-3 / (1_048_576 * 6)


@dataclass(frozen=True)
class GpuRates:
    """The rates one GPU kind's step is counted at; None: not known for this kind."""

    attention: tuple  # causal (forward, backward), head_dim <= 128
    attention_d256: Optional[tuple]  # the same at head_dim 256 (a hybrid's full layers)
    dense_tokenwise: float
    moe_tokenwise: Optional[float]
    gated_delta: Optional[tuple]  # (delta rule fwd, bwd, conv1d fwd, bwd)
    source: str


# Per GPU kind (`ds-longctx plan --gpu`).
GPU_RATES = {
    "h200": GpuRates(
        (ATTENTION_FWD_FLOPS, ATTENTION_BWD_FLOPS),
        (ATTENTION_D256_FWD_FLOPS, ATTENTION_D256_BWD_FLOPS),
        DENSE_TOKENWISE_FLOPS,
        MOE_TOKENWISE_FLOPS,
        (GATED_DELTA_FWD_S, GATED_DELTA_BWD_S, CONV1D_FWD_S, CONV1D_BWD_S),
        "rates measured on H200",
    ),
    # attention: FlashAttention-3's paper (arXiv 2407.08608); the rest: docs/design/plan.md
    "h100": GpuRates(
        (616e12, 561e12),
        None,
        DENSE_TOKENWISE_FLOPS,
        None,
        None,
        "attention at FlashAttention-3's published H100 rates, token-wise GEMMs at the H200's "
        "measured rate (the same chip and peak; not measured on an H100)",
    ),
}
# DeepSpeedCPUAdam's parameters per second per rank, assumed: docs/calibration.md#cpu-adam-rate
CPU_ADAM_PARAMS_PER_S = 1e9


@dataclass(frozen=True)
class StepTime:
    gpu: str  # the GPU kind whose rates (GPU_RATES) count it
    attention: float  # seconds: forward, backward and recomputed forward over every layer
    tokenwise: float  # seconds: projections and MLP / sparse blocks, forward, backward, recompute (+ tiles)
    loss: float
    optimizer: float  # the host's share of an offloaded optimizer
    prediction: interconnect.Prediction

    @property
    def seconds(self) -> float:
        return self.prediction.seconds

    def line(self) -> str:
        p = self.prediction
        return (
            f"predicted step on {self.gpu} (analytic, plan/step_time.py, {GPU_RATES[self.gpu].source}): "
            f"{p.seconds:.1f} s = attention {self.attention:.1f} + "
            f"token-wise {self.tokenwise:.1f} + loss {self.loss:.1f} + optimizer {self.optimizer:.1f} + "
            f"communication {p.seconds - p.compute_seconds:.1f} (all-to-all serial, ZeRO overlapped)"
        )


def _tokenwise_flops(plan: MemoryPlan, layer: int) -> tuple:
    """(forward FLOPs per token of layer `layer`'s projections, of its MLP or sparse block)."""
    g = plan.geom
    proj = 2 * 2 * g.hidden * (g.heads + g.kv_heads) * g.head_dim
    if g.hybrid is not None:
        proj = 2 * sum(
            i * o for i, o in layer_types.mixer_linears(g, g.hybrid.layer_types[layer]).values()
        )
    if g.moe is not None and g.moe.is_sparse(layer):
        return proj, block_fwd_flops(g)
    return proj, 2 * 3 * g.hidden * g.intermediate


def _needed(rates: GpuRates, gpu: str, field: str, work: str):
    value = getattr(rates, field)
    if value is None:
        raise UnknownRate(f"no rate known for {work} on {gpu}")
    return value


def _layer_seconds(plan: MemoryPlan, rates: GpuRates, gpu: str) -> tuple:
    """(attention seconds, token-wise seconds) over every layer of one rank, at `rates`."""
    g, lv, T = plan.geom, plan.levers, plan.local_tokens
    fwd = 2 * plan.seq_len**2 * (g.heads // plan.sp_size) * g.head_dim
    pair = (
        rates.attention
        if g.head_dim <= 128
        else _needed(rates, gpu, "attention_d256", "attention at head_dim 256")
    )
    attention = tokenwise = 0.0
    for i, place in enumerate(plan.placement.layers):
        recompute = 0 if place in (Place.CACHE, Place.CACHE_OFFLOAD) else 1
        if g.hybrid is not None and not g.hybrid.is_full(i):
            delta_fwd, delta_bwd, conv_fwd, conv_bwd = _needed(
                rates, gpu, "gated_delta", "the gated delta rule"
            )
            heads = plan.seq_len * local_linear_heads(g.hybrid.linear_heads, plan.sp_size)[1]
            attention += heads * (2 * (delta_fwd + conv_fwd) + delta_bwd + conv_bwd)
        else:
            attention += fwd * (1 + recompute) / pair[0] + 2.5 * fwd / pair[1]
        proj, mlp = _tokenwise_flops(plan, i)
        sparse = g.moe is not None and g.moe.is_sparse(i)
        rate = (
            _needed(rates, gpu, "moe_tokenwise", "a sparse MoE block")
            if sparse
            else rates.dense_tokenwise
        )
        tokenwise += T * (4 * (proj + mlp) + (mlp if lv.tiled_mlp else 0)) / rate
    return attention, tokenwise


class UnknownRate(ValueError):
    """A plan's step needs a rate its GPU kind does not have (GPU_RATES)."""


def _payloads(plan: MemoryPlan) -> dict:
    """{(kind, ranks): bytes} of one step of rank 0 (its SP group is ranks 0..sp-1; ZeRO-3 spans the world)."""
    g, sp, T, d = plan.geom, plan.sp_size, plan.local_tokens, plan.geom.head_dim
    sp_ranks, world = tuple(range(sp)), tuple(range(plan.world))
    exchange = T * (g.heads + 2 * max(g.kv_heads, sp) + g.heads) * d * 2  # q, k, v in; output back
    if g.hybrid is not None:  # a linear layer exchanges its conv channels, gates and output
        h = g.hybrid
        linear = T * (h.conv_dim + 2 * h.linear_value_heads + h.value_width) * 2
        exchange = (h.full_layers * exchange + h.linear_layers * linear) / g.layers
    trained = g.num_params if not plan.levers.lora_rank else 0  # LoRA's adapters: negligible
    return {
        ("all_to_all", sp_ranks): 3 * g.layers * exchange * (sp > 1),
        ("all_gather", world): 3 * 2 * g.num_params * (plan.world > 1),
        ("reduce_scatter", world): 2 * trained * (plan.world > 1),
    }


def predict_step(plan: MemoryPlan, gpu_mem_gb: float, gpu: str) -> StepTime:
    """The plan's step time on one rank of GPU kind `gpu`, on the NVLink of GPUs of `gpu_mem_gb` GB
    and InfiniBand across nodes. UnknownRate where a rate it needs is not known for that kind."""
    if gpu not in GPU_RATES:
        raise UnknownRate(
            f"no measured or published kernel rates for GPU kind {gpu!r} (known: {sorted(GPU_RATES)})"
        )
    rates = GPU_RATES[gpu]
    g, lv, T = plan.geom, plan.levers, plan.local_tokens
    attention, tokenwise = _layer_seconds(plan, rates, gpu)
    loss = 6 * T * g.hidden * g.vocab / rates.dense_tokenwise
    host_share = lv.optimizer_offload_ratio if lv.optimizer_offload else 0.0
    optimizer = host_share * g.num_params / plan.world / CPU_ADAM_PARAMS_PER_S
    link = interconnect.LINKS[interconnect.intra_link_for(gpu_mem_gb)]
    inter = interconnect.LINKS[interconnect.DEFAULT_INTERNODE]
    pred = interconnect.predict(
        attention + tokenwise + loss + optimizer, _payloads(plan), 0, plan.gpus, link, inter
    )
    return StepTime(gpu, attention, tokenwise, loss, optimizer, pred)


def step_line(plan: MemoryPlan, gpu_mem_gb: float, gpu: Optional[str]) -> str:
    """plan.txt's step-time line: the prediction on GPU kind `gpu`, or why there is none (no kind, no rate)."""
    if gpu is None:
        return (
            f"predicted step: unknown (no GPU kind: pass --gpu, one of {sorted(GPU_RATES)}, for a step time at "
            f"its kernel rates)"
        )
    try:
        return predict_step(plan, gpu_mem_gb, gpu).line()
    except UnknownRate as e:
        return f"predicted step on {gpu}: unknown ({e}; plan/step_time.py GPU_RATES holds the rates known)"
