"""The `ds-longctx` command.

    ds-longctx demo
        tiny Qwen3, 2 CPU processes, SP=2, beside an SP=1 reference
    ds-longctx train --nproc N [--config F] [--key value ...]
        N local processes under torchrun
    ds-longctx plan --model M --seq_len N --gpus G [--nodes N] [--gpu_mem_gb X] [--host_mem_gb Y]
                    [--out DIR]
        the levers for a run, and the configs that launch it
    ds-longctx rehearse --config run.yaml [--rank R|roles] [--layers K]
        one GPU plays ranks of the config's world
    ds-longctx export --checkpoint DIR --out DIR [--merged]
        DeepSpeed checkpoint -> HF safetensors (LoRA: PEFT)
    ds-longctx eval --checkpoint DIR --data PATH|synthetic [--nproc N] [--rows R] [--buckets B]
                    [--answer_loss true] [--recall true] [--key value ...]
    ds-longctx eval --model DIR --data SESSIONS --recall true --out DIR [--seq_len L]
                    [--key value ...]
        the model as it is
    ds-longctx data prepare --stdlib --out DIR
        the Python stdlib as a corpus + BPE + data card
    ds-longctx data prepare --sessions [N] --out DIR
        long agent sessions over it: tools, far-back answers
    ds-longctx checkpoint convert DIR [--tag T]
        a checkpoint of an older version -> digests, RNG as tensors
    ds-longctx checkpoint reshard DIR [--tag T]
        its universal form ahead of a resume on another layout
    ds-longctx plot RUN_DIR [RUN_DIR ...] [--out DIR]
        loss, lr, grad norm, tokens/s, memory against step (PNGs)

Exit codes (docs/reliability.md, "Every stop ends with one line"): 0 done, 1 failed, 2 refused, 130
/ 143 stopped by SIGINT / SIGTERM after the workers saved; every stop prints its one line last.
"""

from __future__ import annotations

# Each command imports its modules when it runs (COMMANDS' entry points, imports inside functions):
# `import ds_longctx.cli` loads the standard library only, so `ds-longctx plan` and every `--help`
# and refusal answer without torch, and fast.
import argparse
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def precheck(nproc: int, run_args: list[str]):
    """Parse and check the run in this process (another writer in output_dir:
    checkpoint/run_lock.py; `preflight`: the engine's checks, RoPE coverage, data source,
    output_dir / resume), before any worker starts. Exits 2 on bad input."""
    from ds_longctx.checkpoint.run_lock import FIX, in_use, lock_holder
    from ds_longctx.run.argv import parse_config
    from ds_longctx.run.preflight import preflight
    from ds_longctx.run.refuse import refuse

    cfg = parse_config(run_args, nproc, nproc)
    try:
        if (holder := lock_holder(cfg.train.output_dir)) is not None:
            refuse(f"refused before start: {in_use(cfg.train.output_dir, holder, FIX)}")
        # one node: this process's environment is not the workers'
        preflight(cfg, nproc, per_node=nproc)
    except ValueError as e:
        refuse(f"refused before start: {e}")
    except OSError as e:  # a path no check could look at (a name too long, an unsearchable folder)
        refuse(
            f"refused before start: {e.filename or ''}: {e.strerror or e}; give a path this "
            f"machine can use (output_dir, data, tokenizer, eval_data)"
        )
    return cfg


def run_train(nproc: int, run_args: list[str]) -> int:
    """Check the run here (`precheck`), then start `nproc` local training workers (run/launch.py)
    holding output_dir's lock."""
    from ds_longctx.checkpoint.run_lock import FIX
    from ds_longctx.run.launch import launch_holding
    from ds_longctx.run.refuse import REFUSED

    if problem := nproc_problem(nproc):
        print(problem, file=sys.stderr)
        return REFUSED
    cfg = precheck(nproc, run_args)
    return launch_holding(
        cfg.train.output_dir, FIX, nproc, run_args, "ds_longctx.train", saves=True
    )


# gloo workers past this many per core only wait for each other (and each holds a model)
CPU_PROCESSES_PER_CORE = 4


def nproc_problem(nproc: int) -> str | None:
    """Why `--nproc` cannot start here, or None: one process per GPU on a GPU machine; on CPU (gloo)
    at most CPU_PROCESSES_PER_CORE per core. Asked before anything starts: a worker count past the
    machine forks hundreds of processes that torchrun then struggles to stop."""
    import torch

    if nproc < 1:
        return f"--nproc {nproc}: need at least 1 process"
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            return (
                f"--nproc {nproc}: this machine has {gpus} GPU(s), one process each; use --nproc "
                f"<= {gpus} (more GPUs: several nodes, launched as in the plan's launch.txt)"
            )
        return None
    cores = os.cpu_count() or 1
    if nproc > CPU_PROCESSES_PER_CORE * cores:
        return (
            f"--nproc {nproc}: no GPU here, so the processes share {cores} CPU core(s) over gloo; "
            f"use --nproc <= {CPU_PROCESSES_PER_CORE * cores} ({CPU_PROCESSES_PER_CORE} per core), "
            "or run on GPUs"
        )
    return None


