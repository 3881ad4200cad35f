"""What a masked row costs against an unmasked one: `ds-longctx train` twice on the same token rows,
once with labels that train a share of the tokens (assistant-like spans) and once with every token
trained.

    python benchmarks/bench_masked_step.py --model qwen3-0.6b --seq_len 131072 --steps 4 \\
        --out DIR [--share 0.1]

Rows: random ids below the model's vocabulary, one row of seq_len per step (layout document). Masked
labels train spans of `span` tokens spaced so that `share` of each row trains. Appends to
DIR/masked_step.jsonl one line per run: date, commit, device, command, trained share, median seconds
of the steps after the first, peak GPU bytes, trained tokens per step; then a line comparing the two
("masked_over_full": the ratio of their median step seconds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path


def write_rows(
    path: Path, rows: int, seq_len: int, vocab: int, share: float, span: int, seed: int
) -> None:
    """`rows` rows of `seq_len` random ids; labels train `share` of each row in spans of `span`
    (1.0: no labels)."""
    rng = random.Random(seed)
    period = max(span, round(span / share)) if share < 1 else span
    with path.open("w") as f:
        for _ in range(rows):
            ids = [rng.randrange(3, vocab) for _ in range(seq_len)]
            row = {"input_ids": ids}
            if share < 1:  # the last `span` of every period trains
                row["labels"] = [
                    t if j % period >= period - span else -100 for j, t in enumerate(ids)
                ]
            f.write(json.dumps(row) + "\n")


def run(args, name: str, data: Path) -> dict:
    """One `ds-longctx train` run; its summary line."""
    out_dir = args.out / name
    cmd = [
        sys.executable,
        "-m",
        "ds_longctx.cli",
        "train",
        "--nproc",
        "1",
        "--model",
        args.model,
        "--seq_len",
        str(args.seq_len),
        "--steps",
        str(args.steps),
        "--data",
        str(data),
        "--data_layout",
        "document",
        "--output_dir",
        str(out_dir),
        *args.train_args.split(),
    ]
    with (args.out / f"{name}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    steps = [
        json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]
    steps = [s for s in steps if "loss" in s]
    timed = [s["seconds"] for s in steps[1:]] or [steps[0]["seconds"]]
    return {
        "run": name,
        "command": " ".join(cmd[1:]),
        "seconds_per_step": statistics.median(timed),
        "step_seconds": [s["seconds"] for s in steps],
        "peak_gpu_bytes": max(s["peak_gpu_bytes"] for s in steps),
        "trained_tokens": steps[-1]["trained_tokens"],
        "losses": [round(s["loss"], 4) for s in steps],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seq_len", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument(
        "--share", type=float, default=0.1, help="share of tokens the masked rows train"
    )
    ap.add_argument("--span", type=int, default=512, help="tokens per trained span")
    ap.add_argument("--train_args", default="", help="more `ds-longctx train` options, one string")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not 0 < args.share <= 1:
        sys.exit(f"--share {args.share}: give a share in (0, 1]")
    args.out.mkdir(parents=True, exist_ok=True)
    from ds_longctx.config.model import SHIPPED_MODELS_DIR

    vocab = json.loads((SHIPPED_MODELS_DIR / f"{args.model}.json").read_text())["vocab_size"]
    import torch

    head = {
        "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": args.model,
        "seq_len": args.seq_len,
        "steps": args.steps,
    }
    lines = []
    for name, share in (("masked", args.share), ("full", 1.0)):
        data = args.out / f"{name}.jsonl"
        write_rows(
            data, args.steps, args.seq_len, vocab, share, args.span, seed=0
        )  # same ids both runs
        lines.append({**head, "share": share, **run(args, name, data)})
        data.unlink()
    ratio = lines[0]["seconds_per_step"] / lines[1]["seconds_per_step"]
    lines.append({**head, "masked_over_full": round(ratio, 4)})
    with (args.out / "masked_step.jsonl").open("a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    for line in lines:
        print(json.dumps({k: v for k, v in line.items() if k not in ("command", "step_seconds")}))


if __name__ == "__main__":
    main()
