"""The tables of docs/results.md and of the README's generated blocks, one function per question,
each from the current results files ({file stem: rows}, benchmarks/results_doc.load). A function
returns markdown, or "" where its file has no rows. Numbers are the files' (GB = 1e9 bytes, GiB =
2**30); a planner error is planned / measured - 1.
"""

from __future__ import annotations

from bench_planner import (
    GPU_TOL,
    HOST_TOL,
    steady_gpu_peak,
)  # the bars and the one-step rule: one home each
from results_disk_tier import disk_tier, disk_tier_rows  # noqa: F401 (SECTIONS)
from results_format import META, device, err, gb, meta, n, result_file, src, table
from results_preference import preference, preference_rows  # noqa: F401 (SECTIONS)
from results_recall import recall, recall_rows  # noqa: F401 (SECTIONS takes recall by name)
from results_rehearsal import (
    longest_rehearsed,
    model_label,
    rehearsal,  # noqa: F401 (SECTIONS takes it by name)
    rehearsed,
)

GIB = 2**30
TITLES = {
    "peers": "How fast: ds_longctx beside TRL and DeepSpeed ALST (`peers.jsonl`)",
    "hf_trainer": "The HF Trainer / TRL path on the same plan (`hf_trainer.jsonl`)",
    "longest_latest": (
        "How long: the planner's longest Qwen3-8B length per machine (`longest.jsonl`)"
    ),
    "longest_history": "How long: each planner's answer, oldest first (`longest.jsonl`)",
    "longest_runs": "How long: planned lengths that ran (`longest.jsonl`)",
    "published": "How long: what papers report (`longest.jsonl`)",
    "planner_accuracy": "How accurate the memory planner is (`planner_runs.jsonl`)",
    "planner_plans": (
        "Held-out whole plans: predicted and committed, then run (`planner_runs.jsonl`)"
    ),
    "planner_tables": "Runs measured against their plan (`planner_runs.jsonl`, kind `table`)",
    "planner_levers": "Lever runs that calibrated and validated the planner (`planner_runs.jsonl`)",
    "planner_unrun": "Predictions not run (`planner_runs.jsonl`)",
    "attention": "Attention kernels alone (`attention.jsonl`)",
    "levers": "Memory levers on and off, Qwen3 on 2 x H200 (`levers.jsonl`)",
    "profile": "Where a step's GPU time goes (`profile.jsonl`)",
    "chunked_loss": (
        "The loss alone: chunked against plain cross-entropy and others (`chunked_loss.jsonl`)"
    ),
    "long_range": "Long-range retrieval under SP, on CPU (`long_range.jsonl`)",
    "stdlib_corpus": "Real text: the Python standard library as a corpus (`stdlib_corpus.jsonl`)",
    "masked_step": (
        "What a masked row costs: a share of tokens trained against all (`masked_step.jsonl`)"
    ),
    "rehearsal": "Rehearsals: one GPU plays a rank of a larger world (`rehearsal.jsonl`)",
    "reshard": "A checkpoint's universal form for a resume on another layout (`reshard.jsonl`)",
    "recall": (
        "Recall far back: a real model on agent sessions, base and fine-tuned (`recall.jsonl`)"
    ),
    "preference": "Preference training on a GPU: DPO and GRPO runs (`preference.jsonl`)",
    "disk_tier": "Longer than host memory: the disk tier run against its plan (`disk_tier.jsonl`)",
}


def heading(name: str) -> str:
    return TITLES[name]


SYSTEMS = {
    "trl_fsdp2_cp": "TRL SFTTrainer, FSDP2 + context parallelism",
    "alst": "DeepSpeed ALST (accelerate, TRL)",
}
SHORT = {"trl_fsdp2_cp": "TRL", "alst": "ALST"}


def system(r: dict) -> str:
    if r["system"] != "ds_longctx":
        return SYSTEMS.get(r["system"], r["system"])
    obs = r["config"].get("observed", {})
    kernel = obs.get("attention", "?").split()[0]
    return (
        f"ds_longctx, attention {kernel}, fused_ops "
        f"{obs.get('run_config', {}).get('kernels', {}).get('fused_ops')}"
    )


