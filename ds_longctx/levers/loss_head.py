"""The loss head: the HF model's trunk, then lm_head + cross-entropy on this rank's slice
(chunked_loss.py).

    module = LossHead(model, state, chunked=True, chunk_rows=4096)  # deepspeed.initialize wraps it
    loss, group_loss, n_tokens = module(input_ids, position_ids, shift_labels)
    with torch.no_grad():  # evaluation (engine.eval_batch); [b, s/sp] fp32, bool
        token_loss, hit = module(input_ids, position_ids, shift_labels, per_token=True)

    # or the model itself is wrapped (the HF Trainer): its forward, given these labels, runs the
    # loss head
    route_forward(model, module)
    model(input_ids=..., position_ids=..., ds_longctx_shift_labels=...)
    unroute_forward(model)

Dimensions: b batch, s/sp this rank's slice, H hidden, V vocab.
"""

from __future__ import annotations

# deepspeed is imported where the lm_head is registered as ZeRO-3's external parameter, not at
# import.
import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from ds_longctx.levers.chunked_loss import (
    chunked_cross_entropy,
    per_token_scores,
    plain_cross_entropy,
)
from ds_longctx.levers.preference import sequence_logps, sp_logps
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.patching import own_forward, restore_forward
from ds_longctx.parallel.units import IGNORE_INDEX


class LMHeadLoss(nn.Module):
    """lm_head + cross-entropy sum on the local slice, chunked or plain (chunked_loss.py).

    Notes: docs/design/levers.md, `loss_head.py`.
    """

    def __init__(self, lm_head: nn.Module, chunked: bool, chunk_rows: int):
        super().__init__()
        self._lm_head = [lm_head]  # a list: not a submodule, its params stay owned by the model
        self.chunked, self.chunk_rows = chunked, chunk_rows
        weight = lm_head.weight
        if hasattr(weight, "ds_id"):
            import deepspeed

            deepspeed.zero.register_external_parameter(self, weight)

    def forward(
        self,
        hidden: torch.Tensor,
        labels: torch.Tensor,
        per_token: bool = False,
        seq=None,
        n_seq: int = 0,
    ):
        """The CE sum (fp32, 0-dim); `per_token`: (each row's CE [N], its argmax hit [N]) instead,
        forward only, chunked whatever `chunked` says (no N x V logits, no gradients: evaluation;
        chunked_loss.per_token_scores); `seq` [N]: the log-prob sums [n_seq] of each sequence's rows
        (levers/preference.py; here, so that ZeRO-3 gathers lm_head for its backward too)."""
        weight = self._lm_head[0].weight  # [V, H]
        if seq is not None:
            return sequence_logps(hidden, weight, labels, seq, n_seq, self.chunk_rows)
        if per_token:
            return per_token_scores(hidden, weight, labels, chunk_size=self.chunk_rows)
        if self.chunked:
            return chunked_cross_entropy(hidden, weight, labels, chunk_size=self.chunk_rows)
        return plain_cross_entropy(hidden, weight, labels)


