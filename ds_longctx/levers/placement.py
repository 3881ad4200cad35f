"""The per-layer placement plan: where each decoder layer keeps what its backward needs. One value,
one home.

    plan = resolve_placement(offload_layers="auto", attention_cache_layers=2, checkpointing=True,
                             placement=None, num_layers=36, auto_offload=lambda: 30)
    plan.spec()        # 'offload:30,keep:4,cache:2'   (what plan.txt and the engine's log print)

Design notes: docs/design/levers.md, section `placement.py`.
"""

from __future__ import annotations

# config/ and plan/ import this module, and `ds-longctx plan` runs without torch.
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Union

Count = Union[int, str]  # an int, or "all" / "auto" where the field allows it


class Place(str, Enum):
    KEEP = "keep"
    OFFLOAD = "offload"
    CACHE = "cache"
    CACHE_OFFLOAD = "cache+offload"
    DISK = "disk"
    NONE = "none"


ON_HOST = (Place.OFFLOAD, Place.CACHE_OFFLOAD)  # the layer's checkpoint lives in host memory
ON_DISK = (Place.DISK,)  # ... in a scratch file under memory.nvme_path (levers/disk_tier.py)
OFF_GPU = ON_HOST + ON_DISK
CACHED = (Place.CACHE, Place.CACHE_OFFLOAD)  # the layer's attention output is kept
CHECKPOINTED = (Place.KEEP, Place.OFFLOAD, Place.CACHE, Place.CACHE_OFFLOAD, Place.DISK)
NOT_YET: dict = {}  # placements named but not built yet: {Place: why}


@dataclass(frozen=True)
class PlacementPlan:
    """One `Place` per decoder layer. Validated on construction (`check_layers`)."""

    layers: tuple

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(Place(p) for p in self.layers))
        check_layers(self.layers)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_counts(
        cls,
        num_layers: int,
        offload: int = 0,
        cache: int = 0,
        checkpointing: bool = True,
        cacheable: Optional[tuple] = None,
        disk: int = 0,
    ) -> "PlacementPlan":
        """The first `offload` layers offloaded (the first `disk` of them to disk), the last `cache`
        cached, the rest kept (`none` everywhere without checkpointing). More:
        docs/design/levers.md."""
        if not checkpointing:
            return cls((Place.NONE,) * num_layers)
        if offload + cache > num_layers or min(offload, cache) < 0:
            raise ValueError(
                f"offload={offload} + cache={cache} layers do not fit {num_layers} layers"
            )
        if not 0 <= disk <= offload:
            raise ValueError(f"disk={disk} layers must be among the offload={offload} offloaded")
        places = (
            [Place.DISK] * disk
            + [Place.OFFLOAD] * (offload - disk)
            + [Place.KEEP] * (num_layers - offload)
        )
        can = [i for i in range(offload, num_layers) if cacheable is None or cacheable[i]]
        if cache > len(can):
            raise ValueError(
                f"attention_cache_layers={cache}: only {len(can)} layers after the {offload} "
                "offloaded "
                "have softmax attention (the attention cache keeps their output); use at most "
                f"{len(can)}"
            )
        for i in can[len(can) - cache :]:
            places[i] = Place.CACHE
        return cls(tuple(places))

    @classmethod
    def parse(cls, spec: str) -> "PlacementPlan":
        """`offload:30,keep:4,cache:2` (run lengths) or `offload,keep,cache` (one entry per layer),
        or a mix."""
        out = []
        for part in (p.strip() for p in str(spec).split(",")):
            name, _, n = part.partition(":")
            try:
                place = Place(name.strip())
            except ValueError:
                raise ValueError(
                    f"placement={spec!r}: {name.strip()!r} is not a placement; use "
                    f"{[p.value for p in Place]}, e.g. 'offload:30,keep:6'"
                ) from None
            if n and (not n.strip().isdigit() or int(n) < 1):
                raise ValueError(
                    f"placement={spec!r}: {part!r} needs a positive layer count after ':', "
                    f"e.g. 'offload:30'"
                )
            out += [place] * (int(n) if n else 1)
        return cls(tuple(out))

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Place:
        return self.layers[i]

    def indices(self, *places: Place) -> list:
        return [i for i, p in enumerate(self.layers) if p in places]

    def count(self, *places: Place) -> int:
        return sum(p in places for p in self.layers)

    @property
    def offloaded(self) -> int:
        """Layers whose checkpoint lives in host memory."""
        return self.count(*ON_HOST)

    @property
    def on_disk(self) -> int:
        """Layers whose checkpoint lives on disk."""
        return self.count(*ON_DISK)

    @property
    def off_gpu(self) -> int:
        """Layers whose checkpoint leaves the GPU (host or disk)."""
        return self.count(*OFF_GPU)

    @property
    def cached(self) -> int:
        """Layers that keep their attention output (the recompute skips attention)."""
        return self.count(*CACHED)

    @property
    def checkpointed(self) -> bool:
        return self.layers[0] != Place.NONE

    def spec(self) -> str:
        """Run-length form, parseable by `parse`: 'offload:30,keep:4,cache:2'."""
        runs: list = []
        for p in self.layers:
            if runs and runs[-1][0] == p:
                runs[-1][1] += 1
            else:
                runs.append([p, 1])
        return ",".join(f"{p.value}:{n}" for p, n in runs)

    def describe(self) -> str:
        """One line for logs and plan.txt: the spec and the layer ranges."""
        ranges, start = [], 0
        for part in self.spec().split(","):
            name, n = part.split(":")
            end = start + int(n) - 1
            ranges.append(f"{start}-{end} {name}" if end > start else f"{start} {name}")
            start = end + 1
        return f"{self.spec()} (layers {', '.join(ranges)})"


