"""ds_longctx beside its peers at one model, length and GPU count: step time, GPU and host peaks,
MFU.

    python benchmarks/bench_peers.py --systems ds_longctx,trl_fsdp2_cp,alst --model qwen3-8b \\
        --seq_len 131072 --gpus 2 --steps 4 --session LABEL [--out DIR] [--commit SHA] \\
        [--timeout_s 1800] [--ds_longctx_args "--attn_backend fa4 --attention_cache_layers all"]
    # print commands and configs, run none:
    python benchmarks/bench_peers.py --dry --model qwen3-tiny --seq_len 4096

One system after another, each its own process group, all with the same shipped geometry (random
weights), the same YaRN (`levers/rope.py:apply_rope_scaling`, which ds_longctx applies itself), one
sequence of `seq_len` tokens per step split over `gpus` GPUs, bf16, AdamW at lr 1e-5:
    ds_longctx     `python -m ds_longctx.cli train --nproc G --sp_size G ...` (the real entry; its
                   metrics.jsonl)
    trl_fsdp2_cp   TRL's FSDP2 + context-parallel recipe: `accelerate launch` with TRL's
                   context_parallel_2gpu.yaml (FSDP2, transformer-layer wrap, cp_size=G), SFTTrainer
                   with its default chunked loss (the fused LM head), pad_to_multiple_of=2*G,
                   gradient checkpointing with `offload` (pinned host memory)
    alst           TRL's DeepSpeed ALST recipe: torchrun, SFTConfig(deepspeed=TRL's zero3.json
                   (+ bf16 SP communication, as TRL's ALST yaml),
                   parallelism_config=ParallelismConfig(sp_size=G, sp_backend="deepspeed")), the
                   same chunked loss and offloaded checkpoints
Each peer's rank runs `bench_peers_worker.py SYSTEM` (the recipes, as data, and the SFTTrainer they
build): a TrainerCallback times each optimizer step between on_step_begin and on_step_end
(cuda-synchronized) and writes `<run>/rank<r>.jsonl`.

Appends one line per system to `<out>/peers.jsonl`, exactly
    session, system, seq_len, gpus, seconds_per_step, peak_gpu_bytes, host_peak_bytes, mfu,
    commit, device, config
(+ `error` when the run failed, timed out or ran out of memory; the numbers of its finished steps
are kept): seconds_per_step = median of the steps after the first; peak_gpu_bytes = max over ranks
and steps of torch.cuda.max_memory_reserved (reset at each step's start); host_peak_bytes = sum over
the ranks of each rank's peak RSS (VmHWM, what ru_maxrss reports), polled from /proc by this driver
for all three systems alike; mfu = bench_levers.model_flops / (seconds_per_step x gpus x 989e12);
config = what was on (recipe + what the worker saw at train start). Per run,
`<out>/peers_<session>/<system>/` keeps the log, generated configs, per-step files and summary.json
(step times, losses).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from bench_levers import (
    H200_BF16_PEAK,
    model_flops,
)  # benchmarks/ is sys.path[0] when this file runs
from bench_peers_worker import PEERS, peer_recipe, tiny_tokenizer, write_recipe_files
from harness import (
    ALLOC_CONF,
    ROOT,
    check_steps,
    free_port,
    fresh_dir,
    git_commit,
    gpu_name,
    parse_choices,
    raw_dir,
    read_lines,
    run_job,
)

SYSTEMS = ("ds_longctx", *PEERS)
LINE_KEYS = (
    "session",
    "system",
    "seq_len",
    "gpus",
    "seconds_per_step",
    "peak_gpu_bytes",
    "host_peak_bytes",
    "mfu",
    "commit",
    "device",
    "config",
)
VERSIONS = ("torch", "transformers", "accelerate", "deepspeed", "trl", "flash-attn-4")


def command(system: str, a, run_dir: Path, port: int) -> list[str]:
    py = sys.executable
    if system == "ds_longctx":
        extra = shlex.split(a.ds_longctx_args)
        lr = (
            []
            if any(x.split("=")[0] in ("--lr", "--optimizer.lr") for x in extra)
            else ["--lr", "1e-5"]
        )
        return [
            py,
            "-m",
            "ds_longctx.cli",
            "train",
            "--nproc",
            str(a.gpus),
            "--model",
            a.model,
            "--seq_len",
            str(a.seq_len),
            "--sp_size",
            str(a.gpus),
            "--steps",
            str(a.steps),
            *lr,
            "--output_dir",
            str(run_dir / "run"),
            *extra,
        ]
    worker = [
        str(Path(__file__).resolve().with_name("bench_peers_worker.py")),
        system,
        "--model",
        a.model,
        "--seq_len",
        str(a.seq_len),
        "--steps",
        str(a.steps),
        "--gpus",
        str(a.gpus),
        "--run_dir",
        str(run_dir),
    ]
    if system == "trl_fsdp2_cp":
        return [
            py,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(run_dir / "accelerate.yaml"),
            "--main_process_port",
            str(port),
            *worker,
        ]
    return [
        py,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(a.gpus),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        *worker,
    ]


# ----------------------------------------------------------------------------- driver
def collect(system: str, run_dir: Path, gpus: int) -> dict:
    """Per-step seconds (rank 0), per-step peak reserved (max over ranks), losses, what the run saw,
    its error."""
    if system == "ds_longctx":
        rows = read_lines(run_dir / "run" / "metrics.jsonl")
        seen = {}
        if (run_dir / "run" / "run.yaml").is_file():
            import yaml

            seen["run_config"] = yaml.safe_load((run_dir / "run" / "run.yaml").read_text())
        log = (
            (run_dir / "log.txt").read_text(errors="replace")
            if (run_dir / "log.txt").is_file()
            else ""
        )
        seen["attention"] = next(
            (x.split("attention: ", 1)[1] for x in log.splitlines() if "] attention: " in x), None
        )
        return {
            "seconds": [r["seconds"] for r in rows],
            "losses": [r["loss"] for r in rows],
            "observed": seen,
            "peaks": [r.get("peak_gpu_bytes_max_rank", r["peak_gpu_bytes"]) for r in rows],
            "error": None,
        }
    ranks = [read_lines(run_dir / f"rank{r}.jsonl") for r in range(gpus)]
    steps = [[x for x in rk if x["event"] == "step"] for rk in ranks]
    n = min((len(s) for s in steps), default=0)
    errors = [x["error"] for rk in ranks for x in rk if x["event"] == "error"]
    return {
        "seconds": [x["seconds"] for x in steps[0][:n]] if n else [],
        "peaks": [max(s[i]["peak_reserved"] for s in steps) for i in range(n)],
        "losses": [x.get("loss") for x in ranks[0] if x["event"] == "log" and "loss" in x],
        "observed": next(
            (
                {k: v for k, v in x.items() if k != "event"}
                for x in ranks[0]
                if x["event"] == "config"
            ),
            {},
        ),
        "self_reported_host_peak_bytes": sum(s[n - 1]["ru_maxrss"] for s in steps) if n else None,
        "error": errors[0] if errors else None,
    }


def failure(rc, timeout_s: float, log_path: Path, reported) -> str | None:
    if rc == 0:
        return None
    if rc is None:
        return f"timeout after {timeout_s:.0f} s"
    lines = [x.strip() for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
    oom = next((x for x in lines if "OutOfMemoryError" in x or "out of memory" in x.lower()), None)
    if oom:
        return f"OOM: {oom[:300]}"
    return f"exit {rc}: {(reported or (lines[-1] if lines else ''))[:300]}"


def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in VERSIONS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def line_for(
    a,
    system: str,
    res: dict,
    host: int,
    config: dict,
    error: str | None,
    commit: str,
    device: str,
    flops: float,
) -> dict:
    """The peers.jsonl line: the issue's keys, in its order, `error` only when the run failed."""
    steady = res["seconds"][1:]
    sps = statistics.median(steady) if steady else None
    if error is None and not steady:
        error = (
            f"only {len(res['seconds'])} step(s) finished; the median needs the steps after the "
            "first"
        )
    line = {
        "session": a.session,
        "system": system,
        "seq_len": a.seq_len,
        "gpus": a.gpus,
        "seconds_per_step": round(sps, 3) if sps else None,
        "peak_gpu_bytes": max(res["peaks"]) if res["peaks"] else None,
        "host_peak_bytes": host or None,
        "mfu": round(flops / (sps * a.gpus * H200_BF16_PEAK), 4) if sps else None,
        "commit": commit,
        "device": device,
        "config": config,
    }
    assert tuple(line) == LINE_KEYS
    return {**line, "error": error} if error else line