class LossHead(nn.Module):
    """HF causal LM + loss on the local slice. forward -> (loss to backprop, detached loss, token
    count), or with `per_token=True` the slice's per-token CE [b, s/sp] and argmax hits (evaluation,
    under no_grad).

    Notes: docs/design/levers.md, `loss_head.py`.
    """

    def __init__(
        self,
        model: nn.Module,
        state: ParallelState,
        chunked: bool = True,
        chunk_rows: int = 4096,
        aux=None,
    ):
        super().__init__()
        self.model = model
        self.state = state
        self.loss = LMHeadLoss(model.get_output_embeddings(), chunked, chunk_rows)
        self.aux = aux  # a mixture of experts' load balance (levers/moe_aux.LoadBalance), or None

    def _aux_loss(self):
        """coef x the load-balancing loss of this micro-batch's sequences, summed over the SP group
        (the same on every SP rank; levers/moe_aux.py), and the share of it each rank adds to its
        loss (weight / sp of it); (0, 0) for a dense model."""
        value = self.aux.finish(self.state.sp_group) if self.aux is not None else None
        if value is None:
            return 0.0, 0.0
        return value, value * self.aux.weight / self.state.sp_size

    def forward(
        self,
        input_ids,
        position_ids,
        shift_labels,
        per_token: bool = False,
        row_weights=None,
        seq=None,
        n_seq: int = 0,
    ):
        """See the class doc. `row_weights` (b floats): the loss to backprop is sum_r weight_r x CE
        sum of row r on this slice, returned as (that loss, None, this slice's tokens). `seq` ([b,
        s/sp], preference rows): the log-prob sums [n_seq] of the micro-batch's sequences over the
        SP group and their trained tokens (levers/preference.py `row_logps`)."""
        hidden = self.model.base_model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # [b, s/sp, H]
        if seq is not None:
            return sp_logps(
                self.loss(
                    hidden.flatten(0, 1), shift_labels.flatten(), seq=seq.flatten(), n_seq=n_seq
                ),
                seq,
                n_seq,
                self.state.sp_group,
            )
        if (
            per_token
        ):  # evaluation: this slice's per-token CE (0.0 where ignored) and hits; no SP reduction
            with record_function("ds_longctx.loss"):
                token_loss, hit = self.loss(
                    hidden.flatten(0, 1), shift_labels.flatten(), per_token=True
                )  # [b*s/sp]
            return token_loss.view(shift_labels.shape), hit.view(
                shift_labels.shape
            )  # [b*s/sp] -> [b, s/sp]
        n_tokens = (shift_labels != IGNORE_INDEX).sum()
        aux, aux_share = self._aux_loss()  # after the trunk: every router has recorded
        if row_weights is not None:
            with record_function("ds_longctx.loss"):
                if len(set(row_weights)) == 1:  # one weight: one pass over the whole slice
                    loss = self.loss(hidden.flatten(0, 1), shift_labels.flatten()) * row_weights[0]
                else:  # [s/sp, H] per row
                    loss = sum(
                        self.loss(hidden[r], shift_labels[r]) * row_weights[r]
                        for r in range(len(hidden))
                    )
            return loss + aux_share, None, n_tokens
        with record_function(
            "ds_longctx.loss"
        ):  # benchmarks/bench_profile.py attributes its kernels by this
            loss_sum = self.loss(
                hidden.flatten(0, 1), shift_labels.flatten()
            )  # [b*s/sp, H] -> fp32 scalar
        group_sum = loss_sum.detach().clone()
        if self.state.sp_group is not None:
            both = torch.stack([n_tokens.to(group_sum.dtype), group_sum])
            dist.all_reduce(both, group=self.state.sp_group)
            n_group, group_sum = both[0], both[1]
        else:
            n_group = n_tokens.to(group_sum.dtype)
        n_group = n_group.clamp(min=1)
        return (
            loss_sum * self.state.sp_size / n_group + aux_share,
            group_sum / n_group + aux,
            n_group,
        )


ROUTE_KWARG = "ds_longctx_shift_labels"
WEIGHTS_KWARG = "ds_longctx_row_weights"  # beside ROUTE_KWARG: LossHead's row_weights
# the loss module as a child of the model (no parameters: the state dict is unchanged)
_LOSS_CHILD = "ds_longctx_loss"
_PREV_FORWARD = "_ds_longctx_prev_forward"


def route_forward(model: nn.Module, head: LossHead) -> None:
    """Make `model(input_ids=, position_ids=, ds_longctx_shift_labels=[, ds_longctx_row_weights=])`
    return `head(...)`'s triple (the trunk and the chunked loss on this rank's slice, with those row
    weights); without the labels keyword the model's own forward runs (generation unchanged).

    Notes: docs/design/levers.md, `loss_head.py`.
    """
    if _PREV_FORWARD in model.__dict__:
        raise ValueError(
            f"{type(model).__name__} already routes its forward to a loss head; unroute_forward "
            "first"
        )
    original = model.forward
    model.__dict__[_PREV_FORWARD] = own_forward(model)
    model.add_module(_LOSS_CHILD, head.loss)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        shift_labels = kwargs.pop(ROUTE_KWARG, None)
        if shift_labels is None:
            return original(*args, **kwargs)
        return head(
            kwargs["input_ids"],
            kwargs["position_ids"],
            shift_labels,
            row_weights=kwargs.get(WEIGHTS_KWARG),
        )

    model.forward = forward


def unroute_forward(model: nn.Module) -> None:
    """Undo `route_forward`: the forward the model had before, and no loss child."""
    if _PREV_FORWARD not in model.__dict__:
        return
    restore_forward(model, model.__dict__.pop(_PREV_FORWARD))
    delattr(model, _LOSS_CHILD)
