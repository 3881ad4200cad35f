"""Worker for test_eval.py: build the engine, evaluate held-out synthetic rows, rank 0 saves what it
saw.

torchrun --nproc_per_node N tests/distributed/eval_worker.py --sp 2 --rows 3 --out result.pt
[--memory] [--set k=v]

Saves the EvalResult's fields, the eval rows' input_ids and labels (from the same `eval_batches` the
engine read), the model's training flag after evaluating, the number of tensors autograd saved for a
backward during the evaluation, and with --memory the peak of CPU bytes allocated during evaluations
of 2 and of 8 rows, and of 8 rows when something is kept per row (`peak_allocated`: torch.profiler's
memory events, the allocator's own count). The profiler sees only the frees made on the thread it
profiles: under SP, gloo's threads free the all-to-all buffers, which it would count as kept; the
memory runs are single-process (the loop is the same at any sp).
"""

import argparse
import dataclasses

import torch


def peak_allocated(fn) -> int:
    """Peak of CPU bytes allocated while `fn()` runs, above what was allocated when it started."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # each op's own allocations net of its own frees, and the frees outside any op ([memory]
    # events), in time order
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sp", type=int, required=True)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--micro_batch", type=int, default=1)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument(
        "--set", action="append", default=[], help="run-config override key=value (YAML value)"
    )
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import yaml

    from ds_longctx.config import RunConfig
    from ds_longctx.data import build_eval_data
    from ds_longctx.run.engine import build_engine
    from ds_longctx.run.evaluate import eval_batches, evaluate

    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    cfg = RunConfig(
        **{
            "model": "qwen3-tiny",
            "seq_len": a.length,
            "sp_size": a.sp,
            "dtype": "fp32",
            "seed": 0,
            "micro_batch": a.micro_batch,
            "eval_data": "synthetic",
            "eval_rows": a.rows,
            "eval_buckets": a.buckets,
            "loss_chunk_rows": 16,
            **overrides,
        }
    )
    eng = build_engine(cfg)
    st = eng.state
    held = build_eval_data(cfg, eng.model.config)
    saved = []  # every tensor autograd would keep for a backward during the evaluation
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        res = evaluate(eng, held, a.rows, a.buckets)
    out = dataclasses.asdict(res)
    per_replica = [
        list(eval_batches(held, a.rows, a.micro_batch, r, st.dp_size)) for r in range(st.dp_size)
    ]
    batches = [
        b for k in zip(*per_replica) for b in k
    ]  # in sample order: batch k of replica r, by k then r
    out["input_ids"] = torch.cat([b[0] for b in batches])
    out["labels"] = torch.cat([b[2] if b[2] is not None else b[0] for b in batches])
    out["training_after"] = eng.module.training and all(m.training for m in eng.module.modules())
    out["saved_for_backward"] = len(saved)
    if a.memory:
        out["peak_2"] = peak_allocated(lambda: evaluate(eng, held, 2, a.buckets))
        out["peak_8"] = peak_allocated(lambda: evaluate(eng, held, 8, a.buckets))
        # the meter sees an evaluation that keeps something per row: the same 8 rows, each batch's
        # last hidden state kept (what a forward that kept activations would hold, and far less than
        # it)
        kept = []
        hook = eng.model.base_model.register_forward_hook(
            lambda m, args, output: kept.append(output[0])
        )
        out["peak_8_keeping_rows"] = peak_allocated(lambda: evaluate(eng, held, 8, a.buckets))
        hook.remove()
        out["kept_bytes_per_row"] = kept[0].numel() * kept[0].element_size() // a.micro_batch
    if st.rank == 0:
        torch.save(out, a.out)
    # leave together, groups torn down (as grad_worker.py does)
    from ds_longctx.parallel.parallel_state import leave

    leave(0)  # barrier, groups torn down, no teardown


if __name__ == "__main__":
    main()
