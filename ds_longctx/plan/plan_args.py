"""`ds-longctx plan`'s command line, checked before any planning (plan/write.py parses it and writes
the plan): every refusal a ValueError naming the value and the fix; the canonical command line the
files record; the search's arguments.

    geom, host = check_args(options.parser().parse_args(argv))   # ValueError on bad input
    choose(geom, seq_len, **search_kw(a, host))
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

from pydantic import ValidationError

from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.config.run import lever_conflict
from ds_longctx.config.train import whole_number_hint
from ds_longctx.levers.lora import ALL_LINEAR, DEFAULT_TARGETS
from ds_longctx.levers.rope import rope_problem
from ds_longctx.parallel import kernel_rules
from ds_longctx.parallel.parallel_state import check_sp_size
from ds_longctx.plan import disk_args, objective_args
from ds_longctx.plan.committed import default_host_mem_gb
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.plan.hf_fields import window_problem
from ds_longctx.plan.levers import Levers
from ds_longctx.plan.memory_terms import adapters
from ds_longctx.plan.moe_terms import moe_lever_problem
from ds_longctx.plan.no_fit import hardware
from ds_longctx.plan.planner import check_headroom
from ds_longctx.plan.search import MAX_SEARCH_TOKENS, find_max_len

MAX_GPUS_PER_NODE, MAX_NODES = (
    1024,
    1_000_000,
)  # past any machine; the search's fixes try divisors of these


def tokens(text: str) -> int:
    """--seq_len's type: a whole number of tokens (`128k` and `1M` are refused naming the numbers
    they may mean)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of tokens{whole_number_hint(text)}"
        ) from None


def check_args(a: argparse.Namespace) -> tuple:
    """Every check that needs no planning; returns (geometry, host_mem_gb). Raises ValueError naming
    the fix."""
    host = _check_values(a)
    disk_args.check_disk_args(a)
    geom = ModelGeometry.from_name_or_path(a.model)  # names the shipped geometries if unknown
    _check_against_model(a, geom, host)
    return geom, host


def _check_values(a: argparse.Namespace) -> float:
    """The checks of the numbers and flags alone (no model read); returns host_mem_gb, the default
    filled in."""
    if a.gpus < 1:
        raise ValueError(f"--gpus {a.gpus}: need at least 1 GPU")
    if a.nodes < 1:
        raise ValueError(f"--nodes {a.nodes}: need at least 1 node")
    if a.gpus > MAX_GPUS_PER_NODE or a.nodes > MAX_NODES:
        raise ValueError(
            f"--gpus {a.gpus} --nodes {a.nodes}: give at most {MAX_GPUS_PER_NODE} GPUs per node (8 "
            f"on the machines here; more GPUs: --nodes N of them) and {MAX_NODES:,} nodes"
        )
    if not 0 < a.gpu_mem_gb < float("inf"):  # also refuses nan
        raise ValueError(
            f"--gpu_mem_gb {a.gpu_mem_gb:g}: give the memory per GPU in GB, e.g. 80 or 141"
        )
    host = default_host_mem_gb(a.gpus) if a.host_mem_gb is None else a.host_mem_gb
    if not 0 < host < float("inf"):  # also refuses nan
        raise ValueError(f"--host_mem_gb {host:g}: give the node's host RAM in GB, e.g. 560")
    check_headroom(a.headroom)
    if a.seq_len is None and not a.find_max_len:
        raise ValueError(
            "--seq_len is required (or pass --find_max_len for the longest length that fits)"
        )
    if a.seq_len is not None and a.seq_len <= 0:
        raise ValueError(f"--seq_len {a.seq_len}: need a positive number of tokens, e.g. 1048576")
    if a.seq_len is not None and a.find_max_len:
        raise ValueError(
            f"--seq_len {a.seq_len} with --find_max_len: the search picks the length; drop one of "
            "them"
        )
    if a.out is not None:
        check_out_dir(a.out)
    if (
        a.optimizer_offload_ratio is not None and not 0 <= a.optimizer_offload_ratio <= 1
    ):  # also refuses nan
        raise ValueError(
            f"--optimizer_offload_ratio {a.optimizer_offload_ratio:g} must be in [0, 1]: the "
            f"host's share of the offloaded optimizer, e.g. 0.5"
        )
    if a.lora_rank < 0:
        raise ValueError(
            f"--lora_rank {a.lora_rank}: give the adapters' rank (e.g. 16), or 0 for full "
            "fine-tuning"
        )
    if msg := lever_conflict(
        lora_rank=a.lora_rank,
        tiled_layer=a.tiled_layer,
        offload_ratio=offload_ratio(a),
        offload_params=a.offload_params,
        flags=True,
    ):
        raise ValueError(msg)
    if a.attn_bwd_head_groups < 1:
        raise ValueError(
            f"--attn_bwd_head_groups {a.attn_bwd_head_groups}: give a number of groups >= 1 (1: "
            f"the whole backward at once)"
        )
    return host