def peers(d: dict) -> str:
    rows = []
    for r in d.get("peers", []):
        group = [
            p for p in d["peers"] if (p["session"], p["seq_len"]) == (r["session"], r["seq_len"])
        ]
        ref = next((p for p in group if p["system"] == "trl_fsdp2_cp"), None) or next(
            p for p in group if p["system"] == "alst"
        )
        rows.append(
            [
                model_name(r),
                r["gpus"],
                n(r["seq_len"]),
                system(r),
                f"{r['seconds_per_step']:.2f}",
                f"{r['seconds_per_step'] / ref['seconds_per_step']:.2f} x {SHORT[ref['system']]}",
                f"{r['mfu']:.1%}",
                gb(r["peak_gpu_bytes"]),
                gb(r["host_peak_bytes"]),
                *meta(r),
            ]
        )
    return (
        "Shipped geometries (random init), one sequence per step over the run's GPUs, median of "
        "the steps after "
        "the first; peak GPU: `max_memory_reserved`, max over ranks; host: Σ ranks' peak RSS. One "
        "session's systems ran one after another on one machine.\n\n"
        + table(
            [
                "model",
                "GPUs",
                "tokens",
                "system",
                "s/step",
                "vs",
                "MFU",
                "peak GPU GB",
                "host GB",
                *META,
            ],
            rows,
        )
    )


def hf_trainer(d: dict) -> str:
    rows = [
        [
            r["run"],
            n(r["seq_len"]),
            f"{r['seconds_per_step']:.2f}",
            gb(r["peak_gpu_bytes"]),
            gb(r["planned_gpu_bytes"]),
            gb(r["host_peak_bytes"]),
            f"{r['losses'][0]:.6f}",
            r.get("lora_rank", ""),
            *meta(r),
        ]
        for r in d.get("hf_trainer", [])
    ]
    return table(
        [
            "run",
            "tokens",
            "s/step",
            "peak GPU GB",
            "planned GB",
            "host GB",
            "step-1 loss",
            "LoRA rank",
            *META,
        ],
        rows,
    )


def machine(r: dict) -> str:
    return f"{r['gpus']} x {r['gpu_mem_gb']:g} GB + {r['host_mem_gb']:g} GB host"


def plain(d: dict) -> list:
    """The planned rows of a plain `plan --find_max_len` (no lever forced), oldest first."""
    return [
        r
        for r in d.get("longest", [])
        if r["kind"] == "planned" and r["flags"] == ["--find_max_len"]
    ]


def latest(d: dict) -> dict:
    """{machine: its newest plain planned row}."""
    return {machine(r): r for r in plain(d)}


def today(r: dict) -> str:
    same = "the same" if r.get("todays_plan") else n(r.get("todays_seq_len"))
    return f"{same} (at {r['checked_at']})" if r.get("checked_at") else ""


def longest_latest(d: dict) -> str:
    rows = [
        [
            m,
            n(r["seq_len"]),
            r["planner_commit"],
            today(r),
            r["planned_gpu_gb"],
            r["planned_host_gb"],
            r["placement"],
            r["levers"],
            r["date"],
            src(r),
        ]
        for m, r in latest(d).items()
    ]
    return table(
        [
            "machine",
            "longest tokens",
            "planner",
            "today's planner",
            "GB per GPU",
            "GB host",
            "placement",
            "levers",
            "date",
            "source",
        ],
        rows,
    )


def longest_history(d: dict) -> str:
    by: dict = {}
    for r in plain(d):
        by.setdefault(machine(r), []).append(
            f"{n(r['seq_len'])} ({r['planner_commit']}, {r['date']})"
        )
    return table(
        ["machine", "longest tokens by planner (commit, date)"],
        [[m, " -> ".join(v)] for m, v in by.items()],
    )


def longest_runs(d: dict) -> str:
    rows = [
        [
            r.get("model", "qwen3-8b") + (f" ({r['layers']} layers)" if r.get("layers") else ""),
            n(r["seq_len"]),
            machine(r),
            len(r["step_seconds"]),
            f"{r['seconds']:.1f}",
            gb(r["peak_gpu_bytes"]),
            gb(r["planned_reserved_bytes"]),
            err(r["planned_reserved_bytes"], r["peak_gpu_bytes"]),
            gb(r["host_peak_bytes"]),
            gb(r["planned_host_bytes"]),
            err(r["planned_host_bytes"], r["host_peak_bytes"]),
            r.get("caveat", ""),
            *meta(r),
        ]
        for r in d.get("longest", [])
        if r["kind"] == "run"
    ]
    return table(
        [
            "model",
            "tokens",
            "machine",
            "steps",
            "s (last step)",
            "reserved GB",
            "planned",
            "error",
            "host GB",
            "planned",
            "error",
            "caveat",
            *META,
        ],
        rows,
    )


