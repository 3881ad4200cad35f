"""`ds-longctx plan`'s options: its argparse parser (plan/write.py runs the command,
plan/plan_args.py checks the values). The options are added in their --help order: the model and the
machine, then the levers a user may force, then LoRA and what to write.

    a = parser(write.__doc__).parse_args(argv)
"""

from __future__ import annotations

import argparse

from ds_longctx.levers.lora import DEFAULT_TARGETS
from ds_longctx.plan.disk_args import add_disk_options
from ds_longctx.plan.objective_args import add_objective_options
from ds_longctx.plan.plan_args import tokens
from ds_longctx.plan.step_time import GPU_RATES


def parser(description: str = "") -> argparse.ArgumentParser:
    """The parser of `ds-longctx plan`, with `description` (the command's documentation) atop its
    --help."""
    p = argparse.ArgumentParser(
        prog="ds-longctx plan",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _machine_options(p)
    _lever_options(p)
    _lora_and_output_options(p)
    return p


def _machine_options(p: argparse.ArgumentParser) -> None:
    """The model, the length, the machine (GPUs, nodes, memory, GPU kind) and the headroom."""
    p.add_argument(
        "--model", required=True, help="shipped geometry (qwen3-8b, ...) or an HF checkpoint dir"
    )
    p.add_argument(
        "--seq_len", type=tokens, help="tokens per sequence (required unless --find_max_len)"
    )
    p.add_argument("--gpus", type=int, required=True, help="GPUs per node (one process each)")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="nodes of --gpus GPUs each (default 1); SP groups stay inside "
        "a node, data parallelism runs across nodes",
    )
    p.add_argument(
        "--gpu_mem_gb",
        type=float,
        default=80.0,
        help="memory per GPU in GB (1e9 bytes); default 80",
    )
    p.add_argument(
        "--host_mem_gb",
        type=float,
        default=None,
        help="host RAM per node in GB; default 128 per GPU up to 560 (the H200 machines here: "
        "1 GPU 128, 2: 256, 4: 512, 8: 560)",
    )
    p.add_argument(
        "--sp_size",
        type=int,
        default=None,
        help="pin sp_size (default: the largest valid that divides --gpus)",
    )
    p.add_argument(
        "--gpu",
        default=None,
        type=str.lower,
        help="the GPU kind the step time is counted for, at its measured or published kernel rates "
        f"({', '.join(sorted(GPU_RATES))}: plan/step_time.py GPU_RATES; another kind: the time is "
        "unknown); default: this machine's GPU (nvidia-smi), none on a machine without one",
    )
    p.add_argument(
        "--headroom", type=float, default=0.9, help="fraction of GPU and host memory a plan may use"
    )


def _lever_options(p: argparse.ArgumentParser) -> None:
    """The levers a user may force on (the search picks each by itself where nothing fits without
    it)."""
    p.add_argument(
        "--no_attention_cache",
        action="store_true",
        help="plan only the fewest offloaded checkpoints (no attention cache): for a GPU without "
        "FlashAttention 4, where cached layers would recompute anyway. By default the plan keeps "
        "the attention output of as many layers as fit (on the GPU, else in host memory) so the "
        "checkpoint recompute skips attention",
    )
    p.add_argument(
        "--pinned_pool",
        action="store_true",
        help="offloaded checkpoints in our exact-size pinned pool (memory.pinned_pool) instead of "
        "DeepSpeed's power-of-two buffers: the same data in up to half the host memory. The search "
        "picks it by itself where the host needs it; this forces it on",
    )
    p.add_argument(
        "--tiled_layer",
        action="store_true",
        help="every decoder layer's token-wise work (norms, projections, rotary, MLP) in sequence "
        "tiles "
        "(memory.tiled_layer): a smaller per-layer working set, so longer lengths fit. The search "
        "picks it by itself where nothing fits without it; this forces it on. Not with --lora_rank",
    )
    p.add_argument(
        "--attn_bwd_head_groups",
        type=int,
        default=1,
        help="the attention backward over this many groups of KV heads, one at a time "
        "(memory.attn_bwd_head_groups): the kernel's fp32 accumulators of one group. The search "
        "picks it by itself (one group per KV head) where nothing fits without it; this forces it",
    )
    p.add_argument(
        "--offload_params",
        action="store_true",
        help="the bf16 parameters in pinned host memory too (optimizer.offload_params, DeepSpeed "
        "offload_param). The search picks it by itself after the optimizer offload where nothing "
        "fits without it; this forces it on. Not with --lora_rank or --optimizer_offload_ratio",
    )
    p.add_argument(
        "--optimizer_offload_ratio",
        type=float,
        default=None,
        help="when the plan offloads the optimizer: the share of its state on the host (DeepSpeed "
        "partial "
        "offload; the rest steps on the GPU). Not given: all of it, and the search picks a smaller "
        "share by itself only where the whole optimizer on the host breaks its budget. Given (1 "
        "included): this share, fixed; 0 keeps the optimizer on the GPU",
    )


def _lora_and_output_options(p: argparse.ArgumentParser) -> None:
    """LoRA, --find_max_len and the directory the plan's files go to."""
    p.add_argument(
        "--lora_rank",
        type=int,
        default=0,
        help="plan a LoRA run (lora section): adapters of this rank on the default target modules; "
        "the "
        "optimizer state, master weights and grads are the adapters' only (0: full fine-tuning)",
    )
    p.add_argument(
        "--lora_target_modules",
        default=None,
        help="with --lora_rank: the Linears that get adapters, "
        f"comma-separated suffixes or all-linear (default {','.join(DEFAULT_TARGETS)})",
    )
    add_disk_options(p)
    add_objective_options(p)
    p.add_argument(
        "--find_max_len",
        action="store_true",
        help="report the longest seq_len that fits (and plan it when --out is given)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory to write run.yaml, ds_config.json, accelerate.yaml, "
        "launch.txt, plan.txt (and with --nodes > 1 hostfile) into",
    )