def _check_against_model(a: argparse.Namespace, geom: ModelGeometry, host: float) -> None:
    """The checks of the flags against the model: its window and RoPE, LoRA targets, levers,
    sp_size, head groups."""
    if problem := window_problem(geom.name, geom.sliding_window, a.seq_len):
        raise ValueError(problem)
    objective_args.check_objective_args(a, geom)
    if a.seq_len and (
        problem := rope_problem(geom.name, geom.rope_type, geom.trained_context, a.seq_len)
    ):
        raise ValueError(problem)
    # geom.name is the shipped name (`Qwen/Qwen3-8B` -> qwen3-8b) or the checkpoint path as given
    try:
        RunConfig(model=geom.name, lora_target_modules=lora_targets(a))
    except ValidationError as e:
        raise ValueError(format_validation_error(e)) from None
    if a.lora_target_modules and not a.lora_rank:
        raise ValueError(
            f"--lora_target_modules {a.lora_target_modules} without --lora_rank: add the adapters' "
            f"rank (e.g. --lora_rank 16), or drop it"
        )
    if (
        a.lora_rank
    ):  # the targets against this model's Linears (a mixture of experts' experts take none)
        adapters(geom, a.lora_rank, lora_targets(a))
    if problem := moe_lever_problem(
        geom, search_kw(a, host)["base"]
    ):  # a lever forced on that this model cannot run
        raise ValueError(f"{problem} (here: drop --tiled_layer)")
    if a.lora_rank > geom.hidden:
        raise ValueError(
            f"--lora_rank {a.lora_rank} is more than {geom.name}'s hidden size {geom.hidden}: an "
            f"adapter of that rank is no longer low-rank; use a rank such as 16 or 64"
        )
    if a.sp_size is not None and a.sp_size < 1:
        raise ValueError(
            f"--sp_size {a.sp_size}: give a sequence-parallel size >= 1 (or leave it out: the plan "
            f"picks the largest that divides the GPUs and the heads)"
        )
    if a.sp_size is not None:
        check_sp_size(
            a.sp_size,
            a.nodes * a.gpus,
            geom.heads,
            geom.kv_heads,
            per_node=a.gpus,
            linear_heads=geom.linear_heads,
        )
    # at the pinned sp, else at sp 1 (the most KV heads per rank: groups that fail there fail at
    # every sp)
    kernel_rules.check_head_groups(a.attn_bwd_head_groups, geom.kv_heads, a.sp_size or 1)


def check_out_dir(out: str) -> None:
    """--out must name a directory that exists or can be made here (before any planning): not a
    file, not under a file, its nearest existing folder writable."""
    if not out.strip():
        raise ValueError(
            "--out '': give the directory to write the plan's files to, e.g. --out plans/8b_1m"
        )
    try:
        _check_out_path(out, Path(out))
    except OSError as e:  # a name too long, a folder that cannot be searched
        raise ValueError(
            f"--out {out}: {e.strerror or e}; give a directory you can write to"
        ) from None


def _check_out_path(out: str, p: Path) -> None:
    if p.exists() and not p.is_dir():
        raise ValueError(
            f"--out {out}: is a file, not a directory; give a directory (made if missing)"
        )
    up = p
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise ValueError(
            f"--out {out}: {up} is a file, so no directory can be made under it; give another path"
        )
    if not os.access(up, os.W_OK | os.X_OK):
        raise ValueError(
            f"--out {out}: {up} is not writable here; give a directory you can write to"
        )


