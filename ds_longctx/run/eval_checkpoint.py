"""`ds-longctx eval`: a saved checkpoint's eval loss and per-position loss curve on held-out rows,
under SP.

    ds-longctx eval --checkpoint OUTPUT_DIR --data PATH|synthetic [--nproc N] [--tag step300]
                    [--rows R] [--buckets B] [--answer_loss true] [--recall true] [--out DIR]
                    [--key value ...]
    ds-longctx eval --model MODEL_DIR --data SESSIONS --out DIR [--recall true] [--seq_len L]
                    [--sp_size N] [--nproc N] [--key value ...]

The run config is the checkpoint's (`<tag>/run.yaml`); the flags set its eval section, and
`--key value` any other key except those that make the model (`FIXED`). N must be the world size
that wrote the checkpoint. Bad input exits 2 with one line before any worker starts.

Writes one line to `<out>/metrics.jsonl` and the curve to `<out>/eval_curve.jsonl`; --answer_loss
true adds answer_loss.jsonl (the data must be `data prepare --sessions` output), --recall true
recall.jsonl and recall_answers.jsonl. `out` is --out, else the checkpoint's output_dir. --model
evaluates a model directory as it is (step 0; --out required; --nproc default sp_size). Details:
docs/design/run.md."""

from __future__ import annotations

# torch and the engine's modules are imported in main, after eval_inputs: bad input is refused
# without them.
# torch, the data and the engine are imported by `main`, in the workers: the launcher checks the
# arguments (`eval_inputs`) without them.
import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from ds_longctx import data
from ds_longctx.checkpoint.layout import (
    ANSWER_LOSS_FILE,
    ANSWERS_FILE,
    CURVE_FILE,
    METRICS_FILE,
    RECALL_ANSWERS_FILE,
    RECALL_FILE,
    RUN_MARKER,
    loadable,
)
from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.parallel.disk import describe_os_error, mark_written, user_path
from ds_longctx.parallel.parallel_state import init_distributed
from ds_longctx.run.answer_loss import answer_loss_lines, answer_sessions
from ds_longctx.run.evaluate import append_jsonl, evaluate
from ds_longctx.run.recall import recall_rows
from ds_longctx.run.refuse import last_line, refuse
from ds_longctx.run.stops import FAILED, end_on_signal, watch_launcher

