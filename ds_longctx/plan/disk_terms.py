"""The disk tier's memory terms (bytes on a node's nvme_path) and the seconds its I/O costs a step.

checkpoint_term(t, z, kept, a)     # disk layers' checkpoints on disk, two bounce buffers on host
nvme_state_term(t, z, name, ...)   # ZeRO-Infinity's optimizer state on disk, swap buffers on host
disk_seconds(plan, bandwidth)      # (checkpoint s, optimizer s, line) of one step's disk I/O
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ds_longctx.parallel.direct_io import Bandwidth
from ds_longctx.plan.zero_buffers import PARAM_PERSISTENCE_ELEMS

# the disk tier's pinned buffers per rank: one checkpoint being written, one read ahead
# (levers/disk_tier.py)
DISK_BOUNCE_BUFFERS = 2
# ZeRO-Infinity's swap buffers as plan/ds_config.py writes them (offload_optimizer / offload_param:
# nvme)
NVME_SUB_GROUP_ELEMS = 10**8
NVME_OPTIMIZER_BUFFERS = 4
NVME_PARAM_BUFFERS = 5
NVME_PARAM_BUFFER_ELEMS = 10**8
# a layer's forward in a step that recomputes it: forward, recompute, backward (~2 forwards)
FORWARD_SHARE = 0.25


def checkpoint_term(t, z, kept: str, a: int) -> None:
    """The checkpoints with some on disk: the GPU's and host's as the pool's, each disk layer's in a
    scratch file, and DISK_BOUNCE_BUFFERS pinned buffers per rank."""
    G, E, L, k, n = z.G, z.E, z.g.layers, z.k, z.n_disk
    t.add(
        "checkpoints",
        (L - k - a) * E,
        G * (k - n) * E,
        f"{kept}·T·H·2; host G·(k-n_disk)·T·H·2, exact-size pool; disk G·n_disk·T·H·2 (k={k}, "
        f"n_disk={n})",
        disk=G * n * E,
    )
    t.add(
        "disk_bounce_buffers",
        0,
        G * DISK_BOUNCE_BUFFERS * E,
        f"host G·{DISK_BOUNCE_BUFFERS}·T·H·2 (pinned: one written, one read ahead)",
    )


def onto_nvme(t, z, lv, on_host: int) -> None:
    """Replace the host's optimizer state (nvme_optimizer) and parameter (nvme_params) terms in `t`
    by their ZeRO-Infinity forms: the bytes on disk, pinned swap buffers on the host."""
    G, w, Pt = z.G, z.w, "A" if z.lora else "P"
    new = {}
    if lv.optimizer_offload and lv.nvme_optimizer:
        for name, nbytes in (("master_fp32", 4), ("adam_m_v_fp32", 8), ("cpu_adam_grads_fp32", 4)):
            host, formula = 0, f"disk {nbytes}·{Pt}/{w} per rank (offload_optimizer: nvme)"
            if name == "cpu_adam_grads_fp32":
                host = G * NVME_OPTIMIZER_BUFFERS * NVME_SUB_GROUP_ELEMS * 4
                formula += (
                    f"; host G·{NVME_OPTIMIZER_BUFFERS}·{NVME_SUB_GROUP_ELEMS:.0e}·4 (swap buffers)"
                )
            new[name] = (0, host, formula, G * nbytes * on_host)
    if lv.offload_params and lv.nvme_params:
        persistent = sum(n for n in z.g.param_numels() if n <= PARAM_PERSISTENCE_ELEMS)
        new["params_bf16"] = (
            2 * persistent,
            G * NVME_PARAM_BUFFERS * NVME_PARAM_BUFFER_ELEMS * 2,
            f"2·(params <= {PARAM_PERSISTENCE_ELEMS:.0e} elements); host G·{NVME_PARAM_BUFFERS}·"
            f"{NVME_PARAM_BUFFER_ELEMS:.0e}·2 (swap buffers); disk G·2·P/{w} (offload_param: nvme)",
            G * 2 * z.part,
        )
    for i, term in enumerate(t):
        if term.name in new:
            gpu, host, formula, disk = new[term.name]
            t[i] = replace(term, gpu_bytes=gpu, host_bytes=host, formula=formula, disk_bytes=disk)


def disk_seconds(
    plan, bandwidth: Bandwidth, compute_s: Optional[float] = None, layers_s: Optional[float] = None
) -> tuple:
    """(checkpoint I/O seconds, optimizer and parameter I/O seconds, one line) of one step on one
    node: each disk checkpoint written once and read once, the optimizer state read and written in
    the step, the parameters read in forward and backward. The node's ranks share its disk.
    With `compute_s` the line predicts the step: a disk layer's write overlaps the next layer's
    forward, its read the layer above's backward (one buffer each, levers/disk_tier.py); only what
    a layer's I/O takes beyond a layer's compute (`layers_s` / layers, default `compute_s`;
    FORWARD_SHARE of it forward) adds."""
    ckpt = sum(t.disk_bytes for t in plan.terms if t.name == "checkpoints")
    params = sum(t.disk_bytes for t in plan.terms if t.name == "params_bf16")
    opt = plan.disk_bytes - ckpt - params
    write_s, read_s = ckpt / bandwidth.write_bytes_s, ckpt / bandwidth.read_bytes_s
    other_s = opt / bandwidth.write_bytes_s + (opt + 2 * params) / bandwidth.read_bytes_s
    line = (
        f"disk per step: {(ckpt + opt) / 1e9:,.1f} GB written, "
        f"{(ckpt + opt + 2 * params) / 1e9:,.1f} GB "
        f"read; checkpoints ~{write_s + read_s:.1f} s (overlapping compute), optimizer/parameters "
        f"~{other_s:.1f} s, at {bandwidth.describe()}"
    )
    if compute_s is not None:
        n = plan.placement.on_disk
        layer_s = (compute_s if layers_s is None else layers_s) / plan.geom.layers
        exposed = 0.0
        if n:
            fwd, bwd = FORWARD_SHARE * layer_s, (1 - FORWARD_SHARE) * layer_s
            exposed = n * (max(0.0, write_s / n - fwd) + max(0.0, read_s / n - bwd))
        line += (
            f"; predicted step with the disk: {compute_s + exposed + other_s:.1f} s (compute "
            f"{compute_s:.1f} s, checkpoint I/O not hidden {exposed:.1f} s)"
        )
    return write_s + read_s, other_s, line
