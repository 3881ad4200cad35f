"""`ds-longctx rehearse`: this machine's one GPU (the CPU in tests) plays ranks of a config's world,
before the nodes are rented.

    ds-longctx rehearse --config ds_configs/qwen3-8b_1m_8x141gb/run.yaml  # rank 0
    ds-longctx rehearse --config run.yaml --rank roles                    # each distinct role once
    # 6 of the layers, extrapolated:
    ds-longctx rehearse --config run.yaml --rank 8 --layers 6 --out rehearsal.jsonl

Each rank runs in its own process (`play_rank`) on torch's fake process group, with the real
shapes, built and stepped as `train` builds and steps a rank; its collectives move no data (how:
docs/design/rehearsal.md). A step whose loss or gradient norm is not finite stops it (such steps
time low). No checkpoint, eval or export; every line printed is prefixed `[rehearsal ...]`.

It reports, per rank, one JSON line in `--out` (default `<output_dir>/rehearsal.jsonl`) and a table:
peak GPU (reserved, allocated) against the plan and the budget, the rank's peak host RSS against
the plan's share per process, the compute seconds of the fastest timed step (step 2 on; a cold
process's later steps can still compile) and the optimizer step's share of them (from the gradients
made to the step's end), the bytes each collective moved per group, and the step time predicted
from them (`plan/interconnect.py`: the link table, the overlap assumed). `--layers K` runs K of the
L decoder layers (all L built: their weights, gradients and optimizer state are the real rank's)
and extrapolates time, memory and bytes to L (`rehearsal/layer_clock.py`).

It needs a CUDA GPU with at least the plan's per-GPU memory: without one it is refused in seconds,
before any model is built (`--cpu` plays the rank on the CPU instead: tiny models and the tests,
whose GPU figures read zero).

Exit codes: 0 every rank ran; 1 a rank failed (out of memory, non-finite numbers); 2 refused (bad
config or arguments, no CUDA GPU, a GPU smaller than the plan), before any rank starts.
"""

from __future__ import annotations

# the engine, the data and torch are imported inside the functions that use them: `ds-longctx
# rehearse` checks its arguments and starts one process per rank first.
import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ds_longctx.config import RunConfig
from ds_longctx.config.model import resolve_model
from ds_longctx.plan.levers import DEFAULT_COMPLETION_LEN
from ds_longctx.plan.shape import RunShape
from ds_longctx.rehearsal.dpo_rows import dpo_completion
from ds_longctx.rehearsal.layer_pick import layer_kinds, pick_layers
from ds_longctx.rehearsal.world import Refused, check, links, planned, vs_plan
from ds_longctx.run.argv import parse_config
from ds_longctx.run.refuse import REFUSED
from ds_longctx.run.stops import watch_launcher
from ds_longctx.run.worker_env import worker_env

