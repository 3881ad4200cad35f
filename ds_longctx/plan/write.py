"""`ds-longctx plan`: choose the levers for a run and write the configs that launch it.

    ds-longctx plan --model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --out DIR
    ds-longctx plan --model qwen3-8b --gpus 2 --gpu_mem_gb 141 --find_max_len [--out DIR]
    # 2 nodes x 8 GPUs:
    ds-longctx plan --model qwen3-8b --seq_len 1048576 --nodes 2 --gpus 8 --gpu_mem_gb 80 --out DIR
    python -m ds_longctx.plan --regen-all ds_configs      # rewrite the committed configs

The planner's search (`plan.search.choose`) picks sp_size, the fewest offloaded checkpoints, tiled
MLP only when needed, the loss chunk rows and optimizer offload;
`plan.cache_placement.fastest_placement` then the layers that keep their attention output. The plan
is printed as a table (term, GB per GPU, GB host). With `--out DIR` it writes:
    run.yaml         our run config (`RunConfig`): exactly the planner's choices; the only input
                     train.py reads
    ds_config.json   `ds_config.build_ds_config(run config, gpus, on_gpu=True)`: the same dict
                     train.py derives from run.yaml (one source of truth); written for reading and
                     for accelerate's plugin
    accelerate.yaml  accelerate's DeepSpeed plugin config pointing at ds_config.json
    launch.txt       the launch lines (run them from DIR: every path in DIR is relative to DIR)
    plan.txt         the table and one line of reasoning per choice
    hostfile         with --nodes N > 1 only: DeepSpeed's hostfile, a template (node-0 slots=G ...)
    .ds_longctx-plan which of these files the plan wrote, with their sha256: a directory holding
                     anything else (a user's own run.yaml, or one changed since) is refused, nothing
                     written
Several nodes (--nodes N, --gpus G per node): SP groups stay inside a node, data parallelism runs
across nodes, ZeRO-3 partitions over all N·G GPUs; host RAM (--host_mem_gb) and the host column are
per node. accelerate.yaml then has num_machines N (each node passes its own --machine_rank),
launch.txt the deepspeed --hostfile line (once, from node 0), the accelerate and torchrun lines (on
every node) and a SLURM srun example (plan/launch_files.py). Output is deterministic (no dates, no
absolute paths): tests regenerate `ds_configs/` and diff it. Exit codes: 0 planned; 2 bad input or
nothing fits (the message names the longest length that fits and what to change). Imports neither
torch nor deepspeed: a plan that fits answers in under a second; one that does not takes a few
seconds (its fixes are searched).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import yaml

from ds_longctx.config import RunConfig
from ds_longctx.config.model import resolve_model
from ds_longctx.levers.rope import rope_problem
from ds_longctx.parallel.disk import mark_written, not_ours, user_path
from ds_longctx.plan import disk_args, objective_args
from ds_longctx.plan.cache_placement import fastest_placement
from ds_longctx.plan.committed import COMMITTED
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.plan.launch_files import (
    REHEARSE,
    accelerate_config,
    hostfile_text,
    launch_lines,
    launch_text,
)
from ds_longctx.plan.no_fit import NoFit
from ds_longctx.plan.options import parser
from ds_longctx.plan.plan_args import (
    check_args,
    command_line,
    local_gpu_kind,
    longest_fit,
    search_kw,
)
from ds_longctx.plan.planner import GB
from ds_longctx.plan.search import Choice, choose
from ds_longctx.plan.step_time import objective_lines, step_line

FILES = ("run.yaml", "ds_config.json", "accelerate.yaml", "launch.txt", "plan.txt")
MULTINODE_FILES = FILES + ("hostfile",)
PLAN_MARKER = (
    ".ds_longctx-plan"  # which files of --out a plan wrote, with their sha256 (disk.mark_written)
)


def plan_run_config(choice: Choice, gpu_mem_gb: float | None = None, disk_keys: dict | None = None):
    """The RunConfig carrying exactly the planner's choices (bf16: these configs are for GPUs) and
    the GPU budget they were made for (memory.gpu_budget_gb: the run caps its allocator there,
    levers/gpu_budget.py)."""
    plan = choice.plan
    gpus = f"{plan.gpus}gpu" if plan.nodes == 1 else f"{plan.nodes}x{plan.gpus}gpu"
    model = plan.geom.name  # a local model as an absolute path: run.yaml works from any directory
    model = os.path.abspath(model) if resolve_model(model).kind != "shipped" else model
    return RunConfig(
        model=model,
        seq_len=plan.seq_len,
        sp_size=plan.sp_size,
        micro_batch=1,
        dtype="bf16",
        nodes=plan.nodes,
        gpus_per_node=plan.gpus,
        output_dir=f"runs/{run_name(plan.geom.name)}_{plan.seq_len}_{gpus}",
        gpu_budget_gb=gpu_mem_gb,
        **choice.levers.run_config_fields(),
        **(disk_keys or {}),
    )


def run_name(model: str) -> str:
    """The model's part of the run directory's name: a shipped name as it is; of a path, its
    checkpoint directory's (or JSON file's) name, so a local model does not put its absolute path
    under runs/."""
    p = Path(model)
    if p.name.endswith(".json"):
        p = p.parent if p.name == "config.json" else p.with_name(p.name[: -len(".json")])
    return re.sub(r"[^A-Za-z0-9._-]+", "_", p.name).strip("._") or "model"


def plan_text(choice: Choice, cmd: str, a: argparse.Namespace, host: float) -> str:
    plan = choice.plan
    nodes, per_node = ("", "") if a.nodes == 1 else (f"{a.nodes} nodes x ", " per node")
    head = [
        f"# generated by `{cmd}`; do not edit",
        f"budget: {nodes}{a.gpus} x {a.gpu_mem_gb:g} GB GPUs -> {a.headroom * a.gpu_mem_gb:.1f} GB "
        "per GPU, "
        f"{host:g} GB host{per_node} -> {a.headroom * host:.1f} GB (headroom {a.headroom:g}; GB = "
        "1e9 bytes)",
    ]
    if a.find_max_len:
        head.append(f"longest seq_len that fits: {plan.seq_len:,} tokens (a multiple of 1024)")
    elif plan.seq_len != a.seq_len:
        head.append(
            f"seq_len {a.seq_len:,} padded to {plan.seq_len:,}, a multiple of "
            f"sp_size={plan.sp_size}"
        )
    head.append(
        f"planned: {plan.gpu_peak_bytes / GB:.1f} GB per GPU, {plan.host_peak_bytes / GB:.1f} GB "
        f"host{per_node}"
    )
    head.append(f"placement per layer: {plan.placement.describe()}")
    head.append(step_line(plan, a.gpu_mem_gb, a.gpu))
    head += objective_lines(plan, a.gpu_mem_gb, a.gpu) + objective_args.placeholder_lines(a)
    head += disk_args.plan_lines(a, plan, host)
    head.append(f"rehearse before renting (one GPU plays each role of this world): {REHEARSE}")
    return (
        "\n".join(head + ["", plan.table(), "", "choices:"] + [f"  - {n}" for n in choice.notes])
        + "\n"
    )


def write_files(out: Path, choice: Choice, cmd: str, a: argparse.Namespace, host: float) -> None:
    """The files of one plan into `out` (created): FILES, and with several nodes MULTINODE_FILES."""
    out.mkdir(parents=True, exist_ok=True)
    keys = {**disk_args.run_config_keys(a, choice.plan), **objective_args.objective_data_keys(a)}
    cfg = plan_run_config(choice, a.gpu_mem_gb, keys)
    header = f"# generated by `{cmd}`; do not edit\n"
    cfg.dump(out / "run.yaml")
    (out / "run.yaml").write_text(header + (out / "run.yaml").read_text())
    ds = build_ds_config(cfg, world_size=a.nodes * a.gpus, on_gpu=True)
    (out / "ds_config.json").write_text(json.dumps(ds, indent=2) + "\n")
    if a.nodes > 1:
        header += (
            f"# every node: --machine_rank (0..{a.nodes - 1}), --main_process_ip / "
            "--main_process_port "
            f"(node 0's address and a free port there) on its accelerate launch line (launch.txt)\n"
        )
        (out / "hostfile").write_text(hostfile_text(cmd, a.gpus, a.nodes))
    (out / "accelerate.yaml").write_text(
        header + yaml.safe_dump(accelerate_config(a.gpus, a.nodes), sort_keys=False)
    )
    (out / "launch.txt").write_text(launch_text(cmd, a.gpus, a.nodes))
    (out / "plan.txt").write_text(plan_text(choice, cmd, a, host))


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--regen-all"]:
        regenerate_all(Path(argv[1] if len(argv) > 1 else "ds_configs"))
        return 0
    a = parser(__doc__).parse_args(argv)
    try:
        geom, host = check_args(a)
        check_plan_out(a)
    except ValueError as e:
        print(f"ds-longctx plan: {e}", file=sys.stderr)
        return 2
    a.gpu = a.gpu or local_gpu_kind()
    cmd = command_line(a, host)
    if note := resolve_model(a.model).note:
        print(f"model {a.model}: {note}", flush=True)
    seq_len = a.seq_len
    longest = ""
    if a.find_max_len:
        seq_len, longest = longest_fit(geom, a, host)
        # the answer is 0: say so first, then what the shortest length would need (NoFit's fixes)
        if not seq_len:
            print(longest, flush=True)
            try:
                plan_choice(a, geom, host, 1024)
            except NoFit as e:
                print(
                    "ds-longctx plan: --find_max_len: no length fits, not even the search's "
                    f"shortest: {e}",
                    file=sys.stderr,
                )
            return 2
    try:
        choice = plan_choice(a, geom, host, seq_len)
    except NoFit as e:
        if longest:
            print(longest)
        print(e.best.table() if e.best else "", flush=True)
        print(f"\nds-longctx plan: {e}", file=sys.stderr)
        return 2
    if a.out:  # the files first: a reader that stops early (`| head`) loses no file
        out = Path(a.out)
        try:
            write_files(out, choice, cmd, a, host)
            mark_written(out, PLAN_MARKER, FILES if a.nodes == 1 else MULTINODE_FILES)
        except (
            OSError
        ) as e:  # what check_out_dir cannot see ahead (a read-only or special file system)
            print(
                f"ds-longctx plan: --out {a.out}: could not write the plan's files ({e}); give a "
                f"directory you can write to",
                file=sys.stderr,
            )
            return 2
    if longest:
        print(longest)
    print(plan_text(choice, cmd, a, host), end="")
    if a.out:
        print(
            f"\nwrote {', '.join(FILES if a.nodes == 1 else MULTINODE_FILES)} to {out}/; from "
            f"there launch with{'' if a.nodes == 1 else ' (launch.txt says where each runs)'}:"
        )
        print("\n".join("  " + line for line in launch_lines(a.gpus, a.nodes)))
    return 0


def check_plan_out(a: argparse.Namespace) -> None:
    """`--out` (resolved: disk.user_path) is new, empty, or holds only the files of an earlier plan,
    unchanged (PLAN_MARKER records them): a ValueError naming what else it holds."""
    if not a.out:
        return
    a.out = user_path(a.out)
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {a.out} is a file; give a new directory for the plan's files")
    if out.is_dir() and (theirs := not_ours(out, PLAN_MARKER)):
        raise ValueError(
            f"--out {a.out} holds {', '.join(theirs[:5])}{' ...' if len(theirs) > 5 else ''}, "
            "which "
            f"no plan wrote there (or changed since), so nothing is written; give a new or empty "
            f"directory (an earlier plan's own unchanged files are replaced)"
        )


def plan_choice(a: argparse.Namespace, geom, host: float, seq_len: int) -> Choice:
    """What `ds-longctx plan` writes: `choose`'s levers for seq_len, then (unless
    --no_attention_cache) the placement that skips the most attention recomputes and still fits
    (`fastest_placement`). Raises NoFit."""
    choice = choose(geom, seq_len, **search_kw(a, host))
    if problem := rope_problem(
        geom.name, geom.rope_type, geom.trained_context, choice.plan.seq_len
    ):
        raise NoFit(
            problem, seq_len, 0, None
        )  # padded to a multiple of sp_size past the trained context
    return (
        choice
        if a.no_attention_cache or choice.plan.placement.on_disk
        else fastest_placement(choice, a.gpu_mem_gb, host, a.headroom)
    )


def regenerate_all(root: Path) -> None:
    """Rewrite `root/<name>/` for every committed config and `root/README.md` (their table)."""
    rows = []
    for name, args in COMMITTED.items():
        a = parser(__doc__).parse_args(args.split())
        geom, host = check_args(a)
        seq_len = longest_fit(geom, a, host)[0] if a.find_max_len else a.seq_len
        choice = plan_choice(a, geom, host, seq_len)
        write_files(root / name, choice, command_line(a, host), a, host)
        p, lv = choice.plan, choice.levers
        hw = (
            f"{a.gpus}×{a.gpu_mem_gb:g} GB, {host:g} GB host"
            if a.nodes == 1
            else f"{a.nodes} nodes × {a.gpus}×{a.gpu_mem_gb:g} GB, {host:g} GB host each"
        )
        rows.append(
            f"| `{name}/` | {hw} | {p.seq_len:,} | {p.sp_size} "
            f"| {p.placement.spec()} | {'yes' if lv.tiled_mlp else 'no'} | {lv.loss_chunk_rows} | "
            f"{'yes' if lv.optimizer_offload else 'no'} | {p.gpu_peak_bytes / GB:.1f} | "
            f"{p.host_peak_bytes / GB:.1f} |"
        )
        print(f"wrote {root / name}/")
    (root / "README.md").write_text(
        README.format(
            header="| " + " | ".join(COLUMNS) + " |",
            rule="|" + "---|" * len(COLUMNS),
            rows="\n".join(rows),
        )
    )


# the columns of the README's table, one per cell of a row in main()
COLUMNS = [
    "directory",
    "hardware",
    "seq_len",
    "sp",
    "placement",
    "tiled MLP",
    "loss chunk rows",
    "optimizer offload",
    "GB/GPU",
    "GB host",
]
README = """# Generated configs: do not edit

