"""The communication model of a rehearsal's prediction (plan/interconnect.py) against hand-computed
seconds."""

from __future__ import annotations

import pytest

from ds_longctx.plan.interconnect import (
    LINKS,
    Link,
    collective_seconds,
    link_from_gbps,
    predict,
    sent_bytes,
)

NV, IB = Link("nv", 300.0, "test"), Link("ib", 50.0, "test")


def test_bytes_a_rank_sends_per_collective():
    assert sent_bytes("all_to_all", 800, 8) == 700
    assert sent_bytes("all_gather", 800, 8) == 700
    assert sent_bytes("reduce_scatter", 800, 8) == 700
    assert sent_bytes("all_reduce", 800, 8) == 1400
    assert sent_bytes("broadcast", 800, 8) == 800
    assert sent_bytes("all_gather", 800, 1) == 0


def test_a_group_inside_a_node_runs_at_the_intra_node_link():
    seconds, cross = collective_seconds("all_to_all", 8e9, tuple(range(8)), 3, 8, NV, IB)
    assert seconds == pytest.approx(7e9 / 300e9) and cross == 0


def test_an_all_to_all_across_two_nodes_sends_half_over_the_slow_link():
    """16 ranks, 8 per node: of 16 GB, 7/16 stay on the node (NVLink), 8/16 leave it (IB); both at
    once."""
    seconds, cross = collective_seconds("all_to_all", 16e9, tuple(range(16)), 9, 8, NV, IB)
    assert cross == pytest.approx(8e9)
    assert seconds == pytest.approx(max(7e9 / 300e9, 8e9 / 50e9))


def test_a_ring_across_nodes_runs_at_the_slower_link():
    seconds, cross = collective_seconds("all_gather", 16e9, tuple(range(16)), 0, 8, NV, IB)
    assert seconds == pytest.approx(15e9 / 50e9) and cross == pytest.approx(15e9)


def test_the_prediction_adds_the_all_to_all_and_hides_zero_under_the_compute():
    world = tuple(range(8))
    payloads = {
        ("all_to_all", world): 8e9 * 300 / 7 / 300 * 7,
        ("all_gather", world): 80e9,
        ("reduce_scatter", world): 8e9,
        ("all_reduce", world): 8,
    }
    p = predict(10.0, payloads, 0, 8, NV, IB)
    a2a = 7 / 8 * payloads[("all_to_all", world)] / 300e9
    zero = 7 / 8 * 88e9 / 300e9
    small = 2 * 7 / 8 * 8 / 300e9
    assert p.seconds == pytest.approx(10.0 + a2a + small)  # zero (0.26 s) < compute: hidden
    assert p.no_overlap_seconds == pytest.approx(10.0 + a2a + small + zero)
    short = predict(0.1, payloads, 0, 8, NV, IB)
    assert short.seconds == pytest.approx(
        0.1 + a2a + small + zero - 0.1
    )  # zero exceeds the compute: the excess adds


def test_links_given_in_gbit_per_s():
    assert link_from_gbps("--link_gbps", 3600).gb_per_s == 450
    with pytest.raises(ValueError, match="Gbit/s"):
        link_from_gbps("--link_gbps", float("nan"))
    assert {"nvlink-h100", "nvlink-h200", "ib-ndr400"} <= set(LINKS)
