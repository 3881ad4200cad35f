"""A plan's step time before any GPU runs it: one rank's work counted from the plan's shapes at
measured rates, its collectives through plan/interconnect.py's model. The cost model:
docs/design/plan.md.

    t = predict_step(plan, 80, "h100")  # StepTime (.seconds, .line()); UnknownRate: no rate known
    step_line(plan, 80, gpu)            # what plan.txt prints (or why there is no prediction)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ds_longctx.levers.placement import Place
from ds_longctx.parallel.parallel_state import local_linear_heads
from ds_longctx.plan import interconnect, layer_types
from ds_longctx.plan.cache_placement import ATTENTION_FWD_FLOPS
from ds_longctx.plan.moe_terms import MOE_TOKENWISE_FLOPS, block_fwd_flops
from ds_longctx.plan.planner import MemoryPlan
from ds_longctx.plan.preference_terms import attention_span, dpo_row

# FlashAttention 4's causal backward at Ulysses shapes on H200, FLOP/s. calibrated: see
# docs/calibration.md#attention-bwd-flops
ATTENTION_BWD_FLOPS = 618e12
# FlashAttention 4's causal forward / backward at Ulysses shapes on H100, FLOP/s.
# calibrated: see docs/calibration.md#h100-rates
H100_ATTENTION_FWD_FLOPS = 667e12
H100_ATTENTION_BWD_FLOPS = 610e12
# The token-wise work of a dense Qwen3 layer, FLOP/s.
# calibrated: see docs/calibration.md#tokenwise-flops
DENSE_TOKENWISE_FLOPS = 480e12
# FlashAttention 4's causal forward / backward at head_dim 256, FLOP/s.
# calibrated: see docs/calibration.md#gated-delta-seconds
ATTENTION_D256_FWD_FLOPS = 720e12
ATTENTION_D256_BWD_FLOPS = 368e12
# FLA's gated delta rule and causal conv1d, seconds per token and value head (dk = dv = 128, bf16,
# H200). calibrated: see docs/calibration.md#gated-delta-seconds
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
    # measured on an H100: docs/calibration.md#h100-rates
    "h100": GpuRates(
        (H100_ATTENTION_FWD_FLOPS, H100_ATTENTION_BWD_FLOPS),
        None,
        DENSE_TOKENWISE_FLOPS,
        None,
        None,
        "FlashAttention 4 measured on H100, token-wise rate held to an H100 rehearsal",
    ),
}
# DeepSpeedCPUAdam's parameters per second per rank, assumed: docs/calibration.md#cpu-adam-rate
CPU_ADAM_PARAMS_PER_S = 1e9


@dataclass(frozen=True)
class StepTime:
    gpu: str  # the GPU kind whose rates (GPU_RATES) count it
    attention: float  # seconds: forward, backward and recomputed forward over every layer
    # seconds: projections and MLP / sparse blocks, forward, backward, recompute (+ tiles)
    tokenwise: float
    loss: float
    optimizer: float  # the host's share of an offloaded optimizer
    prediction: interconnect.Prediction

    @property
    def seconds(self) -> float:
        return self.prediction.seconds

    def line(self) -> str:
        p = self.prediction
        return (
            f"predicted step on {self.gpu} (analytic, plan/step_time.py, "
            f"{GPU_RATES[self.gpu].source}): {p.seconds:.1f} s = attention {self.attention:.1f} + "
            f"token-wise {self.tokenwise:.1f} + loss {self.loss:.1f} + optimizer "
            f"{self.optimizer:.1f} + "
            f"communication {p.seconds - p.compute_seconds:.1f} (all-to-all serial, ZeRO "
            "overlapped)"
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


def _layer_seconds(plan: MemoryPlan, rates: GpuRates, gpu: str, forward_only=False) -> tuple:
    """(attention seconds, token-wise seconds) over every layer of one rank, at `rates`;
    `forward_only`: the forward alone (a reference pass: no recompute, no backward)."""
    g, lv, T = plan.geom, plan.levers, plan.local_tokens
    fwd = 2 * attention_span(plan.seq_len, lv) * (g.heads // plan.sp_size) * g.head_dim
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
            step = 2 * (delta_fwd + conv_fwd) + delta_bwd + conv_bwd
            attention += heads * (delta_fwd + conv_fwd if forward_only else step)
        elif forward_only:
            attention += fwd / pair[0]
        else:
            attention += fwd * (1 + recompute) / pair[0] + 2.5 * fwd / pair[1]
        proj, mlp = _tokenwise_flops(plan, i)
        sparse = g.moe is not None and g.moe.is_sparse(i)
        rate = (
            _needed(rates, gpu, "moe_tokenwise", "a sparse MoE block")
            if sparse
            else rates.dense_tokenwise
        )
        passes = (proj + mlp) if forward_only else 4 * (proj + mlp) + (mlp if lv.tiled_mlp else 0)
        tokenwise += T * passes / rate
    return attention, tokenwise


class UnknownRate(ValueError):
    """A plan's step needs a rate its GPU kind does not have (GPU_RATES)."""


