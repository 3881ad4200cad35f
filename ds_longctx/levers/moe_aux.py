"""The MoE load-balancing loss over the whole sequence under Ulysses SP: transformers'
`load_balancing_loss_func`, its statistics summed over the SP group, its gradient added at each
router.

    aux = LoadBalance(experts=128, top_k=8, coef=0.001)
    # a micro-batch starts: this rank's counted rows [n] (None: all), its weight
    aux.begin(valid, weight)
    # ... the trunk's forward: every router calls aux.record(probs, idx, valid) and
    # with_aux_grad(logits, valid, aux)
    # coef x aux of the micro-batch's sequences (fp32, no graph); recording stops
    value = aux.finish(sp_group)

Design notes: docs/design/levers.md, section `moe_aux.py`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist


class LoadBalance:
    """A micro-batch's load-balancing statistics on this rank, their SP sum, the gradient they give
    (module doc)."""

    def __init__(self, experts: int, top_k: int, coef: float):
        self.experts, self.top_k, self.coef = experts, top_k, float(coef)
        self.valid: Optional[torch.Tensor] = (
            None  # [n] bool of this rank's rows, None: every row counts
        )
        self.weight = 1.0
        self.recording = False
        self.prob_grad: Optional[torch.Tensor] = (
            None  # [E] fp32: coef · weight · E · C / R², once finished
        )
        self._sums: Optional[torch.Tensor] = None  # [2E + 1] float64: C, P, R

    def begin(self, valid: Optional[torch.Tensor], weight: float) -> None:
        """A micro-batch starts: `valid` [n] marks the counted rows of this rank's slice (None:
        all), `weight` its share
        of the step (module doc)."""
        self.valid = None if valid is None else valid.reshape(-1).to(torch.bool)
        self.weight = float(weight)
        self.recording = self.coef != 0.0
        self.prob_grad, self._sums = None, None

    def valid_rows(self, n: int, device) -> torch.Tensor:
        """[n] float: 1 where a row counts. A forward outside a micro-batch (or on rows of another
        shape) counts all."""
        v = self.valid
        if v is None or v.numel() != n:
            return torch.ones(n, device=device)
        return v.to(device=device, dtype=torch.float32)

    def record(self, probs: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> None:
        """Add one router's rows: probs [n, E] fp32, idx [n, k] its top-k experts, valid [n]
        float."""
        if not self.recording:
            return
        with torch.no_grad():
            w = valid.to(torch.float64)
            if self._sums is None:
                self._sums = torch.zeros(
                    2 * self.experts + 1, dtype=torch.float64, device=probs.device
                )
            E = self.experts
            self._sums[:E].index_add_(0, idx.reshape(-1), w.repeat_interleave(idx.shape[-1]))  # C
            self._sums[E : 2 * E] += (probs.to(torch.float64) * w[:, None]).sum(dim=0)  # P
            self._sums[2 * E] += w.sum()  # R

    def finish(self, group) -> Optional[torch.Tensor]:
        """Sum the statistics over the SP `group` (None: one rank), set the gradient the routers'
        backward adds, stop recording; returns coef · aux (fp32, 0-dim, no graph), or None when
        nothing was recorded (coef 0, no router ran)."""
        if not self.recording:
            return None
        self.recording = False
        sums = self._sums
        if sums is None:
            return None
        if group is not None:
            dist.all_reduce(sums, group=group)
        E = self.experts
        counts, probs, rows = sums[:E], sums[E : 2 * E], sums[2 * E].clamp(min=1.0)
        aux = E * (counts / rows * probs / rows).sum()
        self.prob_grad = (self.coef * self.weight * E * counts / rows**2).to(torch.float32)
        return (self.coef * aux).to(torch.float32)


class _AuxGrad(torch.autograd.Function):
    """Identity on router logits [n, E]; its backward adds the load-balancing gradient of the
    counted rows: d logits = p ⊙ (g - <p, g>) with p = softmax(logits), g = `LoadBalance.prob_grad`
    (module doc)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, valid: torch.Tensor, aux: LoadBalance) -> torch.Tensor:
        ctx.save_for_backward(logits, valid)
        ctx.aux = aux
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, valid = ctx.saved_tensors
        g = ctx.aux.prob_grad
        if g is None:
            return grad, None, None
        p = torch.softmax(logits.float(), dim=-1)  # [n, E]
        extra = p * (
            g.to(p.device) - (p * g.to(p.device)).sum(dim=-1, keepdim=True)
        )  # softmax's Jacobian · g
        extra = extra * valid.to(extra.dtype)[:, None]
        return (extra if grad is None else grad + extra).to(logits.dtype), None, None


def with_aux_grad(logits: torch.Tensor, valid: torch.Tensor, aux: LoadBalance) -> torch.Tensor:
    """`logits` [n, E], carrying the load-balancing gradient in the backward (grad mode and a
    coefficient only)."""
    if aux.coef == 0.0 or not torch.is_grad_enabled():
        return logits
    return _AuxGrad.apply(logits, valid, aux)
