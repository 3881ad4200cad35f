"""The terms of one training step's memory, phase by phase: what `planner.plan_memory` sums.

Each builder appends `Term`s (bytes per GPU, bytes on one node's host, the formula printed in the
plan's table, the phases the term is live in) for one part of the step, reading the sizes of `Sizes`
(the legend of plan/planner.py). The order in which they are appended is the order of the printed
table. The top layer's backward (attention and MLP) has its own builders: plan/layer_terms.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_longctx.levers.offload import cache_region_bytes
from ds_longctx.levers.placement import Place, PlacementPlan
from ds_longctx.parallel import parallel_state
from ds_longctx.plan import disk_terms
from ds_longctx.plan.adapter_counts import adapter_counts
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.layer_units import COMPILED_FINAL_NORM_UNITS, POOLED_LAYER_UNITS
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.moe_geometry import lora_problem
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
# a hybrid model's top gated DeltaNet layer: its MLP backward, its post-attention norm's, its token
# mixing's (plan/linear_terms.py)
LIN_MLP, LIN_NORM, LIN_MIX = "lin_mlp_bwd", "lin_norm_bwd", "lin_bwd"
LIN = (LIN_MLP, LIN_NORM, LIN_MIX)
BUILD = ("build",)  # host only: while the engine is built, never at the same time as a step


@dataclass(frozen=True)
class Term:
    """One named allocation: bytes per GPU, on the host (one node's total), formula, live phases."""

    name: str
    gpu_bytes: int
    host_bytes: int
    formula: str
    phases: tuple = ALL
    disk_bytes: int = 0  # one node's bytes on its nvme_path (the disk tier)


class Terms(list):
    """The terms of one plan, in table order."""

    def add(self, name: str, gpu, host, formula: str, phases: tuple = ALL, disk=0) -> None:
        self.append(Term(name, int(gpu), int(host), formula, phases, int(disk)))


@dataclass(frozen=True)
class Sizes:
    """The legend's quantities of one plan (plan/planner.py), in elements, tokens or bytes."""

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
    k: int  # layers whose checkpoint leaves the GPU (host or disk)
    n_cache: int  # layers whose attention output is kept on the GPU
    n_cache_host: int  # ... in pinned host memory
    top_cached: bool  # the top layer keeps its attention output on the GPU
    compiled: bool  # the token-wise ops are compiled (fused_ops auto or compile: a GPU run)
    above_lin: int = 0  # a hybrid's layers above its top linear one, checkpoint on the GPU
    above_lin_cached: int = 0  # ... of them, those keeping their attention output on the GPU
    n_disk: int = 0  # of the k, those on disk

    @property
    def phases(self) -> tuple:
        """The transient phases of this model's step: PHASES, and a hybrid's linear ones (LIN)."""
        return PHASES + (LIN if self.g.hybrid is not None else ())

    def layer_phases(self, *phases: str) -> tuple:
        """`phases` of the full-attention layer, and a hybrid model's matching linear-layer phases:
        for the terms every decoder layer holds (its grads, norms, MLP). A term held through both
        the MLP's and the mixer's backward is held through the norm's between them."""
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
    """(A, A_layer, A_mlp, n): adapter params in all, in the top layer, in its MLP; adapted Linears
    in it."""
    if not rank:
        return 0, 0, 0, 0
    if problem := lora_problem(g.moe, g.layers, targets):
        raise ValueError(problem)
    return adapter_counts(g, rank, targets if isinstance(targets, str) else tuple(targets))


def sizes(
    g: ModelGeometry,
    seq_len: int,
    gpus: int,
    sp: int,
    levers: Levers,
    nodes: int,
    placement: PlacementPlan,
) -> Sizes:
    """The legend's quantities of a checked request (plan_memory checks it) and its placement."""
    S = -(-seq_len // sp) * sp
    T = S // sp
    A, A_layer, A_mlp, n_top = adapters(g, levers.lora_rank, levers.lora_targets)
    # layers above a hybrid's top linear one run their backward (freeing checkpoints) before it
    top_lin = max(
        (i for i, full in enumerate(g.attention_layers or ()) if not full), default=g.layers
    )
    above = placement.layers[top_lin + 1 :]
    return Sizes(
        g=g,
        G=gpus,
        W=nodes * gpus,
        w="G" if nodes == 1 else "W",
        sp=sp,
        S=S,
        T=T,
        E=T * g.hidden * 2,
        hq_l=g.heads // sp,
        kv_l=parallel_state.local_kv_heads(g.kv_heads, sp),
        A=A,
        A_layer=A_layer,
        A_mlp=A_mlp,
        n_top=n_top,
        k=placement.off_gpu,
        n_cache=placement.count(Place.CACHE),
        n_cache_host=placement.count(Place.CACHE_OFFLOAD),
        top_cached=placement[g.layers - 1] == Place.CACHE,
        # a hybrid's zero-centred norms are not among the fused ops (levers/fused_ops.py): eager
        compiled=levers.fused_ops in ("auto", "compile") and g.hybrid is None,
        above_lin=sum(p in (Place.KEEP, Place.CACHE) for p in above),
        above_lin_cached=sum(p == Place.CACHE for p in above),
        n_disk=placement.on_disk,
    )


def zero3_terms(t: Terms, z: Sizes, lv: Levers, live_layers: int) -> None:
    """ZeRO-3's partitioned parameters, gradients and optimizer state (phase all), and the gathered
    layers. LoRA: only the adapters train (P_t = A)."""
    G, W, w, g = z.G, z.W, z.w, z.g
    part, part_t, Pt = z.part, z.part_t, "A" if z.lora else "P"
    off, ratio = lv.optimizer_offload, lv.optimizer_offload_ratio
    if lv.offload_params:
        persistent = sum(n for n in g.param_numels() if n <= PARAM_PERSISTENCE_ELEMS)
        t.add(
            "params_bf16",
            2 * persistent,
            G * pow2(2 * part),
            f"2·(params <= {PARAM_PERSISTENCE_ELEMS:.0e} elements, kept whole); host "
            f"G·pow2(2·P/{w}) (offload_param: stage3.py's flat pinned buffer)",
        )
    else:
        t.add("params_bf16", 2 * part, 0, f"2·(P+A)/{w}" if z.lora else f"2·P/{w}")
    if off and ratio < 1:
        on_gpu, on_host = optimizer_split(g, W, ratio)
        share = (
            f" (partial offload ratio {ratio}: {on_gpu / part_t:.2f} of the partition's sub-groups "
            "on GPU)"
        )
    else:
        on_gpu, on_host, share = (0, part_t, "") if off else (part_t, 0, "")
    if off:
        sub_elems = offload_sub_group_elems(g, W) if ratio < 1 else DS_SUB_GROUP_ELEMS
        pinned_bf16, pinned_fp32, n_groups = offload_pinned_grads(
            g, W, part_t, z.lora, sub_elems, ratio
        )
    for name, nbytes in (("grads_bf16", 2), ("master_fp32", 4), ("adam_m_v_fp32", 8)):
        if off and name == "grads_bf16":  # the whole partition's, on the host whatever the ratio
            t.add(
                name,
                0,
                G * pinned_bf16,
                f"on host G·pow2(2·{Pt}/{w}) (pinned, the whole partition)",
            )
            continue
        t.add(
            name,
            nbytes * on_gpu,
            G * nbytes * on_host,
            f"{nbytes}·{Pt}/{w}"
            + (f"; on host {nbytes}·{Pt}" + ("" if W == G else "·G/W") + share if off else ""),
        )
    if off:
        t.add(
            "cpu_adam_grads_fp32",
            4 * on_gpu,
            G * pinned_fp32,
            f"host G·Σ pow2(4·sub-group) ({n_groups} at sub_group_size {sub_elems:.3g}, pinned"
            + ("; the GPU sub-groups' blocks freed and reused by the next pin" if on_gpu else "")
            + ")"
            + (
                " (the fp32 grads the optimizers step on: the GPU sub-groups' also on the GPU)"
                if on_gpu
                else " (the fp32 grads DeepSpeedCPUAdam steps on)"
            ),
        )
    disk_terms.onto_nvme(t, z, lv, on_host)  # ZeRO-Infinity: what nvme_optimizer / nvme_params move
    t.add(
        "reduce_bucket",
        REDUCE_BUCKET_ELEMS * 2,
        0,
        f"reduce_bucket_size({REDUCE_BUCKET_ELEMS:.0e})·2",
    )
    # one rank (W = 1): nothing to gather, a layer's params are views of the flat partition
    gather = W > 1 or lv.offload_params
    t.add(
        "gathered_layers",
        live_layers * (g.layer_params + z.A_layer) * 2 * gather,
        0,
        f"live_layers({live_layers})·"
        + ("(P_layer+A_layer)·2" if z.lora else "P_layer·2")
        + ("" if gather else " (0: one rank, nothing to gather)"),
    )


def checkpoint_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The checkpointed layer inputs, the offloaded layer's GPU staging, the kept attention outputs,
    rotary tables and token ids (phase all)."""
    G, E, L, k, T, d = z.G, z.E, z.g.layers, z.k, z.T, z.g.head_dim
    # freed by the time the top linear layer runs its backward: not in its phases (LIN)
    a = z.above_lin
    kept = f"(L-k-{a})" if a else "(L-k)"
    if z.n_disk:
        disk_terms.checkpoint_term(t, z, kept, a)
    elif lv.pinned_pool:
        t.add(
            "checkpoints",
            (L - k - a) * E,
            G * k * E,
            f"{kept}·T·H·2; host G·k·T·H·2, exact-size pool (k={k})",
        )
    else:
        t.add(
            "checkpoints",
            (L - k - a) * E,
            G * k * pow2(E),
            f"{kept}·T·H·2; host G·k·pow2(T·H·2) (k={k})",
        )
    if a:
        t.add(
            "checkpoints_above_linear",
            a * E,
            0,
            f"{a}·T·H·2 (the layers above the top linear one)",
            PHASES,
        )
    # restored on demand into one GPU tensor, freed after the layer's backward
    if k and lv.pinned_pool:
        # counts only beyond what the kept layers held (docs/design/plan.md, memory terms)
        kept = (L - k) * E + z.n_cache * z.cache_layer
        restored = POOLED_LAYER_UNITS * E + (
            z.cache_layer if z.n_cache_host and z.top_cached else 0
        )
        t.add(
            "offload_staging",
            max(0, restored - kept),
            0,
            f"max(0, {POOLED_LAYER_UNITS}·T·H·2 (+ its restored "
            f"cache) - what the kept layers held, freed by then) (our pool; {L - k} kept, "
            f"{z.n_cache} cached on the GPU)",
        )
    elif k and z.n_disk == k:  # the disk tier's: one restored at a time, as the pool's
        t.add("offload_staging", E, 0, "T·H·2 (the disk tier's restored input)")
    elif k:  # DeepSpeed's offload engine: the input in use plus the engine's own GPU references
        t.add("offload_staging", 2 * E, 0, "2·T·H·2")
    t.add("rotary_cos_sin", T * d * 2 * 2, 0, "T·d·2·2")
    t.add("token_ids", 3 * T * 8, 0, "3·T·8")
    if z.n_cache or z.n_cache_host:
        host = G * z.n_cache_host * cache_region_bytes(1, z.S, z.hq_l, d, 2)
        c = z.above_lin_cached  # as the checkpoints above
        t.add(
            "attention_cache",
            (z.n_cache - c) * z.cache_layer,
            host,
            f"n·(S·(hq/sp)·d·2 + (hq/sp)·S·4) (n={z.n_cache - c} cached on GPU"
            + ("; the top layer's is its attn_out_a2a + lse" if z.top_cached else "")
            + f"); host G·n_host·(the same + (hq/sp)·128·4 + 64 KiB), the pinned pool's regions "
            f"(n_host={z.n_cache_host})",
        )
        if c:
            t.add(
                "attention_cache_above_linear",
                c * z.cache_layer,
                0,
                f"{c}·(S·(hq/sp)·d·2 + (hq/sp)·S·4) (the layers above the top linear one)",
                PHASES,
            )


def embed_loss_terms(t: Terms, z: Sizes, lv: Levers) -> None:
    """The embedding's phase (embed) and the loss head's (loss): lm_head + cross-entropy, over row
    chunks (levers/chunked_loss.py) or whole (the backward of log_softmax holds three T x V fp32
    tensors at once)."""
    V, H, E, T = z.g.vocab, z.g.hidden, z.E, z.T
    frozen = " (0: frozen, LoRA)" if z.lora else ""
    t.add("embedding_gathered", V * H * 2, 0, "V·H·2", ("embed",))
    t.add("embedding_grad_bf16", 0 if z.lora else V * H * 2, 0, "V·H·2" + frozen, ("embed",))
    t.add("embedding_out", E, 0, "T·H·2", ("embed",))
    t.add("lm_head_gathered", V * H * 2, 0, "V·H·2", ("loss",))
    t.add("lm_head_grad_bf16", 0 if z.lora else V * H * 2, 0, "V·H·2" + frozen, ("loss",))
    u_fn = COMPILED_FINAL_NORM_UNITS if z.compiled else 4
    t.add(
        "final_norm",
        u_fn * E,
        0,
        f"{u_fn}·T·H·2" + (" (compiled)" if z.compiled else ""),
        ("loss",),
    )
    t.add("hidden_grad", E, 0, "T·H·2", ("loss",))
    if lv.chunked_loss:
        c = min(lv.loss_chunk_rows, T)
        t.add("loss_chunk_logits_fp32", c * V * 4, 0, f"c·V·4 (c={c})", ("loss",))
        t.add("loss_chunk_bf16", c * V * 2, 0, f"c·V·2 (c={c})", ("loss",))
        t.add("lm_head_grad_accum_fp32", 0 if z.lora else V * H * 4, 0, "V·H·4" + frozen, ("loss",))
    else:
        t.add("logits", T * V * 12, 0, "T·V·12", ("loss",))
        t.add("logits_bf16_block", T * V * 2, 0, "T·V·2", ("loss",))


def host_terms(
    t: Terms, z: Sizes, lv: Levers, process_host_gib: float, build_host_gib: float
) -> None:
    """The host beyond the partitions and checkpoints: each rank's process and dataset row (all),
    and during the engine build its process and ZeRO-3's init copies (build)."""
    G, w, part = z.G, z.w, z.part
    gib = 2**30
    t.add("process_overhead", 0, round(G * process_host_gib * gib), f"G·{process_host_gib:g} GiB")
    t.add("dataset_row", 0, G * z.S * 16, "G·S·2·8")
    t.add("build_process", 0, round(G * build_host_gib * gib), f"G·{build_host_gib:g} GiB", BUILD)
    if lv.offload_params:
        t.add(
            "zero3_offload_param_build",
            0,
            G * (2 * part + pow2(2 * part)),
            f"G·(2·P/{w} + pow2(2·P/{w}))",
            BUILD,
        )
    else:
        t.add(
            "zero3_defragment_cpu",
            0,
            2 * z.part_t * G,
            f"2·{'A' if z.lora else 'P'}/{w} per rank",
            BUILD,
        )
