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


def _clock_with(kinds, run, gpu_left, input_bytes, on_gpu=True):
    """A LayerClock holding one finished step's records, as a `--layers` run leaves them (no model needed)."""
    from ds_longctx.run.layer_clock import LayerClock, LayerRecord, _Stamp
    clock = LayerClock.__new__(LayerClock)
    clock.kinds, clock.run, clock.on_gpu = kinds, run, on_gpu
    clock.layers = [None] * len(kinds)
    clock.layer_numel = [(0, 0)] * len(kinds)
    clock.model_numel = (1, 1)
    clock.scoped_bytes = []
    t0 = _Stamp(False)
    step = {}
    for i in run:
        r = LayerRecord(fwd=[t0, t0], bwd=[t0, t0], input_bytes=input_bytes)
        r.gpu_left = gpu_left[kinds[i]]
        step[i] = r
    clock.steps = [step]
    return clock


def test_deepspeeds_offload_window_is_extrapolated_by_order_not_per_layer(monkeypatch):
    """DeepSpeed's async offload keeps the newest checkpoint input on the GPU and one more while its copy drains;
    the rest are on the host. The 8x141 GB 1M config's placement (cache+offload:6, cache:30) run as 6 layers has one
    on-host layer, whose input the window held on the GPU (c = 1 GB left there; the cache layers leave 2 GB).
    All 36: 5 inputs on the host (all but the kept one), 2 on the GPU, the cache layers' 2 GB each."""
    from ds_longctx.run import layer_clock
    kinds = ["cache+offload"] * 6 + ["cache"] * 30
    run = [0, 9, 16, 24, 31, 35]
    gb = 1e9
    clock = _clock_with(kinds, run, {"cache+offload": 1 * gb, "cache": 2 * gb}, input_bytes=gb)
    monkeypatch.setattr(layer_clock, "offload_window", lambda: (1, 2))
    est = clock.extrapolate(10.0, 100 * gb, 90 * gb, 8 * gb, {})
    # host: 5 of the 6 inputs, none in the run (its one was kept)
    assert est["host"] == pytest.approx(8 * gb + 5 * gb)
    # GPU: 25 cache layers x 2 GB, + 1 more input held by the window (2 held in all, 1 in the run)
    assert est["peak_reserved"] == pytest.approx(100 * gb + 25 * 2 * gb + 1 * gb)
    assert est["offload_window"]["host_bytes_added"] == int(5 * gb)
    # without the engine (the pinned pool: buffers made at build), an on-host layer's leftovers are per layer
    monkeypatch.setattr(layer_clock, "offload_window", lambda: None)
    est = clock.extrapolate(10.0, 100 * gb, 90 * gb, 8 * gb, {})
    assert est["host"] == pytest.approx(8 * gb)
    assert est["peak_reserved"] == pytest.approx(100 * gb + 25 * 2 * gb + 5 * 1 * gb)


def test_the_layer_gets_its_input_itself_so_what_it_frees_is_freed():
    """An offloading checkpoint empties the layer's input (`arg.data = ...`). Were the mark an identity autograd
    function, the layer would get a view whose base keeps the storage alive; the marks are hooks, so the layer gets
    the tensor itself, and the stamps still come in order: forward start, end; backward start, end."""
    import torch
    import torch.nn as nn

    from ds_longctx.run.layer_clock import LayerClock, _Timed

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
