"""Kernel pairs: an attention kernel's forward that returns its log-sum-exp, and the backward that
takes it, run through our own autograd Function (`_Attend`). parallel/attention.py picks the pair
(`kernel_pair`) and routes through it; this module holds the pairs and the Function.

Design notes: docs/design/parallel.md, section `kernel_pairs.py`.
"""

from __future__ import annotations

# flash_attn is optional: imported where its kernels are called.
# FlashAttention 4 is optional: imported in its pair's forward and backward.
import torch


class _Pair:
    """A forward that returns (out, saved tensors, meta) and the backward that takes them; packed,
    `cu` and `max_len` are (queries', keys') pairs. More: docs/design/parallel.md."""

    gqa = False  # the kernel reads fewer KV heads than query heads itself
    splits_heads = False

    def heads(self, out, saved, start: int, n: int):
        raise NotImplementedError

    def fwd(self, q, k, v, scale, cu, max_len):
        raise NotImplementedError

    def bwd(self, dout, q, k, v, out, saved, meta, scale, cu, max_len):
        raise NotImplementedError

    @staticmethod
    def out_bshd(out: torch.Tensor) -> torch.Tensor:
        """The pair's output as `[b, s, h, d]`."""
        return out


class _FA4(_Pair):
    """FlashAttention 4: q/k/v as `[b, s, h, d]` views (dense) or `[s, h, d]` (varlen, b == 1,
    causal aligned bottom-right where a document's q and k lengths differ); LSE `[b, h, s]`."""

    gqa = True
    splits_heads = True

    def fwd(self, q, k, v, scale, cu, max_len):
        from flash_attn.cute.interface import _flash_attn_fwd

        if cu is None:
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d] -> [b, s, h, d]
            out, lse, *_ = _flash_attn_fwd(
                qt, kt, vt, softmax_scale=scale, causal=True, return_lse=True
            )
        else:
            qt, kt, vt = (t[0].transpose(0, 1) for t in (q, k, v))  # [1, h, s, d] -> [s, h, d]
            out, lse, *_ = _flash_attn_fwd(
                qt,
                kt,
                vt,
                cu_seqlens_q=cu[0],
                cu_seqlens_k=cu[1],
                max_seqlen_q=max_len[0],
                max_seqlen_k=max_len[1],
                softmax_scale=scale,
                causal=True,
                return_lse=True,
            )
        return out, (lse,), {}

    def bwd(self, dout, q, k, v, out, saved, meta, scale, cu, max_len):
        from flash_attn.cute.interface import _flash_attn_bwd

        (lse,) = saved
        if cu is None:
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            dq, dk, dv = _flash_attn_bwd(qt, kt, vt, out, dout, lse, scale, True)
            return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
        qt, kt, vt = (t[0].transpose(0, 1) for t in (q, k, v))
        dq, dk, dv = _flash_attn_bwd(
            qt,
            kt,
            vt,
            out,
            dout,
            lse,
            scale,
            True,
            cu_seqlens_q=cu[0],
            cu_seqlens_k=cu[1],
            max_seqlen_q=max_len[0],
            max_seqlen_k=max_len[1],
        )
        return tuple(t.transpose(0, 1)[None] for t in (dq, dk, dv))

    @staticmethod
    def out_bshd(out):
        return out if out.dim() == 4 else out[None]  # varlen [s, h, d] -> [1, s, h, d]

    def heads(
        self, out, saved, start, n
    ):  # out [b, s, h, d] (varlen [s, h, d]); LSE [b, h, s] (varlen [h, s])
        (lse,) = saved
        return out.narrow(out.dim() - 2, start, n), (lse.narrow(lse.dim() - 2, start, n),)


