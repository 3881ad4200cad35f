"""Per-process training entry: one process per GPU (or CPU rank), started by a launcher.

    torchrun --nproc_per_node 2 -m ds_longctx.train --config run.yaml [--key value ...]
    deepspeed --num_gpus 2 --module ds_longctx.train --config run.yaml
    accelerate launch --config_file accelerate.yaml -m ds_longctx.train --config run.yaml
    ds-longctx train --nproc 2 --sp_size 2            # starts the processes for you
    ... --save_every 100                              # checkpoints in <output_dir>/checkpoints
    ... --resume                                      # continue the latest one (same world size and sp_size)

Writes `<output_dir>/metrics.jsonl`: one JSON line per optimizer step
(step, loss, tokens, seconds, tokens_per_s, peak_gpu_bytes, host_rss_bytes, skipped_rows: the data's rows left out
as bad under data.skip_bad_rows, the same on every line), and with eval_data one line per
evaluation (step, eval_loss, eval_tokens, eval_rows, eval_seconds: every eval_every steps and after the last)
whose per-position curve goes to `<output_dir>/eval_curve.jsonl` (run/evaluate.py), and TensorBoard events in
`<output_dir>/tensorboard` when torch.utils.tensorboard imports. SIGTERM or SIGINT: every rank stops at the next
step boundary, saves a checkpoint and exits 0 (`ds-longctx train` itself 143 / 130). A NaN/inf loss stops the run
(exit 1) before its optimizer step. A refusal (bad config, bad data, an unusable checkpoint) exits 2 on every rank.
Each of these ends with one line (run/refuse.py, run/stops.py). A worker whose launcher dies ends itself.
`--help` lists every run-config field.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

from ds_longctx.parallel.parallel_state import local_world_size
from ds_longctx.run.evaluate import CURVE_FILE, METRICS_FILE, append_jsonl
from ds_longctx.run.refuse import last_line, refuse
from ds_longctx.run.stops import FAILED, StopRequest, signal_exit, signal_name, watch_launcher

log = logging.getLogger("ds_longctx")


def strip_launcher_args(argv: list[str]) -> list[str]:
    """Drop `--local_rank=N` / `--local-rank N` that the deepspeed launcher appends (LOCAL_RANK is in env)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.startswith(("--local_rank", "--local-rank")):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def parse_config(argv: list[str], world_size: int | None = None, per_node: int | None = None):
    """RunConfig from argv, or exit 2 with a readable message (before anything heavy is imported). `--help` / `-h`
    prints every field (section, flat and dotted key, type, default, doc) and exits 0. `world_size`, `per_node`: the
    processes the run is launched on, in all and per node (its planned world and sp_size are checked against them
    first), None where not known."""
    from pydantic import ValidationError

    from ds_longctx.config import RunConfig, format_validation_error
    argv = strip_launcher_args(argv)
    if "--help" in argv or "-h" in argv:
        print(__doc__ + "\n" + RunConfig.help_text())
        sys.exit(0)
    try:
        return RunConfig.from_cli(argv, world_size, per_node)
    except ValidationError as e:
        refuse(format_validation_error(e), int(os.environ.get("RANK", "0")))
    except (ValueError, FileNotFoundError) as e:
        refuse(f"invalid run config: {e}", int(os.environ.get("RANK", "0")))


def _host_rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def stop(message: str, rank: int):
    """A failure (not a refusal): every rank leaves with exit 1 (FAILED); rank 0 says why, last (run/refuse.last_line).
    Tears the process group down."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    last_line(message, FAILED, rank)
    sys.exit(FAILED)


def stopped_by_signal(signum: int, done: int, steps: int, tag_dir, rank: int) -> None:
    """Rank 0's last line after a signal stopped the run at step `done` (saved in `tag_dir`, None: nothing trained);
    the launcher's exit code is the signal's (`signal_exit`)."""
    name = signal_name(signum)
    if tag_dir is None:
        message = f"stopped by {name} before step {done + 1}: nothing trained since the start, nothing saved"
    else:
        message = (f"stopped by {name} at step {done} of {steps}: saved {tag_dir}; the same command with --resume "
                   f"continues it")
    last_line(message, signal_exit(signum), rank)


def out_of_memory(cfg, step: int):
    """An out-of-memory error at `step` on this rank (0: the optimizer state before step 1; maybe not rank 0): the
    allocator's report, then what to change; exit 1 (the launcher ends the other ranks)."""
    import traceback

    from ds_longctx.run.gpu_budget import out_of_budget
    traceback.print_exc()
    print(out_of_budget(cfg.memory.gpu_budget_gb, step), file=sys.stderr, flush=True)
    os._exit(1)  # the other ranks wait in a collective: no teardown that would wait for them


def default_group_timeout(seconds: float) -> None:
    """Make `seconds` the timeout of every process group created from now on, not only the world group.

    init_process_group's timeout covers the world group; `new_group` (our SP/DP groups, DeepSpeed's ZeRO
    groups) falls back to torch's module default (30 min gloo, 10 min NCCL), so a hung rank would hold those
    collectives that long. Set process-wide and never undone: this process lives for this one run.
    """
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d
    c10d.default_pg_timeout = timedelta(seconds=seconds)
    c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


