"""The training run of one process, after its config passed the entry's checks (run/train.py):
preflight, process group, data, engine, resume, then the loop of optimizer steps and the end.

Each section is one function, called in order by `train`; what each writes and how each stops is
run/train.py's module docstring.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from tqdm import tqdm

from ds_longctx.checkpoint import layout_change, resume, run_lock
from ds_longctx.checkpoint.layout import (
    RUN_CONFIGS,
    RUN_MARKER,
    CheckpointError,
    ckpt_root,
    tag_for,
)
from ds_longctx.checkpoint.save import save
from ds_longctx.config import RunConfig
from ds_longctx.config.model import resolve_model
from ds_longctx.data import build_data, build_eval_data
from ds_longctx.data.tokenize import tokenizer_path
from ds_longctx.levers import disk_tier
from ds_longctx.levers.gpu_budget import out_of_budget
from ds_longctx.parallel.disk import mark_written
from ds_longctx.parallel.parallel_state import init_distributed, leave
from ds_longctx.run import memory_snapshot, optimizer_state, resume_changes
from ds_longctx.run.engine import LongCtxEngine, build_engine
from ds_longctx.run.evaluate import evaluate
from ds_longctx.run.metrics_log import MetricsLog
from ds_longctx.run.preference_step import needs_reference, reference_logps
from ds_longctx.run.preflight import preflight
from ds_longctx.run.ranks import default_group_timeout, rank0_first
from ds_longctx.run.recall import answers_writer
from ds_longctx.run.refuse import last_line, refuse
from ds_longctx.run.run_log import LOG_NAME, keep_log
from ds_longctx.run.step import TimedStep, timed_step
from ds_longctx.run.stops import FAILED, StopRequest, saving, signal_exit, signal_name

log = logging.getLogger("ds_longctx")


def _host_rss() -> int:
    return psutil.Process().memory_info().rss


def fail(message: str, rank: int):
    """A failure (not a refusal): every rank leaves with exit 1 (FAILED); rank 0 says why, last
    (run/refuse.last_line). Tears the process group down."""
    if dist.is_initialized():
        dist.destroy_process_group()
    last_line(message, FAILED, rank)
    sys.exit(FAILED)


def stopped_by_signal(
    signum: int, done: int, steps: int, tag_dir, rank: int, note: str = ""
) -> None:
    """Rank 0's last line after a signal stopped the run at step `done` (saved in `tag_dir`, None:
    nothing trained; `note`: metrics lines unwritten); the launcher's exit code is the signal's."""
    name = signal_name(signum)
    if tag_dir is None:
        message = (
            f"stopped by {name} before step {done + 1}: nothing trained since the start, nothing "
            "saved"
        )
    else:
        message = (
            f"stopped by {name} at step {done} of {steps}: saved {tag_dir}; the same command with "
            f"--resume continues it"
        )
    last_line(message + (f"; {note}" if note else ""), signal_exit(signum), rank)


def out_of_memory(cfg: RunConfig, step: int):
    """An out-of-memory error at `step` on this rank (0: the optimizer state before step 1; maybe
    not rank 0): the allocator's report, then what to change; exit 1 (the launcher ends the other
    ranks)."""
    traceback.print_exc()
    print(out_of_budget(cfg.memory.gpu_budget_gb, step), file=sys.stderr, flush=True)
    os._exit(1)  # the other ranks wait in a collective: no teardown that would wait for them


def train(cfg: RunConfig, signals: StopRequest, rank: int, world: int) -> None:
    """The run of this rank, from the engine's checks to the end (exit through
    `parallel_state.leave`)."""
    engine, data, held, resume_meta = build_run(cfg, rank, world, signals)
    start = resume_run(cfg, engine, data, resume_meta)
    out = Path(cfg.train.output_dir)
    # past every refusal of a new run (it writes nothing): this rank's output goes there too
    keep_log(out)
    if engine.state.rank == 0:
        write_run_files(cfg, engine, out, start)
    if needs_reference(cfg.train):
        try:
            reference_logps(engine, data, out, resume_meta is None, cfg.train.ref_model)
        except ValueError as e:
            refuse(f"refused: {e}", engine.state.rank)
    metrics = MetricsLog(out, start, cfg.logging.report_to, enabled=engine.state.rank == 0, cfg=cfg)
    saved = resume_meta["step"] if resume_meta else None
    done, saved = train_steps(cfg, engine, data, held, metrics, signals, start, saved)
    end_run(cfg, engine, data, metrics, signals, start, done, saved)


def build_run(cfg: RunConfig, rank: int, world: int, signals: StopRequest) -> tuple:
    """(engine, data, held-out data or None, resume meta or None): checks, process group, data,
    engine. A refusal (bad input found here) exits 2 on every rank."""
    # ------------------------------------------------------------ checks (nothing started/written)
    try:
        shape, resume_meta = preflight(cfg, world)
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)
    # ------------------------------------------------------------ process group (hangs time out)
    default_group_timeout(cfg.parallel.collective_timeout_s)
    init_distributed(cfg.parallel.collective_timeout_s)
    dp_size = shape.dp
    # ------------------------------------------------------------ one writer, then data
    # rank 0 holds output_dir's lock unless `ds-longctx train` does (checkpoint/run_lock.py), and
    # tokenizes into the cache first
    try:
        rank0_first(
            lambda: run_lock.take(
                cfg.train.output_dir, rank=rank, launcher=os.environ.get(run_lock.LOCK_ENV)
            ),
            rank,
        )
        with signals.now("reading and tokenizing the data"):  # no step boundary to wait for yet
            data = rank0_first(lambda: build_data(cfg, shape.hf_config, dp_size), rank)
            # None without eval_data
            held = rank0_first(lambda: build_eval_data(cfg, shape.hf_config), rank)
        steps_of_epochs(cfg, data, dp_size, rank)
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)
    # ------------------------------------------------------------ engine
    if cfg.logging.memory_snapshot_steps:
        # before the build: the weights' and optimizer's blocks get their code lines
        memory_snapshot.start()
    # the optimizer state is made by `resume_run`, after a checkpoint could bring it
    engine = build_engine(cfg, shape, optimizer_state=False)
    return engine, data, held, resume_meta


def steps_of_epochs(cfg: RunConfig, data, dp_size: int, rank: int) -> None:
    """With train.epochs: train.steps set to epochs x the steps of one pass over the data's rows,
    said in one line."""
    t = cfg.train
    per_step = dp_size * t.micro_batch * t.grad_accum
    if t.epochs is None:
        return
    if not hasattr(data, "n_rows"):
        raise ValueError(
            f"epochs={t.epochs:g} counts passes over the data's rows, and data='synthetic' draws "
            f"new rows forever; give steps instead"
        )
    per_epoch = data.n_rows // per_step
    if per_epoch == 0:
        raise ValueError(
            f"epochs={t.epochs:g}: the data has {data.n_rows} rows, fewer than one step's "
            f"{per_step} (dp {dp_size} x micro_batch {t.micro_batch} x grad_accum {t.grad_accum}); "
            "add data or give steps"
        )
    t.steps = max(1, int(t.epochs * per_epoch))
    if rank == 0:
        log.info(
            "epochs %g: %d rows, %d steps an epoch of %d sequences (%d tokens) -> %d steps",
            t.epochs,
            data.n_rows,
            per_epoch,
            per_step,
            per_step * t.seq_len,
            t.steps,
        )


def resume_run(cfg: RunConfig, engine: LongCtxEngine, data, resume_meta) -> int:
    """Load the checkpoint of `resume_meta` (None: a fresh run), then make the Adam moments before
    step 1 (optimizer.state_at_build) where no checkpoint brought them. Returns the steps already
    done."""
    st, start = engine.state, 0
    if resume_meta is not None:
        tag_dir = ckpt_root(Path(cfg.train.output_dir)) / resume_meta["tag"]
        try:
            start = resume.load(engine, tag_dir, resume_meta, data.signature())
        except ValueError as e:
            refuse(f"refused: {e}", st.rank)
        # this run's lr and schedule over the saved
        resume_changes.apply_changes(engine, cfg, tag_dir, resume_meta)
        engine.sample_offset = layout_change.sample_offset(
            resume_meta, st.dp_size * cfg.train.micro_batch * cfg.train.grad_accum
        )
    t_state = time.perf_counter()
    try:
        made = optimizer_state.at_start(cfg, engine.ds.optimizer, st.rank)
    except torch.OutOfMemoryError:
        out_of_memory(cfg, 0)
    # its seconds: one optimizer pass over every sub-group (CPU Adam where offloaded)
    if made and st.rank == 0:
        log.info(
            "optimizer state ready: %.1f s, host RSS %.2f GiB, GPU allocated %.2f GiB",
            time.perf_counter() - t_state,
            _host_rss() / 2**30,
            torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
        )
    return start


def write_run_files(cfg: RunConfig, engine: LongCtxEngine, out: Path, start: int) -> None:
    """Rank 0: the previous run's checkpoints gone (--overwrite), then run.yaml and ds_config.json
    in `out`."""
    st = engine.state
    try:
        resume.clear_previous_run(cfg)
    except ValueError as e:  # a file no save wrote appeared in checkpoints/ since preflight's check
        refuse(f"refused: {e}", st.rank)
    out.mkdir(parents=True, exist_ok=True)
    cfg.dump(out / "run.yaml")
    (out / "ds_config.json").write_text(json.dumps(engine.ds_config, indent=2) + "\n")
    mark_written(out, RUN_MARKER, RUN_CONFIGS)  # ours: a later --overwrite may replace them
    dtype = "bf16" if engine.ds_config["bf16"]["enabled"] else "fp32"
    source = resolve_model(cfg.model.name)
    log.info(
        "world %d = sp %d x dp %d, model %s, seq_len %d, %s, steps %d..%d",
        st.world_size,
        st.sp_size,
        st.dp_size,
        source.label,
        cfg.train.seq_len,
        dtype,
        start + 1,
        cfg.train.steps,
    )
    weights = "random init (no checkpoint)"
    if source.kind == "directory":
        weights = f"loaded from {source.config.parent}"
    tok = tokenizer_path(cfg) if cfg.data.source != "synthetic" else None
    log.info(
        "weights %s; tokenizer %s; output also in %s",
        weights,
        tok or "none (synthetic data or token ids)",
        out / LOG_NAME,
    )


def step_row(cfg: RunConfig, engine: LongCtxEngine, data, t: TimedStep, done: int) -> dict:
    """The metrics.jsonl line of optimizer step `done`; on several CUDA ranks also the peaks of the
    rank that reached the highest (a collective)."""
    tokens = cfg.train.seq_len * cfg.train.micro_batch * cfg.train.grad_accum * engine.state.dp_size
    row = {
        "step": done,
        "loss": t.loss,
        "lr": t.lr,
        "grad_norm": engine.grad_norm(),
        "tokens": tokens,
        "trained_tokens": t.tokens,
        "seconds": round(t.seconds, 4),
        "tokens_per_s": round(tokens / t.seconds, 1),
        "peak_gpu_bytes": t.peak_reserved,
        "peak_gpu_allocated_bytes": t.peak_allocated,
        "host_rss_bytes": _host_rss(),
        "skipped_rows": data.skipped_rows,
        **disk_tier.step_stats(),
        **t.extra,
    }
    if dist.is_initialized() and torch.cuda.is_available():
        peaks = [t.peak_reserved, t.peak_allocated]
        m = torch.tensor(peaks, dtype=torch.float64, device=engine.device)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        row["peak_gpu_bytes_max_rank"] = int(m[0])
        row["peak_gpu_allocated_bytes_max_rank"] = int(m[1])
    return row


def train_steps(
    cfg: RunConfig,
    engine: LongCtxEngine,
    data,
    held,
    metrics: MetricsLog,
    signals: StopRequest,
    start: int,
    saved,
) -> tuple:
    """Optimizer steps start + 1 .. train.steps, each: the step (stopped before its optimizer step
    on a non-finite loss), its metrics line, the memory snapshot, an evaluation and a checkpoint
    when due. Ends early at the step boundary where every rank saw a signal. Returns (steps done,
    step of the last checkpoint or None)."""
    st, done, last_eval = engine.state, start, None
    snapshot_steps = cfg.logging.memory_snapshot_steps
    shown = dict(disable=st.rank != 0, desc="train", unit="step", dynamic_ncols=True)
    bar = tqdm(range(start, cfg.train.steps), initial=start, total=cfg.train.steps, **shown)
    scored = cfg.eval.answer_loss or cfg.eval.recall
    answers = answers_writer(engine, cfg, cfg.model.name) if scored else None
    if answers is not None and start == 0:
        answers(0)  # the untrained model's, before the first step
    for step in bar:  # `step` optimizer steps are done; this iteration makes step + 1
        if signals.agreed(engine.device):
            break

        def finite_or_stop(res, step=step):
            if not math.isfinite(res.loss):
                note = metrics.close()
                fail(
                    f"stopped: loss is {res.loss} at step {step + 1}, before its optimizer step "
                    f"(the weights are those after step {step}; last checkpoint: "
                    f"{tag_for(saved) if saved else 'none'}). "
                    f"Lower lr (now {cfg.optimizer.lr}), add warmup_steps, or check this step's "
                    "rows" + (f"; {note}" if note else ""),
                    st.rank,
                )

        try:
            t = timed_step(engine, data, step, cfg.train, before_optimizer=finite_or_stop)
        except torch.OutOfMemoryError:
            out_of_memory(cfg, step + 1)
        done = step + 1
        row = step_row(cfg, engine, data, t, done)
        metrics.write(row)
        if snapshot_steps and done == min(start + snapshot_steps, cfg.train.steps):
            memory_snapshot.dump(Path(cfg.train.output_dir), st.rank, done - start)
        if held is not None and (
            done == cfg.train.steps or (cfg.eval.every and done % cfg.eval.every == 0)
        ):
            last_eval = evaluate(engine, held, cfg.eval.rows, cfg.eval.buckets)  # collective
            metrics.write_eval(last_eval, done)
            if answers is not None:
                answers(done)  # collective
        if st.rank == 0 and (step % cfg.logging.log_every == 0 or done == cfg.train.steps):
            bar.set_postfix(
                loss=f"{t.loss:.4f}",
                tok_s=f"{row['tokens_per_s']:.0f}",
                mem=f"{t.peak_reserved / 2**30:.1f}GiB",
                rss=f"{row['host_rss_bytes'] / 2**30:.1f}GiB",
                **({"eval": f"{last_eval.loss:.4f}"} if last_eval is not None else {}),
            )
        if cfg.checkpoint.save_every and (
            done % cfg.checkpoint.save_every == 0 or done == cfg.train.steps
        ):
            save_or_stop(engine, cfg, done, data)
            saved = done
    bar.close()
    return done, saved


def save_or_stop(engine: LongCtxEngine, cfg: RunConfig, done: int, data) -> Path:
    """The checkpoint of step `done`; a save that fails (a full disk) stops the run with its one
    line, exit 1."""
    try:
        with saving(done):  # signals wait for the save (run/stops.py)
            return save(engine, cfg, done, data.signature())
    except CheckpointError as e:
        fail(f"stopped at step {done} of {cfg.train.steps}: {e}", engine.state.rank)


def end_run(
    cfg: RunConfig,
    engine: LongCtxEngine,
    data,
    metrics: MetricsLog,
    signals: StopRequest,
    start: int,
    done: int,
    saved,
) -> None:
    """The end: after a signal, a checkpoint where the ranks stopped and the signal's last line;
    else the done line (exit 1 where metrics lines could not be written: they are printed, and the
    line says so). Every rank leaves through `parallel_state.leave` (barrier, groups torn down, no
    Python teardown), output_dir's lock released."""
    st = engine.state
    signum = signals.agreed(engine.device)
    if signum and done < cfg.train.steps:
        tag_dir = save_or_stop(engine, cfg, done, data) if done > start or saved == done else None
        stopped_by_signal(signum, done, cfg.train.steps, tag_dir, st.rank, metrics.close())
        run_lock.release_all()
        leave(0)
    signals.uninstall()
    note = metrics.close()
    run_lock.release_all()
    if note:
        last_line(f"done: {done} steps, but {note}", FAILED, st.rank)
        leave(FAILED)
    if st.rank == 0:
        log.info("done: %d steps, metrics in %s", done, metrics.path)
    leave(0)
