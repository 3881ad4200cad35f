"""Which K of a model's L decoder layers a `ds-longctx rehearse --layers K` run plays, and each
layer's kind.

    kinds = layer_kinds(placement, layer_types)  # 'offload', or 'offload linear_attention' (hybrid)
    pick_layers(kinds, k)                        # K indices: every kind, the first and top layer

Torch-free: the rehearse command checks K against the placement before any rank starts.
layer_clock.py runs the picked layers and extrapolates the rest from them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds_longctx.levers.placement import PlacementPlan


def layer_kinds(placement: PlacementPlan, layer_types) -> list:
    """Each layer's kind: its placement, and where the model mixes layer types (Qwen3.5) its type
    too, so a layer not run is extrapolated from run layers of its own placement and type."""
    places = [p.value for p in placement.layers]
    if layer_types is None or len(set(layer_types)) < 2:
        return places
    return [f"{p} {t}" for p, t in zip(places, layer_types)]


def pick_layers(kinds: list, k: int) -> list:
    """K layer indices in order for a model whose layer i has kind `kinds[i]`: every kind in
    proportion to its count (at least one each), the first and the top layer included, the rest
    evenly spread within each kind. Raises ValueError where K cannot hold every kind."""
    n = len(kinds)
    by_kind = defaultdict(list)
    for i, kind in enumerate(kinds):
        by_kind[kind].append(i)
    must = {
        kind: sum(1 for i in {0, n - 1} if kinds[i] == kind) for kind in by_kind
    }  # first and top layers
    least = sum(max(1, m) for m in must.values())
    if not least <= k <= n:
        raise ValueError(
            f"--layers {k}: give {least} to {n} layers (this placement has {len(by_kind)} kind(s) "
            f"of layer: {', '.join(by_kind)}; each runs at least once, and so do the first and top "
            "layers)"
        )
    share = {kind: k * len(ix) / n for kind, ix in by_kind.items()}
    quota = {kind: max(1, must[kind], round(share[kind])) for kind in by_kind}
    while sum(quota.values()) > k:  # take from the kind most over its share that can spare one
        kind = max(
            (q for q in quota if quota[q] > max(1, must[q])), key=lambda q: quota[q] - share[q]
        )
        quota[kind] -= 1
    while sum(quota.values()) < k:  # give to the kind most under its share that has layers left
        kind = max(
            (q for q in quota if quota[q] < len(by_kind[q])), key=lambda q: share[q] - quota[q]
        )
        quota[kind] += 1
    chosen = set()
    for kind, ix in by_kind.items():
        ends = [i for i in sorted({0, n - 1}) if i in ix]
        rest = [i for i in ix if i not in ends]
        want = quota[kind] - len(ends)
        step = len(rest) / want if want > 0 else 0
        chosen.update(ends + [rest[int((j + 0.5) * step)] for j in range(max(want, 0))])
    return sorted(chosen)
