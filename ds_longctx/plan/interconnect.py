"""A step's communication time from the bytes a rank hands to its collectives, and the step time
it predicts. Pure arithmetic. Bytes come from a rehearsal (`parallel/fake_world.py`), links from
`LINKS` (or `--link_gbps` / `--internode_gbps`); GB/s is 1e9 bytes per second each way per GPU.
Per-collective bytes and the overlap rule: docs/design/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass

GBS = 1e9  # bytes per second in one GB/s


@dataclass(frozen=True)
class Link:
    name: str
    gb_per_s: float  # per GPU, each way, what a collective achieves
    source: str  # where the figure comes from


# NVLink: all_to_all_single measured on two H200s. InfiniBand: one NIC per GPU, assumed.
LINKS = {
    "nvlink-h100": Link(
        "nvlink-h100", 327.0, "NVLink 4: all_to_all measured on 2 x H200 (same NVLink generation)"
    ),
    "nvlink-h200": Link("nvlink-h200", 327.0, "NVLink 4: all_to_all measured on 2 x H200"),
    "ib-ndr400": Link(
        "ib-ndr400", 45.0, "InfiniBand NDR 400 Gb/s per GPU at 90% of line rate (assumed)"
    ),
    "ib-hdr200": Link(
        "ib-hdr200", 22.5, "InfiniBand HDR 200 Gb/s per GPU at 90% of line rate (assumed)"
    ),
}
DEFAULT_INTERNODE = "ib-ndr400"
OVERLAP = (
    "all-to-all serial (on the attention's critical path); ZeRO all-gather and reduce-scatter "
    "overlapped "
    "with compute (only their excess over the compute adds); all-reduce and broadcast serial"
)


def intra_link_for(gpu_mem_gb: float | None) -> str:
    """The NVLink row for a GPU of this size: nvlink-h200 above 100 GB (141 GB H200), else
    nvlink-h100."""
    return "nvlink-h200" if gpu_mem_gb and gpu_mem_gb > 100 else "nvlink-h100"


def link_from_gbps(name: str, gbps: float) -> Link:
    """A link given in Gbit/s on the command line (e.g. --link_gbps 3600 for 450 GB/s)."""
    if not 0 < gbps < float("inf"):
        raise ValueError(
            f"{name} {gbps:g}: give the link's rate in Gbit/s per GPU each way, e.g. 400"
        )
    return Link(f"{gbps:g} Gbit/s", gbps / 8, f"{name} {gbps:g} (given)")


def sent_bytes(kind: str, payload: int, n: int) -> float:
    """Bytes one rank of an n-rank group sends for one payload of `payload` bytes (module
    docstring)."""
    if n <= 1:
        return 0.0
    if kind in ("all_to_all", "all_gather", "reduce_scatter"):
        return (n - 1) / n * payload
    if kind == "all_reduce":
        return 2 * (n - 1) / n * payload
    return float(payload)  # broadcast, barrier (0 bytes)


def collective_seconds(
    kind: str, payload: int, ranks: tuple, rank: int, per_node: int, intra: Link, inter: Link
) -> tuple[float, float]:
    """(seconds, bytes sent to other nodes) of `payload` bytes of `kind` over the global `ranks`,
    seen by `rank`."""
    n = len(ranks)
    node = rank // per_node
    n_node = sum(1 for r in ranks if r // per_node == node)
    sent = sent_bytes(kind, payload, n)
    if n_node == n:  # inside one node
        return sent / (intra.gb_per_s * GBS), 0.0
    if kind == "all_to_all":
        inside, outside = (n_node - 1) / n * payload, (n - n_node) / n * payload
        return max(inside / (intra.gb_per_s * GBS), outside / (inter.gb_per_s * GBS)), outside
    slow = min(intra.gb_per_s, inter.gb_per_s)
    return sent / (slow * GBS), sent


@dataclass(frozen=True)
class Prediction:
    compute_seconds: float
    comm_seconds: dict  # kind -> seconds over a step
    cross_node_bytes: float  # bytes this rank sends to other nodes per step
    seconds: float  # the predicted step, with OVERLAP
    no_overlap_seconds: float

    def breakdown(self) -> str:
        zero = self.comm_seconds.get("all_gather", 0.0) + self.comm_seconds.get(
            "reduce_scatter", 0.0
        )
        serial = sum(
            v for k, v in self.comm_seconds.items() if k not in ("all_gather", "reduce_scatter")
        )
        exposed = max(0.0, zero - self.compute_seconds)
        return (
            f"{self.seconds:.1f} s = compute {self.compute_seconds:.1f} + all-to-all and small "
            "collectives "
            f"{serial:.2f} (serial) + ZeRO all-gather/reduce-scatter {exposed:.2f} exposed of "
            f"{zero:.2f} (overlapped); nothing overlapped: {self.no_overlap_seconds:.1f} s"
        )


def predict(
    compute_seconds: float, payloads: dict, rank: int, per_node: int, intra: Link, inter: Link
) -> Prediction:
    """The step time from the measured compute and the step's payloads {(kind, ranks): bytes}."""
    comm: dict = {}
    cross = 0.0
    for (kind, ranks), payload in payloads.items():
        seconds, outside = collective_seconds(kind, payload, ranks, rank, per_node, intra, inter)
        comm[kind] = comm.get(kind, 0.0) + seconds
        cross += outside
    zero = comm.get("all_gather", 0.0) + comm.get("reduce_scatter", 0.0)
    serial = sum(v for k, v in comm.items() if k not in ("all_gather", "reduce_scatter"))
    seconds = compute_seconds + serial + max(0.0, zero - compute_seconds)
    return Prediction(compute_seconds, comm, cross, seconds, compute_seconds + serial + zero)
