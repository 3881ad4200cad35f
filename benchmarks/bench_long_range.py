"""Long-range check: a tiny Qwen3 trained with Ulysses SP=2 retrieves keys placed >= 90% of the sequence back.

    python benchmarks/bench_long_range.py                   # 2 CPU processes (gloo, ZeRO-3, fp32), < 5 min
    python benchmarks/bench_long_range.py --steps 1200 --seq_len 256 --out benchmarks/results

The task is `data.SyntheticRetrieval` with fused pairs: `BOS p1 .. p8 <filler> SEP k v SEP k v ...`, each p a
single token binding one of 8 keys to one of 16 values, the pairs in the first and the queries in the last 5%
of the sequence (`min_distance` >= 0.9 * seq_len; at 256 tokens the closest pair is 237 tokens back). The loss
is on the query values only. Accuracy is the argmax of the engine's logits (tests/distributed/export_worker.
sp_logits: the SP forward, gathered) at each query's key against the value bound to that key, on held-out
samples. Baselines: chance 1 / num_values, and 1 / num_pairs (answering one of the values present in the
sequence, which needs no key matching).

Why fused pairs: with the plain `k v` layout the tiny model has to grow an induction circuit (a
previous-token head composed with a matching head); on 2 CPU cores it stayed near the no-matching baseline
for 1,500 steps (~20% vs 1/7), with or without dense recall warm-up data, other lr, RoPE base or head sizes.
Binding key and value in one token makes retrieval one attention hop over >= 90% of the sequence, which is
what this check is about: attention that really spans the sequence split across SP ranks.

Writes results/long_range_<date>.json and .md (command, settings, accuracy per evaluation, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (micro_batch)")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--values", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--eval_samples", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


# ----------------------------------------------------------------------------- evaluation
def accuracy(engine, task, n: int) -> float:
    """Retrieval accuracy on held-out far samples: argmax at each query's key == the paired value."""
    import torch
    from tests.distributed.export_worker import sp_logits
    hits = total = 0
    for start in range(0, n, 8):
        idx = range(10**7 + start, 10**7 + min(start + 8, n))
        draws = [task.draw(i) for i in idx]
        ids = torch.stack([d[0] for d in draws])
        pred = sp_logits(engine, ids).argmax(-1)                                   # [b, L]
        for row, (tok, value_pos, _) in enumerate(draws):
            hits += int((pred[row, value_pos - 1] == tok[value_pos]).sum())
            total += len(value_pos)
    return hits / total


# ----------------------------------------------------------------------------- worker (one per rank)
def worker(a) -> None:
    import torch

    from ds_longctx.config import RunConfig
    from ds_longctx.data.synthetic import SyntheticRetrieval
    from ds_longctx.parallel.parallel_state import init_distributed
    from ds_longctx.run.engine import build_engine

    cfg = RunConfig(model="qwen3-tiny", seq_len=a.seq_len, sp_size=2, micro_batch=a.batch, dtype="fp32", lr=a.lr,
                    warmup_steps=a.warmup, seed=a.seed, output_dir=a.out, activation_checkpointing=False)
    init_distributed(cfg.parallel.collective_timeout_s)
    engine = build_engine(cfg)
    task = SyntheticRetrieval(a.seq_len, engine.model.config.vocab_size, seed=a.seed, num_pairs=a.pairs,
                              num_queries=a.queries, num_keys=a.keys, num_values=a.values, fused_pairs=True,
                              supervise="queries")
    assert task.min_distance >= 0.9 * a.seq_len, (task.min_distance, a.seq_len)
    rank0 = engine.state.rank == 0
    evals, t0 = [], time.time()
    for step in range(a.steps):
        b = task.get(step, a.batch, 0, 1)  # one SP group: every rank trains on the same rows
        res = engine.train_step(b.input_ids, labels=b.labels)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            acc = accuracy(engine, task, a.eval_samples)
            evals.append({"step": step + 1, "loss": res.loss, "accuracy": acc, "seconds": round(time.time() - t0, 1)})
            if rank0:
                print(json.dumps(evals[-1]), flush=True)
    if rank0:
        result = {"settings": {k: v for k, v in vars(a).items() if k not in ("worker", "out")},
                  "min_distance_fraction": task.min_distance / a.seq_len, "chance": 1 / a.values,
                  "present_value_baseline": 1 / a.pairs, "evals": evals, "train_seconds": round(time.time() - t0, 1),
                  "world": "2 CPU processes, gloo, ZeRO-3, SP=2, fp32, qwen3-tiny"}
        Path(a.out, "_long_range_worker.json").write_text(json.dumps(result, indent=1) + "\n")


# ----------------------------------------------------------------------------- launcher
def main() -> int:
    a = args_parser().parse_args()
    if a.worker:
        worker(a)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [x for x in sys.argv[1:]]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(Path(__file__).resolve()), "--worker", *argv]
    t0 = time.time()
    rc = subprocess.call(cmd, env=env, cwd=ROOT)
    wall = time.time() - t0
    raw = out / "_long_range_worker.json"
    if rc or not raw.exists():
        print(f"worker failed ({rc})", file=sys.stderr)
        return rc or 1
    result = json.loads(raw.read_text()) | {"wall_seconds": round(wall, 1),
                                             "command": " ".join(["python benchmarks/bench_long_range.py", *argv])}
    raw.unlink()
    stem = out / f"long_range_{date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    final = result["evals"][-1]
    lines = [f"# Long-range retrieval, SP=2 on CPU ({date.today().isoformat()})", "",
             f"`{result['command']}` — {result['world']}; wall {wall:.0f} s (training {result['train_seconds']} s).",
             "", f"Keys >= {result['min_distance_fraction']:.0%} of the sequence back "
             f"(seq_len {a.seq_len}, {a.pairs} pairs, {a.queries} queries, {a.keys} keys, {a.values} values).", "",
             "| step | loss | retrieval accuracy | chance (1/values) | any present value (1/pairs) |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {e['step']} | {e['loss']:.3f} | {e['accuracy']:.3f} | {result['chance']:.3f} | "
              f"{result['present_value_baseline']:.3f} |" for e in result["evals"]]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"final accuracy {final['accuracy']:.3f} vs chance {result['chance']:.3f}; wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