def check_layers(layers: tuple) -> None:
    """Rules on a whole plan: not empty; `none` only for every layer (checkpointing is on or off for
    the run)."""
    if not layers:
        raise ValueError("a placement plan needs one entry per decoder layer; got none")
    if Place.NONE in layers and set(layers) != {Place.NONE}:
        raise ValueError(
            "a placement plan mixes 'none' (no checkpoint) with checkpointed layers; checkpointing "
            "is on or off for the whole run (activation_checkpointing)"
        )
    for place, why in NOT_YET.items():
        if place in layers:
            raise ValueError(f"placement '{place.value}' is not supported yet: {why}")


def check_cacheable(plan: PlacementPlan, cacheable: Optional[tuple]) -> None:
    """Refuse a plan that caches a layer without softmax attention (a gated DeltaNet layer has no
    attention output to keep). `cacheable`: per layer, None: every layer has attention."""
    if cacheable is None:
        return
    bad = [i for i in plan.indices(*CACHED) if not cacheable[i]]
    if bad:
        ok = [i for i, c in enumerate(cacheable) if c]
        raise ValueError(
            f"placement {plan.spec()} caches layers {bad}, which have no softmax attention (linear "
            f"attention); the attention cache goes on full-attention layers only: {ok}"
        )


def _count_ok(name: str, value, allowed: tuple) -> None:
    if isinstance(value, bool) or not (isinstance(value, int) or value in allowed):
        raise ValueError(f"{name}={value!r} must be a layer count or one of {list(allowed)}")
    if isinstance(value, int) and value < 0:
        raise ValueError(
            f"{name}={value} must be >= 0"
            + (f" or {' / '.join(repr(a) for a in allowed)}" if allowed else "")
        )