log = logging.getLogger("ds_longctx")
FIXED = (
    "model",
    "dtype",
    "rope_scaling",
    "seq_len",
    "sp_size",
)  # keys that make the model and its partitions
# the way out when `out` is another writer's: an eval whose lines go elsewhere only reads the run
# (no lock there)
EVAL_MARKER = (
    ".ds_longctx-eval"  # in an --out an eval made: its lines files are an eval's, appended to later
)
OUT_FIX = "pass --out another directory (an eval that writes elsewhere only reads the checkpoint)"


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds-longctx eval",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        type=user_path,
        help="a run's output_dir (or its checkpoints/ directory)",
    )
    p.add_argument(
        "--model",
        default=None,
        type=user_path,
        help="instead of --checkpoint: a model directory, evaluated as it is",
    )
    p.add_argument(
        "--data", required=True, help="held-out data: synthetic, or a file / directory like --data"
    )
    p.add_argument("--tag", default=None, help="checkpoint tag, e.g. step300 (default: latest)")
    p.add_argument(
        "--rows", type=int, default=None, help="eval rows (default: the run's eval_rows)"
    )
    p.add_argument(
        "--buckets",
        type=int,
        default=None,
        help="position buckets (default: the run's eval_buckets)",
    )
    p.add_argument(
        "--answer_loss",
        "--eval_answer_loss",
        "--eval.answer_loss",
        dest="answer_loss",
        default="false",
        help="true: also the loss on session answers by answer-to-evidence distance, to "
        "answer_loss.jsonl "
        "(--data: a `data prepare --sessions` directory; default false, whatever the run's)",
    )
    p.add_argument(
        "--recall",
        "--eval_recall",
        "--eval.recall",
        dest="recall",
        default="false",
        help="true: also recall by answer-to-evidence distance, to recall.jsonl (run/recall.py; "
        "--data: a `data prepare --sessions` directory; default false, whatever the run's)",
    )
    p.add_argument(
        "--out",
        default=None,
        type=user_path,
        help="where metrics.jsonl and eval_curve.jsonl get the lines (default: the checkpoint's "
        "output_dir)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="local processes (ds-longctx eval: the checkpoint's world size, the default)",
    )
    return p


def eval_inputs(argv: list[str], world_size: int | None):
    """(run config, run shape, tag directory, meta, out directory) of an eval, or ValueError naming
    the fix. Starts and reads nothing heavy."""
    from ds_longctx.checkpoint.resume import check_output_dir
    from ds_longctx.run.preflight import rope_coverage, validate

    a, rest = args_parser().parse_known_args(argv)
    ours = {
        "eval_data": a.data,
        "eval_rows": a.rows,
        "eval_buckets": a.buckets,
        "eval_answer_loss": a.answer_loss,
        "eval_recall": a.recall,
    }
    flags = [x for k, v in ours.items() if v is not None for x in (f"--{k}", str(v))]
    if (a.checkpoint is None) == (a.model is None):
        raise ValueError(
            "eval: give one of --checkpoint RUN (a run's weights) and --model DIR (a model as it "
            "is)"
        )
    if a.model is not None:
        cfg, tag_dir, meta, world = model_inputs(a, rest, flags, world_size)
    else:
        cfg, tag_dir, meta, world = checkpoint_inputs(a, rest, flags, world_size)
    run_dir = None if tag_dir is None else tag_dir.parent.parent
    out = Path(a.out) if a.out else run_dir
    check_output_dir(str(out))
    if (run_dir is None or out.resolve() != run_dir.resolve()) and (theirs := users_lines(out)):
        raise ValueError(
            f"eval: --out {out} holds {', '.join(theirs)}, which no run or eval of this project "
            f"wrote there, and eval appends its lines to them; choose another --out"
        )
    shape = validate(cfg, world)
    rope_coverage(cfg, shape.hf_config)
    data.check_eval_source(cfg, shape.text.vocab_size)
    if cfg.eval.answer_loss or cfg.eval.recall:
        answer_sessions(
            cfg,
            limit=1,
            names=("--recall true" if cfg.eval.recall else "--answer_loss true", "--data"),
        )
    return cfg, shape, tag_dir, meta, out


def checkpoint_inputs(a, rest: list, flags: list, world_size: int | None) -> tuple:
    """(run config, tag directory, meta, world size) of a checkpoint's eval; ValueError where the
    layout cannot load it or a FIXED key changes."""
    from ds_longctx.checkpoint.export import find_run_checkpoint

    tag_dir, meta = find_run_checkpoint(a.checkpoint, a.tag, what="eval")
    run = meta["run"]
    world = run["world_size"] if world_size is None else world_size
    if not loadable(
        run, world, run["sp_size"]
    ):  # sp_size: a FIXED key, so the world alone can differ
        raise ValueError(
            f"eval: checkpoint {str(tag_dir)!r} was written by world_size={run['world_size']} with "
            f"sp_size={run['sp_size']}, this eval has {world} processes; ZeRO-3 partitions are per "
            "rank: "
            f"evaluate with --nproc {run['world_size']} (or `ds-longctx export` it to a model "
            f"directory and train/evaluate that in a new run)"
        )
    saved = RunConfig.load(tag_dir / "run.yaml")
    try:
        cfg = RunConfig.from_cli(["--config", str(tag_dir / "run.yaml"), *rest, *flags])
    except ValidationError as e:
        raise ValueError(format_validation_error(e)) from None
    changed = [(k, saved.get(k), cfg.get(k)) for k in FIXED if saved.get(k) != cfg.get(k)]
    if changed:
        what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)
        raise ValueError(
            f"eval: this changes {what} from checkpoint {str(tag_dir)!r}, whose weights and "
            f"partitions are made for its own; drop those options"
        )
    return cfg, tag_dir, meta, world


def model_inputs(a, rest: list, flags: list, world_size: int | None) -> tuple:
    """(run config, None, meta of step 0, world size) of a model directory's eval."""
    if a.out is None:
        raise ValueError(f"eval --model {a.model!r} needs --out DIR, where its lines go")
    try:
        cfg = RunConfig.from_cli(["--model", a.model, *rest, *flags, "--output_dir", a.out])
    except ValidationError as e:
        raise ValueError(format_validation_error(e)) from None
    world = cfg.parallel.sp_size if world_size is None else world_size
    return cfg, None, {"step": 0, "run": {"world_size": world}}, world


