"""One rank of a rehearsal (`ds-longctx rehearse`, rehearsal/rehearse.py), in the process that plays
it.

    row = RankRun(args, cfg, rank, world, per_node, nodes, counts, command).play()

The rank is built and stepped as `train` builds and steps one (run/train_loop.py): preflight's
checks, the data, the engine, the optimizer state at build, then per step train's own
`run/step.timed_step` (`data.get`, `forward_backward`, `step`, CUDA-synchronized timing and peaks).
The fake process group is already running (`fake_world.start`). The row is the module docstring's of
rehearsal/rehearse.py.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from typing import TYPE_CHECKING

import deepspeed
import psutil
import torch

from ds_longctx.data import build_data
from ds_longctx.plan.interconnect import OVERLAP, predict
from ds_longctx.rehearsal.dpo_rows import synthetic_pair_rows
from ds_longctx.rehearsal.layer_clock import LayerClock
from ds_longctx.rehearsal.world import (
    check,
    commit,
    fastest_steady,
    links,
    now,
    planned,
    role_of,
    vs_plan,
)
from ds_longctx.run import optimizer_state
from ds_longctx.run.engine import build_engine
from ds_longctx.run.step import timed_step

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB"


def _layer_fields(est: dict) -> dict:
    """The row's per-layer figures from `LayerClock.extrapolate`'s answer."""
    return {
        "layer_seconds_by_kind": {k: round(v, 4) for k, v in est["layer_seconds_by_kind"].items()},
        "layer_gpu_bytes_by_kind": {k: int(v) for k, v in est["layer_gpu_bytes_by_kind"].items()},
        "layer_host_bytes_by_kind": {k: int(v) for k, v in est["layer_host_bytes_by_kind"].items()},
        "layer_gpu_bytes": {str(i): int(v) for i, v in sorted(est["layer_gpu_bytes"].items())},
        "layer_host_bytes": {str(i): int(v) for i, v in sorted(est["layer_host_bytes"].items())},
        "offload_window": est["offload_window"],
    }


def _log_result(row: dict, pred) -> None:
    """The rank's closing log line: its peaks and step time against the plan."""
    log.info(
        "GPU peak %s reserved (%s allocated) against the plan's %s (%s), budget %s; host %s "
        "against %s per process (%s); compute %.1f s per step; predicted %s",
        _gb(row["peak_gpu_bytes"]),
        _gb(row["peak_gpu_allocated_bytes"]),
        _gb(row["planned_gpu_bytes"]),
        vs_plan(row["peak_gpu_bytes"], row["planned_gpu_bytes"]),
        _gb(row["gpu_budget_bytes"]),
        _gb(row["host_rss_bytes"]),
        _gb(row["planned_host_bytes_per_process"]),
        vs_plan(row["host_rss_bytes"], row["planned_host_bytes_per_process"]),
        row["compute_seconds_per_step"],
        pred.breakdown(),
    )


