"""objective dpo in a run: the reference pass (once, from the starting weights, stored in output_dir and read back
on resume, as TRL's precompute_ref_log_probs does) and an optimizer step's loss and gradients over its micro-batches
of preference pairs (data/preference.py rows, levers/preference.py's loss).

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

from ds_longctx.levers.preference import dpo_loss
from ds_longctx.parallel import kernel_rules

log = logging.getLogger("ds_longctx")

REF_FILE = "reference_logps.pt"  # in output_dir: {"logps": [pairs, 2] fp32, "signature": the data's, as JSON}


def dpo_model_problem(train, text_config) -> Optional[str]:
    """What objective dpo refuses of a model (None: nothing): a mixture of experts (its load-balancing loss is not
    added to DPO's yet), and shared-prompt rows on a model with linear-attention layers (their recurrence would run
    the second completion after the first)."""
    if train.objective != "dpo":
        return None
    if getattr(text_config, "num_experts", 0):
        return "objective=dpo on a mixture of experts is not built yet (its load-balancing loss); use a dense model"
    if train.shared_prompt and kernel_rules.linear_heads(text_config) is not None:
        return (
            "shared_prompt: true on a model with linear-attention layers: their recurrence would carry the chosen "
            "completion into the rejected one; set shared_prompt: false"
        )
    return None


def reference_logps(engine, data, output_dir, fresh: bool) -> None:
    """Set `data.ref`: computed now by the engine's model (`fresh`: the starting weights) and written by rank 0, or
    read back (a resume). ValueError where a resume finds no file, or one of other data."""
    path = Path(output_dir) / REF_FILE
    signature = json.dumps(data.signature(), sort_keys=True)
    if not fresh:
        if not path.exists():
            raise ValueError(
                f"{path} is missing: a resumed dpo run reads the reference log-probs its first step "
                f"computed from the starting weights; start the run again without resume"
            )
        saved = torch.load(path, weights_only=True)
        if saved["signature"] != signature:
            raise ValueError(
                f"{path} holds reference log-probs of other data ({saved['signature']}, now "
                f"{signature}); resume on the data the run started with"
            )
        data.ref = saved["logps"]
        log.info("reference log-probs of %d pairs read from %s", len(data.ref), path)
        return
    st, t0 = engine.state, time.perf_counter()
    table = torch.zeros(len(data.pairs), 2, dtype=torch.float64, device=engine.device)
    was_training = engine.module.training
    engine.ds.eval()
    try:
        for first in range(
            0, data.n_rows, st.dp_size
        ):  # every rank forwards each round: ZeRO-3 gathers over all
            r = first + st.dp_rank
            batch = data.row(r if r < data.n_rows else 0)
            with torch.no_grad():
                logps, _ = engine.pair_logps(batch)
            if r < data.n_rows:
                table[list(batch.pairs)] = logps.view(
                    -1, 2
                ).double()  # [2P] -> [P, 2]: chosen, rejected
    finally:
        engine.ds.train(was_training)
    if st.dp_group is not None:
        dist.all_reduce(table, group=st.dp_group)
    data.ref = table.float().cpu()
    if st.rank == 0:
        torch.save({"logps": data.ref, "signature": signature}, path)
        log.info(
            "reference log-probs: %d pairs in a first pass over the starting weights (%.1f s), stored in %s "
            "(TRL's precompute_ref_log_probs; a resume reads them)",
            len(data.ref),
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
            train.beta,
            train.loss_type,
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