def main(argv: list[str] | None = None) -> None:
    watch_launcher()  # a killed launcher must not leave this worker running
    end_on_signal("eval")
    argv = sys.argv[1:] if argv is None else argv
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format="[ds_longctx] %(message)s"
    )
    # ---------------------------------------------------------------- checks (nothing started or
    # written)
    try:
        cfg, shape, tag_dir, meta, out = eval_inputs(argv, world)
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)
    import torch

    from ds_longctx.checkpoint import resume, run_lock
    from ds_longctx.data import build_eval_data
    from ds_longctx.run.engine import build_engine
    from ds_longctx.run.ranks import default_group_timeout, rank0_first

    # ------------------------------------------------------------ process group, `out`'s lock,
    # rows, engine, weights
    default_group_timeout(cfg.parallel.collective_timeout_s)
    init_distributed(cfg.parallel.collective_timeout_s)
    # rank 0 holds `out`'s lock unless `ds-longctx eval` does (checkpoint/run_lock.py); released at
    # exit
    try:
        rank0_first(
            lambda: run_lock.take(out, OUT_FIX, rank, os.environ.get(run_lock.LOCK_ENV)), rank
        )
        held = rank0_first(lambda: build_eval_data(cfg, shape.hf_config), rank)
    except ValueError as e:
        refuse(f"refused before start: {e}", rank)
    # --model: its weights, loaded as training loads them; no optimizer state there (an eval never
    # steps)
    engine = build_engine(cfg, shape, optimizer_state=tag_dir is not None)
    try:
        if tag_dir is not None:
            resume.load_weights(engine, tag_dir, meta)
    except ValueError as e:
        refuse(f"refused: {e}", rank)

    # ---------------------------------------------------------------- evaluate, write, say
    result = evaluate(engine, held, cfg.eval.rows, cfg.eval.buckets)
    scored = cfg.eval.answer_loss or cfg.eval.recall
    answers = answer_loss_lines(engine, cfg)(meta["step"]) if scored else ([], [])  # collective
    unwritten = [write_lines(result, answers, out, tag_dir, meta, cfg) if rank == 0 else None]
    run_lock.release_all()
    if torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(
            unwritten, src=0
        )  # also the barrier: rank 0's lines are written
        torch.distributed.destroy_process_group()
    if unwritten[0]:
        last_line(unwritten[0], FAILED, rank)
        sys.exit(FAILED)


def users_lines(out: Path) -> list:
    """The files of `out` an eval appends to that neither a run nor an eval made there."""
    if any((out / m).is_file() for m in (RUN_MARKER, EVAL_MARKER)):
        return []
    names = (
        METRICS_FILE,
        CURVE_FILE,
        ANSWER_LOSS_FILE,
        ANSWERS_FILE,
        RECALL_FILE,
        RECALL_ANSWERS_FILE,
    )
    return [n for n in names if os.path.lexists(out / n)]


def write_lines(
    result, scored: tuple, out: Path, tag_dir: Path | None, meta: dict, cfg: RunConfig
) -> str | None:
    """Rank 0: the eval's lines in `out` (metrics, curve, and the answer-loss and recall files it
    was asked for), then the loss said. Returns None, or the one line naming what could not be
    written."""
    source = str(tag_dir) if tag_dir is not None else cfg.model.name
    extra = {"checkpoint" if tag_dir is not None else "model": source, "eval_data": cfg.eval.data}
    answers, each = scored if cfg.eval.answer_loss else ([], [])
    recall = (
        recall_rows(
            scored[1],
            model=cfg.model.name,
            stage="trained" if tag_dir is not None else "base",
            step=meta["step"],
            seq_len=cfg.train.seq_len,
        )
        if cfg.eval.recall
        else ([], [])
    )
    row = result.metrics_row(meta["step"], **extra)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not any((out / m).is_file() for m in (RUN_MARKER, EVAL_MARKER)):
            mark_written(
                out, EVAL_MARKER, []
            )  # its lines are an eval's: a later eval may append to them
        append_jsonl(out / METRICS_FILE, row)
        append_jsonl(out / CURVE_FILE, result.curve_row(meta["step"], **extra))
        if answers:
            append_jsonl(out / ANSWER_LOSS_FILE, *({**x, **extra} for x in answers))
            append_jsonl(out / ANSWERS_FILE, *({**x, **extra} for x in each))
        if recall[0]:
            append_jsonl(out / RECALL_FILE, *recall[0])
            append_jsonl(out / RECALL_ANSWERS_FILE, *({**x, **extra} for x in recall[1]))
    except OSError as e:
        return (
            f"eval_loss {result.loss:.6f} at step {meta['step']} of {source}, but its lines were "
            "not all written "
            f"({describe_os_error(e, out / METRICS_FILE)}); its metrics line: {json.dumps(row)}; "
            f"make {out} writable or pass --out another directory"
        )
    print(
        f"eval_loss {result.loss:.6f} over {result.tokens} tokens ({result.rows} rows of "
        f"{cfg.train.seq_len}) "
        f"at step {meta['step']} of {source}; lines in {out / METRICS_FILE} and {out / CURVE_FILE}"
        + (
            f"; answer loss of {sum(x['answers'] for x in answers)} answers in {len(answers)} "
            f"distance buckets in {out / ANSWER_LOSS_FILE} (each answer in {ANSWERS_FILE})"
            if answers
            else ""
        )
        + (
            f"; recall exact match {sum(x['exact'] for x in recall[1])} of {len(recall[1])} "
            f"answers in {out / RECALL_FILE}"
            if recall[1]
            else ""
        ),
        flush=True,
    )
    return None


if __name__ == "__main__":
    main()
