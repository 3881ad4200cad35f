"""The run's metrics files on rank 0: metrics.jsonl (one line per optimizer step with `loss`, one per evaluation with
`eval_loss`), eval_curve.jsonl (run/evaluate.py) and TensorBoard events when torch.utils.tensorboard imports.

    metrics = MetricsLog(out, start_step, tensorboard=True, enabled=rank == 0)
    metrics.write({"step": 1, "loss": ...}); metrics.write_eval(result, step); metrics.close()
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ds_longctx.run.evaluate import CURVE_FILE, METRICS_FILE, append_jsonl

log = logging.getLogger("ds_longctx")


def _continue_lines(path: Path, start_step: int) -> None:
    """A fresh run (start_step 0) keeps an older `path` aside; a resumed one drops its lines past start_step."""
    if not path.exists():
        return
    if start_step == 0:
        old = path.with_name(f"{path.stem}.{int(path.stat().st_mtime)}{path.suffix}")
        path.rename(old)
        log.info("previous %s kept as %s", path.name, old)
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= start_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


class MetricsLog:
    """metrics.jsonl (train lines with `loss`, eval lines with `eval_loss`), eval_curve.jsonl and TensorBoard
    (when installed), rank 0 only. A fresh run keeps older files aside; a resumed one drops lines past its
    checkpoint's step and appends."""

    def __init__(self, out: Path, start_step: int, tensorboard: bool, enabled: bool):
        self.path, self.curve_path, self.enabled, self.tb = out / METRICS_FILE, out / CURVE_FILE, enabled, None
        if not enabled:
            return
        _continue_lines(self.path, start_step)
        _continue_lines(self.curve_path, start_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)
            except ImportError:
                log.info("tensorboard not installed: metrics.jsonl only")

    def write(self, row: dict) -> None:
        """A train line (`loss`, ...) or an eval line (`eval_loss`, ...) of metrics.jsonl."""
        if not self.enabled:
            return
        append_jsonl(self.path, row)
        if self.tb is None:
            return
        if "eval_loss" in row:
            self.tb.add_scalar("eval/loss", row["eval_loss"], row["step"])
            return
        for k in ("loss", "tokens_per_s", "lr", "seconds"):
            self.tb.add_scalar(f"train/{k}", row[k], row["step"])

    def write_eval(self, result, step: int) -> None:
        """One evaluation: its metrics.jsonl line and its eval_curve.jsonl line."""
        self.write(result.metrics_row(step))
        if self.enabled:
            append_jsonl(self.curve_path, result.curve_row(step))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
