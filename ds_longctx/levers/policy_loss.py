"""GRPO's clipped policy-gradient loss on per-token log-probs, as TRL's GRPOTrainer._compute_loss
defines it (token-level importance sampling). Formulas and aggregation: docs/design/levers.md,
`policy_loss.py`.

    # levers/preference.py:
    logps, _ = row_logps(model, weight, sp_group, ids, pos, shift_labels, shift_seq, K)
    out = policy_loss(logps, old, ref, adv, token_seq, n_seq, "dapo", 0.2, 0.2, 0.0, tokens=N)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")  # TRL's GRPOConfig.loss_type names built here


@dataclass
class PolicyOut:
    loss: torch.Tensor  # 0-dim: this micro-batch's share of the step's loss
    low: torch.Tensor  # tokens clipped below: ratio < 1 - epsilon, A < 0
    high: torch.Tensor  # tokens clipped above: ratio > 1 + epsilon_high, A > 0
    kl: torch.Tensor  # the per-token k3 KL summed (0 with beta 0)


def policy_loss(
    logps: torch.Tensor,
    old: Optional[torch.Tensor],
    ref: Optional[torch.Tensor],
    advantages: torch.Tensor,
    token_seq: torch.Tensor,
    n_seq: int,
    loss_type: str,
    epsilon: float,
    epsilon_high: float,
    beta: float,
    tokens: Optional[float] = None,
    max_len: Optional[int] = None,
) -> PolicyOut:
    """A micro-batch's loss from its K tokens' log-probs (differentiable), old log-probs (NaN: the
    policy's own), reference log-probs (beta > 0), advantages and sequence ids (0..n_seq-1), [K]
    each. `tokens`: dapo's divisor; `max_len`: dr_grpo's."""
    adv = advantages.to(logps)
    old = logps.detach() if old is None else torch.where(old.isnan(), logps.detach(), old.to(logps))
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)  # [K]
    kl = torch.zeros((), dtype=logps.dtype, device=logps.device)
    if beta != 0.0:
        if ref is None:
            raise ValueError("beta > 0 adds the KL to the reference: pass the reference log-probs")
        d = ref.to(logps) - logps
        token_kl = torch.exp(d) - d - 1
        per_token = per_token + beta * token_kl
        kl = token_kl.detach().sum()
    if loss_type == "grpo":
        sums = torch.zeros(n_seq, dtype=logps.dtype, device=logps.device).index_add(
            0, token_seq, per_token
        )
        count = torch.zeros(n_seq, dtype=logps.dtype, device=logps.device)
        count.index_add_(0, token_seq, torch.ones_like(per_token))
        loss = (sums / count.clamp(min=1.0)).mean()
    elif loss_type == "dapo":
        if tokens is None:
            raise ValueError("loss_type dapo divides by the step's completion tokens: pass tokens")
        loss = per_token.sum() / max(tokens, 1.0)
    elif loss_type == "dr_grpo":
        if max_len is None:
            raise ValueError("loss_type dr_grpo divides by max_completion_length: pass max_len")
        loss = per_token.sum() / (n_seq * max_len)
    else:
        raise ValueError(f"loss_type={loss_type!r} is not built; use one of {list(LOSS_TYPES)}")
    low = ((ratio < 1 - epsilon) & (adv < 0)).sum().detach()
    high = ((ratio > 1 + epsilon_high) & (adv > 0)).sum().detach()
    return PolicyOut(loss, low, high, kl)