def run_eval(argv: list[str]) -> int:
    """`ds-longctx eval`: check everything here (run/eval_checkpoint.eval_inputs: exit 2 on bad
    input), then start the checkpoint's world size of workers (or --nproc, refused unless equal) as
    `run_train` does."""
    from ds_longctx.checkpoint.run_lock import in_use, lock_holder
    from ds_longctx.run.eval_checkpoint import OUT_FIX, args_parser, eval_inputs
    from ds_longctx.run.launch import launch_holding
    from ds_longctx.run.refuse import REFUSED, refuse

    nproc = args_parser().parse_known_args(argv)[0].nproc
    if nproc is not None and (problem := nproc_problem(nproc)):
        print(problem, file=sys.stderr)
        return REFUSED
    try:
        _, _, _, meta, out = eval_inputs(argv, nproc)
        holder = lock_holder(out)
    except ValueError as e:
        refuse(f"refused before start: {e}")
    if holder is not None:  # eval writes its lines into `out`: one writer there
        refuse(f"refused before start: {in_use(out, holder, OUT_FIX)}")
    # the checkpoint's world (--model: sp_size), no --nproc
    if problem := nproc_problem(meta["run"]["world_size"]):
        whose = (
            "the checkpoint was written by"
            if "sp_size" in meta["run"]
            else "--model evaluates at sp_size, so"
        )
        print(
            f"{problem} ({whose} world_size={meta['run']['world_size']}, which eval starts)",
            file=sys.stderr,
        )
        return REFUSED
    return launch_holding(out, OUT_FIX, meta["run"]["world_size"], argv, "ds_longctx.eval")


def read_losses(output_dir: str) -> list[float]:
    """The training losses of metrics.jsonl (its eval lines, if any, left out)."""
    path = Path(output_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if "loss" in r]


