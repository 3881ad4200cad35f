"""Per decoder layer: its forward and backward time, the memory its forward leaves behind, the bytes
of collectives issued inside it; and a step of L layers extrapolated from K of them run (`ds-longctx
rehearse --layers K`).

    clock = LayerClock(model, placement, on_gpu)      # wraps every decoder layer between two marks
    undo = run_only(model, clock.pick(K))             # optional: the forward runs K of the L layers
    ... steps ...; clock.step_done()                  # after each step (synchronizes the GPU)
    est = clock.extrapolate(step_seconds, peaks)      # the L-layer step from the K-layer steps

Hooks add no tensor and no reference to one. Where the marks sit and the formulas:
docs/design/rehearsal.md."""

from __future__ import annotations

# deepspeed is imported where a layer is clocked: importing this module does not load it.
import time
from collections import defaultdict
from dataclasses import dataclass

import psutil
import torch
import torch.nn as nn

from ds_longctx.levers.offload import attention_cache_key, pool
from ds_longctx.levers.placement import ON_HOST, PlacementPlan
from ds_longctx.levers.placement_apply import decoder_layers
from ds_longctx.parallel import fake_world
from ds_longctx.plan.zero_buffers import pow2
from ds_longctx.rehearsal.layer_pick import layer_kinds, pick_layers


class _Stamp:
    """A point in time on the GPU stream (CUDA event) or the host clock."""

    def __init__(self, on_gpu: bool):
        if on_gpu:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.event, self.t = None, time.perf_counter()

    def seconds_to(self, later: "_Stamp") -> float:
        if self.event is not None:
            return self.event.elapsed_time(later.event) / 1e3
        return later.t - self.t


def _on_grad(t: torch.Tensor, call) -> None:
    """Call `call()` when the gradient of `t` is computed. A hook, not an identity autograd
    function: that function's output would be a view of `t`, and a view keeps its base's storage
    alive, so a checkpoint offload that empties the layer's input (DeepSpeed's) would leave it on
    the GPU, a cost the real run does not have."""
    if t.requires_grad:
        t.register_hook(lambda grad: call())


@dataclass
class LayerRecord:
    """One layer in one step."""

    fwd: list  # [start, end] stamps
    bwd: list  # [start, end] stamps
    gpu_left: int = 0  # bytes allocated at the forward's end minus at its start
    host_left: int = 0  # RSS bytes likewise
    input_bytes: int = 0  # bytes of the layer's input (its checkpoint, where checkpointed)
    output_bytes: int = 0  # bytes of the layer's output (the next layer's input)


class _Timed(nn.Module):
    """A decoder layer between two marks; attributes read through to it (`attention_type`)."""

    def __init__(self, layer: nn.Module, index: int, clock: "LayerClock"):
        super().__init__()
        self.layer, self.index, self.clock = layer, index, clock

    def forward(self, hidden_states, *args, **kwargs):
        c, i = self.clock, self.index
        c._fwd_start(i, hidden_states.numel() * hidden_states.element_size())
        # its gradient is ready: the layer's backward has ended
        _on_grad(hidden_states, lambda: c._bwd_end(i))
        out = self.layer(hidden_states, *args, **kwargs)
        h = out[0] if isinstance(out, tuple) else out
        c._fwd_end(i, h.numel() * h.element_size())
        _on_grad(h, lambda: c._bwd_start(i))
        return out

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["layer"], name)


