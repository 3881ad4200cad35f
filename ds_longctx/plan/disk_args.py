"""`ds-longctx plan`'s disk-tier options: --nvme_path, --nvme_gb, --measure_nvme; their checks and
plan lines.

ds-longctx plan --model qwen3-8b --gpus 1 --gpu_mem_gb 141 --nvme_gb 2000 --find_max_len
ds-longctx plan ... --nvme_path /local_nvme/run --nvme_gb 50 --measure_nvme   # and record it
"""

from __future__ import annotations

import argparse
import os

from ds_longctx.config.memory import nvme_path_problem
from ds_longctx.parallel import direct_io
from ds_longctx.parallel.disk import free_bytes, mount_point, size_text, user_path
from ds_longctx.plan.disk_binds import what_binds
from ds_longctx.plan.disk_terms import disk_seconds
from ds_longctx.plan.planner import GB
from ds_longctx.plan.step_time import UnknownRate, predict_step


def add_disk_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nvme_path",
        default=None,
        help="a directory on a local NVMe disk for the disk tier (memory.nvme_path): "
        "checkpoints of `disk` layers and, where the plan needs it, "
        "ZeRO-Infinity's optimizer / parameter swap files",
    )
    p.add_argument(
        "--nvme_gb",
        type=float,
        default=None,
        help="GB of that disk the run may fill; the search puts checkpoints (then the optimizer "
        "state, then the parameters) there only where the host runs out. Not given: no disk tier",
    )
    p.add_argument(
        "--measure_nvme",
        action="store_true",
        help="with --nvme_path: measure its write and read bandwidth (1 GB, O_DIRECT where "
        "allowed), "
        "record it there and plan with it (otherwise a recorded figure, else an assumed one)",
    )


def check_disk_args(a: argparse.Namespace) -> None:
    """Refuse a bad --nvme_* (ValueError naming the fix); measure the bandwidth if asked."""
    if a.nvme_gb is not None and not 0 < a.nvme_gb < float("inf"):
        raise ValueError(f"--nvme_gb {a.nvme_gb:g}: give the disk's GB the run may fill, e.g. 2000")
    if a.nvme_path is not None:
        a.nvme_path = user_path(a.nvme_path)
        if problem := nvme_path_problem(a.nvme_path):
            raise ValueError(problem.replace("nvme_path=", "--nvme_path "))
        free = free_bytes(a.nvme_path)
        if a.nvme_gb and free is not None and a.nvme_gb * GB > free:
            raise ValueError(
                f"--nvme_gb {a.nvme_gb:g}: {mount_point(a.nvme_path)} (holding --nvme_path "
                f"{a.nvme_path}) has {size_text(free)} free; give --nvme_gb {free // GB:.0f} or "
                f"less, or free space there"
            )
    if a.nvme_gb and a.out and a.nvme_path is None:
        raise ValueError(
            f"--nvme_gb {a.nvme_gb:g} with --out: run.yaml names the disk; give --nvme_path DIR too"
        )
    if a.nvme_path is not None and not a.nvme_gb and not a.measure_nvme:
        raise ValueError(
            f"--nvme_path {a.nvme_path} without --nvme_gb: give the GB of it the run may fill, "
            f"e.g. --nvme_gb 500 (the search plans the disk tier within that)"
        )
    if a.measure_nvme:
        if a.nvme_path is None:
            raise ValueError("--measure_nvme measures --nvme_path: give --nvme_path DIR")
        os.makedirs(a.nvme_path, exist_ok=True)
        print(f"measured: {direct_io.measure_bandwidth(a.nvme_path).describe()}", flush=True)


def nvme_gb(a: argparse.Namespace) -> float:
    return a.nvme_gb or 0.0


def command_parts(a: argparse.Namespace) -> list:
    """The disk flags of the canonical command line (the path excluded: files must not depend on
    it)."""
    return [f"--nvme_gb {a.nvme_gb:g}"] if a.nvme_gb else []


def run_config_keys(a: argparse.Namespace, plan) -> dict:
    """The run config's disk keys for `plan`: none unless it uses the disk tier."""
    lv = plan.levers
    if not (plan.disk_bytes or lv.nvme_optimizer or lv.nvme_params):
        return {}
    return {"nvme_path": a.nvme_path, "nvme_gb": a.nvme_gb}


def plan_lines(a: argparse.Namespace, plan, host: float) -> list:
    """plan.txt's disk lines: with --find_max_len what binds next; the bytes on disk, the bandwidth
    used and the I/O seconds of one step."""
    lines = []
    if a.nvme_gb and a.find_max_len:
        binds = what_binds(
            plan.geom,
            plan.seq_len + 1024,
            a.gpus,
            a.gpu_mem_gb,
            host,
            headroom=a.headroom,
            nodes=a.nodes,
            sp_size=a.sp_size,
            nvme_gb=a.nvme_gb,
        )
        lines.append(f"what binds next (with the disk tier): {binds}")
    if not plan.disk_bytes:
        return lines
    bw = direct_io.recorded_bandwidth(a.nvme_path)
    step_s = layers_s = None
    try:
        if a.gpu:
            step = predict_step(plan, a.gpu_mem_gb, a.gpu)
            step_s, layers_s = step.seconds, step.attention + step.tokenwise
    except UnknownRate:
        pass
    return lines + [
        f"disk tier: {plan.disk_bytes / GB:.1f} GB on nvme_path of {a.nvme_gb:g} GB -> "
        f"{a.headroom * a.nvme_gb:.1f} GB; layers on disk: {plan.placement.on_disk}",
        disk_seconds(plan, bw, step_s, layers_s)[2],
    ]