def _payloads(plan: MemoryPlan) -> dict:
    """{(kind, ranks): bytes} of one step of rank 0 (its SP group is ranks 0..sp-1; ZeRO-3 spans the
    world)."""
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
            f"no measured or published kernel rates for GPU kind {gpu!r} (known: "
            f"{sorted(GPU_RATES)})"
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
    """plan.txt's step-time line: the prediction on GPU kind `gpu`, or why there is none (no kind,
    no rate)."""
    if gpu is None:
        return (
            f"predicted step: unknown (no GPU kind: pass --gpu, one of {sorted(GPU_RATES)}, for a "
            f"step time at its kernel rates)"
        )
    try:
        return predict_step(plan, gpu_mem_gb, gpu).line()
    except UnknownRate as e:
        return (
            f"predicted step on {gpu}: unknown ({e}; plan/step_time.py GPU_RATES holds the rates "
            "known)"
        )


def reference_seconds(plan: MemoryPlan, gpu_mem_gb: float, gpu: str) -> float:
    """One row's reference forward (dpo; grpo with beta > 0): the step's forward alone (no
    recompute, backward or optimizer), a third of its exchanges (one pass of three), no
    reduce-scatter. UnknownRate as `predict_step`."""
    if gpu not in GPU_RATES:
        raise UnknownRate(f"no kernel rates known for GPU kind {gpu!r}")
    rates, g, T = GPU_RATES[gpu], plan.geom, plan.local_tokens
    attention, tokenwise = _layer_seconds(plan, rates, gpu, forward_only=True)
    loss = 2 * T * g.hidden * g.vocab / rates.dense_tokenwise
    payloads = {k: v / 3 for k, v in _payloads(plan).items() if k[0] != "reduce_scatter"}
    link = interconnect.LINKS[interconnect.intra_link_for(gpu_mem_gb)]
    inter = interconnect.LINKS[interconnect.DEFAULT_INTERNODE]
    compute = attention + tokenwise + loss
    return interconnect.predict(compute, payloads, 0, plan.gpus, link, inter).seconds


def objective_lines(plan: MemoryPlan, gpu_mem_gb: float, gpu: Optional[str]) -> list:
    """plan.txt's lines on the objective's terms (plan/preference_terms.py): none for sft."""
    lv, S = plan.levers, plan.seq_len
    if lv.objective == "sft":
        return []
    try:
        ref = f"{reference_seconds(plan, gpu_mem_gb, gpu):.1f} s" if gpu else "unknown (no --gpu)"
    except UnknownRate as e:
        ref = f"unknown ({e})"
    if lv.objective == "grpo":
        return [
            "grpo: the sft terms, plus the old and reference log-probs of each token (2·T·4 "
            "bytes); with "
            f"beta > 0 a reference pass before the first step: one forward per row, {ref} each, "
            "once over the data"
        ]
    p, c, r = dpo_row(S, lv)
    virtual = (p + c) ** 2 + (p + r) ** 2
    lines = [
        f"dpo row: prompt {p:,} + chosen {c:,} + rejected {r:,} = {S:,} tokens, the prompt once "
        f"(--completion_len {c}); token-wise work over {S:,} tokens once; attention's queries "
        "once, its keys "
        f"and values over [P, C, P, R]: (P+C)^2 + 2·P·R + R^2 = {attention_span(S, lv) / S**2:.5f} "
        f"of the sft row's S^2 (both completions after their own prompt: {virtual / S**2:.2f})",
        "reference pass (the reference log-probs, stored in output_dir): one forward per row "
        f"before the first step, {ref} per row, counted once over the data, not in the step",
    ]
    if gpu in GPU_RATES:
        sft = replace(plan, levers=replace(lv, objective="sft", completion_len=0))
        try:
            dpo_s, sft_s = (predict_step(x, gpu_mem_gb, gpu).seconds for x in (plan, sft))
            lines.append(
                f"predicted step: dpo {dpo_s:.1f} s, this plan as sft {sft_s:.1f} s: "
                f"{dpo_s / sft_s:.3f}x"
            )
        except UnknownRate:
            pass
    return lines
