"""Per-process training entry: one process per GPU (or CPU rank), started by a launcher.

    torchrun --nproc_per_node 2 -m ds_longctx.train --config run.yaml [--key value ...]
    deepspeed --num_gpus 2 --module ds_longctx.train --config run.yaml
    accelerate launch --config_file accelerate.yaml -m ds_longctx.train --config run.yaml
    ds-longctx train --nproc 2 --sp_size 2            # starts the processes for you

Writes `<output_dir>/metrics.jsonl`: one JSON line per optimizer step
(step, loss, tokens, seconds, tokens_per_s, peak_gpu_bytes, host_rss_bytes).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("ds_longctx")


def strip_launcher_args(argv: list[str]) -> list[str]:
    """Drop `--local_rank=N` / `--local-rank N` that the deepspeed launcher appends (LOCAL_RANK is in env)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.startswith(("--local_rank", "--local-rank")):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def parse_config(argv: list[str]):
    """RunConfig from argv, or exit 2 with a readable message (before anything heavy is imported)."""
    from pydantic import ValidationError

    from .config import RunConfig, format_validation_error
    try:
        return RunConfig.from_cli(strip_launcher_args(argv))
    except ValidationError as e:
        sys.exit(format_validation_error(e))
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"invalid run config: {e}")


def _host_rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def main(argv: list[str] | None = None) -> None:
    # ---------------------------------------------------------------- config and checks
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="[ds_longctx] %(message)s")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    from tqdm import tqdm

    from .data import SyntheticRetrieval
    from .engine import build_engine, validate
    try:
        hf_cfg = validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as e:
        sys.exit(f"refused before start: {e}")
    if cfg.data != "synthetic":
        sys.exit(f"data={cfg.data!r}: only 'synthetic' is implemented in this version")

    # ---------------------------------------------------------------- engine
    engine = build_engine(cfg, hf_cfg)
    st = engine.state
    out = Path(cfg.output_dir)
    metrics_path = out / "metrics.jsonl"
    if st.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if metrics_path.exists():
            old = metrics_path.with_name(f"metrics.{int(metrics_path.stat().st_mtime)}.jsonl")
            metrics_path.rename(old)
            log.info("previous metrics kept as %s", old)
        cfg.dump(out / "run.yaml")
        (out / "ds_config.json").write_text(json.dumps(engine.ds_config, indent=2) + "\n")
        log.info("world %d = sp %d x dp %d, model %s, seq_len %d, %s", st.world_size, st.sp_size, st.dp_size,
                 cfg.model, cfg.seq_len, "bf16" if engine.ds_config["bf16"]["enabled"] else "fp32")

    # ---------------------------------------------------------------- data
    data = SyntheticRetrieval(cfg.seq_len, engine.model.config.vocab_size, cfg.seed)

    # ---------------------------------------------------------------- loop
    bar = tqdm(range(cfg.steps), disable=st.rank != 0, desc="train", unit="step", dynamic_ncols=True)
    for step in bar:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = data.batch(step, cfg.micro_batch, st.dp_rank, st.dp_size)
        res = engine.train_step(batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0
        row = {"step": step + 1, "loss": res.loss, "tokens": cfg.seq_len * cfg.micro_batch * st.dp_size,
               "supervised_tokens": res.tokens, "seconds": round(seconds, 4),
               "tokens_per_s": round(cfg.seq_len * cfg.micro_batch * st.dp_size / seconds, 1),
               "peak_gpu_bytes": peak, "peak_gpu_allocated_bytes":
               torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
               "host_rss_bytes": _host_rss()}
        if torch.distributed.is_initialized() and torch.cuda.is_available():
            m = torch.tensor([peak, row["host_rss_bytes"]], dtype=torch.float64, device=engine.device)
            torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX)
            row["peak_gpu_bytes_max_rank"] = int(m[0])
        if st.rank == 0:
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if step % cfg.log_every == 0 or step + 1 == cfg.steps:
                bar.set_postfix(loss=f"{res.loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                                mem=f"{peak / 2**30:.1f}GiB", rss=f"{row['host_rss_bytes'] / 2**30:.1f}GiB")
    bar.close()
    if st.rank == 0:
        log.info("done: %d steps, metrics in %s", cfg.steps, metrics_path)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
