"""Which layers a `--layers K` rehearsal runs (rehearsal/layer_pick.pick_layers), and the memory its
extrapolation adds for the layers it did not run (`gpu_leftover`, `LayerClock.extrapolate`)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ds_longctx.rehearsal.layer_pick import pick_layers

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
    if (
        k >= 12
    ):  # enough layers for the proportions to show: each kind within one layer of its share
        counts, total = Counter(kinds[i] for i in got), Counter(kinds)
        for kind, n in total.items():
            assert abs(counts[kind] - k * n / len(kinds)) <= 1.5, (kind, counts)


def test_too_few_layers_for_the_kinds_are_refused():
    with pytest.raises(ValueError, match="give 3 to 36"):
        pick_layers(PLACEMENTS["offload:30,keep:4,cache:2"], 2)
    with pytest.raises(ValueError, match="give 2 to 28"):
        pick_layers(PLACEMENTS["keep:28"], 40)


def _clock_with(kinds, run, gpu_left, input_bytes, on_gpu=True):
    """A LayerClock holding one finished step's records, as a `--layers` run leaves them (no model
    needed); each layer's output is the size of its input, as a decoder layer's is."""
    from ds_longctx.rehearsal.layer_clock import LayerClock, LayerRecord, _Stamp

    clock = LayerClock.__new__(LayerClock)
    clock.kinds, clock.run, clock.on_gpu = kinds, run, on_gpu
    clock.layers = [None] * len(kinds)
    clock.layer_numel = [(0, 0)] * len(kinds)
    clock.model_numel = (1, 1)
    clock.scoped_bytes = []
    t0 = _Stamp(False)
    step = {}
    for i in run:
        r = LayerRecord(
            fwd=[t0, t0], bwd=[t0, t0], input_bytes=input_bytes, output_bytes=input_bytes
        )
        r.gpu_left = gpu_left[kinds[i]]
        step[i] = r
    clock.steps = [step]
    return clock


def test_deepspeeds_offload_window_is_extrapolated_by_order_not_per_layer(monkeypatch):
    """DeepSpeed's async offload keeps the newest checkpoint input on the GPU and one more while its
    copy drains; the rest are on the host. The 8x141 GB 1M config's placement (cache+offload:6,
    cache:30) run as 6 layers has one on-host layer, whose input the window held on the GPU (its
    forward's allocation grows by c = 1 GB: its output; the cache layers' by 2 GB: output and
    attention output, and each keeps its 1 GB input). All 36: 5 inputs on the host (all but the kept
    one), 2 on the GPU, the cache layers' 2 GB each."""
    from ds_longctx.rehearsal import layer_clock

    kinds = ["cache+offload"] * 6 + ["cache"] * 30
    run = [0, 9, 16, 24, 31, 35]
    gb = 1e9
    clock = _clock_with(kinds, run, {"cache+offload": 1 * gb, "cache": 2 * gb}, input_bytes=gb)
    monkeypatch.setattr(layer_clock, "offload_window", lambda: (1, 2))
    est = clock.extrapolate(10.0, 100 * gb, 90 * gb, 8 * gb, {})
    # host: 5 of the 6 inputs, none in the run (its one was kept), each in a pinned block of torch's
    # host allocator: 1e9 bytes rounded up to 2**30 (Qwen3.5-4B's 0.67 GB inputs at 1M over sp=8
    # take 1.07 GB blocks)
    assert est["host"] == pytest.approx(8 * gb + 5 * 2**30)
    # GPU: 25 cache layers x 2 GB, + 1 more input held by the window (2 held in all, 1 in the run)
    assert est["peak_reserved"] == pytest.approx(100 * gb + 25 * 2 * gb + 1 * gb)
    assert est["offload_window"]["host_bytes_added"] == 5 * 2**30
    # without the engine (the pinned pool: buffers made at build), an on-host layer leaves nothing
    # on the GPU: the 1 GB its allocation grew by is its output, the next layer's input
    monkeypatch.setattr(layer_clock, "offload_window", lambda: None)
    est = clock.extrapolate(10.0, 100 * gb, 90 * gb, 8 * gb, {})
    assert est["host"] == pytest.approx(8 * gb)
    assert est["peak_reserved"] == pytest.approx(100 * gb + 25 * 2 * gb)


def test_the_layer_gets_its_input_itself_so_what_it_frees_is_freed():
    """An offloading checkpoint empties the layer's input (`arg.data = ...`). Were the mark an
    identity autograd function, the layer would get a view whose base keeps the storage alive; the
    marks are hooks, so the layer gets the tensor itself, and the stamps still come in order:
    forward start, end; backward start, end."""
    import torch
    import torch.nn as nn

    from ds_longctx.rehearsal.layer_clock import LayerClock, _Timed

    seen = []

    class Layer(nn.Module):
        def forward(self, h):
            seen.append(h)
            return h * 2

    clock = LayerClock.__new__(LayerClock)
    clock.on_gpu, clock.records = False, {}
    order = []
    for name in ("_fwd_start", "_fwd_end", "_bwd_start", "_bwd_end"):
        setattr(clock, name, (lambda n: lambda i, *a: order.append(n))(name))
    x = torch.randn(4, 3, requires_grad=True) * 1.0  # a non-leaf, as a layer's input is
    y = _Timed(Layer(), 0, clock)(x)
    assert seen[0] is x and seen[0]._base is None
    y.sum().backward()
    assert order == ["_fwd_start", "_fwd_end", "_bwd_start", "_bwd_end"]


