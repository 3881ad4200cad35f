"""Held-out evaluation under SP: the eval loss and the per-position loss curve, forward only.

    held = data.build_eval_data(cfg, hf_config)              # None: no eval
    result = evaluate(engine, held, rows=8, buckets=32)       # collective; every rank gets it
    append_jsonl(out / "metrics.jsonl", result.metrics_row(step))
    append_jsonl(out / "eval_curve.jsonl", result.curve_row(step))

Dimensions: b micro batch, L seq_len, sp SP degree, B buckets. Row split, buckets and memory:
docs/design/run.md."""

from __future__ import annotations

# torch and the parallel modules are imported inside the functions that use them: `ds-longctx
# eval`'s launcher reads this module's file names without them.
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ds_longctx.parallel.units import IGNORE_INDEX


@dataclass
class EvalResult:
    loss: float  # token-mean CE over every supervised token of the eval rows (nan if none)
    tokens: int  # supervised tokens
    rows: int
    edges: list  # [B + 1] bucket edges (row indices): bucket k is edges[k] .. edges[k+1] - 1
    bucket_loss: list  # [B] mean CE per bucket, None where a bucket has no supervised token
    bucket_tokens: list  # [B] supervised tokens per bucket
    seconds: float
    peak_gpu_bytes: int = (
        0  # this rank's max_memory_allocated during the evaluation (0 without CUDA)
    )

    def metrics_row(self, step: int, **extra) -> dict:
        """The metrics.jsonl line of this evaluation."""
        return {
            "step": step,
            "eval_loss": self.loss,
            "eval_tokens": self.tokens,
            "eval_rows": self.rows,
            "eval_seconds": round(self.seconds, 4),
            "eval_peak_gpu_bytes": self.peak_gpu_bytes,
            **extra,
        }

    def curve_row(self, step: int, **extra) -> dict:
        """The eval_curve.jsonl line: edges, mean loss and tokens per bucket."""
        return {
            "step": step,
            "eval_loss": self.loss,
            "edges": self.edges,
            "loss": self.bucket_loss,
            "tokens": self.bucket_tokens,
            **extra,
        }


def bucket_edges(length: int, buckets: int) -> list:
    """[B + 1] edges of B equal spans of `length` positions: ceil(k * length / B)."""
    return [-(-k * length // buckets) for k in range(buckets + 1)]


def eval_batches(data, rows: int, micro_batch: int, dp_rank: int, dp_size: int) -> Iterator[tuple]:
    """(input_ids [b, L], position_ids, labels) of replica `dp_rank`'s eval batches; samples past
    `rows` are ignored."""

    per_batch = micro_batch * dp_size
    for k in range(-(-rows // per_batch)):
        batch = data.get(k, micro_batch, dp_rank, dp_size)
        real = max(0, min(micro_batch, rows - (k * dp_size + dp_rank) * micro_batch))
        labels = batch.labels
        if real < micro_batch:
            labels = (batch.input_ids if labels is None else labels).clone()
            labels[real:] = IGNORE_INDEX
        yield batch.input_ids, batch.position_ids, labels


def evaluate(engine, data, rows: int, buckets: int) -> EvalResult:
    """Eval loss and per-position curve of `rows` held-out rows of `data`. Collective."""
    from ds_longctx.parallel import fake_world

    fake_world.refuse_in_rehearsal("an eval")
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    st = engine.state
    sums = torch.zeros(
        2, buckets, dtype=torch.float64, device=engine.device
    )  # [loss sum, tokens] x [B]
    length: Optional[int] = None
    for input_ids, position_ids, labels in eval_batches(
        data, rows, engine.cfg.train.micro_batch, st.dp_rank, st.dp_size
    ):
        part = engine.eval_batch(input_ids, position_ids, labels)
        length = part.length
        index = torch.arange(
            part.start, part.start + part.loss.shape[1], device=sums.device
        )  # [L/sp] row index
        bucket = (
            index.clamp(max=length - 1) * buckets // length
        )  # padding (index >= L) is never supervised
        sums[0].index_add_(0, bucket, part.loss.double().sum(0))  # [b, L/sp] -> [L/sp] -> B buckets
        sums[1].index_add_(0, bucket, part.valid.double().sum(0))
        del part
    if dist.is_initialized():
        dist.all_reduce(sums)  # every slice (SP) of every row (DP)
    loss_sums, counts = sums.tolist()
    total, n = sum(loss_sums), int(sum(counts))
    return EvalResult(
        loss=total / n if n else float("nan"),
        tokens=n,
        rows=rows,
        edges=bucket_edges(length, buckets),
        bucket_loss=[s / c if c else None for s, c in zip(loss_sums, counts)],
        bucket_tokens=[int(c) for c in counts],
        seconds=time.perf_counter() - t0,
        peak_gpu_bytes=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
    )


def append_jsonl(path: Path, *rows: dict) -> None:
    """Append `rows` to `path` as JSON lines, all or none (a failed write is cut back, then
    raised)."""
    data = memoryview("".join(json.dumps(r) + "\n" for r in rows).encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