def run_system(
    a, system: str, session_dir: Path, commit: str, device: str, flops: float, out: Path
) -> dict:
    run_dir = fresh_dir(session_dir / system)
    recipe = (
        None if system == "ds_longctx" else peer_recipe(system, a.seq_len, a.steps, a.gpus, run_dir)
    )
    if recipe:
        write_recipe_files(system, recipe, run_dir)
    argv = command(system, a, run_dir, free_port())
    print(f"\n== {system}: {shlex.join(argv)}\n   log: {run_dir / 'log.txt'}", flush=True)
    rc, host, wall = run_job(argv, run_dir / "log.txt", a.timeout_s)
    res = collect(system, run_dir, a.gpus)
    error = failure(rc, a.timeout_s, run_dir / "log.txt", res["error"])
    config = {
        "entry": shlex.join(argv[1:]).replace(str(ROOT) + "/", ""),
        **(recipe or {}),
        "observed": res["observed"],
        "model": a.model,
        "weights": "random init from the shipped geometry",
        "steps": a.steps,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF),
        "versions": versions(),
    }
    line = line_for(a, system, res, host, config, error, commit, device, flops)
    with (out / "peers.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    summary = {
        "line": line,
        "step_seconds": res["seconds"],
        "step_peak_reserved": res["peaks"],
        "losses": res["losses"],
        "self_reported_host_peak_bytes": res.get("self_reported_host_peak_bytes"),
        "exit": rc,
        "wall_seconds": round(wall, 1),
        "date": datetime.date.today().isoformat(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in line.items() if k != "config"}), flush=True)
    return line


