"""Worker for tests/levers/test_preference.py at SP > 1: one DPO micro-batch through Ulysses SP on plain HF models (the
reference pass first, then the policy's loss and backward); rank 0 saves the loss, the reference log-probs and the
parameter gradients summed over the SP group.

torchrun --nproc_per_node 2 tests/distributed/dpo_worker.py --row row.pt --out got.pt
"""

import argparse

import torch


def dpo_side(policy, ref_model, row: dict, state, beta: float, loss_type: str, chunk_rows: int = 5):
    """(loss, reference log-probs [P, 2], {name: this rank's gradient}) of one packed row {input_ids, position_ids,
    labels, seq} [T] on this rank of `state`: the reference's log-probs precomputed, then the policy's DPO loss."""
    from ds_longctx.levers.preference import pair_forward, row_logps
    from ds_longctx.parallel import ulysses
    from ds_longctx.parallel.sharding import shard_batch

    ids, pos = row["input_ids"][None], row["position_ids"][None]
    shard = shard_batch(ids, state.sp_size, state.sp_rank, labels=row["labels"][None], position_ids=pos)
    seq = shard_batch(ids, state.sp_size, state.sp_rank, labels=row["seq"][None], position_ids=pos).shift_labels
    n_seq = int(row["seq"].max()) + 1
    args = (shard.input_ids, shard.position_ids, shard.shift_labels, seq)
    for model in (ref_model, policy):
        attn = ulysses.register(model, state)
        attn.cu_seqlens, attn.max_seqlen = shard.cu_seqlens, shard.max_seqlen
        if model is ref_model:
            with torch.no_grad():
                logps, _ = row_logps(model, model.lm_head.weight, state.sp_group, *args, n_seq, chunk_rows)
            ref = logps.view(-1, 2)
        else:
            loss, _, _ = pair_forward(model, model.lm_head.weight, state.sp_group, *args, ref, beta, loss_type,
                                      chunk_rows)
            loss.backward()
        ulysses.unregister(model)
    return loss.detach(), ref, {n: p.grad for n, p in policy.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch.distributed as dist

    from ds_longctx.parallel.parallel_state import ParallelState, leave
    from tests.helpers import tiny_model
    dist.init_process_group("gloo")
    state = ParallelState.build(dist.get_world_size(), 8, 2)
    task = torch.load(a.row)
    out = []
    for beta, loss_type in task["cases"]:
        policy, ref_model = tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager")
        loss, ref, grads = dpo_side(policy, ref_model, task["row"], state, beta, loss_type)
        for g in grads.values():
            dist.all_reduce(g, group=state.sp_group)  # each rank's share of the gradient -> the whole
        out.append({"loss": loss, "ref": ref, "grads": grads})
    if state.rank == 0:
        torch.save(out, a.out)
    leave(0)


if __name__ == "__main__":
    main()
