"""Worker for tests/levers/test_preference.py at SP > 1: one DPO micro-batch through Ulysses SP on
plain HF models (the reference pass first, then the policy's loss and backward; the two-pass row per
case, the shared-prompt row for the first), one GRPO micro-batch per GRPO case the same way, then
the DPO and GRPO rows through the engine (ZeRO-3, the reference pass from --ref_model's directory);
rank 0 saves the losses, the reference log-probs and the parameter gradients summed over the SP
group (the engine's: ZeRO-3's full gradients).

torchrun --nproc_per_node 2 tests/distributed/dpo_worker.py --row row.pt --out got.pt
"""

import argparse
import os

import torch


def dpo_side(policy, ref_model, row: dict, state, beta: float, loss_type: str, chunk_rows: int = 5):
    """(loss, reference log-probs [P, 2], {name: this rank's gradient}) of one packed row
    {input_ids, position_ids, labels, seq[, branch: a shared-prompt row]} [T] on this rank of
    `state`: the reference's log-probs precomputed, then the policy's DPO loss."""
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


def policy_side(
    policy, ref_model, row: dict, state, loss_type: str, beta: float, chunk_rows: int = 5
):
    """(loss, {name: this rank's gradient}, (tokens clipped low, high)) of one GRPO micro-batch, a
    packed rollout row {input_ids, position_ids, labels, seq [T]; token_seq, advantages, old [K];
    eps, eps_high, max_len}, on this rank of `state`: the reference's per-token log-probs first
    (beta > 0), then the policy's loss."""
    from ds_longctx.levers.policy_loss import policy_loss
    from ds_longctx.levers.preference import row_logps
    from ds_longctx.parallel import ulysses
    from ds_longctx.parallel.sharding import shard_batch

    ids, pos = row["input_ids"][None], row["position_ids"][None]
    shard = shard_batch(
        ids, state.sp_size, state.sp_rank, labels=row["labels"][None], position_ids=pos
    )
    seq = shard_batch(
        ids, state.sp_size, state.sp_rank, labels=row["seq"][None], position_ids=pos
    ).shift_labels
    k = len(row["token_seq"])
    args = (shard.input_ids, shard.position_ids, shard.shift_labels, seq, k, chunk_rows)
    ref = None
    for model in ((ref_model,) if beta else ()) + (policy,):
        attn = ulysses.register(model, state)
        attn.cu_seqlens, attn.max_seqlen, attn.shared = shard.cu_seqlens, shard.max_seqlen, None
        with torch.set_grad_enabled(model is policy):
            logps, _ = row_logps(model, model.lm_head.weight, state.sp_group, *args)
        if model is ref_model:
            ref = logps.detach()
        else:
            out = policy_loss(
                logps,
                row["old"],
                ref,
                row["advantages"],
                row["token_seq"],
                int(row["token_seq"].max()) + 1,
                loss_type,
                row["eps"],
                row["eps_high"],
                beta,
                tokens=float(k),
                max_len=row["max_len"],
            )
            out.loss.backward()
        ulysses.unregister(model)
    clipped = (int(out.low), int(out.high))
    return out.loss.detach(), {n: p.grad for n, p in policy.named_parameters()}, clipped


def engine_side(data, sp: int, out_dir: str, **train) -> dict:
    """The engine's step on row 0 of `data` (PairRows or RolloutRows; `train`: the objective's keys,
    ref_model a HF directory): the reference pass (`reference_logps`, the ref_model's weights
    swapped in and out), then one micro-batch's loss, full gradients, metrics and the reference
    log-probs."""
    import deepspeed

    from ds_longctx.config import RunConfig
    from ds_longctx.run.engine import build_engine
    from ds_longctx.run.preference_step import reference_logps

    os.makedirs(out_dir, exist_ok=True)
    cfg = RunConfig(
        model="qwen3-tiny",
        seq_len=data.seq_len,
        sp_size=sp,
        dtype="fp32",
        seed=0,
        data="unused.jsonl",
        output_dir=out_dir,
        loss_chunk_rows=5,
        **train,
    )
    eng = build_engine(cfg)
    reference_logps(eng, data, out_dir, True, cfg.train.ref_model)
    res = eng.forward_backward([data.row(0)])
    grads = {
        n.removeprefix("model."): deepspeed.utils.safe_get_full_grad(p).detach().clone()
        for n, p in eng.module.named_parameters()
    }
    return {"loss": res.loss, "grads": grads, "metrics": res.extra, "ref": data.ref}


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
    task = torch.load(a.row, weights_only=False)  # the test's own file: rollouts are dataclasses
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
    for case in task.get("grpo_cases", ()):
        policy, ref_model = tiny_model(seed=0, attn="eager"), tiny_model(seed=1, attn="eager")
        loss, grads, _ = policy_side(policy, ref_model, task["grpo"], state, *case)
        for g in grads.values():
            dist.all_reduce(g, group=state.sp_group)
        out[("grpo", *case)] = {"loss": loss, "grads": grads}
    from ds_longctx.data.preference import PairRows
    from ds_longctx.data.rl_rows import RolloutRows

    beta, loss_type = task["cases"][0]
    n = len(task["row"]["input_ids"])
    pairs = PairRows(task["pairs"], n + (-n) % state.sp_size, 0, False, 0)
    here = os.path.dirname(a.out)
    out["engine"] = engine_side(
        pairs,
        state.sp_size,
        f"{here}/dpo",
        objective="dpo",
        beta=beta,
        loss_type=loss_type,
        ref_model=task["ref_dir"],
    )
    if "rollouts" in task:
        g = task["grpo"]
        rows = RolloutRows(task["rollouts"], g["input_ids"].numel(), 0, False, 0, g["max_len"])
        loss_type, beta = task["grpo_engine"]
        out["grpo_engine"] = engine_side(
            rows,
            state.sp_size,
            f"{here}/grpo",
            objective="grpo",
            beta=beta,
            loss_type=loss_type,
            epsilon=g["eps"],
            epsilon_high=g["eps_high"],
            ref_model=task["ref_dir"],
        )
    if state.rank == 0:
        torch.save(out, a.out)
    leave(0)


if __name__ == "__main__":
    main()