def collect_after(a, system: str, run_dir: Path, out: Path) -> dict:
    """The peers.jsonl line of a peer run whose driver was stopped after its steps finished (device
    time ran out while the launcher exited): from the ranks' own files; host_peak_bytes = Σ over
    ranks of the ru_maxrss each rank reported at its last step (the same VmHWM the driver polls),
    and config says so."""
    recipe = json.loads((run_dir / "recipe.json").read_text())
    res = collect(system, run_dir, a.gpus)
    config = {
        **recipe,
        "observed": res["observed"],
        "model": a.model,
        "weights": "random init from the shipped geometry",
        "steps": a.steps,
        "collected": "line written after the device session from the ranks' files "
        "(the driver was stopped when the session's device time ran out); "
        "host_peak_bytes from the ranks' ru_maxrss",
    }
    line = line_for(
        a,
        system,
        res,
        res.get("self_reported_host_peak_bytes") or 0,
        config,
        res["error"],
        git_commit(a.commit),
        a.device or "unknown",
        a.flops,
    )
    with (out / "peers.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def dry(a, systems: list[str]) -> None:
    """Every command and generated config for these arguments, checked against the installed TRL and
    accelerate where they import (field names of SFTConfig, the ParallelismConfig, the env
    `accelerate launch` would set)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_peers_dry_"))
    for system in systems:
        run_dir = tmp / system
        print(f"\n== {system}")
        recipe = None
        if system != "ds_longctx":
            recipe = peer_recipe(system, a.seq_len, a.steps, a.gpus, run_dir)
            write_recipe_files(system, recipe, run_dir)
        print("command:", shlex.join(command(system, a, run_dir, 29500)))
        if recipe is None:
            continue
        print("recipe:", json.dumps(recipe, indent=2))
        try:
            import dataclasses

            from trl import SFTConfig

            unknown = set(recipe["sft_config"]) - {f.name for f in dataclasses.fields(SFTConfig)}
            print(
                f"SFTConfig fields: {'all known' if not unknown else f'UNKNOWN {sorted(unknown)}'}"
            )
        except ImportError as e:
            print(f"SFTConfig fields not checked (trl does not import here: {e})")
        if system == "alst":
            from accelerate import ParallelismConfig
            from accelerate.utils import DeepSpeedSequenceParallelConfig

            pc = recipe["parallelism_config"]
            print(
                ParallelismConfig(
                    sp_size=pc["sp_size"],
                    sp_backend=pc["sp_backend"],
                    sp_handler=DeepSpeedSequenceParallelConfig(
                        sp_seq_length_is_variable=pc["sp_seq_length_is_variable"],
                        sp_attn_implementation=pc["sp_attn_implementation"],
                    ),
                )
            )
        if system == "trl_fsdp2_cp":
            from accelerate.commands.launch import _validate_launch_command, launch_command_parser
            from accelerate.utils.launch import prepare_multi_gpu_env

            args = launch_command_parser().parse_args(command(system, a, run_dir, 29500)[3:])
            args, _, _ = _validate_launch_command(args)
            env = prepare_multi_gpu_env(args)
            print(
                "accelerate launch sets:",
                {
                    k: v
                    for k, v in sorted(env.items())
                    if k.startswith(
                        ("FSDP_", "PARALLELISM_CONFIG_", "ACCELERATE_USE_", "ACCELERATE_MIXED")
                    )
                },
            )
    from ds_longctx.levers.rope import apply_rope_scaling
    from ds_longctx.run.model import load_hf_config

    hf_cfg = load_hf_config(a.model)
    apply_rope_scaling(hf_cfg, a.seq_len)
    print(
        f"\nYaRN for all three at {a.seq_len}: {hf_cfg.rope_parameters}, max_position_embeddings "
        f"{hf_cfg.max_position_embeddings}"
    )
    tok = tiny_tokenizer()
    print(
        f"tiny tokenizer: pad {tok.pad_token}={tok.pad_token_id}, eos "
        f"{tok.eos_token}={tok.eos_token_id}"
    )
    fake = {"seconds": [40.0, 30.0, 31.0, 32.0], "peaks": [80 * 2**30] * 4}
    print(
        "a peers.jsonl line (made-up numbers):",
        json.dumps(
            line_for(
                a,
                systems[0],
                fake,
                40 * 2**30,
                {"...": "..."},
                None,
                git_commit(a.commit),
                "cpu",
                a.flops,
            )
        ),
    )
    print(f"generated files under {tmp}")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument(
        "--model", default="qwen3-8b", help="a shipped geometry (ds_longctx/models/<name>.json)"
    )
    ap.add_argument("--seq_len", type=int, default=131072)
    ap.add_argument(
        "--gpus",
        type=int,
        default=2,
        help="GPUs per run = sp_size = cp_size (one sequence per step)",
    )
    ap.add_argument(
        "--steps", type=int, default=4, help="steps per run; the median is over all but the first"
    )
    ap.add_argument(
        "--session", default=None, help="label shared by the runs of one device session"
    )
    ap.add_argument(
        "--out",
        default=raw_dir(),
        help="peers.jsonl and peers_<session>/ (default: $OUT, else "
        "benchmarks/results/sessions/<date>)",
    )
    ap.add_argument(
        "--commit", default=None, help="used when `git rev-parse` fails (no .git on the device)"
    )
    ap.add_argument("--timeout_s", type=float, default=1800, help="per system, launch to exit")
    ap.add_argument(
        "--ds_longctx_args", default="", help="extra run-config options for ds_longctx, one string"
    )
    ap.add_argument(
        "--dry", action="store_true", help="print the commands and configs, launch nothing"
    )
    ap.add_argument(
        "--collect",
        metavar="RUN_DIR",
        help="write the line of the one --systems peer run in RUN_DIR "
        "whose driver was stopped after its steps (with --session, --commit, --device)",
    )
    ap.add_argument("--device", help="with --collect: the device name the run had")
    a = ap.parse_args()
    systems = parse_choices(ap, "--systems", a.systems, SYSTEMS)
    check_steps(ap, a.steps)
    if a.seq_len % (2 * a.gpus):
        ap.error(
            f"--seq_len {a.seq_len} must divide by 2*gpus={2 * a.gpus} (context parallelism cuts "
            f"2*cp chunks); try {a.seq_len // (2 * a.gpus) * 2 * a.gpus}"
        )
    from ds_longctx.plan.geometry import ModelGeometry

    a.flops = model_flops(
        ModelGeometry.from_name_or_path(a.model), a.seq_len
    )  # one sequence per step, all GPUs
    if a.dry:
        a.session = a.session or "dry"
        return dry(a, systems)
    if not a.session:
        ap.error("--session LABEL is required (it ties the runs of one device session together)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.collect:
        if len(systems) != 1 or systems[0] == "ds_longctx":
            ap.error(
                f"--collect reads one peer run: give --systems trl_fsdp2_cp or alst, not {systems}"
            )
        return print(json.dumps(collect_after(a, systems[0], Path(a.collect), out))[:600])
    session_dir = out / f"peers_{a.session}"
    commit, device = git_commit(a.commit), gpu_name()
    for system in systems:
        run_system(a, system, session_dir, commit, device, a.flops, out)
    print(f"\nappended {len(systems)} line(s) to {out / 'peers.jsonl'}")


if __name__ == "__main__":
    main()
