"""The run's metrics files on rank 0: metrics.jsonl (a line per step with `loss`, per evaluation
with `eval_loss`), eval_curve.jsonl, and the same numbers to TensorBoard or W&B
(logging.report_to).

    metrics = MetricsLog(out, start_step, report_to="auto", enabled=rank == 0, cfg=cfg)
    metrics.write({"step": 1, "loss": ...})
    metrics.write_eval(result, step)
    note = metrics.close()

A line that cannot be written is kept and retried at each later write; what is still unwritten at
the end goes to stderr and `close` returns the note for the run's last line (exit 1)."""

from __future__ import annotations

# tensorboard (torch) and wandb (optional) are imported where a writer opens.
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ds_longctx.checkpoint.layout import CURVE_FILE, METRICS_FILE
from ds_longctx.parallel.disk import describe_os_error
from ds_longctx.run.evaluate import append_jsonl

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")


def _continue_lines(path: Path, start_step: int) -> None:
    """A fresh run (start_step 0) keeps an older `path` aside; a resumed one drops its lines past
    start_step."""
    if not path.exists():
        return
    if start_step == 0:
        old = path.with_name(f"{path.stem}.{int(path.stat().st_mtime)}{path.suffix}")
        path.rename(old)
        log.info("previous %s kept as %s", path.name, old)
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= start_step
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


SCALARS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "seconds",
    "trained_tokens",
    "peak_gpu_bytes",
    "host_rss_bytes",
)


def check_reporter(report_to: str, out=None) -> None:
    """ValueError where `report_to`'s package does not import, W&B's host cannot be reached, or
    TensorBoard cannot write under `out`."""

    need = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(report_to)
    if need and importlib.util.find_spec(need) is None:
        raise ValueError(
            f"report_to={report_to} needs the {need} package: pip install {need} (or report_to: "
            "none)"
        )
    if report_to == "wandb" and (problem := wandb_problem()):
        raise ValueError(problem)
    events = Path(out) / "tensorboard" if out is not None else None
    if (
        report_to in ("auto", "tensorboard")
        and events is not None
        and os.path.lexists(events)
        and (events.is_symlink() or not events.is_dir() or not os.access(events, os.W_OK | os.X_OK))
    ):
        what = "not a directory" if events.is_symlink() or not events.is_dir() else "not writable"
        raise ValueError(
            f"{events} is {what}, so TensorBoard's events cannot go there; move it out of the "
            f"output_dir, or report_to: none"
        )


WANDB_HOST = "https://api.wandb.ai"
PROBE_S = 5.0  # seconds the W&B host has to answer a TCP connect
OFFLINE_MODES = ("offline", "disabled", "dryrun")


def _reach(host: str, port: int, box: list) -> None:

    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
        box.append(None)
    except OSError as e:
        box.append(e.strerror or str(e) or type(e).__name__)


def wandb_problem() -> str | None:
    """Why W&B online cannot work here (its host unreachable within PROBE_S), else None."""

    mode = os.environ.get("WANDB_MODE", "offline").strip().lower()
    if mode in OFFLINE_MODES:
        return None
    url = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_HOST)
    host, box = url.hostname or "", []
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
    except ValueError:
        port = 443
    probe = threading.Thread(target=_reach, args=(host, port, box), daemon=True)
    probe.start()
    probe.join(PROBE_S + 1)
    if box and box[0] is None:
        return None
    why = box[0] if box else f"no answer in {PROBE_S:g} s"
    return (
        f"report_to=wandb with WANDB_MODE={mode}: the W&B host {host}:{port} cannot be reached "
        f"({why}); set WANDB_MODE=offline (`wandb sync` uploads the run later), or report_to: none"
    )


