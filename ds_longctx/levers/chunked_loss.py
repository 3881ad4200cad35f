"""lm_head + cross-entropy over row chunks, with its gradients computed in the forward pass.

Design notes: docs/design/levers.md, section `chunked_loss.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ds_longctx.parallel.units import IGNORE_INDEX

# addmm(..., out_dtype=) (a bf16 product summed straight into an fp32 tensor) exists on CUDA from
# torch 2.8
_ADDMM_HAS_OUT_DTYPE = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)


def _validate(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int,
    ignore_index: int,
) -> None:
    """Fail before any work, naming the bad value and the fix."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(
            f"chunk_size={chunk_size!r} must be a positive int (rows per chunk), e.g. 4096"
        )
    if hidden.dim() != 2:
        raise ValueError(
            f"hidden has shape {tuple(hidden.shape)}; expected [N, H]: flatten it with "
            f"hidden.reshape(-1, hidden.shape[-1])"
        )
    if weight.dim() != 2 or weight.shape[0] == 0:
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}; expected [V, H] with V > 0. Under ZeRO-3 "
            f"gather it first (deepspeed.zero.GatheredParameters or inside lm_head's forward)"
        )
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden size {hidden.shape[1]} != weight's {weight.shape[1]} (weight is "
            f"{tuple(weight.shape)}); pass lm_head.weight, shaped [V, H]"
        )
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise ValueError(
            f"hidden dtype {hidden.dtype} and weight dtype {weight.dtype} must be the same "
            f"float dtype; cast hidden with .to(weight.dtype)"
        )
    if labels.dtype != torch.int64 or labels.shape != hidden.shape[:1]:
        raise ValueError(
            f"labels are {labels.dtype} {tuple(labels.shape)}; expected int64 "
            f"[N={hidden.shape[0]}] (labels.reshape(-1).long(), already shifted)"
        )
    if not (hidden.device == weight.device == labels.device):
        raise ValueError(
            f"hidden, weight, labels are on {hidden.device}, {weight.device}, {labels.device}; "
            f"move them to one device"
        )
    vocab = weight.shape[0]
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab))  # [N]
    if bad.any():
        pos = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"labels[{pos}]={int(labels[pos])} is outside [0, V={vocab}) and is not "
            f"ignore_index={ignore_index}; mask it with ignore_index, or check the tokenizer's "
            f"vocabulary against lm_head's {vocab} rows"
        )


def _accumulate_grad_weight(acc: torch.Tensor, grad_t: torch.Tensor, h_chunk: torch.Tensor) -> None:
    """acc [V, H] += grad_t [V, c] @ h_chunk [c, H], summed in acc's dtype (fp32)."""
    if grad_t.dtype == acc.dtype:
        acc.addmm_(grad_t, h_chunk)
    elif acc.is_cuda and _ADDMM_HAS_OUT_DTYPE:
        torch.addmm(acc, grad_t, h_chunk, out_dtype=acc.dtype, out=acc)  # no [V, H] temporary
    elif acc.is_cuda:
        acc += (grad_t @ h_chunk).to(acc.dtype)  # torch < 2.8: one [V, H] temporary per chunk
    # CPU has no addmm.dtype_out kernel: multiply the upcast operands, still no [V, H] temporary
    else:
        acc.addmm_(grad_t.to(acc.dtype), h_chunk.to(acc.dtype))