class _CudnnSDPA(_Pair):
    """SDPA's cuDNN kernel through its aten ops (dense, bf16/fp16); out `[b, h, s, d]`."""

    def fwd(self, q, k, v, scale, cu, max_len):
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale
        )
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset = res[:8]
        return out, (lse, cum_q, cum_k, seed, offset), {"max_q": max_q, "max_k": max_k}

    def bwd(self, dout, q, k, v, out, saved, meta, scale, cu, max_len):
        lse, cum_q, cum_k, seed, offset = saved
        if dout.stride() != out.stride():  # the kernel reads dO in O's layout
            dout = torch.empty_like(out).copy_(dout)
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            seed,
            offset,
            None,
            cum_q,
            cum_k,
            meta["max_q"],
            meta["max_k"],
            0.0,
            True,
            scale=scale,
        )

    @staticmethod
    def out_bshd(out):
        return out.transpose(1, 2)


class _CpuFlashSDPA(_Pair):
    """SDPA's CPU flash kernel through its aten ops (dense): what CPU tests of the cache run."""

    splits_heads = True

    def fwd(self, q, k, v, scale, cu, max_len):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, True, scale=scale
        )
        return out, (lse,), {}

    def bwd(self, dout, q, k, v, out, saved, meta, scale, cu, max_len):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(),
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            out.contiguous(),
            saved[0].contiguous(),
            0.0,
            True,
            scale=scale,
        )

    @staticmethod
    def out_bshd(out):
        return out.transpose(1, 2)

    def heads(self, out, saved, start, n):  # out [b, h, s, d]; LSE [b, h, s]
        return out.narrow(1, start, n), (saved[0].narrow(1, start, n),)


class _Attend(torch.autograd.Function):
    """Attention through a kernel pair, with an optional cache slot. More:
    docs/design/parallel.md."""

    @staticmethod
    def forward(ctx, q, k, v, pair, scale, cu, max_len, slot):
        kept = slot.take() if slot is not None else None
        if kept is None:
            out, saved, meta = pair.fwd(q, k, v, scale, cu, max_len)
            if slot is not None:
                slot.keep((out, saved, meta))
        else:
            out, saved, meta = kept
        ctx.save_for_backward(q, k, v, out, *saved)
        ctx.pair, ctx.meta, ctx.scale, ctx.cu, ctx.max_len = pair, meta, scale, cu, max_len
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, *saved = ctx.saved_tensors
        args = (ctx.meta, ctx.scale, ctx.cu, ctx.max_len)
        groups = _HEAD_GROUPS[0]
        if groups > 1 and ctx.pair.splits_heads:
            dq, dk, dv = _grouped_bwd(ctx.pair, groups, dout, q, k, v, out, tuple(saved), args)
        else:
            dq, dk, dv = ctx.pair.bwd(dout, q, k, v, out, tuple(saved), *args)
        return dq, dk, dv, None, None, None, None, None


def _grouped_bwd(pair: _Pair, groups: int, dout, q, k, v, out, saved, args) -> tuple:
    """The pair's backward over `groups` groups of KV heads with their query heads, one at a time
    (module doc): each group's grads are computed into fresh tensors by the kernel, then copied into
    the full ones."""
    hq, hk = q.shape[1], k.shape[1]
    if hq % groups or hk % groups:
        raise ValueError(
            f"attn_bwd_head_groups={groups} does not split {hq} query / {hk} KV heads evenly"
        )
    gq, gk = hq // groups, hk // groups
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # their layout: q/k/v's
    for g in range(groups):
        sq, sk = slice(g * gq, (g + 1) * gq), slice(g * gk, (g + 1) * gk)
        out_g, saved_g = pair.heads(out, saved, g * gq, gq)
        dout_g, _ = pair.heads(dout, saved, g * gq, gq)
        parts = pair.bwd(dout_g, q[:, sq], k[:, sk], v[:, sk], out_g, saved_g, *args)
        for full, part, sl in zip(grads, parts, (sq, sk, sk)):
            full[:, sl].copy_(part)
        del parts
    return grads


# memory.attn_bwd_head_groups of this process (set_head_groups, by the engine)
_HEAD_GROUPS = [1]


def set_head_groups(groups: int) -> None:
    """The grouped backward's group count for every attention call of this process (1:
    ungrouped)."""
    if groups < 1:
        raise ValueError(f"attn_bwd_head_groups={groups} must be >= 1")
    _HEAD_GROUPS[0] = groups