def rank0_first(fn, rank: int):
    """fn() on rank 0, then on the others (rank 0 fills the datasets cache, the others read it). A ValueError
    on rank 0 is returned to every rank as its message, so all of them stop together."""
    import torch.distributed as dist
    msg = [None]
    if rank == 0:
        try:
            out = fn()
        except ValueError as e:
            msg = [str(e)]
    if dist.is_initialized():
        dist.broadcast_object_list(msg, src=0)
    if msg[0] is not None:
        raise ValueError(msg[0])
    return out if rank == 0 else fn()


def _continue_lines(path: Path, start_step: int) -> None:
    """A fresh run (start_step 0) keeps an older `path` aside; a resumed one drops its lines past start_step."""
    if not path.exists():
        return
    if start_step == 0:
        old = path.with_name(f"{path.stem}.{int(path.stat().st_mtime)}{path.suffix}")
        path.rename(old)
        log.info("previous %s kept as %s", path.name, old)
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= start_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


class MetricsLog:
    """metrics.jsonl (train lines with `loss`, eval lines with `eval_loss`), eval_curve.jsonl and TensorBoard
    (when installed), rank 0 only. A fresh run keeps older files aside; a resumed one drops lines past its
    checkpoint's step and appends."""

    def __init__(self, out: Path, start_step: int, tensorboard: bool, enabled: bool):
        self.path, self.curve_path, self.enabled, self.tb = out / METRICS_FILE, out / CURVE_FILE, enabled, None
        if not enabled:
            return
        _continue_lines(self.path, start_step)
        _continue_lines(self.curve_path, start_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)
            except ImportError:
                log.info("tensorboard not installed: metrics.jsonl only")

    def write(self, row: dict) -> None:
        """A train line (`loss`, ...) or an eval line (`eval_loss`, ...) of metrics.jsonl."""
        if not self.enabled:
            return
        append_jsonl(self.path, row)
        if self.tb is None:
            return
        if "eval_loss" in row:
            self.tb.add_scalar("eval/loss", row["eval_loss"], row["step"])
            return
        for k in ("loss", "tokens_per_s", "lr", "seconds"):
            self.tb.add_scalar(f"train/{k}", row[k], row["step"])

    def write_eval(self, result, step: int) -> None:
        """One evaluation: its metrics.jsonl line and its eval_curve.jsonl line."""
        self.write(result.metrics_row(step))
        if self.enabled:
            append_jsonl(self.curve_path, result.curve_row(step))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def main(argv: list[str] | None = None) -> None:
    # ---------------------------------------------------------------- config and checks (nothing started or written)
    watch_launcher()  # from the first moment: a killed launcher must not leave this worker running
    signals = StopRequest().install()  # SIGTERM / SIGINT from here on: stop at a step boundary, save
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    cfg = parse_config(sys.argv[1:] if argv is None else argv, world, local_world_size(world))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="[ds_longctx] %(message)s")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    from tqdm import tqdm

    from ds_longctx.run import checkpoint, memory_snapshot, optimizer_state
    from ds_longctx.data import build_data, build_eval_data
    from ds_longctx.parallel.parallel_state import init_distributed, leave
    from ds_longctx.run.engine import build_engine
    from ds_longctx.run.evaluate import evaluate
    from ds_longctx.run.preflight import preflight
    try:
        hf_cfg, resume_meta = preflight(cfg, world)
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)

    # ---------------------------------------------------------------- process group (a dead or hung rank ends the job)
    default_group_timeout(cfg.parallel.collective_timeout_s)
    init_distributed(cfg.parallel.collective_timeout_s)
    dp_size = world // cfg.parallel.sp_size

    # ---------------------------------------------------------------- data (rank 0 tokenizes into the cache first)
    try:
        data = rank0_first(lambda: build_data(cfg, hf_cfg, dp_size), rank)
        held = rank0_first(lambda: build_eval_data(cfg, hf_cfg), rank)  # None without eval_data
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)

    # ---------------------------------------------------------------- engine
    snapshot_steps = cfg.logging.memory_snapshot_steps
    if snapshot_steps:
        memory_snapshot.start()  # before the build: the weights' and optimizer's blocks get their code lines
    engine = build_engine(cfg, hf_cfg, optimizer_state=False)  # made below, after a resume (which brings it)
    st = engine.state
    out = Path(cfg.train.output_dir)

    # ---------------------------------------------------------------- resume, then the run's files
    start = 0
    if resume_meta is not None:
        try:
            start = checkpoint.load(engine, checkpoint.ckpt_root(out) / resume_meta["tag"], resume_meta,
                                    data.signature())
        except ValueError as e:
            refuse(f"refused: {e}", st.rank)
    # the Adam moments before step 1 (optimizer.state_at_build), where no checkpoint brought them
    t_state = time.perf_counter()
    try:
        made = optimizer_state.at_start(cfg, engine.ds.optimizer, st.rank)
    except torch.OutOfMemoryError:
        out_of_memory(cfg, 0)
    if made and st.rank == 0:  # its seconds: one optimizer pass over every sub-group (CPU Adam where offloaded)
        log.info("optimizer state ready: %.1f s, host RSS %.2f GiB, GPU allocated %.2f GiB",
                 time.perf_counter() - t_state, _host_rss() / 2 ** 30,
                 torch.cuda.memory_allocated() / 2 ** 30 if torch.cuda.is_available() else 0.0)
    if st.rank == 0:
        checkpoint.clear_previous_run(cfg)  # --overwrite: the previous run's checkpoints go
        out.mkdir(parents=True, exist_ok=True)
        cfg.dump(out / "run.yaml")
        (out / "ds_config.json").write_text(json.dumps(engine.ds_config, indent=2) + "\n")
        log.info("world %d = sp %d x dp %d, model %s, seq_len %d, %s, steps %d..%d", st.world_size, st.sp_size,
                 st.dp_size, cfg.model.name, cfg.train.seq_len, "bf16" if engine.ds_config["bf16"]["enabled"] else "fp32",
                 start + 1, cfg.train.steps)
    metrics = MetricsLog(out, start, cfg.logging.tensorboard, enabled=st.rank == 0)
    saved = resume_meta["step"] if resume_meta else None
    done = start
    last_eval = None

    # ---------------------------------------------------------------- loop
    bar = tqdm(range(start, cfg.train.steps), initial=start, total=cfg.train.steps, disable=st.rank != 0, desc="train",
               unit="step", dynamic_ncols=True)
    for step in bar:  # `step` optimizer steps are done; this iteration makes step + 1
        if signals.agreed(engine.device):
            break
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = data.get(step, cfg.train.micro_batch, st.dp_rank, st.dp_size)
        try:
            res = engine.forward_backward(batch.input_ids, batch.position_ids, batch.labels)
        except torch.OutOfMemoryError:
            out_of_memory(cfg, step + 1)
        if not math.isfinite(res.loss):
            metrics.close()
            stop(f"stopped: loss is {res.loss} at step {step + 1}, before its optimizer step (the weights are those "
                 f"after step {step}; last checkpoint: {checkpoint.tag_for(saved) if saved else 'none'}). Lower lr "
                 f"(now {cfg.optimizer.lr}), add warmup_steps, or check this step's rows", st.rank)
        try:
            engine.step()
        except torch.OutOfMemoryError:
            out_of_memory(cfg, step + 1)
        done = step + 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0
        row = {"step": step + 1, "loss": res.loss, "tokens": cfg.train.seq_len * cfg.train.micro_batch * st.dp_size,
               "supervised_tokens": res.tokens, "seconds": round(seconds, 4),
               "tokens_per_s": round(cfg.train.seq_len * cfg.train.micro_batch * st.dp_size / seconds, 1),
               "lr": engine.ds.get_lr()[0], "peak_gpu_bytes": peak, "peak_gpu_allocated_bytes":
               torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
               "host_rss_bytes": _host_rss(), "skipped_rows": data.skipped_rows}
        if torch.distributed.is_initialized() and torch.cuda.is_available():
            m = torch.tensor([peak, row["peak_gpu_allocated_bytes"]], dtype=torch.float64, device=engine.device)
            torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX)
            row["peak_gpu_bytes_max_rank"], row["peak_gpu_allocated_bytes_max_rank"] = int(m[0]), int(m[1])
        metrics.write(row)
        if snapshot_steps and done == min(start + snapshot_steps, cfg.train.steps):
            memory_snapshot.dump(out, st.rank, done - start)
        if held is not None and (done == cfg.train.steps or (cfg.eval.every and done % cfg.eval.every == 0)):
            last_eval = evaluate(engine, held, cfg.eval.rows, cfg.eval.buckets)  # collective
            metrics.write_eval(last_eval, done)
        if st.rank == 0 and (step % cfg.logging.log_every == 0 or step + 1 == cfg.train.steps):
            bar.set_postfix(loss=f"{res.loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            mem=f"{peak / 2**30:.1f}GiB", rss=f"{row['host_rss_bytes'] / 2**30:.1f}GiB",
                            **({"eval": f"{last_eval.loss:.4f}"} if last_eval is not None else {}))
        if cfg.checkpoint.save_every and ((step + 1) % cfg.checkpoint.save_every == 0 or step + 1 == cfg.train.steps):
            checkpoint.save(engine, cfg, step + 1, data.signature())
            saved = step + 1
    bar.close()

    # ---------------------------------------------------------------- end (a signal: save where the ranks stopped)
    signum = signals.agreed(engine.device)
    if signum and done < cfg.train.steps:
        tag_dir = checkpoint.save(engine, cfg, done, data.signature()) if done > start or saved == done else None
        metrics.close()
        stopped_by_signal(signum, done, cfg.train.steps, tag_dir, st.rank)
        leave(0)
    signals.uninstall()
    metrics.close()
    if st.rank == 0:
        log.info("done: %d steps, metrics in %s", done, metrics.path)
    leave(0)  # everything is written: barrier, groups torn down, no Python teardown (parallel_state.leave)


if __name__ == "__main__":
    main()