def published(d: dict) -> str:
    rows = [
        [
            r["system"],
            r["model"],
            n(r["seq_len"]),
            r["machine"],
            r["paper"],
            f'"{r["quote"]}"',
            src(r),
        ]
        for r in d.get("longest", [])
        if r["kind"] == "published"
    ]
    return table(["system", "model", "tokens", "machine", "paper", "its words", "source"], rows)


def held(d: dict) -> list:
    """The held-out whole-plan runs: predicted, committed, then run on the plan predicted."""
    return [
        r
        for r in d.get("planner_runs", [])
        if r["kind"] == "plan"
        and r.get("measured_steps")
        and not r.get("plan_changed_since_prediction")
    ]


def plan_errors(r: dict) -> tuple:
    """(GPU error, host error or None): planned / measured - 1 of the reserved peak and of the host
    peak."""
    gpu = r["planned_reserved_bytes"] / max(r["measured_steps"]) - 1
    host = (
        r["planned_host_bytes"] / r["measured_host_bytes"] - 1
        if r.get("measured_host_bytes")
        else None
    )
    return gpu, host


def under_budget(r: dict) -> bool:
    """The run stayed under the budget its plan was made for (GPU: reserved + the plan's CUDA
    context; host: Σ RSS)."""
    gpu = (
        max(r["measured_steps"]) + r["planned_gpu_bytes"] - r["planned_reserved_bytes"]
        <= r["gpu_mem_gb"] * 1e9
    )
    return gpu and (not r.get("host_mem_gb") or r["measured_host_bytes"] <= r["host_mem_gb"] * 1e9)


def accuracy(d: dict) -> dict:
    runs = held(d)
    steady = [r for r in runs if steady_gpu_peak(r)]
    hosted = [r for r in runs if r.get("measured_host_bytes")]
    todays = [r for r in steady if r.get("todays_plan") and r in hosted]
    both = [
        r
        for r in todays
        if abs(plan_errors(r)[0]) <= GPU_TOL and abs(plan_errors(r)[1]) <= HOST_TOL
    ]
    return {
        "gpu_in": sum(abs(plan_errors(r)[0]) <= GPU_TOL for r in steady),
        "gpu_n": len(steady),
        "one_step": len(runs) - len(steady),
        "host_in": sum(abs(plan_errors(r)[1]) <= HOST_TOL for r in hosted),
        "host_n": len(hosted),
        "today_in": len(both),
        "today_n": len(todays),
        "over": sum(not under_budget(r) for r in runs),
        "n": len(runs),
        "checked_at": next((r["checked_at"] for r in runs if r.get("checked_at")), None),
    }


def planner_accuracy(d: dict) -> str:
    a = accuracy(d)
    return (
        f"Held-out whole plans (predicted and committed before they ran): {a['gpu_in']} of "
        f"{a['gpu_n']} inside "
        f"±{GPU_TOL:.0%} on the GPU ({a['one_step']} one-step run left out: its Adam moments did "
        "not exist yet), "
        f"{a['host_in']} of {a['host_n']} inside ±{HOST_TOL:.0%} on the host; {a['over']} of "
        f"{a['n']} went past "
        "the budget they were planned for. Of the runs whose plan today's planner still makes "
        f"(checked at {a['checked_at']}): {a['today_in']} of {a['today_n']} inside both bars.\n"
    )


def planner_plans(d: dict) -> str:
    rows = []
    for r in held(d):
        g, h = plan_errors(r)
        budget = f"{r['gpu_mem_gb']:g}" + (
            f" / {r['host_mem_gb']:g}" if r.get("host_mem_gb") else ""
        )
        rows.append(
            [
                r.get("model", "qwen3-8b"),
                n(r["seq_len"]),
                r["gpus"],
                budget,
                r["planner_commit"],
                r["commit"],
                gb(max(r["measured_steps"])),
                gb(r["planned_reserved_bytes"]),
                f"{g:+.1%}" + ("" if steady_gpu_peak(r) else " (1 step)"),
                gb(r.get("measured_host_bytes")),
                gb(r["planned_host_bytes"]),
                "" if h is None else f"{h:+.1%}",
                "yes" if under_budget(r) else "NO",
                "yes" if r.get("todays_plan") else "no",
                r["date"],
                device(r),
                src(r),
            ]
        )
    return table(
        [
            "model",
            "tokens",
            "GPUs",
            "budget GB (GPU / host)",
            "predicted at",
            "ran at",
            "reserved GB",
            "planned",
            "error",
            "host GB",
            "planned",
            "error",
            "under budget",
            "today's plan",
            "date",
            "device",
            "source",
        ],
        rows,
    )


