"""The terms of one training step's memory, phase by phase: what `planner.plan_memory` sums.

Each builder appends `Term`s (bytes per GPU, bytes on one node's host, the formula printed in the plan's table, the
phases the term is live in) for one part of the step, reading the sizes of `Sizes` (the legend of plan/planner.py).
The order in which they are appended is the order of the printed table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_longctx.levers.lora import target_names
from ds_longctx.levers.offload import cache_region_bytes
from ds_longctx.levers.placement import Place, PlacementPlan
from ds_longctx.parallel import parallel_state
from ds_longctx.parallel.kernel_rules import LINEAR_ATTENTION
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.layer_units import (
    COMPILED_FINAL_NORM_UNITS,
    COMPILED_MLP_SAVED,
    COMPILED_QK_NORM_SAVED_COPIES,
    COMPILED_UNITS_ATTN_BWD,
    COMPILED_UNITS_MLP_BWD,
    HIDDEN_UNITS_ATTN_BWD,
    HIDDEN_UNITS_MLP_BWD,
    POOLED_LAYER_UNITS,
    QK_NORM_SAVED_COPIES,
    TILED_LAYER_UNITS_ATTN_BWD,
    TILED_LAYER_UNITS_MLP_BWD,
)
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.moe_geometry import lora_problem
from ds_longctx.plan.moe_terms import moe_terms, top_layer_sparse
from ds_longctx.plan.zero_buffers import (
    DS_SUB_GROUP_ELEMS,
    PARAM_PERSISTENCE_ELEMS,
    REDUCE_BUCKET_ELEMS,
    offload_pinned_grads,
    offload_sub_group_elems,
    optimizer_split,
    pow2,
)

PHASES = ("embed", "loss", "mlp_bwd", "attn_bwd")
ALL = ("all",)
LAYER = ("mlp_bwd", "attn_bwd")
# a hybrid model's top gated DeltaNet layer: its MLP backward, its post-attention norm's, its token mixing's
# (plan/linear_terms.py)
LIN_MLP, LIN_NORM, LIN_MIX = "lin_mlp_bwd", "lin_norm_bwd", "lin_bwd"
LIN = (LIN_MLP, LIN_NORM, LIN_MIX)
BUILD = ("build",)  # host only: while the engine is built, never at the same time as a step


@dataclass(frozen=True)
class Term:
    """One named allocation: bytes per GPU, bytes on the host (one node's total), formula, phases it is live in."""

    name: str
    gpu_bytes: int
    host_bytes: int
    formula: str
    phases: tuple = ALL


class Terms(list):
    """The terms of one plan, in table order."""

    def add(self, name: str, gpu, host, formula: str, phases: tuple = ALL) -> None:
        self.append(Term(name, int(gpu), int(host), formula, phases))


@dataclass(frozen=True)
class Sizes:
    """The legend's quantities for one plan (plan/planner.py): elements, tokens or bytes as there."""

    g: ModelGeometry
    G: int  # GPUs per node
    W: int  # ranks in all (the ZeRO-3 world)
    w: str  # the world's symbol in the formulas: "G" on one node, "W" on several
    sp: int
    S: int  # seq_len padded to a multiple of sp
    T: int  # tokens per rank
    E: int  # bytes of one hidden tensor of the slice, T·H·2
    hq_l: int  # query heads per rank after the all-to-all
    kv_l: int  # KV heads per rank after the all-to-all (kv')
    A: int  # LoRA adapter parameters in all (0: full fine-tuning)
    A_layer: int  # ... in the top layer
    A_mlp: int  # ... in the top layer's MLP
    n_top: int  # adapted Linears of the top layer
    k: int  # offloaded layers
    n_cache: int  # layers whose attention output is kept on the GPU
    n_cache_host: int  # ... in pinned host memory
    top_cached: bool  # the top layer keeps its attention output on the GPU
    compiled: bool  # the token-wise ops are compiled (fused_ops auto or compile: what a GPU run does)
    above_lin: int = 0  # a hybrid model's layers above its top linear layer with their checkpoint on the GPU
    above_lin_cached: int = 0  # ... of them, those keeping their attention output on the GPU

    @property
    def phases(self) -> tuple:
        """The transient phases of this model's step: PHASES, and a hybrid model's linear layer's (LIN)."""
        return PHASES + (LIN if self.g.hybrid is not None else ())

    def layer_phases(self, *phases: str) -> tuple:
        """`phases` of the full-attention layer, and a hybrid model's matching linear-layer phases: for the terms
        every decoder layer holds (its grads, norms, MLP). A term held through both the MLP's and the mixer's
        backward is held through the norm's between them."""
        if self.g.hybrid is None:
            return phases
        lin = tuple(lin for p, lin in zip(LAYER, (LIN_MLP, LIN_MIX)) if p in phases)
        return phases + lin + ((LIN_NORM,) if set(LAYER) <= set(phases) else ())

    @property
    def lora(self) -> bool:
        return self.A > 0

    @property
    def P_t(self) -> int:
        """The trained parameters: the adapters under LoRA, else every parameter."""
        return self.A if self.lora else self.g.num_params

    @property
    def part(self) -> int:
        """Elements of one rank's ZeRO-3 partition (DeepSpeed pads to equal partitions)."""
        return -(-(self.g.num_params + self.A) // self.W)

    @property
    def part_t(self) -> int:
        return -(-self.P_t // self.W)

    @property
    def cache_layer(self) -> int:
        """Bytes of one layer's kept attention output and fp32 LSE, S·(hq/sp)·d·2 + (hq/sp)·S·4."""
        return self.S * self.hq_l * self.g.head_dim * 2 + self.hq_l * self.S * 4


def adapters(g: ModelGeometry, rank: int, targets) -> tuple:
    """(A, A_layer, A_mlp, n): adapter params in all, in the top layer, in its MLP; adapted Linears in it."""
    if not rank:
        return 0, 0, 0, 0
    if problem := lora_problem(g.moe, g.layers, targets):
        raise ValueError(problem)
    lin, top = g.linears(), f"model.layers.{g.layers - 1}."
    names = target_names(lin, targets, "lm_head")

    def count(prefix: str = "") -> int:
        return sum(rank * sum(lin[n]) for n in names if n.startswith(prefix))
    return count(), count(top), count(top + "mlp."), sum(n.startswith(top) for n in names)


def sizes(g: ModelGeometry, seq_len: int, gpus: int, sp: int, levers: Levers, nodes: int,
          placement: PlacementPlan) -> Sizes:
    """The legend's quantities of a checked request (plan_memory checks first) with its per-layer placement."""
    S = -(-seq_len // sp) * sp
    T = S // sp
    A, A_layer, A_mlp, n_top = adapters(g, levers.lora_rank, levers.lora_targets)
    # above a hybrid model's top linear layer: their backward has run (and freed their checkpoints) before its own
    top_lin = max((i for i, full in enumerate(g.attention_layers or ()) if not full), default=g.layers)
    above = placement.layers[top_lin + 1:]
    return Sizes(g=g, G=gpus, W=nodes * gpus, w="G" if nodes == 1 else "W", sp=sp, S=S, T=T, E=T * g.hidden * 2,
                 hq_l=g.heads // sp, kv_l=parallel_state.local_kv_heads(g.kv_heads, sp), A=A, A_layer=A_layer,
                 A_mlp=A_mlp, n_top=n_top, k=placement.offloaded, n_cache=placement.count(Place.CACHE),
                 n_cache_host=placement.count(Place.CACHE_OFFLOAD),
                 top_cached=placement[g.layers - 1] == Place.CACHE,
                 # a hybrid model's zero-centred norms are not among the fused ops (levers/fused_ops.py): eager units
                 compiled=levers.fused_ops in ("auto", "compile") and g.hybrid is None,
                 above_lin=sum(p in (Place.KEEP, Place.CACHE) for p in above),
                 above_lin_cached=sum(p == Place.CACHE for p in above))


def zero3_terms(t: Terms, z: Sizes, lv: Levers, live_layers: int) -> None:
    """The parameters, gradients and optimizer state ZeRO-3 partitions over all W ranks (phase all), where they live
    with optimizer_offload / offload_params, and the gathered layers. LoRA: only the adapters train (P_t = A)."""
    G, W, w, g = z.G, z.W, z.w, z.g
    part, part_t, Pt = z.part, z.part_t, "A" if z.lora else "P"
    off, ratio = lv.optimizer_offload, lv.optimizer_offload_ratio
    if lv.offload_params:  # DeepSpeed offload_param: one flat pinned buffer of the partition per rank
        persistent = sum(n for n in g.param_numels() if n <= PARAM_PERSISTENCE_ELEMS)
        t.add("params_bf16", 2 * persistent, G * pow2(2 * part),
              f"2·(params <= {PARAM_PERSISTENCE_ELEMS:.0e} elements, kept whole); host G·pow2(2·P/{w}) (offload_param:"
              f" stage3.py's flat pinned buffer)")
    else:
        t.add("params_bf16", 2 * part, 0, f"2·(P+A)/{w}" if z.lora else f"2·P/{w}")
    if off and ratio < 1:  # partial offload: DeepSpeed's sub-groups, the first ones on the GPU
        on_gpu, on_host = optimizer_split(g, W, ratio)
        share = f" (partial offload ratio {ratio}: {on_gpu / part_t:.2f} of the partition's sub-groups on GPU)"
    else:
        on_gpu, on_host, share = (0, part_t, "") if off else (part_t, 0, "")
    if off:  # DeepSpeed's pinned grad buffers, rounded (offload_pinned_grads)
        sub_elems = offload_sub_group_elems(g, W) if ratio < 1 else DS_SUB_GROUP_ELEMS  # as ds_config.py writes it
        pinned_bf16, pinned_fp32, n_groups = offload_pinned_grads(g, W, part_t, z.lora, sub_elems, ratio)
    for name, nbytes in (("grads_bf16", 2), ("master_fp32", 4), ("adam_m_v_fp32", 8)):
        if off and name == "grads_bf16":  # the whole partition's, on the host whatever the ratio
            t.add(name, 0, G * pinned_bf16, f"on host G·pow2(2·{Pt}/{w}) (pinned, the whole partition)")
            continue
        t.add(name, nbytes * on_gpu, G * nbytes * on_host, f"{nbytes}·{Pt}/{w}" + (
            f"; on host {nbytes}·{Pt}" + ("" if W == G else "·G/W") + share if off else ""))
    if off:
        t.add("cpu_adam_grads_fp32", 4 * on_gpu, G * pinned_fp32,
              f"host G·Σ pow2(4·sub-group) ({n_groups} at sub_group_size {sub_elems:.3g}, pinned"
              + ("; the GPU sub-groups' blocks freed and reused by the next pin" if on_gpu else "") + ")"
              + (" (the fp32 grads the optimizers step on: the GPU sub-groups' also on the GPU)" if on_gpu
                 else " (the fp32 grads DeepSpeedCPUAdam steps on)"))
    t.add("reduce_bucket", REDUCE_BUCKET_ELEMS * 2, 0, f"reduce_bucket_size({REDUCE_BUCKET_ELEMS:.0e})·2")
    # one rank (W = 1): ZeRO-3 has nothing to gather, a layer's params are views of the flat partition
    gather = W > 1 or lv.offload_params
    t.add("gathered_layers", live_layers * (g.layer_params + z.A_layer) * 2 * gather, 0,
          f"live_layers({live_layers})·" + ("(P_layer+A_layer)·2" if z.lora else "P_layer·2") + ("" if gather else
          " (0: one rank, nothing to gather)"))


def checkpoint_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The checkpointed layer inputs (on the GPU, or k of them in pinned host memory: torch rounds each block up to a
    power of two, our exact-size pool does not), the offloaded layer's GPU staging, the kept attention outputs of
    the placement's `cache` / `cache+offload` layers, rotary tables and token ids (phase all)."""
    G, E, L, k, T, d = z.G, z.E, z.g.layers, z.k, z.T, z.g.head_dim
    a = z.above_lin  # freed by the time the top linear layer runs its backward: not in its phases (LIN)
    kept = f"(L-k-{a})" if a else "(L-k)"
    if lv.pinned_pool:
        t.add("checkpoints", (L - k - a) * E, G * k * E, f"{kept}·T·H·2; host G·k·T·H·2, exact-size pool (k={k})")
    else:
        t.add("checkpoints", (L - k - a) * E, G * k * pow2(E), f"{kept}·T·H·2; host G·k·pow2(T·H·2) (k={k})")
    if a:
        t.add("checkpoints_above_linear", a * E, 0, f"{a}·T·H·2 (the layers above the top linear one)", PHASES)
    if k and lv.pinned_pool:  # restored on demand into one GPU tensor, freed after the layer's backward
        # Offloaded layers are the lowest (placement order), so when one runs its backward every layer kept on the
        # GPU has had its own and freed its checkpoint and cache: what an offloaded layer adds (POOLED_LAYER_UNITS·E,
        # and its restored cache when the top layer's kernel output is not already counted) only counts where it is
        # more than they held.
        kept = (L - k) * E + z.n_cache * z.cache_layer
        restored = POOLED_LAYER_UNITS * E + (z.cache_layer if z.n_cache_host and z.top_cached else 0)
        t.add("offload_staging", max(0, restored - kept), 0, f"max(0, {POOLED_LAYER_UNITS}·T·H·2 (+ its restored "
              f"cache) - what the kept layers held, freed by then) (our pool; {L - k} kept, {z.n_cache} cached on "
              f"the GPU)")
    elif k:  # DeepSpeed's offload engine: the input in use plus the engine's own GPU references
        t.add("offload_staging", 2 * E, 0, "2·T·H·2")
    t.add("rotary_cos_sin", T * d * 2 * 2, 0, "T·d·2·2")
    t.add("token_ids", 3 * T * 8, 0, "3·T·8")
    if z.n_cache or z.n_cache_host:
        host = G * z.n_cache_host * cache_region_bytes(1, z.S, z.hq_l, d, 2)
        c = z.above_lin_cached  # as the checkpoints above
        t.add("attention_cache", (z.n_cache - c) * z.cache_layer, host,
              f"n·(S·(hq/sp)·d·2 + (hq/sp)·S·4) (n={z.n_cache - c} cached on GPU"
              + ("; the top layer's is its attn_out_a2a + lse" if z.top_cached else "")
              + f"); host G·n_host·(the same + (hq/sp)·128·4 + 64 KiB), the pinned pool's regions "
                f"(n_host={z.n_cache_host})")
        if c:
            t.add("attention_cache_above_linear", c * z.cache_layer, 0,
                  f"{c}·(S·(hq/sp)·d·2 + (hq/sp)·S·4) (the layers above the top linear one)", PHASES)


def embed_loss_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The embedding's phase (embed) and the loss head's (loss): lm_head + cross-entropy, over row chunks
    (levers/chunked_loss.py) or whole (the backward of log_softmax holds three T x V fp32 tensors at once)."""
    V, H, E, T = z.g.vocab, z.g.hidden, z.E, z.T
    frozen = " (0: frozen, LoRA)" if z.lora else ""
    t.add("embedding_gathered", V * H * 2, 0, "V·H·2", ("embed",))
    t.add("embedding_grad_bf16", 0 if z.lora else V * H * 2, 0, "V·H·2" + frozen, ("embed",))
    t.add("embedding_out", E, 0, "T·H·2", ("embed",))
    t.add("lm_head_gathered", V * H * 2, 0, "V·H·2", ("loss",))
    t.add("lm_head_grad_bf16", 0 if z.lora else V * H * 2, 0, "V·H·2" + frozen, ("loss",))
    u_fn = COMPILED_FINAL_NORM_UNITS if z.compiled else 4
    t.add("final_norm", u_fn * E, 0, f"{u_fn}·T·H·2" + (" (compiled)" if z.compiled else ""), ("loss",))
    t.add("hidden_grad", E, 0, "T·H·2", ("loss",))
    if lv.chunked_loss:
        c = min(lv.loss_chunk_rows, T)
        t.add("loss_chunk_logits_fp32", c * V * 4, 0, f"c·V·4 (c={c})", ("loss",))
        t.add("loss_chunk_bf16", c * V * 2, 0, f"c·V·2 (c={c})", ("loss",))
        t.add("lm_head_grad_accum_fp32", 0 if z.lora else V * H * 4, 0, "V·H·4" + frozen, ("loss",))
    else:
        t.add("logits", T * V * 12, 0, "T·V·12", ("loss",))
        t.add("logits_bf16_block", T * V * 2, 0, "T·V·2", ("loss",))


def attention_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The top layer's backward (mlp_bwd and attn_bwd; the top layer is the worst: every on-GPU checkpoint is still
    live then): its grads, the hidden-size tensors (layer_units), the all-to-all buffers, the kernel's saved output,
    LSE and fp32 accumulators (per KV-head group with attn_bwd_head_groups)."""
    g, T, S, E, sp, d, hq_l, kv_l = z.g, z.T, z.S, z.E, z.sp, z.g.head_dim, z.hq_l, z.kv_l
    hq, hkv, tl = g.heads, g.kv_heads, lv.tiled_layer
    if g.tied_embeddings and not z.lora:
        # the lm_head grad (made in the loss forward) waits in autograd's input buffer for the embedding's
        # grad: a tied leaf's AccumulateGrad runs once, after its last use's backward (the embedding, last)
        t.add("tied_lm_head_grad_held", g.vocab * g.hidden * 2, 0, "V·H·2 (tied embeddings)",
              z.layer_phases(*LAYER) + ("embed",))
    # Each part's grads live in the phase of its own backward (ZeRO-3 moves them to its bucket right after)
    if z.lora:
        t.add("layer_grads_bf16", z.A_mlp * 2, 0, "A_mlp·2", z.layer_phases("mlp_bwd"))
        t.add("mixer_grads_bf16", (z.A_layer - z.A_mlp) * 2, 0, "(A_layer-A_mlp)·2", z.layer_phases("attn_bwd"))
    else:
        t.add("layer_grads_bf16", g.mlp_params * 2, 0, "P_mlp·2 (the MLP's, the second norm's)",
              z.layer_phases("mlp_bwd"))
        t.add("mixer_grads_bf16", g.mixer_params() * 2, 0, "P_mix·2 (q/k/v/o, the first norm's)", ("attn_bwd",))
        if g.hybrid is not None:
            t.add("lin_mixer_grads_bf16", g.mixer_params(LINEAR_ATTENTION) * 2, 0,
                  "P_lin·2 (the gated DeltaNet mixer's, the first norm's)", (LIN_MIX,))
    if z.lora:
        r = lv.lora_rank
        t.add("lora_saved", z.n_top * T * r * 2, 0, f"n·T·r·2 (n={z.n_top} adapted Linears, r={r})",
              z.layer_phases(*LAYER))
    u_mlp, u_attn = ((TILED_LAYER_UNITS_MLP_BWD, TILED_LAYER_UNITS_ATTN_BWD) if tl
                     else (COMPILED_UNITS_MLP_BWD, COMPILED_UNITS_ATTN_BWD) if z.compiled
                     else (HIDDEN_UNITS_MLP_BWD, HIDDEN_UNITS_ATTN_BWD))
    t.add("hidden_mlp_bwd", u_mlp * E, 0, f"{u_mlp}·T·H·2", z.layer_phases("mlp_bwd"))
    t.add("hidden_attn_bwd", u_attn * E, 0, f"{u_attn}·T·H·2", z.layer_phases("attn_bwd"))
    if g.hybrid is not None and g.hybrid.output_gate:  # sigmoid(gate) and the gated output o_proj saves; gate grad
        t.add("attn_output_gate", 2 * T * hq * d * 2, 0, "2·T·hq·d·2 (the output gate: sigmoid(gate), o_proj's input)",
              LAYER)
        t.add("attn_gate_grad", T * hq * d * 2, 0, "T·hq·d·2 (the gate half of q_proj's output grad)", ("attn_bwd",))
    if g.qk_norm and not tl:  # tiled: q/k norms run inside the q/k/v tiles
        c = COMPILED_QK_NORM_SAVED_COPIES if z.compiled else QK_NORM_SAVED_COPIES
        t.add("qk_norm_saved", c * T * (hq + hkv) * d * 2, 0, f"{c}·T·(hq+hkv)·d·2", LAYER)
    qkv_a2a = S * (hq_l + 2 * kv_l) * d * 2
    t.add("qkv_a2a", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", LAYER)
    t.add("qkv_a2a_grad", qkv_a2a, 0, f"S·(hq/sp+2·kv')·d·2 (kv'={kv_l})", ("attn_bwd",))
    # a cached top layer's kernel output and LSE are its cached ones (counted in attention_cache)
    t.add("attn_out_a2a", 0 if z.top_cached else S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", LAYER)
    t.add("attn_out_a2a_grad", S * hq_l * d * 2, 0, "S·(hq/sp)·d·2", ("attn_bwd",))
    t.add("softmax_lse_fp32", 0 if z.top_cached else hq_l * S * 4, 0, "(hq/sp)·S·4", LAYER)
    hg = lv.attn_bwd_head_groups  # the backward over hg groups of KV heads: one group's accumulators at a time
    per = "" if hg == 1 else f"/{hg}"
    t.add("attn_bwd_workspace", hq_l * S * (d + 1) * 4 // hg, 0, f"(hq/sp)·S·(d+1)·4{per}", ("attn_bwd",))
    kv_pre = max(hkv, sp)  # KV heads are repeated up to sp before the all-to-all when sp > hkv
    # After the kernel (sp > 1): q/k/v grads back through the all-to-all. Inside it, with grouped KV heads,
    # FlashAttention 4 accumulates dK / dV in fp32 per KV head (flash_attn/cute/interface.py's _flash_attn_bwd).
    # The term is the larger; at sp 1 there is no exchange.
    local = T * (hq + 2 * kv_pre) * d * 2 if sp > 1 else 0
    accum = 2 * kv_l * S * d * 4 // hg if hq_l > kv_l else 0
    t.add("qkv_local_grad", max(local, accum), 0, "max(T·(hq+2·max(hkv,sp))·d·2 if sp > 1, "
          f"2·kv'·S·d·4{per} if hq/sp > kv')", ("attn_bwd",))
    if hg > 1:  # each group's q/k/v grads, made by the kernel, then copied into the full ones
        t.add("attn_bwd_group_grads", qkv_a2a // hg, 0, f"S·(hq/sp+2·kv')·d·2/{hg}", ("attn_bwd",))
    # o_proj's saved input: the kernel's output itself at sp 1 (no exchange), counted in attn_out_a2a or the cache
    t.add("attn_out_local", T * hq * d * 2 * (sp > 1), 0, "T·hq·d·2" + ("" if sp > 1 else " (0 at sp 1)"),
          ("mlp_bwd",))


def mlp_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The top layer's token-wise work in its backward: the MLP whole (its saved intermediate-width tensors and
    grads) or in tiles of t tokens (tiled_mlp; with tiled_layer the q/k/v projections and norms tiled too, their fp32
    weight-grad sums beside the tiles); a mixture of experts' sparse block: plan/moe_terms.py."""
    g, T, tl = z.g, z.T, lv.tiled_layer
    if top_layer_sparse(g):  # a mixture of experts' sparse block (plan/moe_terms.py)
        moe_terms(t, z, lv)
        return
    H, inter, d, hq, hkv = g.hidden, g.intermediate, g.head_dim, g.heads, g.kv_heads
    tile = min(lv.tile_tokens or H, T)  # the tile of the tiled MLP / tiled layer
    if tl:
        # the q/k/v tiles' backward: one tile's norm / projections / rotary with their grads, and the fp32 sums
        # of the attention-side weight grads (o_proj's is an ordinary Linear's); q, k and v are three outputs,
        # so their grads (qkv_local_grad) go in as they are, never joined into one buffer
        t.add("qkv_tile", tile * (6 * H + 4 * (hq + 2 * hkv) * d) * 2, 0, f"t·(6·H+4·(hq+2·hkv)·d)·2 (t={tile})",
              ("attn_bwd",))
        t.add("qkv_tile_wgrad_fp32", (hq + 2 * hkv) * d * H * 4 * (T > tile), 0, "(hq+2·hkv)·d·H·4 if T > t",
              ("attn_bwd",))
    if lv.tiled_mlp or tl:
        t.add("mlp_tile", 6 * tile * inter * 2, 0, f"6·t·I·2 (t={tile})", z.layer_phases("mlp_bwd"))
        t.add("mlp_tile_hidden", (6 if tl else 2) * tile * H * 2, 0, f"{6 if tl else 2}·t·H·2 (t={tile}"
              + ("; the post-attention norm in the tile" if tl else "") + ")", z.layer_phases("mlp_bwd"))
        t.add("mlp_tile_wgrad_fp32", (z.A_mlp if z.lora else 3 * H * inter) * 4 * (T > tile), 0,
              ("A_mlp" if z.lora else "3·H·I") + "·4 if T > t", z.layer_phases("mlp_bwd"))
    else:
        m = COMPILED_MLP_SAVED if z.compiled else 4
        t.add("mlp_saved", m * T * inter * 2, 0, f"{m}·T·I·2", z.layer_phases("mlp_bwd"))
        t.add("mlp_grads", 2 * T * inter * 2, 0, "2·T·I·2", z.layer_phases("mlp_bwd"))


def host_terms(t: Terms, z: Sizes, lv: Levers, process_host_gib: float, build_host_gib: float) -> None:
    """The host beyond the partitions and checkpoints: each rank's steady process memory and dataset row (all), and
    while the engine is built (build) its process and ZeRO-3's init copies (`defragment` in
    deepspeed/runtime/zero/utils.py; with offload_params zero.Init's unpinned partitions beside the flat pinned buffer
    they move into)."""
    G, w, part = z.G, z.w, z.part
    gib = 2 ** 30
    t.add("process_overhead", 0, round(G * process_host_gib * gib), f"G·{process_host_gib:g} GiB")
    t.add("dataset_row", 0, G * z.S * 16, "G·S·2·8")
    t.add("build_process", 0, round(G * build_host_gib * gib), f"G·{build_host_gib:g} GiB", BUILD)
    if lv.offload_params:
        t.add("zero3_offload_param_build", 0, G * (2 * part + pow2(2 * part)), f"G·(2·P/{w} + pow2(2·P/{w}))", BUILD)
    else:
        t.add("zero3_defragment_cpu", 0, 2 * z.part_t * G, f"2·{'A' if z.lora else 'P'}/{w} per rank", BUILD)