def reporter(report_to: str, out: Path, start_step: int, cfg: RunConfig | None = None):
    """The `report_to` writer (`scalars(dict, step)`, `close()`), None for none; ValueError naming
    the install."""
    if report_to in ("auto", "tensorboard"):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if report_to == "auto":
                return None
            raise ValueError(
                "report_to=tensorboard needs the tensorboard package: pip install tensorboard (or "
                "report_to: none)"
            ) from None
        log.info(
            "TensorBoard events in %s (tensorboard --logdir %s)",
            out / "tensorboard",
            out / "tensorboard",
        )
        return TensorBoard(
            SummaryWriter(
                str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None
            )
        )
    if report_to == "wandb":
        try:
            import wandb
        except ImportError:
            raise ValueError(
                "report_to=wandb needs the wandb package: pip install wandb (or report_to: none)"
            ) from None
        os.environ.setdefault(
            "WANDB_MODE", "offline"
        )  # no network needed; `wandb sync` uploads later
        run = wandb.init(
            dir=str(out),
            project="ds_longctx",
            name=out.name,
            resume="allow",
            config=cfg.model_dump() if cfg is not None else None,
        )
        log.info("Weights & Biases run in %s (%s)", out / "wandb", os.environ["WANDB_MODE"])
        return WandB(run)
    return None


class TensorBoard:
    def __init__(self, writer):
        self.writer = writer

    def scalars(self, values: dict, step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, run):
        self.run = run

    def scalars(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """metrics.jsonl, eval_curve.jsonl and the report_to writer, rank 0 only; fresh runs keep old
    files aside, resumed runs drop lines past their step."""

    def __init__(
        self,
        out: Path,
        start_step: int,
        report_to: str,
        enabled: bool,
        cfg: RunConfig | None = None,
    ):
        self.path, self.curve_path, self.enabled, self.tb = (
            out / METRICS_FILE,
            out / CURVE_FILE,
            enabled,
            None,
        )
        self.unwritten: dict = {}  # path -> the rows it has not taken yet, in order
        self.why: dict = {}  # path -> the first error that kept them
        if not enabled:
            return
        _continue_lines(self.path, start_step)
        _continue_lines(self.curve_path, start_step)
        self.tb = reporter(report_to, out, start_step, cfg)
        if self.tb is None:
            log.info("metrics: %s only (report_to=%s)", self.path, report_to)

    def write(self, row: dict) -> None:
        """A train line (`loss`, ...) or an eval line (`eval_loss`, ...) of metrics.jsonl."""
        if not self.enabled:
            return
        self._append(self.path, row)
        if self.tb is None:
            return
        if "eval_loss" in row:
            self.tb.scalars({"eval/loss": row["eval_loss"]}, row["step"])
            return
        self.tb.scalars(
            {f"train/{k}": row[k] for k in SCALARS if row.get(k) is not None}, row["step"]
        )

    def write_eval(self, result, step: int) -> None:
        """One evaluation: its metrics.jsonl line and its eval_curve.jsonl line."""
        self.write(result.metrics_row(step))
        if self.enabled:
            self._append(self.curve_path, result.curve_row(step))

    def _append(self, path: Path, row: dict) -> None:
        """`row` after the rows `path` has not taken yet, all of them or (OSError) none: kept for
        the next try."""
        rows = self.unwritten.setdefault(path, [])
        rows.append(row)
        try:
            append_jsonl(path, *rows)
        except OSError as e:
            if path not in self.why:
                self.why[path] = describe_os_error(e, path)
                log.warning(
                    "metrics: %s; step %s's line and later ones are kept and written once the file "
                    "takes them",
                    self.why[path],
                    row["step"],
                )
            return
        if path in self.why:
            log.warning(
                "metrics: %s takes lines again: the %d kept (steps %s-%s) written",
                path,
                len(rows),
                rows[0]["step"],
                rows[-1]["step"],
            )
            del self.why[path]
        del self.unwritten[path]

    def close(self) -> str:
        """Close the writer; unwritten rows go to stderr. Returns the last-line note ('' if
        none)."""
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        notes = []
        for path, rows in self.unwritten.items():
            for row in rows:
                print(
                    f"[ds_longctx] unwritten {path.name} line: {json.dumps(row)}",
                    file=sys.stderr,
                    flush=True,
                )
            notes.append(
                f"{len(rows)} line(s) of {path.name} (steps {rows[0]['step']}-{rows[-1]['step']}) "
                f"were not written ({self.why[path]}) and are printed above"
            )
        self.unwritten.clear()
        self.why.clear()
        return "; ".join(notes)