def longest_fit(geom, a: argparse.Namespace, host: float) -> tuple:
    """(--find_max_len's length, its line): the longest that fits, searched up to the longest
    train's rope_scaling auto takes (`rope_problem`: past the trained context of a RoPE YaRN cannot
    rescale), else MAX_SEARCH_TOKENS."""
    capped = rope_problem(geom.name, geom.rope_type, geom.trained_context, geom.trained_context + 1)
    seq_len = find_max_len(
        geom, upper=geom.trained_context if capped else MAX_SEARCH_TOKENS, **search_kw(a, host)
    )
    machine = hardware(a.gpus, a.gpu_mem_gb, host, a.nodes)
    line = f"{geom.name} on {machine}: longest seq_len that fits = {seq_len:,} tokens"
    if seq_len >= MAX_SEARCH_TOKENS:  # the search's end, not a limit this hardware reached
        line = (
            f"{geom.name} on {machine}: longest seq_len that fits >= {seq_len:,} tokens (the "
            f"search stops there; the plan below is for that length)"
        )
    elif capped and seq_len + 1024 > geom.trained_context:
        line += f" (searched up to the trained context: {capped})"
    return seq_len, line


def command_line(a: argparse.Namespace, host: float) -> str:
    """The canonical `ds-longctx plan` line for these inputs (without --out: files must not depend
    on it)."""
    parts = [f"--model {a.model}"]
    parts += ["--find_max_len"] if a.find_max_len else [f"--seq_len {a.seq_len}"]
    parts += [f"--nodes {a.nodes}"] if a.nodes > 1 else []
    parts += [f"--gpus {a.gpus}", f"--gpu_mem_gb {a.gpu_mem_gb:g}", f"--host_mem_gb {host:g}"]
    parts += [f"--gpu {a.gpu}"] if a.gpu else []
    parts += [f"--sp_size {a.sp_size}"] if a.sp_size else []
    parts += [f"--headroom {a.headroom:g}"] if a.headroom != 0.9 else []
    parts += ["--no_attention_cache"] if a.no_attention_cache else []
    parts += ["--pinned_pool"] if a.pinned_pool else []
    parts += ["--tiled_layer"] if a.tiled_layer else []
    parts += (
        [f"--attn_bwd_head_groups {a.attn_bwd_head_groups}"] if a.attn_bwd_head_groups > 1 else []
    )
    parts += ["--offload_params"] if a.offload_params else []
    ratio = a.optimizer_offload_ratio
    parts += [f"--optimizer_offload_ratio {ratio:g}"] if ratio is not None else []
    parts += [f"--lora_rank {a.lora_rank}"] if a.lora_rank else []
    parts += [f"--lora_target_modules {a.lora_target_modules}"] if a.lora_target_modules else []
    parts += disk_args.command_parts(a)
    parts += objective_args.objective_flags(a)
    return "ds-longctx plan " + " ".join(parts)


def lora_targets(a: argparse.Namespace):
    """--lora_target_modules as the lora section reads it: a tuple of suffixes, or all-linear."""
    t = a.lora_target_modules or ",".join(DEFAULT_TARGETS)
    return t if t == ALL_LINEAR else tuple(x.strip() for x in t.split(","))


def offload_ratio(a: argparse.Namespace) -> float:
    """The host's share of an offloaded optimizer the command line asks for: all of it (1) when not
    given."""
    return 1.0 if a.optimizer_offload_ratio is None else a.optimizer_offload_ratio


def search_kw(a: argparse.Namespace, host: float) -> dict:
    """`choose` / `find_max_len`'s hardware and search arguments from the command line."""
    base = Levers(
        pinned_pool=a.pinned_pool,
        lora_rank=a.lora_rank,
        lora_targets=lora_targets(a),
        tiled_layer=a.tiled_layer,
        optimizer_offload_ratio=offload_ratio(a),
        partial_offload=a.optimizer_offload_ratio is None,
        attn_bwd_head_groups=a.attn_bwd_head_groups,
        offload_params=a.offload_params,
        objective=a.objective,
        completion_len=objective_args.completion_len(a),
    )
    return dict(
        gpus=a.gpus,
        nodes=a.nodes,
        gpu_mem_gb=a.gpu_mem_gb,
        host_mem_gb=host,
        headroom=a.headroom,
        sp_size=a.sp_size,
        base=base,
        nvme_gb=disk_args.nvme_gb(a),
    )


def local_gpu_kind() -> str | None:
    """This machine's first GPU as a kind `--gpu` takes (`NVIDIA H100 80GB HBM3` -> h100), None
    without nvidia-smi."""

    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    kind = re.search(r"\b([A-Z]+\d{2,3}[A-Z]?)\b", name[0]) if name else None
    return kind.group(1).lower() if kind else None