def _numel(module: nn.Module) -> tuple:
    """(all, trainable) parameter elements of `module`, whole (ZeRO-3's ds_numel if partitioned)."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in module.parameters()]
    return sum(n for n, _ in sizes), sum(n for n, t in sizes if t)


ZERO_KINDS = ("all_gather", "reduce_scatter")
HOST_KINDS = tuple(p.value for p in ON_HOST)  # placements keeping their checkpoint on the host


def on_host(kind: str) -> bool:
    """Whether a layer of `kind` (its placement, then a hybrid model's layer type: `offload
    linear_attention`) keeps its checkpoint in host memory."""
    return kind.split(" ")[0] in HOST_KINDS


def gpu_leftover(record: LayerRecord, kind: str) -> int:
    """GPU bytes layer `record`'s forward leaves for its backward (module docstring): its allocation
    change less its output, plus its input where its checkpoint is on the GPU (every kind not in
    HOST_KINDS; docs/design/rehearsal.md)."""
    kept_input = record.input_bytes if not on_host(kind) else 0
    return record.gpu_left - record.output_bytes + kept_input


def offload_window():
    """(keep_last_count, inputs held on the GPU in all) of DeepSpeed's async checkpoint offload
    engine, or None where no checkpoint went through it (no GPU, nothing offloaded, or the pinned
    pool's own copies)."""
    from deepspeed.runtime.activation_checkpointing import checkpointing

    engine = getattr(checkpointing, "_cpu_offload_engine", None)
    if engine is None:
        return None
    keep = engine.keep_last_count
    return keep, keep + max(engine.max_fwd_stash_count - 1, 0)


def _layer_list(model: nn.Module) -> nn.ModuleList:
    """The ModuleList that holds the model's decoder layers."""
    first = decoder_layers(model)[0]
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) and m[0] is first:
            return m
    raise ValueError(f"{type(model).__name__}: no ModuleList holds its decoder layers")


class LayerClock:
    """Marks on every decoder layer of `model`; `placement` gives each layer's kind."""

    def __init__(self, model: nn.Module, placement: PlacementPlan, on_gpu: bool):
        self.container = _layer_list(model)
        self.layers = list(self.container)
        if len(self.layers) != len(placement):
            raise ValueError(
                f"placement has {len(placement)} entries, the model {len(self.layers)} layers"
            )
        self.text_config = model.config.get_text_config() if hasattr(model, "config") else None
        types = getattr(self.text_config, "layer_types", None)
        self.kinds = layer_kinds(
            placement, types if types is not None and len(types) == len(self.layers) else None
        )
        # (all, trainable) elements per layer
        self.layer_numel = [_numel(layer) for layer in self.layers]
        self.model_numel = _numel(model)
        self.partitioned = [
            p
            for p in model.parameters()
            if hasattr(p, "ds_status") and not getattr(p, "ds_persist", False)
        ]
        self.on_gpu, self.run = on_gpu, list(range(len(self.layers)))
        self.records: dict = {}
        self.steps: list = []  # one {layer: LayerRecord} per finished step
        self.scoped_bytes: list = []  # one {layer: {(kind, ranks): bytes}} per finished step
        for i, layer in enumerate(self.layers):
            self.container[i] = _Timed(layer, i, self)

    def remove(self) -> None:
        """Put the model's layers back as they were (all of them, unwrapped)."""
        self.container._modules.clear()
        for i, layer in enumerate(self.layers):
            self.container.add_module(str(i), layer)

    # ------------------------------------------------------------ which layers run
    def pick(self, k: int) -> list:
        """`pick_layers` of this model's placement."""
        return pick_layers(self.kinds, k)

    def run_only(self, indices: list):
        """The model's forward runs these layers only (in order); the others keep their parameters,
        gradients and optimizer state, so the memory they hold is the real model's. Returns the
        undo."""
        self.run = sorted(indices)
        wrapped = [self.container[i] for i in range(len(self.layers))]
        self.container._modules.clear()
        for j, i in enumerate(self.run):
            self.container.add_module(str(j), wrapped[i])
        model_cfg = (
            self.text_config
            if self.text_config is not None
            else getattr(self.layers[0], "config", None)
        )
        types = getattr(model_cfg, "layer_types", None)
        if types is not None and len(types) == len(self.layers):
            model_cfg.layer_types = [types[i] for i in self.run]

        def undo():
            self.container._modules.clear()
            for j, m in enumerate(wrapped):
                self.container.add_module(str(j), m)
            if types is not None and len(types) == len(self.layers):
                model_cfg.layer_types = types
            self.run = list(range(len(self.layers)))

        return undo

    # ------------------------------------------------------------ the marks
    def _now(self):
        return _Stamp(self.on_gpu)

    def _mem(self):
        """(GPU bytes allocated less ZeRO-3's gathered parameters, host RSS): what a layer's forward
        leaves for its backward is its activations; parameters gathered or prefetched then are a
        bounded pool (ZeRO's stage3_max_live_parameters), not a per-layer cost."""
        gpu = torch.cuda.memory_allocated() - self._gathered_bytes() if self.on_gpu else 0
        return gpu, psutil.Process().memory_info().rss

    def _gathered_bytes(self) -> int:
        """Bytes of the partitioned parameters whose whole tensor is on the GPU now (gathered or
        being gathered)."""
        return sum(
            p.ds_numel * p.element_size()
            for p in self.partitioned
            if p.ds_status.name != "NOT_AVAILABLE"
        )

    def _fwd_start(self, i: int, input_bytes: int = 0) -> None:
        self.records[i] = LayerRecord(fwd=[self._now()], bwd=[], input_bytes=input_bytes)
        self.records[i].gpu_left, self.records[i].host_left = self._mem()
        if fake_world.active():
            fake_world.collective_log().scope = i

    def _fwd_end(self, i: int, output_bytes: int = 0) -> None:
        r = self.records[i]
        r.fwd.append(self._now())
        r.output_bytes = output_bytes
        gpu, host = self._mem()
        r.gpu_left, r.host_left = gpu - r.gpu_left, host - r.host_left
        if fake_world.active():
            fake_world.collective_log().scope = None

    def _bwd_start(self, i: int) -> None:
        self.records[i].bwd.append(self._now())
        if fake_world.active():
            fake_world.collective_log().scope = i

    def _bwd_end(self, i: int) -> None:
        self.records[i].bwd.append(self._now())
        # the layer below's backward may have begun: its hook, on the same tensor, came first
        if fake_world.active() and fake_world.collective_log().scope == i:
            fake_world.collective_log().scope = None

    def step_done(self) -> None:
        """Close the step: keep its records (synchronizes the GPU to read the events)."""
        if self.on_gpu:
            torch.cuda.synchronize()
        self.steps.append(self.records)
        if fake_world.active():
            log = fake_world.collective_log()
            self.scoped_bytes.append({i: dict(b) for i, b in log.by_scope.items() if i is not None})
        self.records = {}

    def layer_seconds(self, step: int = -1) -> dict:
        """{layer: forward + backward seconds} of a finished step."""
        return {
            i: r.fwd[0].seconds_to(r.fwd[1]) + r.bwd[0].seconds_to(r.bwd[1])
            for i, r in self.steps[step].items()
            if len(r.fwd) == 2 and len(r.bwd) == 2
        }

    def steady_layer_seconds(self) -> dict:
        """{layer: its fastest forward + backward over the timed steps (step 2 on; the only step
        when one ran)}: a later step of a cold process can still compile or autotune, once, which is
        no step cost."""
        timed = [
            self.layer_seconds(k) for k in range(1 if len(self.steps) > 1 else 0, len(self.steps))
        ]
        return {i: min(t[i] for t in timed if i in t) for i in set().union(*timed)}

    # ------------------------------------------------------------ extrapolation
    def _means(self, values: dict) -> dict:
        """{kind: mean of `values` over the run layers of that kind}, the first and top layers only
        where alone."""
        ends = {0, len(self.layers) - 1}
        out = {}
        for kind in set(self.kinds[i] for i in self.run):
            ix = [i for i in self.run if self.kinds[i] == kind and i in values]
            inner = [i for i in ix if i not in ends] or ix
            out[kind] = sum(values[i] for i in inner) / len(inner)
        return out

    def pooled(self, j: int) -> bool:
        """Whether layer j's host buffers (its checkpoint's slot; a cache+offload layer's attention
        region too) are in the pinned pool, made at build: a layer not run still holds them."""
        kind = self.kinds[j].split(" ")[0]
        return (
            kind in HOST_KINDS
            and pool().holds(j)
            and (kind != "cache+offload" or pool().holds(attention_cache_key(j)))
        )

    def missing(self) -> list:
        return [j for j in range(len(self.layers)) if j not in self.run]

    def extrapolate(
        self, seconds: float, peak_reserved: int, peak_allocated: int, host: int, payloads: dict
    ) -> dict:
        """The L-layer step's seconds, peaks, host and collective payloads from the layers run: each
        one's fastest timed step, the last step's memory and bytes (docs/design/rehearsal.md). With
        every layer run, the measured values."""
        last = self.steps[-1]
        miss = self.missing()
        t = self._means(self.steady_layer_seconds())
        gpu_by_layer = {i: gpu_leftover(r, self.kinds[i]) for i, r in last.items()}
        host_by_layer = {
            i: r.host_left if on_host(self.kinds[i]) else 0 for i, r in self.steps[0].items()
        }  # buffers taken at first use: step 1
        gpu, host_mean = self._means(gpu_by_layer), self._means(host_by_layer)
        window = offload_window() if self.on_gpu else None
        extra_gpu, extra_host = self._window_terms(window, last, gpu, host_mean)
        out_payloads = self._payloads(payloads, miss)
        more_gpu = sum(gpu[self.kinds[j]] for j in miss) + extra_gpu
        return {
            "seconds": seconds + sum(t[self.kinds[j]] for j in miss),
            "peak_reserved": peak_reserved + more_gpu,
            "peak_allocated": peak_allocated + more_gpu,
            "host": host
            + sum(max(host_mean[self.kinds[j]], 0) for j in miss if not self.pooled(j))
            + extra_host,
            "payloads": {k: int(v) for k, v in out_payloads.items()},
            "layer_seconds_by_kind": t,
            "layer_gpu_bytes_by_kind": gpu,
            "layer_host_bytes_by_kind": host_mean,
            "layer_gpu_bytes": gpu_by_layer,
            "layer_host_bytes": host_by_layer,
            "offload_window": None
            if window is None
            else {
                "keep_last": window[0],
                "held_on_gpu": window[1],
                "host_bytes_added": int(extra_host),
                "gpu_bytes_added": int(extra_gpu),
            },
        }

    def _window_terms(self, window, last: dict, gpu: dict, host_mean: dict) -> tuple:
        """(GPU, host) bytes DeepSpeed's offload `window` adds for the on-host layers not run; moves
        the inputs it let go into `gpu` and zeroes `host_mean` of the on-host kinds, in place
        (docs/design/rehearsal.md)."""
        on_host_run = [i for i in self.run if on_host(self.kinds[i])]
        if window is None or not on_host_run:
            return 0.0, 0.0
        keep, held = window
        n, big_n = len(on_host_run), sum(1 for k in self.kinds if on_host(k))
        c = sum(last[i].input_bytes for i in on_host_run if i in last) / n
        # inputs the window freed in the run's forwards, spread over them
        let_go = c * (n - min(n, held)) / n
        for kind in {k for k in self.kinds if on_host(k)}:
            if kind in gpu:
                gpu[kind] += let_go
            host_mean[kind] = 0.0
        # each input on the host is one pinned buffer of torch's host allocator: a power of two
        extra_host = (max(big_n - keep, 0) - max(n - keep, 0)) * pow2(int(c))
        extra_gpu = (min(big_n, held) - min(n, held)) * c
        return extra_gpu, extra_host

    def _payloads(self, payloads: dict, miss: list) -> dict:
        """The L-layer step's collective payloads from the run's: ZeRO's scaled by the parameter
        elements they move, each layer not run adding the in-layer collectives (Ulysses') of a run
        layer of its kind."""
        scoped = self.scoped_bytes[-1] if self.scoped_bytes else {}
        per_kind_bytes = defaultdict(lambda: defaultdict(float))
        for kind in set(self.kinds[i] for i in self.run):
            ix = [i for i in self.run if self.kinds[i] == kind]
            for i in ix:
                for key, b in scoped.get(i, {}).items():
                    if key[0] not in ZERO_KINDS:
                        per_kind_bytes[kind][key] += b / len(ix)
        # ZeRO's all-gathers and reduce-scatters move parameters and gradients: scaled by the
        # elements they move (all parameters / the trainable ones) over those of the layers run and
        # of the rest of the model
        gone = [sum(self.layer_numel[j][w] for j in miss) for w in (0, 1)]
        scale = {
            kind: self.model_numel[w] / max(self.model_numel[w] - gone[w], 1)
            for kind, w in (("all_gather", 0), ("reduce_scatter", 1))
        }
        out_payloads = defaultdict(float)
        for key, b in payloads.items():
            out_payloads[key] += b * scale.get(key[0], 1.0)
        for j in miss:
            for key, b in per_kind_bytes[self.kinds[j]].items():
                out_payloads[key] += b
        return out_payloads
