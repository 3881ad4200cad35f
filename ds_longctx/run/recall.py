"""Recall of long agent sessions by answer-to-evidence distance: does greedy decoding give back the
value an answer quotes from far back? Lines in `<out>/recall.jsonl` and `recall_answers.jsonl`.

    write = answers_writer(engine, cfg, model, stage)  # write(step): lines at `step`; collective

One teacher-forced forward per session; `exact` when every value token is its position's argmax. The
fields: docs/design/run.md."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ds_longctx.checkpoint.layout import (
    ANSWER_LOSS_FILE,
    ANSWERS_FILE,
    RECALL_ANSWERS_FILE,
    RECALL_FILE,
)
from ds_longctx.corpora.answer_spans import BUCKETS
from ds_longctx.run.answer_loss import answer_loss_lines
from ds_longctx.run.evaluate import append_jsonl
from ds_longctx.run.provenance import commit, device_name, now

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

STAGES = ("base", "trained")


def recall_rows(each: list, *, model: str, stage: str, step: int, seq_len: int) -> tuple:
    """(bucket rows, answer rows) of the answer lines `each`, nearest bucket first."""
    where = {"model": model, "stage": stage, "step": step, "seq_len": seq_len}
    said = {"commit": commit(), "device": device_name(), "date": now()}
    rows = []
    for name in BUCKETS:
        got = [x for x in each if x["bucket"] == name]
        if got:
            rows.append(
                {
                    **where,
                    "bucket": name,
                    "answers": len(got),
                    "loss_with_evidence": sum(x["loss"] for x in got) / len(got),
                    "loss_without_evidence": sum(x["loss_without_evidence"] for x in got)
                    / len(got),
                    "recall_exact_match": sum(x["exact"] for x in got) / len(got),
                    **said,
                }
            )
    return rows, [{**where, **x} for x in each]


def answers_writer(engine, cfg: RunConfig, model: str, stage: str = "trained"):
    """`write(step)`: eval_data's sessions scored under `engine`, appended by rank 0 to the
    answer_loss and recall files the config asks for. Collective."""

    lines, out = answer_loss_lines(engine, cfg), Path(cfg.train.output_dir)

    def write(step: int) -> None:
        buckets, each = lines(step)
        if engine.state.rank != 0:
            return
        if cfg.eval.answer_loss:
            append_jsonl(out / ANSWER_LOSS_FILE, *buckets)
            append_jsonl(out / ANSWERS_FILE, *each)
        if cfg.eval.recall:
            rows, answers = recall_rows(
                each, model=model, stage=stage, step=step, seq_len=cfg.train.seq_len
            )
            append_jsonl(out / RECALL_FILE, *rows)
            append_jsonl(out / RECALL_ANSWERS_FILE, *answers)

    return write
