"""TRL's SFTTrainer through ds_longctx (`launch/trl_sft.py`) beside `ds-longctx train` on the same
plan, and a LoRA run: step time, GPU peak and host peak, one after another in one device session.

    python benchmarks/bench_hf_trainer.py --model qwen3-8b --seq_len 131072 --gpus 2 \\
        --gpu_mem_gb 141 --steps 3 --runs trl_sft,train,lora --lora_rank 16 \\
        --out $OUT [--commit SHA]
    python benchmarks/bench_hf_trainer.py --model qwen3-tiny --seq_len 512 --gpus 2 --steps 3 \\
        --cpu --out /tmp/b

The data is the seed guide's shape, in words: a folder of text files (random words `w0 ... wN`) and
a word-level tokenizer (tests/helpers.py builds both), joined end to end and cut into rows of
exactly seq_len tokens. For each run: `ds-longctx plan --model M --seq_len L --gpus G --gpu_mem_gb X
[--lora_rank R] --out plan_<run>` writes run.yaml and accelerate.yaml, then
    trl_sft  accelerate launch --config_file plan/accelerate.yaml launch/trl_sft.py \\
                 --config plan/run.yaml --data ...
             (rank 0 prints one JSON line per step: loss, seconds, peak_gpu_bytes = the
             integration's step clock)
    train    ds-longctx train --config plan/run.yaml --nproc G --data ...
             (its metrics.jsonl)
    lora     ds-longctx train --config plan_lora/run.yaml --nproc G --data ...
             (plan made with --lora_rank R)
Appends one line per run to `<out>/hf_trainer.jsonl`: {run, model, seq_len, gpus, steps,
seconds_per_step (median of the steps after the first), step_seconds, peak_gpu_bytes (max over
steps; trl_sft: rank 0's, train/lora: max over ranks), planned_gpu_bytes, host_peak_bytes (sum over
ranks of peak RSS, polled), losses, commit, device, date, command, error}; each run's log and plan
under `<out>/hf_trainer_runs/<run>/`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

from harness import (
    ROOT,
    check_steps,
    free_port,
    git_commit,
    gpu_name,
    parse_choices,
    raw_dir,
    read_lines,
    read_plan,
    run_job,  # benchmarks/ is sys.path[0]
)

RUNS = ("trl_sft", "train", "lora")


def make_corpus(d: Path, tokens: int, n_words: int) -> tuple[Path, Path]:
    """A tokenizer over n_words words and a folder of text files holding at least `tokens` of
    them."""
    sys.path.insert(0, str(ROOT))
    from tests.corpus import documents, make_tokenizer, write_txt_dir

    tok = make_tokenizer(d / "tok", n_words=n_words)
    per_doc = 20_000
    n_docs = tokens // per_doc + 2
    write_txt_dir(
        d / "books",
        documents(
            n_docs, min_words=per_doc // 2, max_words=per_doc * 3 // 2, n_words=n_words, seed=0
        ),
    )
    return d / "books", tok


def run_one(a, run: str, books: Path, tok: Path, work: Path, commit: str, device: str) -> dict:
    d = work / run
    d.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    plan = d / "plan"
    plan_cmd = [
        py,
        "-m",
        "ds_longctx.cli",
        "plan",
        "--model",
        a.model,
        "--seq_len",
        str(a.seq_len),
        "--gpus",
        str(a.gpus),
        "--gpu_mem_gb",
        str(a.gpu_mem_gb),
        "--out",
        str(plan),
    ]
    if run == "lora":
        plan_cmd += ["--lora_rank", str(a.lora_rank)]
    rc, _, _ = run_job(plan_cmd, d / "plan.log", 600)
    data = [
        "--data",
        str(books),
        "--tokenizer",
        str(tok),
        "--data_cache_dir",
        str(work / "cache"),
        "--steps",
        str(a.steps),
        "--output_dir",
        str(d / "run"),
        *shlex.split(a.extra),
    ]
    if rc != 0:
        argv, error = plan_cmd, f"plan failed ({rc}): see {d / 'plan.log'}"
        rows, host = [], 0
    else:
        if run == "trl_sft":
            argv = [
                py,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(plan / "accelerate.yaml"),
                "--main_process_port",
                str(free_port()),
                str(ROOT / "launch" / "trl_sft.py"),
                "--config",
                str(plan / "run.yaml"),
                *data,
            ]
        else:
            argv = [
                py,
                "-m",
                "ds_longctx.cli",
                "train",
                "--config",
                str(plan / "run.yaml"),
                "--nproc",
                str(a.gpus),
                *data,
            ]
        print(f"\n== {run}: {shlex.join(argv)}", flush=True)
        rc, host, _ = run_job(argv, d / "log.txt", a.timeout_s)
        log = (d / "log.txt").read_text(errors="replace")
        if run == "trl_sft":
            rows = [
                json.loads(m) for m in re.findall(r'\{"step": [^{}]*\}', log)
            ]  # after a progress bar
            rows = [r for r in rows if "loss" in r and "seconds" in r]
        else:
            rows = [
                {**r, "peak_gpu_bytes": r.get("peak_gpu_bytes_max_rank", r["peak_gpu_bytes"])}
                for r in read_lines(d / "run" / "metrics.jsonl")
            ]
        lines = [x.strip() for x in log.splitlines() if x.strip()]
        said = [x for x in lines if re.search(r"refused|Error|error:", x) and "Traceback" not in x]
        error = None if rc == 0 else f"exit {rc}: {(said or lines or [''])[-1][:300]}"
    secs = [r["seconds"] for r in rows]
    if error is None and len(secs) < 2:
        error = f"only {len(secs)} step(s) logged; the median needs the steps after the first"
    line = {
        "run": run,
        "model": a.model,
        "seq_len": a.seq_len,
        "gpus": a.gpus,
        "steps": a.steps,
        "seconds_per_step": round(statistics.median(secs[1:]), 3) if len(secs) > 1 else None,
        "step_seconds": secs,
        "peak_gpu_bytes": max((r.get("peak_gpu_bytes", 0) for r in rows), default=None),
        "planned_gpu_bytes": read_plan(plan)["planned_gpu_bytes"]
        if (plan / "plan.txt").is_file()
        else None,
        "host_peak_bytes": host or None,
        "losses": [r["loss"] for r in rows],
        "commit": commit,
        "device": device,
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(argv).replace(str(ROOT) + "/", ""),
        **({"lora_rank": a.lora_rank} if run == "lora" else {}),
        **({"error": error} if error else {}),
    }
    with (Path(a.out) / "hf_trainer.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps({k: v for k, v in line.items() if k != "command"}), flush=True)
    return line


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--seq_len", type=int, default=131072)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--gpu_mem_gb", type=float, default=141)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--lora_rank", type=int, default=16)
    ap.add_argument(
        "--n_words", type=int, default=4000, help="tokenizer size (<= the model's vocab)"
    )
    ap.add_argument("--extra", default="", help="run-config options added to every run, one string")
    ap.add_argument("--timeout_s", type=float, default=1200)
    ap.add_argument(
        "--commit", default=None, help="used when `git rev-parse` fails (no .git on the device)"
    )
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    a = ap.parse_args()
    runs = parse_choices(ap, "--runs", a.runs, RUNS)
    check_steps(ap, a.steps)
    out = Path(a.out)
    work = out / "hf_trainer_runs"
    work.mkdir(parents=True, exist_ok=True)
    from ds_longctx.run.model import load_hf_config

    n_words = min(a.n_words, load_hf_config(a.model).vocab_size - 4)  # + 4 special tokens
    books, tok = make_corpus(work, a.seq_len * (a.steps + 2), n_words)
    commit, device = git_commit(a.commit), gpu_name()
    for run in runs:
        run_one(a, run, books, tok, work, commit, device)


if __name__ == "__main__":
    main()