def _one_chunk(
    h_chunk: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    grad_hidden: torch.Tensor | None,
    grad_weight: torch.Tensor | None,
    hits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row losses [c] fp32 of one chunk. More: docs/design/levers.md."""
    mask = valid.unsqueeze(1)  # [c] -> [c, 1]
    target = labels.masked_fill(~valid, 0).unsqueeze(
        1
    )  # [c] -> [c, 1], ignored rows point at class 0
    # matmul in the input dtype, then fp32: exactly F.linear(h, w).float()
    logits = F.linear(h_chunk, weight).float()  # [c, V] fp32
    row_max = logits.amax(dim=1, keepdim=True)  # [c, 1]
    target_logit = logits.gather(1, target) - row_max  # [c, 1]
    if hits is not None:
        hits.copy_((target_logit.squeeze(1) >= 0) & valid)  # [c]: target logit == row max
    exp = logits.sub_(row_max).exp_()  # [c, V] in place: exp(logit - max)
    sum_exp = exp.sum(dim=1, keepdim=True)  # [c, 1]
    row_loss = torch.where(mask, sum_exp.log() - target_logit, 0.0).squeeze(
        1
    )  # [c]: logsumexp - target
    if grad_hidden is None and grad_weight is None:
        return row_loss
    # dL/dlogits = softmax - onehot(target) on kept rows, 0 on ignored rows; in place over exp
    grad_logits = exp.mul_(mask / sum_exp)  # [c, V]
    grad_logits.scatter_add_(1, target, -mask.to(grad_logits.dtype))
    grad_logits = grad_logits.to(h_chunk.dtype)  # the cast F.linear's backward would see
    if grad_hidden is not None:
        torch.mm(grad_logits, weight, out=grad_hidden)  # [c, V] @ [V, H] -> [c, H]
    if grad_weight is not None:
        _accumulate_grad_weight(grad_weight, grad_logits.t(), h_chunk)  # [V, c] @ [c, H] -> [V, H]
    return row_loss


def _chunk_loop(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int,
    ignore_index: int,
    need_hidden_grad: bool,
    need_weight_grad: bool,
    hits: torch.Tensor | None = None,
):
    """Per-row losses [N] fp32 (0.0 on ignored rows) and, if asked, grad_hidden [N, H], grad_weight
    [V, H] of their sum (None when not asked); `hits` [N] bool, if given, gets each row's argmax hit
    (`_one_chunk`). Inputs must have passed ``_validate``."""
    n, h = hidden.shape
    valid = labels != ignore_index  # [N] bool
    n_chunks = -(-n // chunk_size)
    # [N] -> [n_chunks * c] (padded with False) -> [n_chunks, c] -> [n_chunks]; one host sync for
    # the loop
    has_target = (
        F.pad(valid, (0, n_chunks * chunk_size - n)).view(n_chunks, chunk_size).any(dim=1).tolist()
    )

    losses = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    grad_hidden = (
        torch.zeros(n, h, dtype=hidden.dtype, device=hidden.device) if need_hidden_grad else None
    )
    grad_weight = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        if need_weight_grad
        else None
    )
    for i, start in enumerate(range(0, n, chunk_size)):
        if not has_target[i]:
            continue  # every row ignored: zero loss and zero gradient, already in place
        end = min(start + chunk_size, n)
        losses[start:end] = _one_chunk(
            hidden[start:end],
            weight,
            labels[start:end],
            valid[start:end],
            None if grad_hidden is None else grad_hidden[start:end],
            grad_weight,
            None if hits is None else hits[start:end],
        )
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)  # fp32 -> weight dtype (a no-op for fp32)
    return losses, grad_hidden, grad_weight


def _scale_(grad: torch.Tensor, scale: torch.Tensor, rows: int) -> None:
    """grad *= scale (a 0-dim fp32 tensor) in place, in fp32 blocks of ``rows`` rows: one rounding,
    no sync."""
    if grad.dtype == torch.float32:
        grad.mul_(scale)
        return
    for start in range(0, grad.shape[0], rows):
        block = grad[start : start + rows]  # [rows, H]
        block.copy_(block.float().mul_(scale))


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Sum of cross-entropy over rows; gradients computed in forward, scaled by grad_output in
    backward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size, ignore_index):
        need_hidden_grad, need_weight_grad = ctx.needs_input_grad[:2]
        losses, grad_hidden, grad_weight = _chunk_loop(
            hidden, weight, labels, chunk_size, ignore_index, need_hidden_grad, need_weight_grad
        )
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.chunk_size = chunk_size
        ctx.used = False
        return losses.sum()

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.used:
            raise RuntimeError(
                "chunked_cross_entropy's stored gradients are scaled in place, so its backward "
                "runs once; call the loss again instead of backward(retain_graph=True) twice"
            )
        ctx.used = True
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output.float()
        for grad in (grad_hidden, grad_weight):
            if grad is not None:
                _scale_(grad, scale, ctx.chunk_size)
        return grad_hidden, grad_weight, None, None, None


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 4096,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Sum over non-ignored rows of cross_entropy(hidden @ weight.T, labels), fp32, 0-dim.

    Notes: docs/design/levers.md, `chunked_loss.py`.
    """
    _validate(hidden, weight, labels, chunk_size, ignore_index)
    if not torch.is_grad_enabled():  # needs_input_grad ignores no_grad: skip the gradient work here
        return _chunk_loop(hidden, weight, labels, chunk_size, ignore_index, False, False)[0].sum()
    return _ChunkedCrossEntropy.apply(hidden, weight, labels, chunk_size, ignore_index)


@torch.no_grad()
def per_token_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 4096,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Per-row cross-entropy [N] fp32, no gradients, for a loss-by-position probe.

    Ignored rows are 0.0, as in ``F.cross_entropy(..., reduction="none")``, so ``.sum()`` equals
    ``chunked_cross_entropy``; select ``labels != ignore_index`` before averaging.
    """
    _validate(hidden, weight, labels, chunk_size, ignore_index)
    return _chunk_loop(hidden, weight, labels, chunk_size, ignore_index, False, False)[0]


@torch.no_grad()
def per_token_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 4096,
    ignore_index: int = IGNORE_INDEX,
) -> tuple:
    """(``per_token_cross_entropy``, hits [N] bool): row i's hit is whether its label's logit is the
    row's max, i.e. greedy decoding from the true prefix emits the label (False on ignored rows);
    still c x V logits at a time."""
    _validate(hidden, weight, labels, chunk_size, ignore_index)
    hits = torch.zeros(labels.shape, dtype=torch.bool, device=hidden.device)
    return _chunk_loop(hidden, weight, labels, chunk_size, ignore_index, False, False, hits)[
        0
    ], hits


def plain_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """The unchunked path (lever off): full [N, V] logits, fp32 cross-entropy, reduction="sum"."""
    logits = F.linear(hidden, weight).float()  # [N, V]
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
