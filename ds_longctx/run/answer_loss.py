"""The loss on the answers of long agent sessions by answer-to-evidence distance, one JSON line per
bucket per evaluation in `<output_dir>/answer_loss.jsonl`.

    rows = read_sessions(path)                         # a `data prepare --sessions` dir or jsonl
    sessions = session_spans(tok, rows)                # tokens and answer spans, once per run
    lines = answer_loss(engine_losses(engine), sessions, step)   # collective under the engine
    lines = answer_loss(hf_losses(model), sessions, step)        # a plain HF model (CPU reference)

Fields, the control and the buckets: docs/design/run.md."""

from __future__ import annotations

# torch is imported where a loss is computed: importing this module does not load it.
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ds_longctx.corpora.answer_spans import BUCKETS, answer_spans, without_evidence
from ds_longctx.data.tokenize import open_tokenizer, tokenizer_path

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig


def read_sessions(path, limit: int | None = None) -> list:
    """The first `limit` session rows (None: all) with `meta.answers` of a `data prepare --sessions`
    directory or jsonl file."""
    p = Path(path)
    p = p / "train.jsonl" if p.is_dir() else p
    rows = []
    with open(p, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line) if line.strip() else {}
            if isinstance(row.get("meta"), dict) and row["meta"].get("answers"):
                rows.append(row)
                if len(rows) == limit:
                    break
    return rows


def answer_sessions(
    cfg: RunConfig, limit: int | None = None, names: tuple = ("eval_answer_loss", "eval_data")
) -> list:
    """The first `limit` sessions of eval_data that hold answers, or ValueError naming `names` and
    the fix."""
    data = cfg.eval.data
    p = Path(data).expanduser()
    rows = (
        read_sessions(p, limit or cfg.eval.rows)
        if (p / "train.jsonl").is_file() or p.is_file()
        else []
    )
    if not rows:
        raise ValueError(
            f"{names[0]}: {names[1]}={data!r} holds no session with meta.answers (the loss on "
            "answers "
            f"needs them); give {names[1]} a `ds-longctx data prepare --sessions` directory (or "
            f"its train.jsonl), or drop {names[0]}"
        )
    return rows


def hf_losses(model):
    """Per-token (losses [L - 1] fp32, hits [L - 1] bool) of one row from a plain HF causal LM;
    index i predicts token i + 1."""
    import torch
    import torch.nn.functional as F

    def losses(ids: list):
        x = torch.tensor(ids, device=model.device)
        with torch.no_grad():
            logits = model(x[None]).logits[0].float()  # [L, V]
        target = logits[:-1].gather(1, x[1:, None])[:, 0]  # [L - 1]
        hits = target >= logits[:-1].amax(dim=1)
        return F.cross_entropy(logits[:-1], x[1:], reduction="none").cpu(), hits.cpu()

    return losses


def engine_losses(engine):
    """`hf_losses` of one row under the engine, the SP slices summed into the whole row.
    Collective."""
    import torch
    import torch.distributed as dist

    def losses(ids: list):
        part = engine.eval_batch(torch.tensor([ids]))
        full = torch.zeros(
            2, part.length, dtype=torch.float32, device=part.loss.device
        )  # [loss, hit] x [L]
        n = max(0, min(part.loss.shape[1], part.length - part.start))  # the slice less padding
        full[0, part.start : part.start + n] = part.loss[0, :n]
        full[1, part.start : part.start + n] = part.hit[0, :n].float()
        if engine.state.sp_size > 1:
            dist.all_reduce(full, group=engine.state.sp_group)
        full = full[:, :-1].cpu()  # the last index predicts nothing (labels are the row shifted)
        return full[0], full[1] > 0.5

    return losses


def session_spans(tok, rows: list) -> list:
    """(name, token ids, answer spans) of each row."""
    return [(row.get("name"), *answer_spans(tok, row)) for row in rows]


def control_spans(tok, rows: list) -> list:
    """`session_spans` of the rows with their evidence blanked."""
    return session_spans(tok, [without_evidence(row) for row in rows])


def per_answer(losses, sessions: list) -> list:
    """Every answer's span with `loss` (mean CE over its value), `exact` (every token its argmax)
    and `session`."""
    out = []
    for name, ids, spans in sessions:
        token_loss, hits = losses(ids)  # [L - 1] x 2
        for s in spans:
            a, b = s["tokens"]
            out.append(
                {
                    **s,
                    "session": name,
                    "loss": float(token_loss[a - 1 : b - 1].double().mean()),
                    "exact": bool(hits[a - 1 : b - 1].all()),
                }
            )
    return out


def bucket_lines(answers: list, step: int) -> list:
    """One line per bucket that holds an answer, in BUCKETS order."""
    lines = []
    for name in BUCKETS:
        got = [x for x in answers if x["bucket"] == name]
        if got:
            lines.append(
                {
                    "step": step,
                    "bucket": name,
                    "answers": len(got),
                    "tokens": sum(x["tokens"][1] - x["tokens"][0] for x in got),
                    "mean_loss": sum(x["loss"] for x in got) / len(got),
                }
            )
            if "loss_without_evidence" in got[0]:
                lines[-1]["mean_loss_without_evidence"] = sum(
                    x["loss_without_evidence"] for x in got
                ) / len(got)
    return lines


def answer_lines(answers: list, step: int) -> list:
    """One line per answer, in session and message order."""
    return [
        {
            "step": step,
            "session": x["session"],
            "message": x["message"],
            "kind": x["kind"],
            "distance_tokens": x["distance_tokens"],
            "bucket": x["bucket"],
            "position": x["tokens"][0],
            "tokens": x["tokens"][1] - x["tokens"][0],
            "loss": x["loss"],
            "exact": x["exact"],
            **(
                {"loss_without_evidence": x["loss_without_evidence"]}
                if "loss_without_evidence" in x
                else {}
            ),
        }
        for x in answers
    ]


def answer_loss(losses, sessions: list, step: int) -> list:
    """The bucket lines of `sessions`' answers at `step`."""
    return bucket_lines(per_answer(losses, sessions), step)


def answer_loss_both(losses, sessions: list, step: int, control: list | None = None) -> tuple:
    """(bucket lines, answer lines) from one forward per session; with `control`, each answer's loss
    without its evidence too."""
    answers = per_answer(losses, sessions)
    if control is not None:
        for x, c in zip(answers, per_answer(losses, control), strict=True):
            assert (x["session"], x["message"]) == (c["session"], c["message"]), (x, c)
            x["loss_without_evidence"] = c["loss"]
    return bucket_lines(answers, step), answer_lines(answers, step)


def answer_loss_lines(engine, cfg: RunConfig):
    """`lines(step)`: (bucket lines, answer lines) of eval_data's sessions under `engine`.
    Collective."""

    rows = answer_sessions(cfg)
    tok = open_tokenizer(tokenizer_path(cfg))
    sessions, control = (
        session_spans(tok, rows),
        control_spans(tok, rows),
    )  # tokenized once, read at every eval
    losses = engine_losses(engine)
    return lambda step: answer_loss_both(losses, sessions, step, control)