def check_request(
    offload_layers: Count,
    attention_cache_layers: Count,
    checkpointing: bool,
    placement: Optional[str],
) -> None:
    """Every placement rule that needs no model (the run config calls it): raises ValueError naming
    the fix."""
    _count_ok("offload_layers", offload_layers, ("all", "auto"))
    _count_ok("attention_cache_layers", attention_cache_layers, ("all",))
    if offload_layers and not checkpointing:
        raise ValueError(
            f"offload_layers={offload_layers!r} offloads the checkpointed layer inputs: it needs "
            f"activation checkpointing; set activation_checkpointing: true"
        )
    if attention_cache_layers and not checkpointing:
        raise ValueError(
            f"attention_cache_layers={attention_cache_layers!r} keeps attention outputs through "
            "activation checkpointing; set activation_checkpointing: true or "
            "attention_cache_layers: 0"
        )
    if attention_cache_layers == "all" and offload_layers == "auto":
        raise ValueError(
            "attention_cache_layers='all' (every layer not offloaded) with offload_layers='auto' "
            "(the "
            "fewest that fit, counting the cache) is circular; give attention_cache_layers a number"
        )
    if placement is not None:
        if offload_layers or attention_cache_layers:
            raise ValueError(
                f"placement={placement!r} names every layer's place; drop offload_layers="
                f"{offload_layers!r} / attention_cache_layers={attention_cache_layers!r} (or the "
                f"placement)"
            )
        plan = PlacementPlan.parse(placement)
        if not checkpointing and plan.checkpointed:
            raise ValueError(
                f"placement={placement!r} places checkpoints; set activation_checkpointing: true"
            )


def requests_offload(offload_layers: Count, placement: Optional[str]) -> bool:
    """Whether a run may offload checkpoints (`auto` may): the DeepSpeed JSON then turns
    cpu_checkpointing on."""
    if placement is not None:
        return PlacementPlan.parse(placement).offloaded > 0
    return offload_layers not in (0, None)


def resolve_placement(
    offload_layers: Count,
    attention_cache_layers: Count,
    checkpointing: bool,
    placement: Optional[str],
    num_layers: int,
    auto_offload: Optional[Callable[[], int]] = None,
    cacheable: Optional[tuple] = None,
) -> PlacementPlan:
    """The run's plan for a model of `num_layers` decoder layers. More:
    docs/design/levers.md."""
    check_request(offload_layers, attention_cache_layers, checkpointing, placement)
    L = num_layers
    if placement is not None:
        plan = PlacementPlan.parse(placement)
        if len(plan) != L:
            raise ValueError(
                f"placement={placement!r} has {len(plan)} entries but the model has {L} decoder "
                f"layers; give one place per layer (run lengths summing to {L})"
            )
        check_cacheable(plan, cacheable)
        return plan
    if not checkpointing:
        return PlacementPlan.from_counts(L, checkpointing=False)
    cache = attention_cache_layers
    if isinstance(cache, int) and cache > L:
        raise ValueError(
            f"attention_cache_layers={cache} is more than the model's {L} layers; use 0..{L} or "
            "'all'"
        )
    if offload_layers == "auto":
        if auto_offload is None:
            raise ValueError("offload_layers='auto' needs the planner's answer (auto_offload)")
        off = min(int(auto_offload()), L - (cache if isinstance(cache, int) else 0))
    elif offload_layers == "all":
        off = L
    else:
        off = int(offload_layers)
        if off > L:
            raise ValueError(
                f"offload_layers={off} is outside 0..{L} (the model's layers); use a number in "
                f"that range, 'all' or 'auto'"
            )
    if cache == "all":
        cache = L - off if cacheable is None else sum(cacheable[off:])
    if cache and off + cache > L:
        raise ValueError(
            f"attention_cache_layers={cache} (the last layers) overlaps offload_layers="
            f"{offload_layers} (the first layers) of {L}: DeepSpeed's offloading checkpoint has no "
            f"selective policy; keep attention_cache_layers + offload_layers <= {L}, or "
            f"attention_cache_layers: all"
        )
    return PlacementPlan.from_counts(L, off, cache, cacheable=cacheable)
