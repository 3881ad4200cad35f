"""Memory model: how much GPU and host memory a run takes, before anything is allocated.

Pure arithmetic on an HF config's geometry: no torch, no deepspeed, no transformers. It models the
design this package trains with (per GPU: bf16 compute, one sequence per SP group, micro-batch 1,
ZeRO-3 over all ranks, every decoder layer checkpointed, Ulysses all-to-all around attention).

Dimensions (bytes are bf16 = 2 unless said):
    G GPUs per node    N nodes    W = N·G ranks (the ZeRO-3 world; W = G on one node)
    sp sp_size (divides G: an SP group stays inside a node)    dp = W / sp
    S seq_len padded up to a multiple of sp    T = S / sp (tokens per rank)
    H hidden    I intermediate    L layers    hq / hkv query / KV heads    d head_dim    V vocab
    P all parameters    P_layer one decoder layer's parameters    k offload_layers    E = T·H·2 (one hidden tensor)
    c = min(chunk_rows, T) loss rows per chunk    t = min(tile_tokens, T) MLP tile    kv' = max(hkv/sp, 1)

A step's GPU memory is the terms live in every phase ("all") plus the largest of the transient phases:
    embed     the embedding's forward / backward
    loss      lm_head + cross-entropy (the loss-head gradients are computed in its forward and kept)
    mlp_bwd   the top layer recomputed, all its saved tensors live, its MLP backward running
    attn_bwd  the same layer's attention backward (MLP saved tensors freed, attention grads live)
The top layer (L-1) is the worst layer: every on-GPU checkpoint is still live when its backward runs.
Then  gpu_peak = fragmentation · (Σ all + Σ peak phase) + cuda_context;  host_peak sums every host term
over one node (its G ranks: every node holds the same). GB below means 10⁹ bytes (an "80 GB" card passed as 80
is conservative: H100 has 85.0e9).

Usage (which levers to pull for a length is `plan_search.choose`):
    from ds_longctx.plan.planner import Levers, ModelGeometry, plan_memory
    print(plan_memory(ModelGeometry.from_name_or_path("qwen3-8b"), 1 << 20, 8, 8, Levers(offload_layers=32)).table())
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_longctx.config.run import lever_conflict
from ds_longctx.levers.lora import target_names
from ds_longctx.levers.offload import cache_region_bytes
from ds_longctx.levers.placement import Place, PlacementPlan
from ds_longctx.parallel import kernel_rules, parallel_state
from ds_longctx.plan.geometry import ModelGeometry, as_geometry
from ds_longctx.plan.layer_units import (COMPILED_FINAL_NORM_UNITS, COMPILED_MLP_SAVED,
                                          COMPILED_QK_NORM_SAVED_COPIES, COMPILED_UNITS_ATTN_BWD,
                                          COMPILED_UNITS_MLP_BWD, HIDDEN_UNITS_ATTN_BWD, HIDDEN_UNITS_MLP_BWD,
                                          POOLED_LAYER_UNITS, QK_NORM_SAVED_COPIES, TILED_LAYER_UNITS_ATTN_BWD,
                                          TILED_LAYER_UNITS_MLP_BWD)
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.zero_buffers import (DS_SUB_GROUP_ELEMS, PARAM_PERSISTENCE_ELEMS, REDUCE_BUCKET_ELEMS,
                                           offload_pinned_grads, offload_sub_group_elems, optimizer_split, pow2)
from ds_longctx.run.gpu_budget import CUDA_CONTEXT_GIB

GB = 10**9
GIB = 2**30
PHASES = ("embed", "loss", "mlp_bwd", "attn_bwd")
ALL = ("all",)
LAYER = ("mlp_bwd", "attn_bwd")
BUILD = ("build",)  # host only: while the engine is built, never at the same time as a step
# Calibrated on nvidia-h200-x2 (benchmarks/results/planner_runs_2026-11-30.md, expandable segments):
# max_memory_reserved / max_memory_allocated was 1.03-1.06 without offload and 1.12 with it, and a
# rank's steady host RSS 2.2 GiB.
FRAGMENTATION = 1.06
OFFLOAD_FRAGMENTATION = 1.12
# Checkpoints offloaded through DeepSpeed's own offload engine (pinned_pool off) while the optimizer is offloaded too:
# measured 1.282 (Qwen3-8B, 262,144 tokens, 2 x H200, all 36 layers offloaded: 8.7 GiB cached on side streams,
# session_2026-11-30_h200x2-20261130T2256/budget64/memory) and 1.21 (65,536 tokens, train_optoffload_2026-11-30).
# Without the optimizer offload that engine measured 1.05-1.15 on 7 runs (OFFLOAD_FRAGMENTATION), and our pool with
# the optimizer offloaded 1.13-1.23 on 5 (session_2026-12-01_h200x1-*): planner_runs_2026-12-01b.md.
DS_OFFLOAD_FRAGMENTATION = 1.28
PROCESS_HOST_GIB = 2.25
# The safety rule: a plan fills at most MAX_HEADROOM of the budget the user gave. The worst under-prediction of any
# committed run (benchmarks/results/planner_runs_*.md, calibration and held-out) was measured reserved / predicted
# = 1.107 (Qwen3-0.6B, 262,144 tokens, offloaded checkpoints), so a plan at 0.90 of the budget ran at <= 0.997 of it;
# tests/plan/test_planner.py re-reads every committed run and fails if one needs a lower bound. Higher `--headroom`
# is refused (check_headroom).
MAX_HEADROOM = 0.90
# A rank's RSS at the start of DeepSpeed's ZeRO-3 init, before its CPU defragment buffer (same runs: 9.08 GiB
# peak per rank for Qwen3-8B on 2 GPUs = this + 2·P/G bytes).
BUILD_HOST_GIB = 1.5


@dataclass(frozen=True)
class Term:
    """One named allocation: bytes per GPU, bytes on the host (one node's total), formula, phases it is live in."""

    name: str
    gpu_bytes: int
    host_bytes: int
    formula: str
    phases: tuple = ALL


@dataclass(frozen=True)
class MemoryPlan:
    """The result of `plan_memory`: every term, the peak phase, per-GPU and node-host peaks (bytes)."""

    geom: ModelGeometry
    seq_len: int  # padded to a multiple of sp_size
    gpus: int  # per node
    sp_size: int
    levers: Levers
    terms: tuple
    phase_bytes: tuple  # ((phase, Σ gpu bytes of that phase's transient terms), ...)
    peak_phase: str
    reserved_bytes: int  # what torch.cuda.max_memory_reserved will report: f·(all + peak phase)
    gpu_peak_bytes: int  # reserved + cuda_context: what must fit on the card
    host_peak_bytes: int
    placement: PlacementPlan  # the per-layer plan the terms read (levers.placement_for)
    nodes: int = 1

    @property
    def world(self) -> int:
        """Ranks in all: nodes · GPUs per node (ZeRO-3 partitions over all of them)."""
        return self.nodes * self.gpus

    @property
    def dp_size(self) -> int:
        return self.world // self.sp_size

    @property
    def local_tokens(self) -> int:
        return self.seq_len // self.sp_size

    @property
    def host_step_bytes(self) -> int:
        """Host bytes during training steps (the build's transient host terms excluded)."""
        return _host_bytes(self.terms, ALL)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def fits(self, gpu_budget_bytes: float, host_budget_bytes: float) -> bool:
        return self.gpu_peak_bytes <= gpu_budget_bytes and self.host_peak_bytes <= host_budget_bytes

    def table(self) -> str:
        """A fixed-width table: term, phase, GB per GPU, GB host (node), formula; then the peaks."""
        lv = self.levers
        where = (f"gpus={self.gpus}" if self.nodes == 1 else
                 f"nodes={self.nodes} gpus/node={self.gpus} world={self.world}")
        rows = [f"{self.geom.name}: seq_len={self.seq_len:,} {where} sp={self.sp_size} dp={self.dp_size} "
                f"T={self.local_tokens:,} | chunked_loss={lv.chunked_loss} loss_chunk_rows={lv.loss_chunk_rows} "
                f"tiled_mlp={lv.tiled_mlp}{' tiled_layer=True' if lv.tiled_layer else ''} "
                f"tile_tokens={lv.tile_tokens} optimizer_offload={lv.optimizer_offload}"
                + (f" (ratio {lv.optimizer_offload_ratio})" if lv.optimizer_offload and lv.optimizer_offload_ratio < 1
                   else "")
                + (" offload_params=True" if lv.offload_params else "")
                + (f" attn_bwd_head_groups={lv.attn_bwd_head_groups}" if lv.attn_bwd_head_groups > 1 else "")
                + (f" fused_ops={lv.fused_ops}" if lv.fused_ops != "auto" else "")
                + (f" lora_rank={lv.lora_rank}" if lv.lora_rank else ""),
                f"placement: {self.placement.describe()}",
                f"{'term':<26}{'phase':<17}{'GB/GPU':>9}{'GB host':>10}  formula"
                + ("" if self.nodes == 1 else "  (GB host: per node)")]
        for t in self.terms:
            rows.append(f"{t.name:<26}{','.join(t.phases):<17}{t.gpu_bytes / GB:>9.2f}{t.host_bytes / GB:>10.2f}"
                        f"  {t.formula}")
        phases = "  ".join(f"{p}={b / GB:.2f}" for p, b in self.phase_bytes)
        rows.append(f"phases (GB/GPU beyond 'all'): {phases}")
        rows.append(f"{'peak (' + self.peak_phase + ')':<43}{self.gpu_peak_bytes / GB:>9.2f}"
                    f"{self.host_peak_bytes / GB:>10.2f}  = fragmentation·(all + {self.peak_phase}) + cuda_context")
        return "\n".join(rows)


def check_headroom(headroom: float) -> None:
    """Refuse a headroom outside (0, MAX_HEADROOM] (the safety rule above), naming the value and the fix."""
    if not 0 < headroom <= MAX_HEADROOM:
        raise ValueError(f"--headroom {headroom:g} must be in (0, {MAX_HEADROOM:g}]: the planner has under-predicted "
                         f"a measured peak by up to 10.7% (benchmarks/results/planner_runs_*.md), so a plan above "
                         f"{MAX_HEADROOM:g} of the budget could run past it; use {MAX_HEADROOM:g} or less")


def valid_sp_sizes(geom: ModelGeometry, gpus: int, nodes: int = 1) -> list:
    """The sp sizes a model geometry can run on `nodes` nodes of `gpus` GPUs, each SP group inside a node (the rule
    is parallel_state.sp_size_problem's)."""
    return parallel_state.valid_sp_sizes(nodes * gpus, geom.heads, geom.kv_heads, per_node=gpus)


def _host_bytes(terms, phases: tuple) -> int:
    """Σ host bytes of the terms live in exactly `phases` (ALL: the steps; BUILD: the engine build)."""
    return sum(t.host_bytes for t in terms if t.phases == phases)


def checkpoint_bytes_per_token(geom: ModelGeometry) -> int:
    """L·H·2: the checkpointed layer inputs per token of the full sequence (Qwen3-8B: 288 KiB)."""
    return geom.layers * geom.hidden * 2


def _adapters(g: ModelGeometry, rank: int, targets) -> tuple:
    """(A, A_layer, A_mlp, n): adapter params in all, in the top layer, in its MLP; adapted Linears in it."""
    if not rank:
        return 0, 0, 0, 0
    lin, top = g.linears(), f"model.layers.{g.layers - 1}."
    names = target_names(lin, targets, "lm_head")
    count = lambda prefix="": sum(rank * sum(lin[n]) for n in names if n.startswith(prefix))  # noqa: E731
    return count(), count(top), count(top + "mlp."), sum(n.startswith(top) for n in names)


def plan_memory(geom: ModelGeometry, seq_len: int, gpus: int, sp_size: int, levers: Levers = Levers(), *,
                nodes: int = 1, live_layers: int = 2, fragmentation: float = FRAGMENTATION,
                offload_fragmentation: float = OFFLOAD_FRAGMENTATION,
                ds_offload_fragmentation: float = DS_OFFLOAD_FRAGMENTATION, cuda_context_gib: float = CUDA_CONTEXT_GIB,
                process_host_gib: float = PROCESS_HOST_GIB) -> MemoryPlan:
    """Every allocation of one training step, per GPU and on the host of one node. `gpus` G is per node, `nodes` N;
    the ZeRO-3 world is W = N·G (the formulas below write G for W: on one node they are equal, and the table
    prints W once N > 1). Host terms are one node's: G ranks' worth. Terms (phase; formula):

    ZeRO-3 over all W ranks (all). LoRA (lora_rank r > 0): only the A adapter params train (r·(in+out) summed over
    the targeted Linears, levers/lora.target_names; A_layer / A_mlp: the top layer's / its MLP's): P_t = A, else
    P; no base weight gets a grad (embedding, lm_head: 0; layer grads A_layer·2; tiled MLP sums A_mlp·4), and
    each adapted Linear of the top layer saves its r-wide A·x: lora_saved T·r·2 each.
        params_bf16            2·(P+A)/G; with offload_params (DeepSpeed offload_param) the parameters of at most
                               PARAM_PERSISTENCE_ELEMS elements whole, and on the host G·pow2(2·P/G), the stage-3
                               optimizer's flat pinned buffer (gathered_layers then counts on one rank too)
        grads_bf16             2·P_t/G     \\  DeepSpeed accumulates grads in the model dtype (its grad_accum_dtype
        master_fp32            4·P_t/G      > default); with optimizer_offload these three live in host memory, G
        adam_m_v_fp32          8·P_t/G     /  ranks' worth on the node: G·pow2(2·P_t/G) (pinned), 4·P_t, 8·P_t
        cpu_adam_grads_fp32    host with optimizer_offload: the fp32 grads the CPU optimizer steps on, one pinned
                               block per DeepSpeed sub-group, G·Σ pow2(4·sub-group) (`offload_pinned_grads`; about
                               4·P_t; measured: 74.7 GiB RSS per rank for the 8B on 2 GPUs = 18·P/G + checkpoints +
                               process; 0.6B to 4B on one GPU without the rounding: 3.8-4.7 GB over,
                               benchmarks/results/planner_plans_2026-12-01.md)
        reduce_bucket          REDUCE_BUCKET_ELEMS·2 (ds_config's reduce_bucket_size, bf16)
        gathered_layers        live_layers·(P_layer+A_layer)·2   (the layer being computed + prefetch; 0 on one rank:
                               nothing to gather)
    Checkpoints and small inputs (all):
        checkpoints            (L-k)·E on GPU; host G·k·pow2(E) (pinned, k offloaded layers; torch's pinned
                               host allocator rounds every block up to a power of two), or G·k·E with our
                               exact-size pool (pinned_pool)
        offload_staging        2·E if k > 0 with DeepSpeed's offload (calibrated: the input in use plus the offload
                               engine's own GPU references, `_fwd_stash` / `keep_last`, in
                               deepspeed/runtime/activation_checkpointing/offload_activations.py); with our pool
                               (levers/offload.py: the input restored on demand for the layer's backward, freed after
                               it; nothing kept or prefetched) max(0, POOLED_LAYER_UNITS·E (+ its restored cache when
                               the top layer is cached) - (L-k)·E - the GPU caches): an offloaded layer runs its
                               backward after every kept layer freed its checkpoint and cache
        rotary_cos_sin         T·d·2·2
        token_ids              3·T·8 (input_ids, shifted labels, position_ids, int64)
        attention_cache        n·(S·(hq/sp)·d·2 + (hq/sp)·S·4) for the n `cache` layers of the placement: each
                               one's kernel output and fp32 LSE (when the top layer is one, attn_out_a2a /
                               softmax_lse below are 0: its are the cached ones); host G·n_host·the same for the
                               n_host `cache+offload` layers, each a region of the pinned pool (registered, no
                               rounding; offload.cache_region_bytes: + (hq/sp)·128·4 + 64 KiB of room)
    Embedding (embed):  embedding_gathered V·H·2, embedding_grad_bf16 V·H·2, embedding_out E
    Token-wise ops compiled (Levers.fused_ops auto or compile: what a GPU run does) count COMPILED_* units below
    (the norms keep their bf16 input, SwiGLU gate, up and product), eager (none, liger) the HF units.
    Loss (loss):  lm_head_gathered V·H·2, lm_head_grad_bf16 V·H·2, final_norm 4·E (compiled 2·E), hidden_grad E, then
        chunked:  loss_chunk_logits_fp32 c·V·4 (turned in place into dL/dlogits), loss_chunk_bf16 c·V·2 (the
                  bf16 logits, then the bf16 cast of the gradient), lm_head_grad_accum_fp32 V·H·4 (chunked_loss.py)
        plain:    logits T·V·12 (the backward of log_softmax: its saved fp32 output, the fp32 grad from
                  nll_loss and the fp32 grad it makes, all T×V at once), logits_bf16_block T·V·2 (the bf16
                  logits, freed in the forward: a block too small for any later T×V fp32 tensor, so it stays
                  reserved)
    Top layer backward (mlp_bwd and/or attn_bwd):
        layer_grads_bf16       P_layer·2 (one layer's full grads before reduce-scatter; both)
        tied_lm_head_grad_held V·H·2 with tied embeddings (embed too): the lm_head grad waits for the embedding's
        hidden_mlp_bwd         10·E (see HIDDEN_UNITS_MLP_BWD)            hidden_attn_bwd  6·E (attn_bwd)
                               (compiled: 5·E and 3·E; tiled_layer: 3·E and 1·E, TILED_LAYER_UNITS_*)
        qk_norm_saved          3·T·(hq+hkv)·d·2 (compiled 1·) if qk_norm and not tiled_layer (both)
        qkv_a2a                S·(hq/sp + 2·kv')·d·2 (both); qkv_a2a_grad the same (attn_bwd)
        attn_out_a2a           S·(hq/sp)·d·2 saved by the kernel (both); attn_out_a2a_grad the same (attn_bwd)
        softmax_lse_fp32       (hq/sp)·S·4 (both)
        attn_bwd_workspace     (hq/sp)·S·(d+1)·4, the kernel's fp32 dQ accumulator + softmax-grad row sums
                               (flash-attn 2 and cuDNN both keep these; attn_bwd); /G with attn_bwd_head_groups G,
                               and the accumulators in qkv_local_grad /G too; attn_bwd_group_grads qkv_a2a/G, one
                               group's grads before they are copied into the full ones
        qkv_local_grad         the larger of T·(hq+2·max(hkv,sp))·d·2 if sp > 1 (q/k/v grads back through the
                               all-to-all, KV as repeated to sp heads when sp > hkv) and 2·kv'·S·d·4 if hq/sp > kv'
                               (FlashAttention 4's fp32 dK / dV accumulators for grouped KV heads) (attn_bwd)
        attn_out_local         T·hq·d·2 if sp > 1, o_proj's saved input (at sp 1 the kernel's output) (mlp_bwd)
        MLP (mlp_bwd), untiled: mlp_saved 4·T·I·2 (gate, up, act(gate), act·up; compiled 3: gate, up, product),
                       mlp_grads 2·T·I·2;
                       tiled:   mlp_tile 6·t·I·2 (the same four + two grads, per tile), mlp_tile_hidden 2·t·H·2,
                                mlp_tile_wgrad_fp32 3·H·I·4 (tiled_mlp.py's fp32 sum of the MLP weight grads)
        tiled_layer (the MLP tiled as above, its tile also holding the norm: mlp_tile_hidden 6·t·H·2), attn_bwd:
                       qkv_tile t·(6·H+4·(hq+2·hkv)·d)·2, qkv_tile_wgrad_fp32 (hq+2·hkv)·d·H·4
    Slack (all):  allocator_slack (f-1)·(all + peak phase), f = fragmentation, or offload_fragmentation
                  when checkpoints are offloaded, ds_offload_fragmentation when through DeepSpeed's engine with the
                  optimizer offloaded too (side streams caching their own blocks);
                  reserved = f·(all + peak phase) is what torch.cuda.max_memory_reserved reports;
                  cuda_context (context, NCCL, cuBLAS workspaces) is outside the allocator but on the card:
                  gpu_peak = reserved + cuda_context.
    Host:  process_overhead G·process_host_gib (a rank's steady RSS: Python, torch, CUDA and NCCL host state),
           dataset_row G·S·16 (ids + labels int64 on each rank)
    Host while the engine is built (build; not at the same time as the step's host terms):
           build_process G·BUILD_HOST_GIB, zero3_defragment_cpu 2·P_t (DeepSpeed's ZeRO-3 init copies every
           rank's trainable bf16 partition through a CPU buffer: `defragment` in deepspeed/runtime/zero/utils.py);
           with offload_params zero3_offload_param_build G·(2·P/G + pow2(2·P/G)) instead (zero.Init's unpinned
           partitions beside the flat pinned buffer they move into)
    host_peak = max(Σ step host terms, Σ build host terms).
    """
    g, G, sp = as_geometry(geom), gpus, sp_size
    if nodes < 1:
        raise ValueError(f"nodes={nodes}: need at least 1 node")
    W, w = nodes * G, "G" if nodes == 1 else "W"  # the ZeRO world and its symbol in the formulas
    parallel_state.check_sp_size(sp, W, g.heads, g.kv_heads, per_node=G)
    kernel_rules.check_head_groups(levers.attn_bwd_head_groups, g.kv_heads, sp)
    placement = levers.placement_for(g.layers)
    k = placement.offloaded
    n_cache, n_cache_host = placement.count(Place.CACHE), placement.count(Place.CACHE_OFFLOAD)
    top_cached = placement[g.layers - 1] == Place.CACHE  # its kept output is already counted on the GPU
    if min(seq_len, levers.loss_chunk_rows, 1 if levers.tile_tokens is None else levers.tile_tokens) < 1:
        raise ValueError(f"seq_len={seq_len}, loss_chunk_rows={levers.loss_chunk_rows}, tile_tokens="
                         f"{levers.tile_tokens} must be >= 1")
    H, I, L, d, V, hq, hkv = g.hidden, g.intermediate, g.layers, g.head_dim, g.vocab, g.heads, g.kv_heads
    S = -(-seq_len // sp) * sp
    T, P, Pl = S // sp, g.num_params, g.layer_params
    E = T * H * 2
    hq_l, kv_l = hq // sp, parallel_state.local_kv_heads(hkv, sp)
    r, lora = levers.lora_rank, levers.lora_rank > 0
    A, A_layer, A_mlp, n_top = _adapters(g, r, levers.lora_targets)
    P_t = A if lora else P  # the trained parameters
    frozen = " (0: frozen, LoRA)" if lora else ""
    terms: list = []

    def add(name, gpu, host, formula, phases=ALL):
        terms.append(Term(name, int(gpu), int(host), formula, phases))
    part = -(-(P + A) // W)  # elements in one rank's ZeRO-3 partition (DeepSpeed pads to equal partitions)
    part_t, Pt = -(-P_t // W), "A" if lora else "P"
    off, ratio, offp = levers.optimizer_offload, levers.optimizer_offload_ratio, levers.offload_params
    if msg := lever_conflict(lora_rank=r, tiled_layer=levers.tiled_layer, offload_ratio=ratio if off else 1.0,
                             offload_params=offp):
        raise ValueError(msg)
    if offp:  # DeepSpeed offload_param: one flat pinned buffer of the partition per rank; small params stay whole
        persistent = sum(n for n in g.param_numels() if n <= PARAM_PERSISTENCE_ELEMS)
        add("params_bf16", 2 * persistent, G * pow2(2 * part),
            f"2·(params <= {PARAM_PERSISTENCE_ELEMS:.0e} elements, kept whole); host G·pow2(2·P/{w}) (offload_param:"
            f" stage3.py's flat pinned buffer)")
    else:
        add("params_bf16", 2 * part, 0, f"2·(P+A)/{w}" if lora else f"2·P/{w}")
    if off and ratio < 1:  # partial offload: DeepSpeed's sub-groups, the first ones on the GPU
        on_gpu, on_host = optimizer_split(g, W, ratio)
        share = f" (partial offload ratio {ratio}: {on_gpu / part_t:.2f} of the partition's sub-groups on GPU)"
    else:
        on_gpu, on_host, share = (0, part_t, "") if off else (part_t, 0, "")
    if off:  # DeepSpeed's pinned grad buffers, rounded (offload_pinned_grads)
        sub_elems = offload_sub_group_elems(g, W) if ratio < 1 else DS_SUB_GROUP_ELEMS  # as ds_config.py writes it
        pinned_bf16, pinned_fp32, n_groups = offload_pinned_grads(g, W, part_t, lora, sub_elems, ratio)
    for name, nbytes in (("grads_bf16", 2), ("master_fp32", 4), ("adam_m_v_fp32", 8)):
        if off and name == "grads_bf16":  # the whole partition's, on the host whatever the ratio
            add(name, 0, G * pinned_bf16, f"on host G·pow2(2·{Pt}/{w}) (pinned, the whole partition)")
            continue
        add(name, nbytes * on_gpu, G * nbytes * on_host, f"{nbytes}·{Pt}/{w}" + (
            f"; on host {nbytes}·{Pt}" + ("" if nodes == 1 else "·G/W") + share if off else ""))
    if off:
        add("cpu_adam_grads_fp32", 4 * on_gpu, G * pinned_fp32,
            f"host G·Σ pow2(4·sub-group) ({n_groups} at sub_group_size {sub_elems:.3g}, pinned"
            + ("; the GPU sub-groups' blocks freed and reused by the next pin" if on_gpu else "") + ")"
            + (" (the fp32 grads the optimizers step on: the GPU sub-groups' also on the GPU)" if on_gpu
               else " (the fp32 grads DeepSpeedCPUAdam steps on)"))
    add("reduce_bucket", REDUCE_BUCKET_ELEMS * 2, 0, f"reduce_bucket_size({REDUCE_BUCKET_ELEMS:.0e})·2")
    # one rank (W = 1): ZeRO-3 has nothing to gather, a layer's params are views of the flat partition (the 1 x H200
    # snapshots of session_2026-12-01_h200x1-20261201T0307 hold no all-gather block)
    gather = W > 1 or offp
    add("gathered_layers", live_layers * (Pl + A_layer) * 2 * gather, 0,
        f"live_layers({live_layers})·" + ("(P_layer+A_layer)·2" if lora else "P_layer·2") + ("" if gather else
        " (0: one rank, nothing to gather)"))
    if levers.pinned_pool:
        add("checkpoints", (L - k) * E, G * k * E, f"(L-k)·T·H·2; host G·k·T·H·2, exact-size pool (k={k})")
    else:
        add("checkpoints", (L - k) * E, G * k * pow2(E), f"(L-k)·T·H·2; host G·k·pow2(T·H·2) (k={k})")
    cache_layer = S * hq_l * d * 2 + hq_l * S * 4
    if k and levers.pinned_pool:  # restored on demand into one GPU tensor, freed after the layer's backward
        # Offloaded layers are the lowest (placement order), so when one runs its backward every layer kept on the
        # GPU has had its own and freed its checkpoint and cache: what an offloaded layer adds (POOLED_LAYER_UNITS·E,
        # and its restored cache when the top layer's kernel output is not already counted) only counts where it is
        # more than they held.
        kept = (L - k) * E + n_cache * cache_layer
        restored = POOLED_LAYER_UNITS * E + (cache_layer if n_cache_host and top_cached else 0)
        add("offload_staging", max(0, restored - kept), 0, f"max(0, {POOLED_LAYER_UNITS}·T·H·2 (+ its restored cache) "
            f"- what the kept layers held, freed by then) (our pool; {L - k} kept, {n_cache} cached on the GPU)")
    elif k:
        add("offload_staging", 2 * E, 0, "2·T·H·2")
    add("rotary_cos_sin", T * d * 2 * 2, 0, "T·d·2·2")
    add("token_ids", 3 * T * 8, 0, "3·T·8")
    if n_cache or n_cache_host:
        add("attention_cache", n_cache * cache_layer, G * n_cache_host * cache_region_bytes(1, S, hq_l, d, 2),
            f"n·(S·(hq/sp)·d·2 + (hq/sp)·S·4) (n={n_cache} cached on GPU"
            + ("; the top layer's is its attn_out_a2a + lse" if top_cached else "")
            + f"); host G·n_host·(the same + (hq/sp)·128·4 + 64 KiB), the pinned pool's regions (n_host={n_cache_host})")

    add("embedding_gathered", V * H * 2, 0, "V·H·2", ("embed",))
    add("embedding_grad_bf16", 0 if lora else V * H * 2, 0, "V·H·2" + frozen, ("embed",))
    add("embedding_out", E, 0, "T·H·2", ("embed",))

    add("lm_head_gathered", V * H * 2, 0, "V·H·2", ("loss",))
    add("lm_head_grad_bf16", 0 if lora else V * H * 2, 0, "V·H·2" + frozen, ("loss",))
    compiled = levers.fused_ops in ("auto", "compile")  # a plan is for a GPU: auto compiles there
    u_fn = COMPILED_FINAL_NORM_UNITS if compiled else 4
    add("final_norm", u_fn * E, 0, f"{u_fn}·T·H·2" + (" (compiled)" if compiled else ""), ("loss",))
    add("hidden_grad", E, 0, "T·H·2", ("loss",))
    if levers.chunked_loss:
        c = min(levers.loss_chunk_rows, T)
        add("loss_chunk_logits_fp32", c * V * 4, 0, f"c·V·4 (c={c})", ("loss",))
        add("loss_chunk_bf16", c * V * 2, 0, f"c·V·2 (c={c})", ("loss",))
        add("lm_head_grad_accum_fp32", 0 if lora else V * H * 4, 0, "V·H·4" + frozen, ("loss",))
    else:
        add("logits", T * V * 12, 0, "T·V·12", ("loss",))
        add("logits_bf16_block", T * V * 2, 0, "T·V·2", ("loss",))

    if g.tied_embeddings and not lora:
        # the lm_head grad (made in the loss forward) waits in autograd's input buffer for the embedding's
        # grad: a tied leaf's AccumulateGrad runs once, after its last use's backward (the embedding, last)
        add("tied_lm_head_grad_held", V * H * 2, 0, "V·H·2 (tied embeddings)", LAYER + ("embed",))
    add("layer_grads_bf16", (A_layer if lora else Pl) * 2, 0, "A_layer·2" if lora else "P_layer·2", LAYER)
    if lora:
        add("lora_saved", n_top * T * r * 2, 0, f"n·T·r·2 (n={n_top} adapted Linears, r={r})", LAYER)
    tl = levers.tiled_layer
    u_mlp, u_attn = ((TILED_LAYER_UNITS_MLP_BWD, TILED_LAYER_UNITS_ATTN_BWD) if tl
                     else (COMPILED_UNITS_MLP_BWD, COMPILED_UNITS_ATTN_BWD) if compiled
                     else (HIDDEN_UNITS_MLP_BWD, HIDDEN_UNITS_ATTN_BWD))
    add("hidden_mlp_bwd", u_mlp * E, 0, f"{u_mlp}·T·H·2", ("mlp_bwd",))
    add("hidden_attn_bwd", u_attn * E, 0, f"{u_attn}·T·H·2", ("attn_bwd",))
    if g.qk_norm and not tl:  # tiled: q/k norms run inside the q/k/v tiles
        c = COMPILED_QK_NORM_SAVED_COPIES if compiled else QK_NORM_SAVED_COPIES
        add("qk_norm_saved", c * T * (hq + hkv) * d * 2, 0, f"{c}·T·(hq+hkv)·d·2", LAYER)
    qkv_a2a = S * (hq_l + 2 * kv_l) * d * 2
    add("qkv_a2a", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", LAYER)
    add("qkv_a2a_grad", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", ("attn_bwd",))
    # a cached top layer's kernel output and LSE are its cached ones (counted in attention_cache)
    add("attn_out_a2a", 0 if top_cached else S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", LAYER)
    add("attn_out_a2a_grad", S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", ("attn_bwd",))
    add("softmax_lse_fp32", 0 if top_cached else hq_l * S * 4, 0, "(hq/sp)·S·4", LAYER)
    hg = levers.attn_bwd_head_groups  # the backward over hg groups of KV heads: one group's accumulators at a time
    per = "" if hg == 1 else f"/{hg}"
    add("attn_bwd_workspace", hq_l * S * (d + 1) * 4 // hg, 0, f"(hq/sp)·S·(d+1)·4{per}", ("attn_bwd",))
    kv_pre = max(hkv, sp)  # KV heads are repeated up to sp before the all-to-all when sp > hkv
    # After the kernel (sp > 1): q/k/v grads back through the all-to-all. Inside it, with grouped KV heads,
    # FlashAttention 4 accumulates dK / dV in fp32 per KV head (flash_attn/cute/interface.py's _flash_attn_bwd; the
    # 1.7B snapshot at sp 1 holds both, 2·hkv·S·d·4). The term is the larger; at sp 1 there is no exchange.
    local = T * (hq + 2 * kv_pre) * d * 2 if sp > 1 else 0
    accum = 2 * kv_l * S * d * 4 // hg if hq_l > kv_l else 0
    add("qkv_local_grad", max(local, accum), 0, "max(T·(hq+2·max(hkv,sp))·d·2 if sp > 1, "
        f"2·kv'·S·d·4{per} if hq/sp > kv')", ("attn_bwd",))
    if hg > 1:  # each group's q/k/v grads, made by the kernel, then copied into the full ones
        add("attn_bwd_group_grads", qkv_a2a // hg, 0, f"S·(hq/sp+2·kv')·d·2/{hg}", ("attn_bwd",))
    # o_proj's saved input: the kernel's output itself at sp 1 (no exchange), counted in attn_out_a2a or the cache
    add("attn_out_local", T * hq * d * 2 * (sp > 1), 0, "T·hq·d·2" + ("" if sp > 1 else " (0 at sp 1)"), ("mlp_bwd",))
    t = min(levers.tile_tokens or H, T)  # the tile of the tiled MLP / tiled layer
    if tl:
        # the q/k/v tiles' backward: one tile's norm / projections / rotary with their grads, and the fp32 sums
        # of the attention-side weight grads (o_proj's is an ordinary Linear's); q, k and v are three outputs,
        # so their grads (qkv_local_grad) go in as they are, never joined into one buffer
        add("qkv_tile", t * (6 * H + 4 * (hq + 2 * hkv) * d) * 2, 0, f"t·(6·H+4·(hq+2·hkv)·d)·2 (t={t})",
            ("attn_bwd",))
        add("qkv_tile_wgrad_fp32", (hq + 2 * hkv) * d * H * 4 * (T > t), 0, "(hq+2·hkv)·d·H·4 if T > t",
            ("attn_bwd",))
    if levers.tiled_mlp or tl:
        add("mlp_tile", 6 * t * I * 2, 0, f"6·t·I·2 (t={t})", ("mlp_bwd",))
        add("mlp_tile_hidden", (6 if tl else 2) * t * H * 2, 0, f"{6 if tl else 2}·t·H·2 (t={t}"
            + ("; the post-attention norm in the tile" if tl else "") + ")", ("mlp_bwd",))
        add("mlp_tile_wgrad_fp32", (A_mlp if lora else 3 * H * I) * 4 * (T > t), 0,
            ("A_mlp" if lora else "3·H·I") + "·4 if T > t", ("mlp_bwd",))
    else:
        m = COMPILED_MLP_SAVED if compiled else 4
        add("mlp_saved", m * T * I * 2, 0, f"{m}·T·I·2", ("mlp_bwd",))
        add("mlp_grads", 2 * T * I * 2, 0, "2·T·I·2", ("mlp_bwd",))

    base = sum(t.gpu_bytes for t in terms if t.phases == ALL)
    phase_bytes = tuple((p, sum(t.gpu_bytes for t in terms if p in t.phases)) for p in PHASES)
    peak_phase, peak_extra = max(phase_bytes, key=lambda pb: pb[1])
    sub, ctx = base + peak_extra, round(cuda_context_gib * GIB)
    ds_opt = k and off and not levers.pinned_pool  # DeepSpeed's offload engine beside its CPU optimizer's copies
    f = ds_offload_fragmentation if ds_opt else offload_fragmentation if k else fragmentation
    slack = round((f - 1) * sub)
    add("allocator_slack", slack, 0, f"({f:g}-1)·(all + {peak_phase})")
    add("cuda_context", ctx, 0, f"{cuda_context_gib:g} GiB")
    add("process_overhead", 0, round(G * process_host_gib * GIB), f"G·{process_host_gib:g} GiB")
    add("dataset_row", 0, G * S * 16, "G·S·2·8")
    add("build_process", 0, round(G * BUILD_HOST_GIB * GIB), f"G·{BUILD_HOST_GIB:g} GiB", BUILD)
    if offp:  # zero.Init's unpinned partitions, moved into the optimizer's flat pinned buffer (held from here on)
        add("zero3_offload_param_build", 0, G * (2 * part + pow2(2 * part)), f"G·(2·P/{w} + pow2(2·P/{w}))", BUILD)
    else:
        add("zero3_defragment_cpu", 0, 2 * part_t * G, f"2·{Pt}/{w} per rank", BUILD)
    return MemoryPlan(geom=g, seq_len=S, gpus=G, nodes=nodes, sp_size=sp, levers=levers, terms=tuple(terms),
                      phase_bytes=phase_bytes, peak_phase=peak_phase, reserved_bytes=sub + slack,
                      gpu_peak_bytes=sub + slack + ctx,
                      host_peak_bytes=max(_host_bytes(terms, ALL), _host_bytes(terms, BUILD)), placement=placement)
