"""objective dpo in a run: the reference pass (once, from the starting weights, stored in output_dir
and read back on resume, as TRL's precompute_ref_log_probs does) and an optimizer step's loss and
gradients over its micro-batches of preference pairs (data/preference.py rows,
levers/preference.py's loss).

    reference_logps(engine, data, output_dir, fresh=True)       # sets data.ref [pairs, 2]
    loss, tokens, metrics = pair_forward_backward(engine, batches, engine.pair_logps)
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ds_longctx.config.train import objective_terms
from ds_longctx.levers.policy_loss import policy_loss
from ds_longctx.levers.preference import dpo_loss
from ds_longctx.parallel import kernel_rules
from ds_longctx.run.ref_weights import ref_signature, reference_weights, signature_json

log = logging.getLogger("ds_longctx")

# in output_dir: {"logps": [pairs, 2] fp32, "signature": the data's, as JSON}
REF_FILE = "reference_logps.pt"


def dpo_model_problem(train, text_config) -> Optional[str]:
    """What objective dpo or grpo refuses of a model (None: nothing): a mixture of experts (its
    load-balancing loss is not added yet), and dpo's shared-prompt rows on a model with
    linear-attention layers (their recurrence would run the second completion after the first)."""
    if train.objective not in ("dpo", "grpo"):
        return None
    if getattr(text_config, "num_experts", 0):
        return (
            f"objective={train.objective} on a mixture of experts is not built yet (its "
            f"load-balancing loss); use a dense model"
        )
    if (
        train.objective == "dpo"
        and train.shared_prompt
        and kernel_rules.linear_heads(text_config) is not None
    ):
        return (
            "shared_prompt: true on a model with linear-attention layers: their recurrence would "
            "carry the chosen completion into the rejected one; set shared_prompt: false"
        )
    return None


def needs_reference(train) -> bool:
    """Whether the run makes a reference pass: dpo always, grpo with beta > 0 (its KL)."""
    return train.objective == "dpo" or (train.objective == "grpo" and objective_terms(train)[0] > 0)


def _what(ref: torch.Tensor) -> str:
    return "pairs" if ref.dim() == 2 else "completion tokens"


def _read_back(data, path: Path, signature: str) -> None:
    """Set `data.ref` from a stored pass; ValueError where none is stored, or one of other data or
    reference."""
    if not path.exists():
        raise ValueError(
            f"{path} is missing: a resumed run reads the reference log-probs its first step "
            f"computed; start the run again without resume"
        )
    saved = torch.load(path, weights_only=True)
    was, now = json.loads(saved["signature"]), json.loads(signature)
    if problem := _other_reference(path, was, now.pop("reference")):
        raise ValueError(problem)
    was.pop("reference", None)
    if was != now:
        raise ValueError(
            f"{path} holds reference log-probs of other data ({saved['signature']}, now "
            f"{signature}); resume on the data the run started with"
        )
    data.ref = saved["logps"]
    log.info("reference log-probs of %d %s read from %s", len(data.ref), _what(data.ref), path)


def _other_reference(path: Path, was: dict, now: dict) -> Optional[str]:
    """Why the stored signature `was` names another reference than `now` (None: the same)."""
    stored = was.get("reference", {"ref_model": None})  # stored before ref_model existed
    if stored == now:
        return None
    was_now = [json.dumps(r, sort_keys=True) for r in (stored, now)]
    return (
        f"{path} holds reference log-probs of another reference ({was_now[0]}, now {was_now[1]}); "
        "resume with the ref_model the run started with"
    )


def stored_reference_problem(train) -> Optional[str]:
    """A resume's check before the engine is built: the reference that output_dir's stored pass
    names against train.ref_model (None: the same, no pass is read, or none is stored)."""
    path = Path(train.output_dir) / REF_FILE
    if not needs_reference(train) or not path.is_file():
        return None
    saved = torch.load(path, weights_only=True)
    return _other_reference(path, json.loads(saved["signature"]), ref_signature(train.ref_model))


def reference_logps(engine, data, output_dir, fresh: bool, ref_model: Optional[str] = None) -> None:
    """Set `data.ref` (dpo: [pairs, 2]; grpo: [tokens]): computed now by the engine's model with the
    weights of `ref_model` (None: the starting weights) and written by rank 0 with the data's and
    the reference's signature, or read back (`fresh` False: a resume). ValueError where a resume
    finds no file, or one of another signature."""
    path = Path(output_dir) / REF_FILE
    signature = signature_json(data.signature(), ref_model)
    if not fresh:
        return _read_back(data, path, signature)
    st, t0 = engine.state, time.perf_counter()
    table = torch.zeros(data.ref_numel(), dtype=torch.float64, device=engine.device)
    was_training = engine.module.training
    engine.ds.eval()
    try:
        with reference_weights(engine.module.model, ref_model):
            for first in range(0, data.n_rows, st.dp_size):  # every rank forwards: ZeRO-3 gathers
                r = first + st.dp_rank
                batch = data.row(r if r < data.n_rows else 0)
                with torch.no_grad():
                    logps, _ = engine.pair_logps(batch)
                if r < data.n_rows:
                    table[data.ref_slots(batch).to(table.device)] = logps.double()
    finally:
        engine.ds.train(was_training)
    if st.dp_group is not None:
        dist.all_reduce(table, group=st.dp_group)
    data.ref = table.float().cpu().view(data.ref_shape)
    if st.rank == 0:
        torch.save({"logps": data.ref, "signature": signature}, path)
        log.info(
            "reference log-probs: %d %s in a first pass over %s (%.1f s), stored in %s (TRL's "
            "precompute_ref_log_probs; a resume reads them)",
            len(data.ref),
            _what(data.ref),
            "the starting weights" if ref_model is None else f"ref_model={ref_model}",
            time.perf_counter() - t0,
            path,
        )


def pair_forward_backward(engine, batches: list, logps_of) -> tuple:
    """(loss, trained tokens, metrics) of one optimizer step of this dp replica: each micro-batch's
    mean per-pair loss (TRL's, train.beta and train.loss_type) backpropagated with weight sp /
    micro-batches (DeepSpeed averages over the sp x dp ranks). The loss and metrics are over every
    micro-batch and replica."""
    st, train = engine.state, engine.cfg.train
    sums = torch.zeros(7, dtype=torch.float64, device=engine.device)
    for k, batch in enumerate(batches):
        logps, tokens = logps_of(batch)  # [2P] each, over the SP group
        ref = batch.ref.to(logps)  # [P, 2]
        out = dpo_loss(
            logps[0::2],
            logps[1::2],
            ref[:, 0],
            ref[:, 1],
            *objective_terms(train),
            tokens[0::2],
            tokens[1::2],
        )
        loss = out.losses.mean()
        with record_function("ds_longctx.backward"):
            engine.ds.backward(loss * st.sp_size / len(batches), scale_wrt_gas=False)
        margin = out.chosen_rewards - out.rejected_rewards
        sums += torch.stack(
            [
                loss.detach() / len(batches),
                out.chosen_rewards.sum(),
                out.rejected_rewards.sum(),
                (margin > 0).sum(),
                margin.sum(),
                torch.tensor(float(len(margin))).to(margin),
                tokens.sum(),
            ]
        ).double()
        if k < len(batches) - 1:
            engine.step()
    if dist.is_initialized() and st.world_size > 1:
        dist.all_reduce(
            sums
        )  # each SP rank holds its group's values: sums over the world are sp x those over dp
        sums /= st.sp_size
    pairs = float(sums[5])
    metrics = {
        "rewards/chosen": float(sums[1]) / pairs,
        "rewards/rejected": float(sums[2]) / pairs,
        "rewards/accuracies": float(sums[3]) / pairs,
        "rewards/margins": float(sums[4]) / pairs,
    }
    return float(sums[0]) / st.dp_size, int(sums[6]), metrics


def policy_forward_backward(engine, batches: list, logps_of) -> tuple:
    """(loss, trained tokens, metrics) of one optimizer step of this dp replica under objective
    grpo: each micro-batch's per-token log-probs (`logps_of`, over the SP group), TRL's GRPO loss
    (levers/policy_loss.py), its backward weighted so DeepSpeed's mean over the sp x dp ranks gives
    TRL's step: grpo and dr_grpo, the mean of the micro-batches' losses (TRL divides by grad
    accumulation); dapo, the sum of every token's loss over the step's completion tokens. The loss
    and metrics are over every micro-batch and replica."""
    st, train = engine.state, engine.cfg.train
    beta, loss_type = objective_terms(train)
    eps_high = train.epsilon if train.epsilon_high is None else train.epsilon_high
    tokens = torch.tensor(
        float(sum(len(b.token_seq) for b in batches)), dtype=torch.float64, device=engine.device
    )
    if st.dp_group is not None:
        dist.all_reduce(tokens, group=st.dp_group)
    weight = st.dp_size if loss_type == "dapo" else 1.0 / len(batches)
    sums = torch.zeros(7, dtype=torch.float64, device=engine.device)
    for k, batch in enumerate(batches):
        logps, _ = logps_of(batch)  # [K] over the SP group
        seq = batch.token_seq.to(logps.device)
        n_seq = len(batch.items)
        out = policy_loss(
            logps,
            batch.old,
            batch.ref,
            batch.advantages,
            seq,
            n_seq,
            loss_type,
            train.epsilon,
            eps_high,
            beta,
            tokens=float(tokens),
            max_len=train.max_completion_length or batch.max_len,
        )
        with record_function("ds_longctx.backward"):
            engine.ds.backward(out.loss * st.sp_size * weight, scale_wrt_gas=False)
        adv = torch.zeros(n_seq, dtype=torch.float64).scatter_(
            0, seq.cpu(), batch.advantages.double()
        )
        sums += torch.stack(
            [
                out.loss.detach().double() * weight,
                out.low.double(),
                out.high.double(),
                out.kl.double(),
                torch.tensor(float(len(seq))),
                adv.sum(),
                torch.tensor(float(n_seq)),
            ]
        ).to(sums)
        if k < len(batches) - 1:
            engine.step()
    if dist.is_initialized() and st.world_size > 1:
        dist.all_reduce(sums)  # each SP rank holds its group's values
        sums /= st.sp_size
    n = max(float(sums[4]), 1.0)
    metrics = {
        "advantages/mean": float(sums[5]) / max(float(sums[6]), 1.0),
        "clip_ratio/low_mean": float(sums[1]) / n,
        "clip_ratio/high_mean": float(sums[2]) / n,
        "clip_ratio/region_mean": float(sums[1] + sums[2]) / n,
    }
    if beta != 0.0:
        metrics["kl"] = float(sums[3]) / n
    return float(sums[0]) / st.dp_size, int(float(tokens)), metrics
