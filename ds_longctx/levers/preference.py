"""Preference optimization (DPO): per-sequence log-probs over SP slices and packed documents, and
TRL's DPO losses.

    logps = sequence_logps(hidden, weight, shift_labels, shift_seq, n_seq)  # [n_seq] this slice's
    logps = group_sum(logps, state.sp_group)                                # the whole sequences'
    out = dpo_loss(logps[0::2], logps[1::2], ref[:, 0], ref[:, 1], beta=0.1, loss_type="sigmoid")

Design notes: docs/design/levers.md, section `preference.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ds_longctx.levers.chunked_loss import _accumulate_grad_weight, per_token_cross_entropy
from ds_longctx.parallel.units import IGNORE_INDEX

LOSS_TYPES = ("sigmoid", "hinge", "ipo")  # TRL's DPOConfig.loss_type names built here


def _weighted_grads(hidden, weight, labels, row_weight, chunk_rows: int):
    """Gradients (hidden [N, H], weight [V, H]) of sum_i row_weight_i x CE_i, chunk by chunk (no N x
    V logits)."""
    grad_hidden = torch.zeros_like(hidden)
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    for start in range(0, hidden.shape[0], chunk_rows):
        end = min(start + chunk_rows, hidden.shape[0])
        w = row_weight[start:end]  # [c] fp32, 0 where the row trains nothing
        if not bool((w != 0).any()):
            continue
        h = hidden[start:end]
        target = labels[start:end].clamp(min=0).unsqueeze(1)  # [c, 1]: ignored rows weigh 0
        grad_logits = torch.softmax(F.linear(h, weight).float(), dim=1)  # [c, V] fp32
        grad_logits.scatter_add_(1, target, -torch.ones_like(target, dtype=grad_logits.dtype))
        grad_logits = grad_logits.mul_(w.unsqueeze(1)).to(h.dtype)  # dCE/dlogits x weight
        torch.mm(grad_logits, weight, out=grad_hidden[start:end])  # [c, V] @ [V, H] -> [c, H]
        _accumulate_grad_weight(grad_weight, grad_logits.t(), h)  # [V, c] @ [c, H] -> [V, H]
    return grad_hidden, grad_weight.to(weight.dtype)


class _SequenceLogps(torch.autograd.Function):
    """Per-sequence sums of token log-probs; the backward recomputes the chunks' softmax, each row
    weighted by its sequence's incoming gradient (so nothing of size N x V or n_seq x V x H is
    kept)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, seq, n_seq: int, chunk_rows: int):
        ce = per_token_cross_entropy(
            hidden, weight, labels, chunk_size=chunk_rows
        )  # [N] fp32, 0 where ignored
        keep = seq != IGNORE_INDEX  # [N]
        out = torch.zeros(n_seq, dtype=torch.float32, device=hidden.device)
        out.index_add_(0, seq[keep], -ce[keep])
        ctx.save_for_backward(hidden, weight, labels, seq)
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, labels, seq = ctx.saved_tensors
        keep = seq != IGNORE_INDEX
        # d logp_s / d CE_i = -1 for row i of sequence s
        row_weight = torch.where(keep, -grad.float()[seq.clamp(min=0)], 0.0)  # [N]
        gh, gw = _weighted_grads(hidden, weight, labels, row_weight, ctx.chunk_rows)
        return gh, gw, None, None, None, None


def sequence_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    seq: torch.Tensor,
    n_seq: int,
    chunk_rows: int = 4096,
) -> torch.Tensor:
    """fp32 [n_seq]: sum of log p(label_i | row i) over this slice's rows i of each sequence (`seq`,
    int64 [N]; IGNORE_INDEX rows count nowhere). hidden [N, H], weight [V, H], labels int64 [N]
    shifted. Differentiable."""
    trains = labels != IGNORE_INDEX
    named = seq != IGNORE_INDEX
    if bool((named & (~trains | (seq < 0))).any()):
        raise ValueError(
            "a row names a sequence but trains nothing (or a sequence id < 0): give each sequence "
            "id only where its label trains"
        )
    if bool((seq >= n_seq).any()):
        raise ValueError(
            f"sequence id {int(seq.max())} >= n_seq={n_seq}; count every sequence of the row"
        )
    return _SequenceLogps.apply(hidden, weight, labels, seq, n_seq, chunk_rows)


