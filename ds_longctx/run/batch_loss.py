"""The loss of one full batch on this rank (`sharded_loss`) and its rows' weights over the step
(`step_weights`), shared by `run/engine.py` and the HF Trainer (`integrations/hf_loss.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ds_longctx.levers import attention_cache
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.sharding import shard_batch, trained_counts
from ds_longctx.parallel.shared_prefix import shared_layout

if TYPE_CHECKING:
    from ds_longctx.run.lever_order import AppliedLevers


def step_weights(
    batches: list, state: ParallelState, average: str, device: Optional[torch.device] = None
) -> tuple[list, int]:
    """(per micro-batch, its row weights; the step's trained tokens over every replica). A row
    weighs W / N (docs/design/run.md), 0 without trained tokens. Collective over dp."""
    counts = [
        trained_counts(b.input_ids, b.labels, b.position_ids).double() for b in batches
    ]  # [b] each
    sums = torch.stack(
        [torch.cat(counts).sum(), (torch.cat(counts) > 0).sum().double()]
    )  # tokens, rows
    sums = sums if device is None else sums.to(device)
    if state.dp_group is not None:
        dist.all_reduce(sums, group=state.dp_group)
    tokens, rows = float(sums[0]), float(sums[1])
    w = state.world_size
    if average == "tokens":
        weights = [[w / max(tokens, 1.0)] * len(c) for c in counts]
    else:
        weights = [[w / (float(n) * rows) if n > 0 else 0.0 for n in c] for c in counts]
    return weights, int(tokens)


def sharded_loss(
    run,
    levers: AppliedLevers,
    state: ParallelState,
    device: torch.device,
    input_ids: torch.Tensor,
    position_ids: Optional[torch.Tensor] = None,
    labels: Optional[torch.Tensor] = None,
    row_weights: Optional[list] = None,
    micro_batches: int = 1,
    seq: Optional[torch.Tensor] = None,
    n_seq: int = 0,
    branch: Optional[torch.Tensor] = None,
):
    """`run(input_ids, position_ids, shift_labels)` on this rank's slice of one full batch `[b, L]`,
    after setting the documents, attention caches and MoE balance for it."""
    shard = shard_batch(
        input_ids, state.sp_size, state.sp_rank, labels=labels, position_ids=position_ids
    )
    attn = levers.attn
    attn.cu_seqlens, attn.max_seqlen = shard.cu_seqlens, shard.max_seqlen
    attn.shared = None if branch is None else shared_layout(position_ids[0], branch[0], shard.pad)
    attention_cache.new_step(levers.layers)
    if levers.moe is not None:
        b, n = shard.input_ids.shape
        valid = (
            (torch.arange(n) + state.sp_rank * n < input_ids.shape[1]).expand(b, n)
            if shard.pad
            else None
        )
        levers.moe.aux.begin(
            None if valid is None else valid.to(device), state.sp_size / micro_batches
        )
    calls_before = attn.calls
    extra = {} if row_weights is None else {"row_weights": row_weights}
    if (
        seq is not None
    ):  # preference rows: each trained token's sequence id, sharded and shifted as the labels are
        seq = shard_batch(
            input_ids, state.sp_size, state.sp_rank, labels=seq, position_ids=position_ids
        ).shift_labels
        extra = {"seq": seq.to(device), "n_seq": n_seq}
    with record_function("ds_longctx.forward"):
        out = run(
            shard.input_ids.to(device),
            shard.position_ids.to(device),
            shard.shift_labels.to(device),
            **extra,
        )
    if attn.calls == calls_before:
        model = levers.head.model
        raise RuntimeError(
            f"{type(model).__name__} did not call the Ulysses attention function: its "
            f"attention is not routed through transformers' AttentionInterface"
        )
    return out