def planner_tables(d: dict) -> str:
    rows = [
        [
            r["run"].replace("|", "/"),
            n(r["seq_len"]),
            r["placement"],
            r.get("fused_ops", ""),
            r["planner_commit"],
            r["commit"],
            r["measured_reserved_gb"],
            r["planned_reserved_gb"],
            err(r["planned_reserved_gb"], r["measured_reserved_gb"]),
            r.get("measured_host_gb", "rank 0 only"),
            r["planned_host_gb"],
            err(r["planned_host_gb"], r.get("measured_host_gb")),
            r["gpu_mem_gb"],
            *meta(r)[:1],
            device(r),
            src(r),
        ]
        for r in d.get("planner_runs", [])
        if r["kind"] == "table"
    ]
    return table(
        [
            "run",
            "tokens",
            "placement",
            "fused ops",
            "predicted at",
            "ran at",
            "reserved GB",
            "planned",
            "error",
            "host GB",
            "planned",
            "error",
            "GPU budget GB",
            "date",
            "device",
            "source",
        ],
        rows,
    )


def planner_levers(d: dict) -> str:
    rows = [
        [
            r.get("set"),
            r["model"],
            n(r["seq_len"]),
            r["variant"],
            f"{r['seconds']:.2f}",
            "" if r.get("mfu") is None else f"{r['mfu']:.1%}",
            r["measured_gpu_gib"],
            r["measured_host_gib"],
            *meta(r),
        ]
        for r in d.get("planner_runs", [])
        if r["kind"] == "levers" and "measured_gpu_gib" in r
    ]
    return (
        "Measured only here; `notebooks/memory_plan.ipynb` sets them against today's planner.\n\n"
        + table(
            [
                "set",
                "model",
                "tokens",
                "variant",
                "s/step",
                "MFU",
                "reserved GiB",
                "host GiB (Σ ranks)",
                *META,
            ],
            rows,
        )
    )


def planner_unrun(d: dict) -> str:
    rows = [
        [
            r["spec"],
            r.get("model", "qwen3-8b"),
            r["gpus"],
            r["planner_commit"],
            gb(r.get("planned_reserved_bytes")),
            gb(r.get("planned_host_bytes")),
            r.get("placement", r.get("error", "")),
            "yes" if r.get("todays_plan") else "no",
            r["date"],
            src(r),
        ]
        for r in d.get("planner_runs", [])
        if r["kind"] == "prediction"
    ]
    return table(
        [
            "plan (seq_len:GPU GB:flags)",
            "model",
            "GPUs",
            "planner",
            "reserved GB",
            "host GB",
            "placement",
            "today's plan",
            "date",
            "source",
        ],
        rows,
    )


def attention(d: dict) -> str:
    """Softmax attention kernels, and a gated DeltaNet layer's (FLA's gated delta rule and conv1d,
    the torch conv1d: `bench_linear_attention.py`, heads = key / value heads per rank, d = 128) at
    the same lengths."""
    rows = [
        [
            n(r["seq_len"]),
            r["backend"],
            f"{r['heads']} / {r['kv_heads']} x {r['head_dim']}",
            r.get("fwd_tflops"),
            r.get("bwd_tflops"),
            f"{r['fwd_ms']:.1f}",
            f"{r['bwd_ms']:.1f}",
            r.get("max_abs_diff_vs_other"),
            r.get("peak_gb"),
            *meta(r),
        ]
        for r in d.get("attention", [])
    ]
    return (
        "Softmax attention: q / kv heads. The gated DeltaNet rows (fla_*, torch_conv1d): kv heads "
        "are its key heads and heads its value heads per rank.\n\n"
        + table(
            [
                "tokens",
                "kernel",
                "q / kv heads x d",
                "forward TFLOP/s",
                "backward TFLOP/s",
                "forward ms",
                "backward ms",
                "max abs diff (bf16)",
                "peak GB",
                *META,
            ],
            rows,
        )
    )


