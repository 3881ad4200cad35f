"""The loss on the answers of long agent sessions by answer-to-evidence distance: did the model
learn to answer from far back? One JSON line per distance bucket per evaluation, in
`<output_dir>/answer_loss.jsonl`.

    rows = read_sessions(path)                               # a `data prepare --sessions` directory or its jsonl
    rows = answer_sessions(cfg)                              # eval_data's first eval_rows sessions, or refused
    sessions = session_spans(tok, rows)                      # tokens and answer spans, once per run
    lines = answer_loss(engine_losses(engine), sessions, step)  # collective under the engine: every rank calls it
    lines = answer_loss(hf_losses(model), sessions, step)       # a plain HF model (CPU reference)
    buckets, each = answer_loss_both(losses, sessions, step, control)  # and one line per answer

Each session is forwarded whole as one row; each answer counts once in its bucket's mean; the
control blanks every answer's evidence. The fields and their meaning: docs/design/run.md."""

from __future__ import annotations

import json
from pathlib import Path

from ds_longctx.data.answer_spans import BUCKETS, answer_spans, without_evidence


def read_sessions(path, limit: int | None = None) -> list:
    """The session rows of a `data prepare --sessions` directory (its train.jsonl) or of a jsonl file, rows without
    `meta.answers` left out; the first `limit` of them (None: all), the file read no further."""
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
    cfg, limit: int | None = None, names: tuple = ("eval_answer_loss", "eval_data")
) -> list:
    """The first `limit` sessions of eval_data that hold answers (None: eval_rows of them); ValueError naming the fix
    where it holds none (synthetic, a hub name, text or chat rows without `meta.answers`). `names`: the options to
    name in it (train's keys; `ds-longctx eval`'s --answer_loss and --data)."""
    data = cfg.eval.data
    p = Path(data).expanduser()
    rows = (
        read_sessions(p, limit or cfg.eval.rows)
        if (p / "train.jsonl").is_file() or p.is_file()
        else []
    )
    if not rows:
        raise ValueError(
            f"{names[0]}: {names[1]}={data!r} holds no session with meta.answers (the loss on answers "
            f"needs them); give {names[1]} a `ds-longctx data prepare --sessions` directory (or its "
            f"train.jsonl), or drop {names[0]}"
        )
    return rows


def hf_losses(model):
    """Per-token scores of one row from a plain HF causal LM: ids [L] -> (losses [L - 1] fp32, hits [L - 1] bool);
    index i predicts token i + 1, its hit: that token's logit is the max (greedy decoding emits it)."""
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
    """`hf_losses` of one row under the engine (SP: every rank passes the whole row; `eval_batch` gives this rank's
    slice, summed over the SP group into the whole row). Collective: every rank calls it on the same rows."""
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
    """(name, token ids, answer spans) of each row (answer_spans): what every evaluation reads."""
    return [(row.get("name"), *answer_spans(tok, row)) for row in rows]


def control_spans(tok, rows: list) -> list:
    """`session_spans` of the rows with their evidence blanked (module doc: the control)."""
    return session_spans(tok, [without_evidence(row) for row in rows])


def per_answer(losses, sessions: list) -> list:
    """Every answer's span (`session_spans`) with `loss`, the mean CE over its value's tokens, `exact`, whether every
    one of them is its position's argmax (run/recall.py: greedy decoding reproduces the value), and `session`."""
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
    """One line per bucket that holds an answer (module doc), in BUCKETS order."""
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
    """One line per answer (module doc), in session and message order."""
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
    """The bucket lines of `sessions`' answers at `step` (module doc)."""
    return bucket_lines(per_answer(losses, sessions), step)


def answer_loss_both(losses, sessions: list, step: int, control: list | None = None) -> tuple:
    """(the bucket lines, the answer lines) of `sessions`' answers at `step`, from one forward of each session;
    with `control` (`control_spans` of the same rows), each answer's loss without its evidence too."""
    answers = per_answer(losses, sessions)
    if control is not None:
        for x, c in zip(answers, per_answer(losses, control), strict=True):
            assert (x["session"], x["message"]) == (c["session"], c["message"]), (x, c)
            x["loss_without_evidence"] = c["loss"]
    return bucket_lines(answers, step), answer_lines(answers, step)


def answer_loss_lines(engine, cfg):
    """`lines(step)`: (the bucket lines, the answer lines) of eval_data's first eval_rows sessions under `engine` at
    `step` (every rank gets them). Collective. Refused (`answer_sessions`) where eval_data holds no answer."""
    from ds_longctx.data.tokenize import open_tokenizer, tokenizer_path

    rows = answer_sessions(cfg)
    tok = open_tokenizer(tokenizer_path(cfg))
    sessions, control = (
        session_spans(tok, rows),
        control_spans(tok, rows),
    )  # tokenized once, read at every eval
    losses = engine_losses(engine)
    return lambda step: answer_loss_both(losses, sessions, step, control)