def run_demo(args) -> int:
    """Tiny Qwen3 (8 q / 2 kv heads) on the synthetic retrieval task: SP=2 over 2 gloo processes,
    then the same run on 1 process (SP=1), losses side by side."""
    base = ["--model", "qwen3-tiny", "--seq_len", str(args.seq_len), "--steps", str(args.steps)]
    base += ["--seed", str(args.seed), "--lr", "1e-3", "--dtype", "fp32"]
    base += ["--overwrite"]  # a demo replaces the last
    out = Path(args.output_dir)
    runs = {"sp2": (2, ["--sp_size", "2"]), "sp1": (1, ["--sp_size", "1"])}
    for name, (nproc, extra) in runs.items():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a launch leaves signals ignored
        print(f"\n== {name}: {nproc} process(es), {' '.join(extra)}", flush=True)
        rc = run_train(nproc, base + extra + ["--output_dir", str(out / name)])
        if rc:
            return rc
    print(f"\ngenerated DeepSpeed config ({out / 'sp2' / 'ds_config.json'}):")
    print((out / "sp2" / "ds_config.json").read_text())
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.planner import Levers, plan_memory

    geom = ModelGeometry.from_name_or_path("qwen3-tiny")
    plan = plan_memory(geom, args.seq_len, 2, 2, Levers(tiled_mlp=False, loss_chunk_rows=4096))
    print("memory plan of this run (per GPU if it ran on GPUs; `ds-longctx plan` for real runs):")
    print(plan.table())
    print()
    sp2, sp1 = read_losses(str(out / "sp2")), read_losses(str(out / "sp1"))
    print(f"{'step':>4}  {'loss SP=2':>12}  {'loss SP=1':>12}  {'rel diff':>9}")
    for i, (a, b) in enumerate(zip(sp2, sp1), 1):
        print(f"{i:>4}  {a:12.6f}  {b:12.6f}  {abs(a - b) / abs(b):9.1e}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(sp2, sp1))
    print(
        f"SP=2 matches SP=1 to rel {worst:.1e}"
        if worst <= 1e-4
        else f"MISMATCH: rel {worst:.1e} > 1e-4"
    )
    return 0 if worst <= 1e-4 else 1


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before any worker ran (after, torchrun hands it to them)
        from ds_longctx.run.stops import signal_exit

        print(
            "stopped by SIGINT before any worker started: nothing written",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(signal_exit(signal.SIGINT))
    except BrokenPipeError:
        # the reader went away (`ds-longctx plan ... | head`): no traceback; stdout's remaining
        # buffer goes to /dev/null so the interpreter's final flush cannot raise again (Python's
        # documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


# ---------------------------------------------------------------- entry points that live here
def _train(args: list[str]) -> int:
    """`ds-longctx train --nproc N [--config F] [--key value ...]`: --nproc here, the rest to the
    run config."""
    from ds_longctx.config import RunConfig

    t = argparse.ArgumentParser(
        prog="ds-longctx train",
        allow_abbrev=False,
        epilog=RunConfig.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start N local training processes under torchrun; every option but "
        "--nproc goes to the run config (below). Refusals exit 2 with one line, printed last.",
    )
    t.add_argument(
        "--nproc", type=int, default=1, help="local processes (one per GPU; gloo on CPU)"
    )
    parsed, rest = t.parse_known_args(args)
    # argparse keeps the last
    if (n := sum(a == "--nproc" or a.startswith("--nproc=") for a in args)) > 1:
        t.error(f"--nproc is given {n} times; keep one")
    return run_train(parsed.nproc, rest)


def _demo(args: list[str]) -> int:
    d = argparse.ArgumentParser(prog="ds-longctx demo", description=COMMANDS["demo"].help)
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--seq_len", type=int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--output_dir", default="runs/demo")
    parsed, rest = d.parse_known_args(args)
    if rest:
        d.error(f"unknown arguments for demo: {rest}")
    return run_demo(parsed)


def _data(args: list[str]) -> int:
    """`ds-longctx data prepare --stdlib|--sessions --out DIR`; a signal ends it at once, with its
    line."""
    from ds_longctx.corpora.prepare import main as data_main
    from ds_longctx.run.refuse import refuse
    from ds_longctx.run.stops import StopRequest

    signals = StopRequest().install()  # no step to wait for
    try:
        with signals.now(
            "preparing the data",
            "nothing written at --out (a .partial directory beside it, if any, goes at the next "
            "`data prepare` there)",
        ):
            sys.exit(data_main(args))
    except ValueError as e:
        refuse(f"refused: {e}")
    finally:
        signals.uninstall()


def _eval(args: list[str]) -> int:
    """Its own options (ds-longctx eval -h); the rest go to the run config."""
    if "-h" in args or "--help" in args:
        from ds_longctx.run.eval_checkpoint import args_parser

        args_parser().print_help()
        return 0
    return run_eval(args)


# ---------------------------------------------------------------- the commands: one record each
@dataclass(frozen=True)
class Command:
    """One `ds-longctx` command: its name, its line in `--help`, and its entry point
    ("module:function", imported when the command runs and called with the arguments after the
    name)."""

    name: str
    help: str
    entry: str

    def resolve(self) -> Callable[[list[str]], int | None]:
        module, _, function = self.entry.partition(":")
        if module == HERE:  # this module, which `python -m ds_longctx.cli` runs as __main__
            return globals()[function]
        return getattr(importlib.import_module(module), function)


HERE = "ds_longctx.cli"
COMMANDS = {
    c.name: c
    for c in (
        Command(
            "demo",
            "the embedded default: tiny Qwen3, 2 CPU processes, SP=2 vs SP=1",
            f"{HERE}:_demo",
        ),
        Command(
            "train",
            "start N local training processes (torchrun); other options go to the run config "
            "(--config FILE, --key value)",
            f"{HERE}:_train",
        ),
        Command(
            "plan",
            "memory plan + generated DeepSpeed/accelerate configs (ds-longctx plan -h)",
            "ds_longctx.plan.write:main",
        ),
        Command(
            "rehearse",
            "one GPU plays ranks of a config's world: memory, time, collectives "
            "(ds-longctx rehearse -h)",
            "ds_longctx.rehearsal.rehearse:main",
        ),
        Command(
            "export",
            "DeepSpeed checkpoint -> HF safetensors (ds-longctx export -h)",
            "ds_longctx.checkpoint.export:main",
        ),
        Command(
            "eval",
            "a checkpoint's (or a model's) eval loss, per-position curve and recall on held-out "
            "rows (ds-longctx eval -h)",
            f"{HERE}:_eval",
        ),
        Command(
            "data",
            "prepare a corpus: ds-longctx data prepare --stdlib|--sessions [N] --out DIR "
            "(ds-longctx data prepare -h)",
            f"{HERE}:_data",
        ),
        Command(
            "checkpoint",
            "convert a checkpoint of an older version, or reshard one ahead of a resume on "
            "another layout (ds-longctx checkpoint convert|reshard -h)",
            "ds_longctx.checkpoint.convert:main",
        ),
        Command(
            "plot",
            "a run's metrics.jsonl against step as PNGs, runs overlaid (ds-longctx plot -h)",
            "ds_longctx.run.plots:main",
        ),
        Command(
            "models",
            "a real model as an HF directory: ds-longctx models get NAME --out DIR",
            "ds_longctx.checkpoint.real_models:main",
        ),
    )
}


def _parser() -> argparse.ArgumentParser:
    """The top parser: `--help` lists COMMANDS; a missing or unknown command is refused here."""
    p = argparse.ArgumentParser(
        prog="ds-longctx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for c in COMMANDS.values():
        sub.add_parser(c.name, help=c.help, add_help=False)
    return p


def _main(argv: list[str] | None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:  # --help; a missing or unknown command exits 2
        parsed, rest = _parser().parse_known_args(argv)
        argv = [parsed.cmd, *rest]
    sys.exit(COMMANDS[argv[0]].resolve()(argv[1:]))


if __name__ == "__main__":
    main()
