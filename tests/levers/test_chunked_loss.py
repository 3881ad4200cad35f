"""chunked_cross_entropy against plain F.cross_entropy on full logits (written here), on CPU.

Dimensions: N rows, H hidden, V vocab, c chunk_size. V != H so the weight gradient [V, H] and a
logits chunk [c, V] are told apart by their last dimension.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ds_longctx.levers.chunked_loss import (
    chunked_cross_entropy,
    per_token_cross_entropy,
    per_token_scores,
)
from tests.helpers import rel_err

IGNORE = -100
H, V = 24, 131

# fp32: only the summation order differs from the reference.
# bf16: compared against an fp32 reference fed the same bf16-rounded inputs. Rounding the logits and
# dL/dlogits to bf16 (8-bit mantissa, 2^-9 = 2e-3 relative) is inherent to bf16 training, and plain
# bf16 F.cross_entropy shows it too: ~3e-3 on the gradients, ~1e-4 on the loss at these shapes. We
# allow 1e-2 (gradients) and 2e-3 (loss), and check that chunking costs at most 10 % more error than
# plain bf16 does. With grad_output != 1 the bf16 gradients stored in forward are rounded a second
# time when backward scales them (plain CE scales before its one rounding): over 30 seeds that cost
# up to 1.36x plain's error at grad_output 3.5 (1.23x at 1/29), so there the bound is 1.5x.
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2}
LOSS_TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2e-3}


def reference_cross_entropy(hidden, weight, labels):
    """The plain path, written out: full [N, V] logits in the input dtype, fp32 cross-entropy,
    sum."""
    logits = F.linear(hidden, weight).float()  # [N, V]
    return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")


def make_labels(n, case, gen):
    labels = torch.randint(0, V, (n,), generator=gen)
    if case == "scattered":
        labels[torch.rand(n, generator=gen) < 0.3] = IGNORE
    elif case == "chunk_ignored":
        labels[8:16] = IGNORE  # the second chunk of 8 rows entirely ignored
        labels[3] = IGNORE
    elif case == "all_ignored":
        labels[:] = IGNORE
    return labels


def make_inputs(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) * 2 / H**0.5).to(dtype)  # logits of std ~2
    return hidden, weight, gen


def loss_and_grads(fn, hidden, weight, labels, grad_scale, **kw):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = fn(h, w, labels, **kw)
    (loss * grad_scale).backward()
    return loss.detach(), h.grad, w.grad


CASES = [  # (name, N, chunk_size, labels case, grad_scale)
    ("scattered", 40, 8, "scattered", 1.0),
    ("chunk_ignored", 32, 8, "chunk_ignored", 1.0),
    ("odd_n", 37, 8, "scattered", 1.0),
    ("chunk_gt_n", 37, 64, "scattered", 1.0),
    ("all_ignored", 24, 8, "all_ignored", 1.0),
    ("grad_output_3.5", 37, 8, "scattered", 3.5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,n,chunk,case,grad_scale", CASES, ids=[c[0] for c in CASES])
def test_matches_plain_cross_entropy(name, n, chunk, case, grad_scale, dtype):
    hidden, weight, gen = make_inputs(n, dtype)
    labels = make_labels(n, case, gen)
    ours = loss_and_grads(
        chunked_cross_entropy, hidden, weight, labels, grad_scale, chunk_size=chunk
    )
    assert ours[0].dtype == torch.float32 and ours[0].dim() == 0
    assert ours[1].dtype == dtype and ours[2].dtype == dtype

    # the reference in fp32, from the same (possibly bf16-rounded) inputs
    ref = loss_and_grads(
        reference_cross_entropy, hidden.float(), weight.float(), labels, grad_scale
    )
    if case == "all_ignored":
        assert ours[0].item() == 0.0 and ours[1].abs().sum() == 0 and ours[2].abs().sum() == 0
    assert rel_err(ours[0], ref[0]) <= LOSS_TOLERANCE[dtype]
    for got, want in zip(ours[1:], ref[1:]):
        assert rel_err(got, want) <= TOLERANCE[dtype]
    if dtype == torch.bfloat16 and case != "all_ignored":
        plain = loss_and_grads(reference_cross_entropy, hidden, weight, labels, grad_scale)
        ratio = 1.1 if grad_scale == 1.0 else 1.5
        for got, base, want in zip(ours, plain, ref):
            assert rel_err(got, want) <= ratio * rel_err(base, want) + 1e-5


@pytest.mark.parametrize("hidden_grad,weight_grad", [(True, False), (False, True)])
def test_only_the_needed_gradient(hidden_grad, weight_grad):
    hidden, weight, gen = make_inputs(37, torch.float32)
    labels = make_labels(37, "scattered", gen)
    h, w = hidden.clone().requires_grad_(hidden_grad), weight.clone().requires_grad_(weight_grad)
    chunked_cross_entropy(h, w, labels, chunk_size=8).backward()
    _, ref_h, ref_w = loss_and_grads(reference_cross_entropy, hidden, weight, labels, 1.0)
    assert (h.grad is not None) == hidden_grad and (w.grad is not None) == weight_grad
    if hidden_grad:
        assert rel_err(h.grad, ref_h) <= 1e-6
    if weight_grad:
        assert rel_err(w.grad, ref_w) <= 1e-6


def test_no_grad_and_per_token():
    hidden, weight, gen = make_inputs(37, torch.float32)
    labels = make_labels(37, "chunk_ignored", gen)
    h = hidden.clone().requires_grad_()
    with torch.no_grad():
        loss = chunked_cross_entropy(h, weight, labels, chunk_size=8)
    assert not loss.requires_grad
    assert rel_err(loss, reference_cross_entropy(hidden, weight, labels)) <= 1e-6

    per_row = per_token_cross_entropy(h, weight, labels, chunk_size=8)
    want = F.cross_entropy(
        F.linear(hidden, weight).float(), labels, ignore_index=IGNORE, reduction="none"
    )
    assert per_row.shape == (37,) and per_row.dtype == torch.float32 and not per_row.requires_grad
    assert rel_err(per_row, want) <= 1e-6
    assert (per_row[labels == IGNORE] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_hits_are_the_argmax_of_the_full_logits(dtype):
    """per_token_scores: the losses of per_token_cross_entropy, and hit[i] == (labels[i]'s logit is
    row i's max), False where ignored; half the labels set to the argmax so both outcomes occur,
    chunks of 8 rows."""
    hidden, weight, gen = make_inputs(37, dtype)
    labels = make_labels(37, "chunk_ignored", gen)
    logits = F.linear(hidden, weight).float()  # [N, V]
    labels = torch.where(
        (torch.arange(37) % 2 == 0) & (labels != IGNORE), logits.argmax(dim=1), labels
    )
    loss, hit = per_token_scores(hidden, weight, labels, chunk_size=8)
    assert torch.equal(loss, per_token_cross_entropy(hidden, weight, labels, chunk_size=8))
    target = logits.gather(1, labels.clamp(min=0)[:, None])[:, 0]  # [N]
    want = (target == logits.amax(dim=1)) & (labels != IGNORE)  # a tie with the max counts as a hit
    assert (
        hit.dtype == torch.bool
        and torch.equal(hit, want)
        and 0 < int(hit.sum()) < int((labels != IGNORE).sum())
    )


def test_second_backward_raises():
    hidden, weight, gen = make_inputs(16, torch.float32)
    loss = chunked_cross_entropy(
        hidden.requires_grad_(), weight, make_labels(16, "scattered", gen), chunk_size=8
    )
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        loss.backward()


@pytest.mark.parametrize("bad_label", [V, -1, 10**6])
def test_out_of_range_label_names_the_value(bad_label):
    hidden, weight, gen = make_inputs(12, torch.float32)
    labels = make_labels(12, "scattered", gen)
    labels[5] = bad_label
    with pytest.raises(ValueError, match=rf"labels\[5\]={bad_label} is outside \[0, V={V}\)"):
        chunked_cross_entropy(hidden, weight, labels)


@pytest.mark.parametrize("chunk", [0, -4, 2.5, True])
def test_bad_chunk_size_names_the_value(chunk):
    hidden, weight, gen = make_inputs(12, torch.float32)
    with pytest.raises(ValueError, match=rf"chunk_size={chunk!r}"):
        chunked_cross_entropy(hidden, weight, make_labels(12, "scattered", gen), chunk_size=chunk)


@pytest.mark.parametrize(
    "what,match",
    [
        ("hidden_3d", r"hidden has shape \(1, 12, 24\)"),
        ("weight_hidden_size", r"hidden size 24 != weight's 23"),
        ("dtype", r"hidden dtype torch.float32 and weight dtype torch.bfloat16"),
        ("labels_int32", r"labels are torch.int32"),
        ("zero3_empty_weight", r"weight has shape \(0,\).*ZeRO-3"),
    ],
)
def test_bad_shapes_name_the_value(what, match):
    hidden, weight, gen = make_inputs(12, torch.float32)
    labels = make_labels(12, "scattered", gen)
    if what == "hidden_3d":
        hidden = hidden.unsqueeze(0)
    elif what == "weight_hidden_size":
        weight = weight[:, :23]
    elif what == "dtype":
        weight = weight.bfloat16()
    elif what == "labels_int32":
        labels = labels.int()
    elif what == "zero3_empty_weight":
        weight = torch.empty(0)
    with pytest.raises(ValueError, match=match):
        chunked_cross_entropy(hidden, weight, labels)


class RecordShapes(TorchDispatchMode):
    """Records the shape of every new tensor an aten op returns, and counts the matmuls giving
    logits."""

    def __init__(self):
        super().__init__()
        self.shapes, self.logit_matmuls = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view (slice, weight.t()) or an in-place op: allocates nothing new
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
                if (
                    func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
                    and t.shape[-1] == V
                ):
                    self.logit_matmuls += 1
        return out


def test_never_builds_n_by_v_logits():
    n, chunk = 40, 8  # five chunks, the second one entirely ignored
    hidden, weight, gen = make_inputs(n, torch.float32)
    labels = make_labels(n, "chunk_ignored", gen)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with RecordShapes() as rec:
        chunked_cross_entropy(h, w, labels, chunk_size=chunk).backward()
    assert rec.shapes, "the dispatch mode recorded nothing"
    vocab_wide = [s for s in rec.shapes if len(s) == 2 and s[-1] == V]
    assert vocab_wide and max(s[0] for s in vocab_wide) <= chunk, vocab_wide
    assert max(torch.Size(s).numel() for s in rec.shapes) <= max(chunk * V, V * H)
    assert rec.logit_matmuls == 4  # the ignored chunk is skipped