class RankRun:
    def __init__(
        self,
        a,
        cfg: RunConfig,
        rank: int,
        world: int,
        per_node: int,
        nodes: int,
        counts,
        command: str,
    ):
        self.a, self.cfg, self.rank, self.world, self.per_node, self.nodes = (
            a,
            cfg,
            rank,
            world,
            per_node,
            nodes,
        )
        self.counts, self.command = counts, command
        self.on_gpu = torch.cuda.is_available()

    def _row_head(self) -> dict:
        cfg, sp = self.cfg, self.cfg.parallel.sp_size
        plan = planned(cfg, self.shape, self.a.completion_len)
        budget = (
            cfg.memory.gpu_budget_gb * 1e9
            if cfg.memory.gpu_budget_gb
            else (torch.cuda.get_device_properties(0).total_memory if self.on_gpu else 0)
        )
        return {
            "config": self.a.config,
            "rank": self.rank,
            "world": self.world,
            "nodes": self.nodes,
            "gpus_per_node": self.per_node,
            "role": role_of(self.rank, self.per_node, sp),
            "sp_size": sp,
            "seq_len": cfg.train.seq_len,
            "model": cfg.model.name,
            "placement": plan.placement.spec(),  # the per-layer plan rehearsed
            "planned_gpu_bytes": int(plan.gpu_peak_bytes),
            "gpu_budget_bytes": int(budget),
            "planned_host_bytes_per_process": int(plan.host_peak_bytes / self.per_node),
        }

    def play(self) -> dict:
        self.shape = check(self.cfg, self.world, self.per_node)  # preflight's, read once
        row = self._row_head()
        try:
            return self._play(row)
        except torch.OutOfMemoryError as e:
            log.error("out of memory: %s", str(e).splitlines()[0])
            row.update(
                status="out_of_memory", error=str(e).splitlines()[0], layers=self._layers_text()
            )
        except NonFinite as e:
            log.error("%s", e)
            row.update(status="non_finite", error=str(e), layers=self._layers_text())
        row.update(self._provenance())
        return row

    def _layers_text(self) -> str:
        total = self.shape.geometry.layers
        return f"{self.a.layers or total}/{total}"

    def _provenance(self) -> dict:
        device = (
            torch.cuda.get_device_name(0) if self.on_gpu else f"cpu ({psutil.cpu_count()} cores)"
        )
        return {
            "commit": commit(),
            "device": device,
            "date": now(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "command": self.command,
        }

    def _play(self, row: dict) -> dict:
        cfg, a = self.cfg, self.a
        engine, data, params = self._build()
        st = engine.state
        clock = LayerClock(engine.model, engine.placement, self.on_gpu)
        if a.layers:
            ran = clock.pick(a.layers)
            clock.run_only(ran)
            log.info(
                "running %d of %d layers: %s (every layer built)", len(ran), len(clock.layers), ran
            )
        steps = []
        for step in range(a.steps):
            steps.append(self._step(engine, data, clock, step))
            self._so_far(clock, steps, row)
        compute = fastest_steady([s["seconds"] for s in steps])
        est, (peak_reserved, peak_allocated, host) = self._estimate(clock, steps, compute)
        intra, inter = links(a, cfg)
        pred = predict(est["seconds"], est["payloads"], self.rank, self.per_node, intra, inter)
        total = len(clock.layers)
        row.update(
            {
                "status": "ok",
                "layers": f"{len(clock.run)}/{total}",
                "layers_run": clock.run,
                "steps": a.steps,
                "peak_gpu_bytes": int(est["peak_reserved"]),
                "peak_gpu_allocated_bytes": int(est["peak_allocated"]),
                "host_rss_bytes": int(est["host"]),
                "compute_seconds_per_step": round(est["seconds"], 3),
                **self._prediction_fields(pred, intra, inter, est["payloads"], st),
                "step_seconds": [round(s["seconds"], 3) for s in steps],
                "optimizer_seconds_per_step": round(
                    fastest_steady([s["optimizer_seconds"] for s in steps]), 3
                ),
                "losses": [s["loss"] for s in steps],
                "grad_norms": [s["grad_norm"] for s in steps],
                "finite": True,
                "measured": {
                    "compute_seconds_per_step": round(compute, 3),
                    "peak_gpu_bytes": peak_reserved,
                    "peak_gpu_allocated_bytes": peak_allocated,
                    "host_rss_bytes": host,
                },
                **_layer_fields(est),
                **params,
                "dp_size": st.dp_size,
                "train_batch_size": engine.ds.train_batch_size(),
            }
        )
        row["gpu_vs_plan"] = row["peak_gpu_bytes"] / row["planned_gpu_bytes"] - 1
        row["host_vs_plan"] = row["host_rss_bytes"] / row["planned_host_bytes_per_process"] - 1
        row.update(self._provenance())
        _log_result(row, pred)
        return row

    def _build(self) -> tuple:
        """(engine, data, parameter counts): the rank built as `train` builds one, its optimizer
        state at build."""
        cfg = self.cfg
        t0, shape = time.perf_counter(), self.shape
        if cfg.train.objective == "dpo":  # rehearse.rehearsal_config set its data synthetic
            vocab, seed = shape.text.vocab_size, cfg.train.seed
            data = synthetic_pair_rows(cfg.train.seq_len, vocab, self.a.completion_len, seed)
        else:
            data = build_data(cfg, shape.hf_config, shape.dp)
        engine = build_engine(cfg, shape, optimizer_state=False)
        optimizer_state.at_start(cfg, engine.ds.optimizer, self.rank)
        st = engine.state
        params = {
            "params_local": local_params(engine.model),
            "params_total": full_params(engine.model),
        }  # all L
        log.info(
            "built in %.1f s: ZeRO-3 over %d ranks holds %d of the model's %d parameters here "
            "(1/%d), sp rank %d of %d",
            time.perf_counter() - t0,
            self.world,
            params["params_local"],
            params["params_total"],
            self.world,
            st.sp_rank,
            st.sp_size,
        )
        return engine, data, params

    def _prediction_fields(self, pred, intra, inter, payloads: dict, st) -> dict:
        """The row's predicted step time, its links and the collective bytes (by group and across
        nodes)."""
        return {
            "predicted_seconds_per_step": round(pred.seconds, 3),
            "predicted_no_overlap_seconds_per_step": round(pred.no_overlap_seconds, 3),
            "comm_seconds_per_step": {k: round(v, 4) for k, v in pred.comm_seconds.items()},
            "prediction": pred.breakdown(),
            "overlap": OVERLAP,
            "link": f"{intra.name} {intra.gb_per_s:g} GB/s"
            + (f" + {inter.name} {inter.gb_per_s:g} GB/s across nodes" if self.nodes > 1 else ""),
            "link_sources": {intra.name: intra.source, inter.name: inter.source},
            "collective_bytes_per_step": self._by_group(payloads, st),
            "cross_node_bytes_per_step": int(pred.cross_node_bytes),
        }

    @staticmethod
    def _estimate(clock, steps: list, seconds: float) -> tuple:
        """(the L-layer extrapolation of the steps so far at `seconds` per step, (peak reserved,
        peak allocated, host RSS) as measured): peaks over the steps, the host peak of the process,
        the last step's collectives."""
        measured = (
            max(s["peak_reserved"] for s in steps),
            max(s["peak_allocated"] for s in steps),
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        )
        return clock.extrapolate(seconds, *measured, steps[-1]["payloads"]), measured

    def _so_far(self, clock, steps: list, row: dict) -> None:
        """One log line per step with the rank's memory so far against the plan (extrapolated to
        every layer with --layers), so that a rehearsal whose machine is lost before its row is
        written still leaves its numbers."""
        est, _ = self._estimate(clock, steps, steps[-1]["seconds"])
        gpu, host = est["peak_reserved"], est["host"]
        plan_gpu, plan_host = row["planned_gpu_bytes"], row["planned_host_bytes_per_process"]
        left = ", ".join(f"{i}: {b:,}" for i, b in sorted(est["layer_gpu_bytes"].items()))
        log.info(
            "after step %d, %s: GPU peak %s reserved against the plan's %s (%s), host %s against "
            "%s (%s), step %.1f s%s",
            len(steps),
            f"extrapolated from {len(clock.run)} to {len(clock.layers)} layers"
            if clock.missing()
            else "every layer run",
            _gb(gpu),
            _gb(plan_gpu),
            vs_plan(gpu, plan_gpu),
            _gb(host),
            _gb(plan_host),
            vs_plan(host, plan_host),
            est["seconds"],
            f"; GPU left by each layer run (bytes) {left}" if clock.missing() else "",
        )

    def _step(self, engine, data, clock, step: int) -> dict:
        """Optimizer step `step + 1` through train's own step (run/step.timed_step), with the
        collectives' bytes counted; refuses a non-finite loss or gradient norm."""
        self.counts.reset()
        # the optimizer step's start: the gradients made (step_time.py's optimizer term, measured)
        marks = []

        def before_optimizer(_res):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

        t = timed_step(engine, data, step, self.cfg.train, before_optimizer)
        optimizer_seconds = time.perf_counter() - marks[0]
        clock.step_done()
        norm = engine.ds.get_global_grad_norm()
        norm = float(norm) if norm is not None else None
        if not math.isfinite(t.loss) or (norm is not None and not math.isfinite(norm)):
            raise NonFinite(
                f"step {step + 1}: loss {t.loss}, gradient norm {norm}: a rehearsal's numbers must "
                f"stay finite (kernels on non-finite values run faster, so its time would be wrong)"
            )
        out = {
            "seconds": t.seconds,
            "optimizer_seconds": optimizer_seconds,
            "loss": t.loss,
            "grad_norm": norm,
            "peak_reserved": t.peak_reserved,
            "peak_allocated": t.peak_allocated,
            "payloads": dict(self.counts.bytes),
        }
        log.info(
            "step %d/%d: %.2f s, loss %.4f and gradient norm %s finite, GPU peak %s reserved, host "
            "RSS %s",
            step + 1,
            self.a.steps,
            t.seconds,
            t.loss,
            f"{norm:.3g}" if norm is not None else "n/a",
            _gb(out["peak_reserved"]),
            _gb(psutil.Process().memory_info().rss),
        )
        return out

    def _by_group(self, payloads: dict, st) -> dict:
        """{kind: {group label: bytes}}: `sp` (this rank's SP group: Ulysses' all-to-all), `zero`
        (ZeRO-3's all-gather and reduce-scatter over the whole world), `world` (other collectives
        over it), `dp`, or the ranks."""
        sp_ranks = tuple(range(self.rank - st.sp_rank, self.rank - st.sp_rank + st.sp_size))
        dp_ranks = tuple(range(st.sp_rank, self.world, st.sp_size))
        out: dict = {}
        for (kind, ranks), b in payloads.items():
            if kind == "all_to_all" and ranks == sp_ranks:
                label = "sp"
            elif len(ranks) == self.world:
                label = "zero" if kind in ("all_gather", "reduce_scatter") else "world"
            else:
                label = (
                    "sp"
                    if ranks == sp_ranks
                    else "dp"
                    if ranks == dp_ranks
                    else f"ranks {ranks[0]}..{ranks[-1]}"
                )
            out.setdefault(kind, {})
            out[kind][label] = out[kind].get(label, 0) + int(b)
        return out


class NonFinite(RuntimeError):
    """A rehearsed step's loss or gradient norm is not finite."""


def local_params(model) -> int:
    """Elements of the parameters this rank holds (ZeRO-3's partitions; whole tensors where not
    partitioned)."""
    return sum(
        p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters()
    )


def full_params(model) -> int:
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