class _GroupSum(torch.autograd.Function):
    """All-reduce (sum) over a group; the backward passes the gradient through unchanged: every rank
    computes the same loss from the sum, and each backpropagates only through its own share."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def group_sum(x: torch.Tensor, group) -> torch.Tensor:
    """`x` summed over `group` (None: sp_size 1, `x` itself); see `_GroupSum` for the gradient."""
    return x if group is None else _GroupSum.apply(x, group)


@dataclass
class DpoOut:
    losses: torch.Tensor  # [P] per-pair loss
    chosen_rewards: (
        torch.Tensor
    )  # [P] beta x (policy - reference) log-prob of the chosen completion, detached
    rejected_rewards: torch.Tensor  # [P] the same for the rejected one


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str,
    chosen_tokens: Optional[torch.Tensor] = None,
    rejected_tokens: Optional[torch.Tensor] = None,
) -> DpoOut:
    """TRL's DPOTrainer per-pair loss (f-divergence reverse_kl) on summed log-probs [P]; ipo
    averages each score over its completion's tokens (`*_tokens`, [P]), as TRL does."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError(
                "loss_type ipo averages over each completion's tokens: pass chosen_tokens and "
                "rejected_tokens"
            )
        delta = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(
            min=1
        )
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"loss_type={loss_type!r} is not built; use one of {list(LOSS_TYPES)}")
    return DpoOut(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def pair_metrics(out: DpoOut) -> dict:
    """The step's DPO metrics as TRL names them: mean rewards, accuracy (chosen above rejected) and
    margin."""
    margin = out.chosen_rewards - out.rejected_rewards
    return {
        "rewards/chosen": float(out.chosen_rewards.mean()),
        "rewards/rejected": float(out.rejected_rewards.mean()),
        "rewards/accuracies": float((margin > 0).float().mean()),
        "rewards/margins": float(margin.mean()),
    }


def sp_logps(
    local: torch.Tensor, seq: torch.Tensor, n_seq: int, sp_group
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [n_seq] summed over the SP group, differentiable; trained tokens [n_seq] of each
    sequence) from this slice's `local` sums and sequence ids `seq` (any shape)."""
    kept = seq[seq != IGNORE_INDEX]
    tokens = torch.zeros(n_seq, dtype=torch.float32, device=seq.device)
    tokens.index_add_(0, kept, torch.ones_like(kept, dtype=torch.float32))
    if sp_group is not None:
        dist.all_reduce(tokens, group=sp_group)
    return group_sum(local, sp_group), tokens


def row_logps(
    model,
    weight: torch.Tensor,
    sp_group,
    input_ids,
    position_ids,
    shift_labels,
    shift_seq,
    n_seq: int,
    chunk_rows: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [n_seq] of the micro-batch's sequences, summed over the SP group; their trained
    tokens [n_seq]) from this rank's slice (`[b, s/sp]` each): the HF model's trunk, then
    `sequence_logps`. `weight` is lm_head's [V, H], gathered. Under no_grad this is the reference
    pass."""
    hidden = model.base_model(
        input_ids=input_ids, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [b, s/sp, H]
    seq = shift_seq.flatten()
    local = sequence_logps(
        hidden.flatten(0, 1), weight, shift_labels.flatten(), seq, n_seq, chunk_rows
    )
    return sp_logps(local, seq, n_seq, sp_group)


def pair_forward(
    model,
    weight: torch.Tensor,
    sp_group,
    input_ids,
    position_ids,
    shift_labels,
    shift_seq,
    ref: torch.Tensor,
    beta: float,
    loss_type: str,
    chunk_rows: int = 4096,
):
    """One micro-batch of P pairs (`row_logps`; sequence ids number its sequences, pair p's chosen
    2p, rejected 2p + 1): the mean of TRL's per-pair loss against `ref` ([P, 2] reference log-probs,
    chosen first). Returns (loss, DpoOut, policy log-probs [2P] detached); the loss's gradients
    summed over the SP ranks are the whole rows'."""
    logps, tokens = row_logps(
        model,
        weight,
        sp_group,
        input_ids,
        position_ids,
        shift_labels,
        shift_seq,
        2 * ref.shape[0],
        chunk_rows,
    )
    ref = ref.to(logps)
    out = dpo_loss(
        logps[0::2], logps[1::2], ref[:, 0], ref[:, 1], beta, loss_type, tokens[0::2], tokens[1::2]
    )
    return out.losses.mean(), out, logps.detach()