PREFIX = "[rehearsal]"
DEFAULT_STEPS = 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds-longctx rehearse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--config", required=True, help="the run config (e.g. a plan's run.yaml)")
    p.add_argument(
        "--rank",
        default="0",
        help="the rank to play (0..world-1), or `roles`: the first and last rank "
        "of an SP group on node 0, and on node 1 where there are several nodes",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="run K of the model's L decoder layers (all built) and extrapolate to L; default all",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"steps per rank (default {DEFAULT_STEPS}: step 1 warms up, step 2 on are timed, the "
        "fastest counts)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs (processes) per node, where the config has no parallel.gpus_per_node",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="nodes of the world, where the config has no parallel.nodes (default 1)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON lines file to append a line per rank to (default <output_dir>/rehearsal.jsonl)",
    )
    _add_link_args(p)
    p.add_argument(
        "--cpu",
        action="store_true",
        help="play the rank(s) on this CPU (tiny models, tests): the GPU figures read zero",
    )
    p.add_argument(
        "--completion_len",
        type=int,
        default=None,
        help="objective dpo: each completion's tokens of the synthetic row rehearsed (a shared "
        f"prompt the rest; default the planner's: {DEFAULT_COMPLETION_LEN}, at most seq_len // 4)",
    )
    p.add_argument("--child_rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child_row", default=None, help=argparse.SUPPRESS)
    return p


def _add_link_args(p: argparse.ArgumentParser) -> None:
    """The links the predicted step time assumes (`world.links` reads them)."""
    p.add_argument(
        "--link",
        default=None,
        help="the intra-node link of plan/interconnect.LINKS (default: "
        "nvlink-h200 for a GPU budget over 100 GB, else nvlink-h100)",
    )
    p.add_argument(
        "--link_gbps",
        type=float,
        default=None,
        help="override the intra-node link: Gbit/s per GPU each way (NVLink 4: 3600 nominal)",
    )
    p.add_argument(
        "--internode_gbps",
        type=float,
        default=None,
        help="override the inter-node link: Gbit/s per GPU each way (default ib-ndr400: 400 Gb/s "
        "at 90%%)",
    )


# ------------------------------------------------------------------ the world, the roles, the plan


def world_of(cfg: RunConfig, a) -> tuple[int, int, int]:
    """(world, processes per node, nodes): the config's planned world, or --gpus / --nodes."""
    par = cfg.parallel
    per_node = a.gpus if a.gpus is not None else par.gpus_per_node  # --gpus 0: refused, not unset
    nodes = a.nodes if a.nodes is not None else par.nodes or 1
    if per_node is None:
        raise Refused(
            f"{a.config} names no world (parallel.gpus_per_node): give --gpus G [--nodes N], the "
            f"GPUs per node it is for (`ds-longctx plan` writes both into run.yaml)"
        )
    given = " ".join(
        f"--{k} {v}" for k, v in (("gpus", a.gpus), ("nodes", a.nodes)) if v is not None
    )
    if per_node < 1 or nodes < 1:
        raise Refused(f"{given}: give at least one GPU and one node")
    if (a.gpus is not None and par.gpus_per_node and a.gpus != par.gpus_per_node) or (
        a.nodes is not None and par.nodes and a.nodes != par.nodes
    ):
        raise Refused(
            f"{given}: {a.config} was planned for {par.nodes} node(s) x "
            f"{par.gpus_per_node}; drop --gpus / --nodes, or plan that world"
        )
    return nodes * per_node, per_node, nodes


def ranks_to_play(spec: str, world: int, per_node: int, sp: int) -> list:
    """`--rank`: one rank, or `roles`: the first and last rank of node 0's first SP group, and of
    node 1's."""
    if spec == "roles":
        out = []
        for node in range(min(2, world // per_node)):
            first = node * per_node
            out += [r for r in (first, first + sp - 1) if r not in out]
        return out
    try:
        rank = int(spec)
    except ValueError:
        raise Refused(f"--rank {spec}: give a rank (0..{world - 1}) or `roles`") from None
    if not 0 <= rank < world:
        raise Refused(
            f"--rank {rank}: this world has ranks 0..{world - 1} ({world // per_node} node(s) x "
            f"{per_node})"
        )
    return [rank]


def device_problem(a) -> str | None:
    """Why this machine cannot rehearse, or None: no CUDA GPU (unless `--cpu`). Asked before the
    model's config is read (seconds: torch, not transformers)."""
    import torch

    if a.cpu or torch.cuda.is_available():
        return None
    return (
        "a rehearsal needs a CUDA GPU (this machine has none: torch.cuda.is_available() is "
        "False); run it on one GPU of the kind the plan is for (or add --cpu to play a tiny "
        "model on this CPU)"
    )


def memory_problem(a, cfg: RunConfig, shape: RunShape) -> str | None:
    """Why this GPU cannot rehearse `cfg`: less memory than `shape`'s plan puts on one, or None."""
    import torch

    if a.cpu:
        return None
    gpu = torch.cuda.get_device_properties(0)
    need = planned(cfg, shape, a.completion_len).gpu_peak_bytes / 1e9
    have = gpu.total_memory / 1e9
    if have >= need:
        return None
    return (
        f"this GPU ({gpu.name}) has {have:.1f} GB, less than the plan's {need:.1f} GB per GPU "
        f"for the rank(s) rehearsed ({a.config}); rehearse on a GPU with at least {need:.1f} "
        f"GB, or plan for this one (ds-longctx plan --gpu_mem_gb {have:.0f})"
    )


def rehearsal_config(argv: list):
    """The run config of `argv` as a rehearsal runs it: nothing saved, resumed or evaluated (each
    said in a line)."""
    cfg = parse_config(argv)
    off = []
    if cfg.checkpoint.save_every:
        off.append(f"checkpoint.save_every {cfg.checkpoint.save_every}")
    if cfg.checkpoint.resume:
        off.append("checkpoint.resume")
    if cfg.eval.data:
        off.append(f"eval.data {cfg.eval.data}")
    cfg.checkpoint.save_every, cfg.checkpoint.resume, cfg.eval.data = 0, False, None
    if cfg.train.objective == "dpo":  # rehearsal/dpo_rows.py: a synthetic shared-prompt row instead
        off.append(f"data {cfg.data.source} (a synthetic pair per row) and the reference pass")
        cfg.data.source = "synthetic"
    cfg.logging.report_to = "none"
    return cfg, off


# ------------------------------------------------------------------ the parent: checks, ranks


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a, rest = parser().parse_known_args(argv)
    if a.child_rank is not None:
        return play_rank(a, rest)
    try:
        if a.steps < 2:
            raise Refused(
                f"--steps {a.steps}: give at least 2 (step 1 warms up; step 2 on are timed)"
            )
        cfg, off = rehearsal_config(["--config", a.config, *rest])
        dpo_completion(a, cfg)
        world, per_node, nodes = world_of(cfg, a)
        ranks = ranks_to_play(a.rank, world, per_node, cfg.parallel.sp_size)
        links(a, cfg)
        if problem := device_problem(a):
            raise Refused(problem)
        shape = check(cfg, world, per_node)
        if problem := memory_problem(a, cfg, shape):
            raise Refused(problem)
        if a.layers is not None:  # K against the placement's kinds, before any rank starts
            hybrid = shape.geometry.hybrid
            kinds = layer_kinds(shape.placement, hybrid.layer_types if hybrid else None)
            pick_layers(kinds, a.layers)
    except ValueError as e:  # Refused, and the checks' ValueErrors
        print(f"{PREFIX} refused: {e}", file=sys.stderr, flush=True)
        return REFUSED
    out = Path(a.out) if a.out else Path(cfg.train.output_dir) / "rehearsal.jsonl"
    say(
        f"{a.config}: model {resolve_model(cfg.model.name).label}, world {world} ({nodes} node(s) "
        f"x {per_node}), sp {cfg.parallel.sp_size}, {cfg.train.seq_len:,} tokens; playing rank(s) "
        f"{', '.join(map(str, ranks))}, "
        f"{a.steps} steps each" + (f"; not in a rehearsal: {', '.join(off)}" if off else "")
    )
    rows, failed = [], 0
    for rank in ranks:
        row, code = run_child(argv, rank, world, per_node)
        if row is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
        failed += code != 0
    say(f"{len(rows)} row(s) appended to {out}")
    print(table(rows), flush=True)
    return 1 if failed else 0


def say(line: str, stream=None) -> None:
    print(f"{PREFIX} {line}", file=stream or sys.stdout, flush=True)


def run_child(argv: list, rank: int, world: int, per_node: int) -> tuple:
    """Play `rank` in a fresh process, its every output line prefixed; (its row or None, its exit
    code)."""
    tag = f"[rehearsal rank {rank}/{world}]"
    with tempfile.TemporaryDirectory(prefix="ds_longctx-rehearsal-") as tmp:
        row_path = Path(tmp) / "row.json"
        cmd = [sys.executable, "-m", "ds_longctx.rehearsal.rehearse", *argv]
        cmd += ["--child_rank", str(rank), "--child_row", str(row_path)]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=worker_env(),
        )
        try:
            for line in proc.stdout:
                print(f"{tag} {line.rstrip()}", flush=True)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        row = json.loads(row_path.read_text()) if row_path.is_file() else None
    if code:
        say(f"rank {rank} ended with exit code {code}", sys.stderr)
    return row, code


def table(rows: list) -> str:
    gb = 1e9
    head = (
        f"{PREFIX} {'rank':>4}  {'layers':>6}  {'GPU peak':>8} {'plan':>6} {'vs plan':>8} "
        f"{'budget':>6}  {'host':>6} {'plan':>6} {'vs plan':>8}  {'compute s':>9}  "
        f"{'predicted s':>11}  link"
    )
    lines = [head]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(
                f"{PREFIX} {r['rank']:>4}  {r['layers']:>6}  {r['status']}: {r.get('error', '')}"
            )
            continue
        lines.append(
            f"{PREFIX} {r['rank']:>4}  {r['layers']:>6}  {r['peak_gpu_bytes'] / gb:8.1f} "
            f"{r['planned_gpu_bytes'] / gb:6.1f} "
            f"{vs_plan(r['peak_gpu_bytes'], r['planned_gpu_bytes']):>8} "
            f"{r['gpu_budget_bytes'] / gb:6.1f}  {r['host_rss_bytes'] / gb:6.1f} "
            f"{r['planned_host_bytes_per_process'] / gb:6.1f} "
            f"{vs_plan(r['host_rss_bytes'], r['planned_host_bytes_per_process']):>8}  "
            f"{r['compute_seconds_per_step']:9.1f}  "
            f"{r['predicted_seconds_per_step']:11.1f}  {r['link']}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ the child: one rank


def play_rank(a, rest: list) -> int:
    """Play rank `a.child_rank` in this process; write its row to `a.child_row`. Exit code as the
    module says."""
    cfg, _ = rehearsal_config(["--config", a.config, *rest])
    dpo_completion(a, cfg)
    world, per_node, nodes = world_of(cfg, a)
    rank = a.child_rank
    from ds_longctx.parallel import fake_world

    counts = fake_world.start(rank, world, per_node)
    # the rehearse command that started this process is its launcher: it ends with it
    watch_launcher()
    logging.basicConfig(level=logging.INFO, format="[ds_longctx] %(message)s")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    from ds_longctx.rehearsal.rank import RankRun

    run = RankRun(a, cfg, rank, world, per_node, nodes, counts, replay_command(a, rank, rest))
    row = run.play()
    Path(a.child_row).write_text(json.dumps(row))
    fake_world.stop()
    sys.stdout.flush()
    os._exit(0 if row["status"] == "ok" else 1)


def replay_command(a, rank: int, overrides: list) -> str:
    """The command that plays `rank` again as this process plays it: every option given (config
    overrides too), `--rank` this one rank, without `--out`."""
    opts = ["--config", a.config, "--rank", str(rank)]
    for action in parser()._actions:  # every option the parser has, so a new one is replayed too
        value = getattr(a, action.dest, None)
        skip = action.dest in ("config", "rank", "out", "child_rank", "child_row")
        if skip or value is None or value is False:
            continue
        opts += [action.option_strings[0]] + ([] if action.nargs == 0 else [str(value)])
    return shlex.join(["ds-longctx", "rehearse", *opts, *overrides])


if __name__ == "__main__":
    sys.exit(main())