def levers(d: dict) -> str:
    rows = []
    for r in d.get("levers", []):
        alloc = r.get("peak_allocated_gib", (r.get("peak_gpu_allocated_bytes") or 0) / GIB)
        reserved = r.get("peak_reserved_gib", (r.get("peak_gpu_bytes") or 0) / GIB)
        rss = r.get("max_rank_rss_gib", (r.get("host_rss_bytes") or 0) / GIB)
        rows.append(
            [
                r["model"],
                n(r["seq_len"]),
                r["variant"],
                r["step"],
                f"{r['seconds']:.2f}",
                "" if r.get("mfu") is None else f"{r['mfu']:.1%}",
                f"{alloc:.2f}",
                f"{reserved:.2f}",
                f"{rss:.2f}",
                *meta(r),
            ]
        )
    return (
        "One engine per file, the variants toggled in place one after another (their reserved "
        "memory keeps "
        "earlier variants' cache: compare allocated); step 1 of a variant builds its buffers.\n\n"
        + table(
            [
                "model",
                "tokens",
                "variant",
                "step",
                "s",
                "MFU",
                "allocated GiB",
                "reserved GiB",
                "max rank RSS GiB",
                *META,
            ],
            rows,
        )
    )


def profile(d: dict) -> str:
    rows = []
    for r in d.get("profile", []):
        ms, step = r["ms"], r["steps"][-1]
        rows.append(
            [
                r["label"],
                r["placement"],
                f"{step['seconds']:.2f}",
                *(
                    f"{ms[k] / 1e3:.2f}"
                    for k in (
                        "attn_fwd",
                        "attn_bwd",
                        "matmul",
                        "all_to_all",
                        "other",
                        "gpu_busy_ms",
                    )
                ),
                step["peak_reserved_gib"],
                *meta(r),
            ]
        )
    return (
        "Step 2 profiled on rank 0, Qwen3-8B geometry, 131,072 tokens, SP=2; kernel seconds by "
        "category (each "
        "category an upper bound: `sessions/2026-11-30/profile_131072_2026-11-30.md`).\n\n"
        + table(
            [
                "run",
                "placement",
                "step s",
                "attention fwd s",
                "attention bwd s",
                "matmul s",
                "all-to-all s",
                "other s",
                "GPU busy s",
                "peak reserved GiB",
                *META,
            ],
            rows,
        )
    )


def chunked_loss(d: dict) -> str:
    rows = [
        [
            n(r["N"]),
            r["method"],
            "" if r.get("time_ms") is None else f"{r['time_ms']:.0f}",
            "" if r.get("peak_gib") is None else f"{r['peak_gib']:.2f}",
            "" if r.get("predicted_gib") is None else f"{r['predicted_gib']:.2f}",
            "" if r.get("weight_grad_rel_err") is None else f"{r['weight_grad_rel_err']:.1e}",
            r.get("grad_output_ok", ""),
            r.get("status") or "",
            *meta(r),
        ]
        for r in d.get("chunked_loss", [])
    ]
    return table(
        [
            "rows N",
            "method",
            "ms",
            "peak GiB",
            "planned GiB",
            "weight-grad rel err",
            "grad_output ok",
            "status",
            *META,
        ],
        rows,
    )


def long_range(d: dict) -> str:
    rows = [
        [
            r["name"],
            r["settings"]["steps"] + r["settings"].get("then_all", 0),
            r["settings"]["seq_len"],
            f"{r['evals'][-1]['accuracy']:.3f}",
            f"{r['chance']:.3f}",
            r.get("world", ""),
            *meta(r),
        ]
        for r in d.get("long_range", [])
    ]
    return table(
        ["run", "steps", "seq_len", "accuracy at the end", "chance", "processes", *META], rows
    )


def stdlib_corpus(d: dict) -> str:
    rows = [
        [
            r["run"],
            f"Python {r['python']}",
            f"{n(r['documents'])} ({r['held_out_documents']} held out)",
            n(r["tokens"]),
            f"{r['longest_document']} ({n(r['longest_tokens'])})",
            f"{r['layers']} x {r['hidden_size']}",
            n(r["seq_len"]),
            r["steps"],
            r["seconds_per_step"],
            f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}",
            f"{r['evals'][0]['eval_loss']:.3f} -> {r['evals'][-1]['eval_loss']:.3f}",
            f"{r['evals'][0]['far_minus_near']:+.3f} -> {r['evals'][-1]['far_minus_near']:+.3f}",
            *meta(r),
        ]
        for r in d.get("stdlib_corpus", [])
    ]
    return table(
        [
            "run",
            "corpus",
            "documents",
            "tokens",
            "longest document (tokens)",
            "layers x hidden",
            "seq_len",
            "steps",
            "s/step",
            "train loss",
            "eval loss",
            "far half - near half",
            *META,
        ],
        rows,
    )


