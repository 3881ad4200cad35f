"""Worker for tests/levers/test_preference.py at SP > 1: one DPO micro-batch through Ulysses SP on plain HF models (the
reference pass first, then the policy's loss and backward; the two-pass row per case, the shared-prompt row for the
first), then the two-pass row through the engine (ZeRO-3, objective
dpo) given the reference log-probs; rank 0 saves the losses, the reference log-probs and the parameter gradients
summed over the SP group (the engine's: ZeRO-3's full gradients).

torchrun --nproc_per_node 2 tests/distributed/dpo_worker.py --row row.pt --out got.pt
"""

import argparse
import os

import torch


def dpo_side(policy, ref_model, row: dict, state, beta: float, loss_type: str, chunk_rows: int = 5):
    """(loss, reference log-probs [P, 2], {name: this rank's gradient}) of one packed row {input_ids, position_ids,
    labels, seq[, branch: a shared-prompt row]} [T] on this rank of `state`: the reference's log-probs precomputed,
    then the policy's DPO loss."""
    from ds_longctx.levers.preference import pair_forward, row_logps
    from ds_longctx.parallel import ulysses
    from ds_longctx.parallel.sharding import shard_batch
    from ds_longctx.parallel.shared_prefix import shared_layout

    ids, pos = row["input_ids"][None], row["position_ids"][None]
    shard = shard_batch(
        ids, state.sp_size, state.sp_rank, labels=row["labels"][None], position_ids=pos
    )
    seq = shard_batch(
        ids, state.sp_size, state.sp_rank, labels=row["seq"][None], position_ids=pos
    ).shift_labels
    n_seq = int(row["seq"].max()) + 1
    args = (shard.input_ids, shard.position_ids, shard.shift_labels, seq)
    shared = (
        shared_layout(row["position_ids"], row["branch"], shard.pad) if "branch" in row else None
    )
    for model in (ref_model, policy):
        attn = ulysses.register(model, state)
        attn.cu_seqlens, attn.max_seqlen, attn.shared = shard.cu_seqlens, shard.max_seqlen, shared
        if model is ref_model:
            with torch.no_grad():
                logps, _ = row_logps(
                    model, model.lm_head.weight, state.sp_group, *args, n_seq, chunk_rows
                )
            ref = logps.view(-1, 2)
        else:
            loss, _, _ = pair_forward(
                model, model.lm_head.weight, state.sp_group, *args, ref, beta, loss_type, chunk_rows
            )
            loss.backward()
        ulysses.unregister(model)
    return loss.detach(), ref, {n: p.grad for n, p in policy.named_parameters()}


def engine_side(
    row: dict, ref: torch.Tensor, beta: float, loss_type: str, sp: int, out_dir: str
) -> dict:
    """The engine's step loss and full gradients on the row (one micro-batch, these reference log-probs)."""
    import deepspeed

    from ds_longctx.config import RunConfig
    from ds_longctx.data.preference import PairBatch
    from ds_longctx.run.engine import build_engine

    n = len(row["input_ids"])
    cfg = RunConfig(
        model="qwen3-tiny",
        seq_len=n + (-n) % sp,
        sp_size=sp,
        dtype="fp32",
        seed=0,
        objective="dpo",
        beta=beta,
        loss_type=loss_type,
        data="unused.jsonl",
        output_dir=out_dir,
        loss_chunk_rows=5,
    )
    eng = build_engine(cfg)
    batch = PairBatch(
        row["input_ids"][None],
        row["position_ids"][None],
        row["labels"][None],
        row["seq"][None],
        tuple(range(len(ref))),
        ref,
    )
    res = eng.forward_backward([batch])
    grads = {
        n.removeprefix("model."): deepspeed.utils.safe_get_full_grad(p).detach().clone()
        for n, p in eng.module.named_parameters()
    }
    return {"loss": res.loss, "grads": grads, "metrics": res.extra}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch.distributed as dist

    from ds_longctx.parallel.parallel_state import ParallelState, init_distributed, leave
    from tests.helpers import tiny_model

    init_distributed()  # DeepSpeed's, as the engine wants it (gloo on CPU)
    state = ParallelState.build(dist.get_world_size(), 8, 2)
    task = torch.load(a.row)
    out = {}
    for name, row, case in [
        *((c, task["row"], c) for c in task["cases"]),
        ("shared", task["shared"], task["cases"][0]),
    ]:
        policy, ref_model = tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager")
        loss, ref, grads = dpo_side(policy, ref_model, row, state, *case)
        for g in grads.values():
            dist.all_reduce(
                g, group=state.sp_group
            )  # each rank's share of the gradient -> the whole
        out[name] = {"loss": loss, "ref": ref, "grads": grads}
    first = task["cases"][0]
    out["engine"] = engine_side(
        task["row"], out[first]["ref"], *first, state.sp_size, os.path.dirname(a.out)
    )
    if state.rank == 0:
        torch.save(out, a.out)
    leave(0)


if __name__ == "__main__":
    main()