Every file here is written by the planner (`ds_longctx/plan/write.py`); `tests/plan/test_write.py`
regenerates them and fails on any difference. To change one, change the planner or `COMMITTED` in
`ds_longctx/plan/committed.py`, then run from the repository root:

    python -m ds_longctx.plan --regen-all ds_configs

Each directory holds `run.yaml` (our run config, the planner's choices), `ds_config.json` (derived
from it by `ds_config.build_ds_config`; train.py derives the same dict itself), `accelerate.yaml`
(accelerate's DeepSpeed plugin on that JSON), `launch.txt` (the launch lines, run from that
directory) and `plan.txt` (the memory table and the reasoning). From the repository root,
`launch/deepspeed.sh` and `launch/accelerate.sh` take any single-node one:
`NGPU=8 CONFIG=ds_configs/qwen3-8b_1m_8x141gb/run.yaml launch/deepspeed.sh`. A multi-node one
(`2x8x80gb`: two 8-GPU nodes) also holds `hostfile` (DeepSpeed's, a template to fill with the
nodes' names); its `launch.txt` says which line runs where.

GB = 10^9 bytes; a plan fits under 0.9 × GPU memory and 0.9 × host RAM (per node). Host RAM is that
of the machines here (2-GPU H200: 256 GB, 8-GPU: 560 GB; the 4×80 GB row assumes 512 GB).

{header}
{rule}
{rows}
"""


if __name__ == "__main__":
    sys.exit(main())