def masked_step(d: dict) -> str:
    """Each pair of `bench_masked_step.py` runs: the masked run, the full one, and their ratio."""
    rows = []
    runs = [r for r in d.get("masked_step", []) if "run" in r]
    for r in runs:
        ratio = next(
            (
                x["masked_over_full"]
                for x in d["masked_step"]
                if "masked_over_full" in x
                and x["source"].split(":")[0] == r["source"].split(":")[0]
            ),
            None,
        )
        rows.append(
            [
                r["model"],
                n(r["seq_len"]),
                r["run"],
                f"{r['share']:.0%}",
                n(r["trained_tokens"]),
                f"{r['seconds_per_step']:.2f}",
                gb(r["peak_gpu_bytes"]),
                f"{ratio:.3f}" if ratio is not None and r["run"] == "masked" else "",
                *meta(r),
            ]
        )
    if not rows:
        return ""
    return (
        "`ds-longctx train` on the same random ids twice: labels that train a share of each row "
        "(512-token spans) and every token trained; median of the steps after the first.\n\n"
        + table(
            [
                "model",
                "tokens",
                "run",
                "trained share",
                "trained tokens/step",
                "s/step",
                "peak GPU GB",
                "masked / full",
                *META,
            ],
            rows,
        )
    )


def reshard(d: dict) -> str:
    """Each `bench_reshard.py` run: the checkpoint converted, its seconds and peak host RSS, the
    whole model's time."""
    rows = [
        [
            r["geometry"],
            f"{r['layers']} of {r['of_layers']}",
            r["params"] and n(r["params"]),
            gb(r["source_bytes"]),
            f"{r['seconds']:.1f}",
            f"{r['peak_host_rss_gb']:.2f}",
            f"{r['whole_predicted_s']:.0f}",
            *meta(r),
        ]
        for r in d.get("reshard", [])
    ]
    if not rows:
        return ""
    return (
        "`ds-longctx checkpoint reshard` of a ZeRO-3 checkpoint over 8 ranks cut to its first "
        "decoder layers (the "
        "whole model needs its size twice on disk), files checked and hashed included; the whole "
        "model's seconds "
        "predicted by bytes. Host memory is bounded by the largest parameter's fragment, not the "
        "depth.\n\n"
        + table(
            [
                "geometry",
                "layers",
                "parameters",
                "GB",
                "s",
                "peak host RSS GB",
                "whole model s (predicted)",
                *META,
            ],
            rows,
        )
    )


def ran(d: dict, r: dict) -> tuple:
    """(", ran k steps (s the last)", the run's row) where a planned length ran on its machine (a
    longest.jsonl run, else a held-out plan run of planner_runs.jsonl); ("", None) where it did
    not."""
    key = (r["seq_len"], r["gpus"], r["gpu_mem_gb"], r["host_mem_gb"])
    runs = [
        x
        for x in (*[x for x in d.get("longest", []) if x["kind"] == "run"], *held(d))
        if (x["seq_len"], x["gpus"], x["gpu_mem_gb"], x.get("host_mem_gb")) == key
    ]
    if not runs:
        return "", None
    steps = runs[0]["step_seconds"]
    return (
        f", ran {len(steps)} step{'s' if len(steps) > 1 else ''} ({steps[-1]:.0f} s the last)",
        runs[0],
    )


def other_longest(d: dict) -> list:
    """README rows: per model other than Qwen3-8B and machine, its newest run at a planned longest
    length (its depth named where reduced), peaks beside the plan's."""
    newest = {
        (r["model"], machine(r)): r
        for r in d.get("longest", [])
        if r["kind"] == "run" and r.get("model", "qwen3-8b") != "qwen3-8b"
    }  # file order: newest last
    rows = []
    for (model, m), r in newest.items():
        done, total = (r.get("layers") or "1/1").split("/")
        depth = "" if done == total else f", {done} of {total} layers"
        rows.append(
            [
                f"longest {model_label(model)}, {m}",
                f"planned, then run (measured{depth})",
                f"{n(r['seq_len'])} tokens, {gb(r['peak_gpu_bytes'])} GB peak GPU (plan "
                f"{gb(r['planned_reserved_bytes'])}), {gb(r['host_peak_bytes'])} GB host (plan "
                f"{gb(r['planned_host_bytes'])})",
                "",
                result_file("longest"),
            ]
        )
    return rows


