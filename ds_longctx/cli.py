"""The `ds-longctx` command.

    ds-longctx demo                              # tiny Qwen3, 2 CPU processes, SP=2, beside an SP=1 reference
    ds-longctx train --nproc N [--config F] [--key value ...]   # N local processes under torchrun
    ds-longctx plan --model M --seq_len N --gpus G [--gpu_mem_gb X] [--host_mem_gb Y] [--out DIR]
    ds-longctx export --checkpoint DIR --out DIR                # DeepSpeed checkpoint -> HF safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu" if not _has_cuda() else env.get("DS_ACCELERATOR", "cuda"))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(nproc: int, run_args: list[str]) -> list[str]:
    """The torchrun command line that starts `nproc` local training processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
            "-m", "ds_longctx.train", *run_args]


def precheck(nproc: int, run_args: list[str]):
    """Parse and check the run in this process (`preflight`: the engine's checks, RoPE coverage, data source,
    output_dir / resume), before any worker starts. Exits 2 on bad input."""
    from ds_longctx.run.preflight import preflight
    from ds_longctx.run.train import parse_config
    cfg = parse_config(run_args)
    try:
        preflight(cfg, nproc)
    except ValueError as e:
        print(f"refused before start: {e}", file=sys.stderr)
        sys.exit(2)
    return cfg


def run_train(nproc: int, run_args: list[str]) -> int:
    if nproc < 1:
        print(f"--nproc {nproc}: need at least 1 process", file=sys.stderr)
        return 2
    precheck(nproc, run_args)
    return subprocess.call(train_command(nproc, run_args), env=_child_env())


def read_losses(output_dir: str) -> list[float]:
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if line.strip()]


def run_demo(args) -> int:
    """Tiny Qwen3 (8 q / 2 kv heads) on the synthetic retrieval task: SP=2 over 2 gloo processes, then
    the same run on 1 process (SP=1), losses side by side."""
    base = ["--model", "qwen3-tiny", "--seq_len", str(args.seq_len), "--steps", str(args.steps),
            "--seed", str(args.seed), "--lr", "1e-3", "--dtype", "fp32"]
    out = Path(args.output_dir)
    runs = {"sp2": (2, ["--sp_size", "2"]), "sp1": (1, ["--sp_size", "1"])}
    for name, (nproc, extra) in runs.items():
        print(f"\n== {name}: {nproc} process(es), {' '.join(extra)}", flush=True)
        rc = run_train(nproc, base + extra + ["--output_dir", str(out / name)])
        if rc:
            return rc
    print(f"\ngenerated DeepSpeed config ({out / 'sp2' / 'ds_config.json'}):")
    print((out / "sp2" / "ds_config.json").read_text())
    from ds_longctx.plan.planner import Levers, ModelGeometry, plan_memory
    plan = plan_memory(ModelGeometry.from_name_or_path("qwen3-tiny"), args.seq_len, 2, 2,
                       Levers(tiled_mlp=False, chunk_rows=4096))
    print("memory plan of this run (per GPU if it ran on GPUs; `ds-longctx plan` for real runs):")
    print(plan.table())
    print()
    sp2, sp1 = read_losses(str(out / "sp2")), read_losses(str(out / "sp1"))
    print(f"{'step':>4}  {'loss SP=2':>12}  {'loss SP=1':>12}  {'rel diff':>9}")
    for i, (a, b) in enumerate(zip(sp2, sp1), 1):
        print(f"{i:>4}  {a:12.6f}  {b:12.6f}  {abs(a - b) / abs(b):9.1e}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(sp2, sp1))
    print(f"SP=2 matches SP=1 to rel {worst:.1e}" if worst <= 1e-4 else f"MISMATCH: rel {worst:.1e} > 1e-4")
    return 0 if worst <= 1e-4 else 1


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plan":  # the generator owns its own options
        from ds_longctx.plan.generate import main as plan_main
        sys.exit(plan_main(argv[1:]))
    if argv and argv[0] == "export":
        from ds_longctx.run.export import main as export_main
        sys.exit(export_main(argv[1:]))
    p = argparse.ArgumentParser(prog="ds-longctx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("plan", help="memory plan + generated DeepSpeed/accelerate configs (ds-longctx plan -h)")
    sub.add_parser("export", help="DeepSpeed checkpoint -> HF safetensors (ds-longctx export -h)")
    t = sub.add_parser("train", help="start N local training processes (torchrun); other options go to the run "
                       "config (--config FILE, --key value)")
    t.add_argument("--nproc", type=int, default=1)
    d = sub.add_parser("demo", help="the embedded default: tiny Qwen3, 2 CPU processes, SP=2 vs SP=1")
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--seq_len", type=int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--output_dir", default="runs/demo")
    args, rest = p.parse_known_args(argv)
    if args.cmd == "train":
        sys.exit(run_train(args.nproc, rest))
    if rest:
        p.error(f"unknown arguments for {args.cmd}: {rest}")
    sys.exit(run_demo(args))


if __name__ == "__main__":
    main()
