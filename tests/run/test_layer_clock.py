"""Which layers a `--layers K` rehearsal runs (run/layer_clock.pick_layers)."""

from __future__ import annotations

from collections import Counter

import pytest

from ds_longctx.run.layer_clock import pick_layers

PLACEMENTS = {
    "cache+offload:6,cache:30": ["cache+offload"] * 6 + ["cache"] * 30,
    "offload:30,keep:4,cache:2": ["offload"] * 30 + ["keep"] * 4 + ["cache"] * 2,
    "keep:28": ["keep"] * 28,
}


@pytest.mark.parametrize("name", PLACEMENTS)
@pytest.mark.parametrize("k", [3, 4, 6, 9, 12])
def test_k_layers_hold_every_kind_the_first_and_the_top_layer(name, k):
    kinds = PLACEMENTS[name]
    got = pick_layers(kinds, k)
    assert len(got) == k and got == sorted(set(got))
    assert got[0] == 0 and got[-1] == len(kinds) - 1
    assert set(kinds[i] for i in got) == set(kinds)
    if k >= 12:  # enough layers for the proportions to show: each kind within one layer of its share
        counts, total = Counter(kinds[i] for i in got), Counter(kinds)
        for kind, n in total.items():
            assert abs(counts[kind] - k * n / len(kinds)) <= 1.5, (kind, counts)


def test_too_few_layers_for_the_kinds_are_refused():
    with pytest.raises(ValueError, match="give 3 to 36"):
        pick_layers(PLACEMENTS["offload:30,keep:4,cache:2"], 2)
    with pytest.raises(ValueError, match="give 2 to 28"):
        pick_layers(PLACEMENTS["keep:28"], 40)