def readme(d: dict) -> str:
    """The README's one table: speed and GPU memory beside TRL and ALST, the longest lengths, the
    rehearsals' step times, the planner's accuracy; each row says whether its figure was measured,
    planned or predicted."""
    runs = {(r["config"]["model"], r["gpus"], r["seq_len"]) for r in d.get("peers", [])}
    rows = [
        speed_row(d, *k)
        for k in sorted(runs, key=lambda k: (k[0] != "qwen3-8b", k[0], -k[1], k[2]))
    ]
    papers = {
        (r["gpus"], r.get("gpu_mem_gb")): r
        for r in d.get("longest", [])
        if r["kind"] == "published" and "seconds_per_step" not in r
    }  # a longest length, not a step time
    for m, r in latest(d).items():
        paper = papers.get(
            (r["gpus"], r["gpu_mem_gb"])
        )  # a paper's figure beside the same GPUs only
        text, run = ran(d, r)
        rows.append(
            [
                f"longest Qwen3-8B, {m}",
                "planned" + (", then run (measured)" if run else ""),
                f"{n(r['seq_len'])} tokens" + text,
                f"{paper['system']} paper: {paper['seq_len'] / 1e6:g}M ({paper['model']}, "
                f"{paper['machine']}), published"
                if paper
                else "",
                result_file(
                    "longest", *(["planner_runs"] if run and run["kind"] == "plan" else [])
                ),
            ]
        )
    rows += other_longest(d) + rehearsed(d) + longest_rehearsed(d) + recall_rows(d)
    rows += preference_rows(d) + disk_tier_rows(d)
    a = accuracy(d)
    rows.append(
        [
            "planner, held-out plans run",
            "measured against the plan",
            f"{a['gpu_in']} of {a['gpu_n']} within "
            f"±{GPU_TOL:.0%} GPU, {a['host_in']} of {a['host_n']} within ±{HOST_TOL:.0%} host",
            f"{a['over']} of {a['n']} past their budget",
            result_file("planner_runs"),
        ]
    )
    return table(["", "how", "ds_longctx", "beside it", "file"], rows)


def model_name(r: dict) -> str:
    """A peers row's shipped geometry as the model card spells it (`qwen3-8b` -> `Qwen3-8B`)."""
    return model_label(r["config"]["model"])


def speed_row(d: dict, model: str, gpus: int, seq: int) -> list:
    """The fastest ds_longctx run of `model` on `gpus` GPUs at `seq` tokens beside each peer's,
    seconds per step and peak GPU memory (reserved, max over ranks) each; where ours holds more GPU
    memory, its placement says why: the plan spends the budget on speed."""
    at = [
        r
        for r in d["peers"]
        if (r["config"]["model"], r["gpus"], r["seq_len"]) == (model, gpus, seq)
        and not r.get("error")
    ]
    ours = min((r for r in at if r["system"] == "ds_longctx"), key=lambda r: r["seconds_per_step"])
    peers = [r for r in at if r["system"] != "ds_longctx"]
    placement = (
        ours["config"].get("observed", {}).get("run_config", {}).get("memory", {}).get("placement")
    )
    more = placement and all(ours["peak_gpu_bytes"] > p["peak_gpu_bytes"] for p in peers)
    return [
        f"s/step, {model_name(ours)}, {n(seq)} tokens, {device(ours)}",
        "measured",
        f"{ours['seconds_per_step']:.1f} s, {gb(ours['peak_gpu_bytes'])} GB peak GPU"
        + (
            f" (by design: its plan fills the GPU budget for speed, placement {placement})"
            if more
            else ""
        ),
        "; ".join(
            f"{SYSTEMS[r['system']].split(' (')[0]}: {r['seconds_per_step']:.1f} s, "
            f"{gb(r['peak_gpu_bytes'])} GB peak GPU"
            for r in peers
        ),
        result_file("peers"),
    ]


# the function that writes each docs/results.md section (TITLES, in order) and the README's table
SECTIONS = {name: globals()[name] for name in (*TITLES, "readme")}