C = 4000  # bytes of one layer's input and output: 1000 fp32 elements
EXTRA = {
    "offload": 100,
    "keep": 0,
    "cache": C,
}  # what a layer saves besides its input (cache: the attention output)


def _simulated_forward(clock, kinds, run, first_extra=0):
    """One step through the layers `run` under `clock`, with GPU allocation simulated in a counter
    that `_mem` reads: the embedding output (layer 0's input) is allocated; each layer allocates its
    output and what it saves; after it returns, an on-host layer's input is freed (the pinned pool's
    copy is on the host). Layer 0 allocates `first_extra` more, once (what ZeRO-3 holds at the first
    layer's end and not at its start). Returns the bytes allocated at the forward's end."""
    import torch
    import torch.nn as nn

    from ds_longctx.rehearsal.layer_clock import HOST_KINDS, _Timed

    mem = [0]
    clock._mem = lambda: (mem[0], 0)

    class Layer(nn.Module):
        def __init__(self, kind, index):
            super().__init__()
            self.kind, self.index = kind, index

        def forward(self, h):
            mem[0] += C + EXTRA[self.kind] + (first_extra if self.index == 0 else 0)
            return h * 2.0

    h = torch.zeros(C // 4, requires_grad=True) * 1.0
    mem[0] += C
    for i in run:
        h = _Timed(Layer(kinds[i], i), i, clock)(h)
        if kinds[i] in HOST_KINDS:
            mem[0] -= C
    top = mem[0]
    h.sum().backward()
    clock.step_done()
    return top


def _sim_clock(kinds, run):
    from ds_longctx.rehearsal.layer_clock import LayerClock

    clock = LayerClock.__new__(LayerClock)
    clock.kinds, clock.run, clock.on_gpu = kinds, run, False
    clock.layers, clock.layer_numel, clock.model_numel = (
        [None] * len(kinds),
        [(0, 0)] * len(kinds),
        (1, 1),
    )
    clock.records, clock.steps, clock.scoped_bytes = {}, [], []
    return clock


def test_a_layers_gpu_leftover_counts_its_kept_input_and_not_its_output():
    """offload:6,keep:3,cache:1 (the H200 configs' shape), c = 4000 bytes. All 10 layers, by hand: 4
    inputs kept (3 keep, 1 cache) 16000 + the top's output 4000 + the cache layer's attention output
    4000 + 6 offload layers' 100 = 24600. Layers 0, 7, 9 run: c + (c + 100 - c) + c + 2c = 16100,
    and the leftovers per kind are offload 100, keep c, cache 2c, so the 7 missing (5 offload, 2
    keep) add 500 + 8000: 24600 again. (Counting each layer's output as its own, offload would be c
    + 100 and the 7 add 28500: 44600.)"""
    kinds = ["offload"] * 6 + ["keep"] * 3 + ["cache"]
    full = _sim_clock(kinds, list(range(10)))
    top = _simulated_forward(full, kinds, full.run)
    assert top == 24600
    assert (
        full.extrapolate(1.0, top, top, 0, {})["peak_allocated"] == 24600
    )  # every layer run: the measured peak
    part = _sim_clock(kinds, [0, 7, 9])
    top = _simulated_forward(part, kinds, part.run)
    assert top == 16100
    est = part.extrapolate(1.0, top, top, 0, {})
    assert est["layer_gpu_bytes_by_kind"] == {"offload": 100, "keep": C, "cache": 2 * C}
    assert est["peak_allocated"] == est["peak_reserved"] == 24600


def test_the_first_layer_counts_in_its_kinds_mean_only_where_it_ran_alone():
    """Layer 0 leaves 96 bytes more than the other offloaded layers (measured on an H200: one MLP
    weight of ZeRO-3's at the first layer's end). Run 0, 3, 7, 9 of offload:6,keep:3,cache:1: layer
    3 alone gives the offload mean, and the extrapolation lands on the whole run's peak, which holds
    the 96 once. Averaged in, the 96 would count for each of the 4 offloaded layers not run."""
    kinds = ["offload"] * 6 + ["keep"] * 3 + ["cache"]
    full = _sim_clock(kinds, list(range(10)))
    whole = _simulated_forward(full, kinds, full.run, first_extra=96)
    assert whole == 24600 + 96
    part = _sim_clock(kinds, [0, 3, 7, 9])
    est = part.extrapolate(
        1.0, *[_simulated_forward(part, kinds, part.run, first_extra=96)] * 2, 0, {}
    )
    assert est["layer_gpu_bytes_by_kind"]["offload"] == 100
    assert est["layer_gpu_bytes"][0] == 196 and est["layer_gpu_bytes"][3] == 100
    assert est["peak_allocated"] == whole
    alone = _sim_clock(
        kinds, [0, 7, 9]
    )  # layer 0 the only offloaded layer run: it is the kind's mean
    est = alone.extrapolate(
        1.0, *[_simulated_forward(alone, kinds, alone.run, first_extra=96)] * 2, 0, {}
    )
    assert est["layer_gpu_bytes_by_kind"]["offload"] == 196


def test_layers_whose_host_buffers_the_pool_made_at_build_add_no_host(monkeypatch):
    """Step 1's forward of layer 0 (offloaded) took 300 bytes of host. Its checkpoint's slot, like
    every offloaded layer's, is in the pinned pool made at build, so the 5 offloaded layers not run
    add nothing; a layer whose slot the pool does not hold takes its buffer at first use and adds
    the 300."""
    from ds_longctx.levers import offload

    kinds = ["offload"] * 6 + ["keep"] * 3 + ["cache"]
    clock = _clock_with(kinds, [0, 7, 9], {"offload": 0, "keep": C, "cache": 2 * C}, input_bytes=C)
    clock.steps[0][0].host_left = 300
    monkeypatch.setattr(offload, "_POOL", offload.PinnedPool())
    offload.pool().reserve(range(6), (1, 2, 2), torch.float32, pin=False)
    assert clock.extrapolate(1.0, 0, 0, 10_000, {})["host"] == 10_000
    offload.pool().reserve(
        range(3), (1, 2, 2), torch.float32, pin=False
    )  # layers 3-5 not in the pool
    est = clock.extrapolate(1.0, 0, 0, 10_000, {})
    assert est["host"] == 10_000 + 3 * 300 and est["layer_host_bytes"] == {0: 300, 7: 0, 9: 0}


def test_a_hybrid_models_layers_are_picked_and_extrapolated_by_placement_and_type():
    """Qwen3.5-4B's layers (a full-attention layer every 4th) under offload:13,keep:19: K layers
    hold every (placement, layer type) pair, so a layer not run is extrapolated from run layers of
    its own type."""
    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.plan.geometry import as_geometry
    from ds_longctx.rehearsal.layer_clock import on_host
    from ds_longctx.rehearsal.layer_pick import layer_kinds

    kinds = layer_kinds(
        PlacementPlan.parse("offload:13,keep:19"), as_geometry("qwen3.5-4b").hybrid.layer_types
    )
    assert (
        kinds[3] == "offload full_attention"
        and kinds[13] == "keep linear_attention"
        and on_host(kinds[3])
    )
    picked = pick_layers(kinds, 6)
    assert {kinds[i] for i in picked} == set(kinds) and {0, 31} <= set(picked)
    assert layer_kinds(PlacementPlan.parse("keep:2"), ["full_attention"] * 2) == ["keep", "keep"]


def _timed_step(clock, seconds: dict) -> None:
    """One finished step in which layer i took seconds[i] (forward 1/4 of it, backward the rest),
    host-clock stamps."""
    from ds_longctx.rehearsal.layer_clock import LayerRecord, _Stamp

    def span(d):
        a, b = _Stamp(False), _Stamp(False)
        b.t = a.t + d
        return [a, b]

    clock.records = {
        i: LayerRecord(fwd=span(s / 4), bwd=span(3 * s / 4)) for i, s in seconds.items()
    }
    clock.steps.append(clock.records)
    clock.records = {}


def test_each_layer_is_timed_at_its_fastest_timed_step():
    """Step 1 warms up; in step 2 layer 7 still compiled once (a cold process), so each layer counts
    at its fastest of steps 2 and 3, and the 7 layers not run of offload:6,keep:3,cache:1 add 5
    offload (1 s) and 2 keep (2 s) layers."""
    kinds = ["offload"] * 6 + ["keep"] * 3 + ["cache"]
    clock = _sim_clock(kinds, [0, 7, 9])
    _timed_step(clock, {0: 9.0, 7: 9.0, 9: 9.0})
    _timed_step(clock, {0: 1.0, 7: 5.0, 9: 3.0})
    _timed_step(clock, {0: 1.2, 7: 2.0, 9: 3.1})
    assert clock.steady_layer_seconds() == pytest.approx({0: 1.0, 7: 2.0, 9: 3.0})
    assert clock.extrapolate(6.0, 0, 0, 0, {})["seconds"] == pytest.approx(6.0 + 5 * 1.0 + 2 * 2.0)
    one = _sim_clock(kinds, [0, 7, 9])
    _timed_step(one, {0: 9.0, 7: 9.0, 9: 9.0})  # a single step is the only one there is
    assert one.steady_layer_seconds() == pytest.approx({0: 9.0, 7: 9.0, 9: 9.0})


def test_a_rank_is_timed_at_its_fastest_timed_step():
    from ds_longctx.rehearsal.world import fastest_steady

    assert fastest_steady([200.0, 16.8, 11.2]) == 11.2 and fastest_steady([50.0, 40.0]) == 40.0
