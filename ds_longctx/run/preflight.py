"""Every check of a run that reads no dataset and starts nothing: called before any process group
exists (by `ds-longctx train` before it starts workers, and by each rank).

    shape, resume_meta = preflight(cfg, world_size)  # ValueError naming the value and the fix

Rules: the cheap checks come first, each refusal names the fix, and nothing is written (a refused
run leaves no output). The order of the checks: docs/design/run.md."""

from __future__ import annotations

import copy
import logging
import os
from typing import TYPE_CHECKING

import psutil
import torch

from ds_longctx import data
from ds_longctx.checkpoint import layout_change, resume
from ds_longctx.checkpoint.layout import META, ckpt_root
from ds_longctx.data.synthetic import SyntheticRetrieval
from ds_longctx.levers.disk_tier import nvme_space_problem
from ds_longctx.levers.fused_ops import check_fused_ops
from ds_longctx.levers.gpu_budget import planning_gpu_gb
from ds_longctx.levers.lora import check_model_targets
from ds_longctx.levers.rope import apply_rope_scaling, rope_problem
from ds_longctx.levers.tiled_layer import check_tiled_layer
from ds_longctx.parallel import attention, gated_delta, kernel_rules, ulysses
from ds_longctx.parallel.disk import free_bytes, size_text
from ds_longctx.parallel.parallel_state import check_planned_world, check_sp_size, local_world_size
from ds_longctx.parallel.units import GB
from ds_longctx.plan.geometry import ModelGeometry, as_geometry
from ds_longctx.plan.hf_fields import window_problem
from ds_longctx.plan.planner import disk_checkpoint_bytes
from ds_longctx.plan.shape import RunShape
from ds_longctx.run.answer_loss import answer_sessions
from ds_longctx.run.metrics_log import check_reporter
from ds_longctx.run.model import load_hf_config, model_class, weights_problem
from ds_longctx.run.moe_checks import check_moe
from ds_longctx.run.placement_plan import run_placement
from ds_longctx.run.preference_step import dpo_model_problem, stored_reference_problem
from ds_longctx.run.ref_weights import ref_model_problem

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")


def _world_checks(cfg: RunConfig, text, world_size: int, per_node: int) -> None:
    """The planned world, the heads against SP and the kernels' rules."""
    check_planned_world(cfg.parallel.nodes, cfg.parallel.gpus_per_node, world_size, per_node)
    kernel_rules.check_attention_heads(
        text.num_attention_heads,
        text.num_key_value_heads or text.num_attention_heads,
        f"model={cfg.model.name!r}",
    )
    check_sp_size(
        cfg.parallel.sp_size,
        world_size,
        text.num_attention_heads,
        text.num_key_value_heads,
        per_node=None if cfg.parallel.sp_across_nodes else per_node,
        across_fix=" per node, or set sp_across_nodes: true to let SP groups span nodes",
        linear_heads=kernel_rules.linear_heads(text),
    )
    attention.resolve_backend(cfg.kernels.attn_backend, attention.model_head_dim(text))
    if kernel_rules.linear_heads(text) is not None:  # a hybrid model's gated DeltaNet (FLA's rule)
        gated_delta.resolve_linear_backend(cfg.kernels.linear_attn_backend)
    kernel_rules.check_head_groups(
        cfg.memory.attn_bwd_head_groups, text.num_key_value_heads, cfg.parallel.sp_size
    )
    check_fused_ops(cfg.kernels.fused_ops, torch.cuda.is_available())


def validate(cfg: RunConfig, world_size: int, per_node: int | None = None) -> RunShape:
    """Every check the engine needs that allocates nothing. Returns the run's shape: the model read
    once, the placement planned for gpu_budget_gb. `per_node`: processes per node (None: from the
    launcher's environment, `local_world_size`)."""
    # the model families and sizes `plan` knows: one home
    geom = ModelGeometry.from_name_or_path(cfg.model.name)
    if problem := window_problem(cfg.model.name, geom.sliding_window, cfg.train.seq_len):
        raise ValueError(problem)
    rope = (geom.rope_type, geom.trained_context, cfg.train.seq_len, cfg.model.rope_scaling)
    if problem := rope_problem(cfg.model.name, *rope) or weights_problem(cfg.model.name):
        raise ValueError(problem)
    hf_cfg = load_hf_config(cfg.model.name)
    text = hf_cfg.get_text_config()
    per_node = local_world_size(world_size) if per_node is None else per_node
    _world_checks(cfg, text, world_size, per_node)
    if cfg.logging.memory_snapshot_steps and not torch.cuda.is_available():
        raise ValueError(
            f"memory_snapshot_steps={cfg.logging.memory_snapshot_steps} records the CUDA allocator "
            f"and needs a CUDA GPU; set memory_snapshot_steps: 0 on CPU"
        )
    ulysses.check_wrappable_class(model_class(hf_cfg), hf_cfg)
    if problem := dpo_model_problem(cfg.train, text) or ref_model_problem(cfg, hf_cfg):
        raise ValueError(problem)
    if cfg.memory.tiled_layer:  # the tiles compute from plain Linear weights: a meta model's
        check_tiled_layer(model_class(hf_cfg), hf_cfg)
    # the placement plan's rules for this model (`auto` without gpu_budget_gb: the engine's GPU)
    budget = cfg.memory.gpu_budget_gb
    placement = run_placement(cfg, text.num_hidden_layers, world_size, budget, geom)
    shape = RunShape(
        geom, hf_cfg, cfg.train.seq_len, cfg.parallel.sp_size, world_size, per_node, placement
    )
    check_moe(cfg, shape)  # a mixture of experts: its coefficient, untileable blocks, the budget
    if cfg.lora.rank:  # the LoRA targets against the model's Linears (a meta-device model)
        check_model_targets(model_class(hf_cfg), hf_cfg, cfg.lora.target_modules)
    return shape


def rope_coverage(cfg: RunConfig, hf_config) -> None:
    """Refuse a seq_len beyond the positions YaRN is set for (an explicit rope_parameters dict, or a
    checkpoint that already carries YaRN with rope_scaling='none'). Works on a copy: the engine
    applies it itself."""
    hf = copy.deepcopy(hf_config)
    quiet = log.disabled
    log.disabled = True
    try:
        apply_rope_scaling(hf, cfg.train.seq_len, cfg.model.rope_scaling)
    finally:
        log.disabled = quiet
    rp = getattr(hf, "rope_parameters", None) or {}
    seq_len = cfg.train.seq_len
    if rp.get("rope_type") == "yarn":
        covered = float(rp["factor"]) * int(rp["original_max_position_embeddings"])
        if covered < seq_len:
            need = seq_len / int(rp["original_max_position_embeddings"])
            raise ValueError(
                f"seq_len={seq_len} is beyond what YaRN is set for: factor {rp['factor']} x "
                f"original_max_position_embeddings {rp['original_max_position_embeddings']} = "
                f"{int(covered)} positions; use factor >= {need:g} in rope_scaling, "
                f"rope_scaling: auto (sets it from seq_len), or seq_len <= {int(covered)}"
            )


BATCH_BYTES_PER_TOKEN = (
    3 * 8
)  # input_ids, labels and position_ids of a step's rows, int64 (data/rows.Batch)


def host_problem(cfg: RunConfig) -> str | None:
    """What this machine cannot hold or run whatever the plan (None: nothing): one step's rows on
    each rank ( micro_batch x seq_len tokens, BATCH_BYTES_PER_TOKEN each) beyond the host's RAM, or
    more tokenizing processes than cores (datasets.map forks every one)."""
    tokens = cfg.train.micro_batch * cfg.train.seq_len
    need, ram = tokens * BATCH_BYTES_PER_TOKEN, psutil.virtual_memory().total
    if need > ram:
        return (
            f"micro_batch={cfg.train.micro_batch} x seq_len={cfg.train.seq_len} = {tokens:,} "
            "tokens per step: its "
            f"ids, labels and positions alone take {need / 1e9:,.1f} GB on each rank, more than "
            "this machine's "
            f"{ram / 1e9:,.1f} GB of RAM; lower seq_len or micro_batch (`ds-longctx plan` gives "
            "what fits)"
        )
    cores = os.cpu_count() or 1
    if cfg.data.tokenize_num_proc > cores:
        return (
            f"tokenize_num_proc={cfg.data.tokenize_num_proc}: this machine has {cores} CPU cores "
            f"and datasets starts one process each; use tokenize_num_proc <= {cores}"
        )
    return None


def cpu_model_problem(cfg: RunConfig, ram: int, geom: ModelGeometry | None = None) -> str | None:
    """Without a GPU every rank's share of the training state is in host RAM, the shares together at
    least the weights and, unless LoRA freezes them, their grads and Adam's two moments (16 bytes a
    parameter in fp32, as in bf16 with its fp32 master): more than the machine holds is refused
    (None: it may fit). `geom`: the model's (`RunShape.geometry`), else read here."""
    per_param = (2 if cfg.model.dtype == "bf16" else 4) if cfg.lora.rank else 16
    params = as_geometry(cfg.model.name if geom is None else geom).num_params
    if (need := params * per_param) <= ram:
        return None
    return (
        f"model={cfg.model.name!r} on CPU (no CUDA GPU here): its {params / 1e9:,.2f}B parameters "
        f"take >= {need / 1e9:,.1f} GB of host RAM across the ranks ({per_param} bytes each: "
        f"{'the frozen weights' if cfg.lora.rank else 'weights, grads and Adam state'}), more than "
        "this machine's "
        f"{ram / 1e9:,.1f} GB; train it on GPUs (`ds-longctx plan` says what fits), or a smaller "
        f"model here (e.g. --model qwen3-tiny)"
    )


def disk_problem(cfg: RunConfig, geom: ModelGeometry, resume_meta: dict | None) -> str | None:
    """Where save_every > 0: the space the run's checkpoints take at once (keep_checkpoints + 1
    while a save is written; keep 0 keeps every one; plan/planner.disk_checkpoint_bytes each) beyond
    what output_dir's filesystem has free, less what the checkpoints already there hold (a resume).
    None: it fits, or nothing is saved periodically."""
    ck, steps = cfg.checkpoint, cfg.train.steps
    if not ck.save_every:
        return None
    cuda_bf16 = cfg.model.dtype == "bf16" or (
        cfg.model.dtype == "auto" and torch.cuda.is_available()
    )
    one = disk_checkpoint_bytes(geom, cfg.lora.rank, cfg.lora.target_modules, 2 if cuda_bf16 else 4)
    start = resume_meta["step"] if resume_meta else 0
    saves = steps // ck.save_every - start // ck.save_every + (1 if steps % ck.save_every else 0)
    root = ckpt_root(cfg.train.output_dir)
    held = sum(1 for p in root.glob("step*") if (p / META).is_file()) if resume_meta else 0
    at_once = min(ck.keep + 1, held + saves) if ck.keep else held + saves
    needed, free = max(at_once - held, 1) * one, free_bytes(cfg.train.output_dir)
    if free is None or needed <= free:
        return None
    fits = free // one  # whole checkpoints that fit beside the ones held
    fix = (
        f"set keep_checkpoints {fits + held - 1} ({fits + held} at once while a save is written)"
        if fits + held >= 2
        else "no two checkpoints fit there (keep_checkpoints 1 holds two while a save is written)"
    )
    return (
        f"output_dir={cfg.train.output_dir!r}: its checkpoints need ~{size_text(needed)} more and "
        f"its filesystem has {size_text(free)} free (one checkpoint of "
        f"{cfg.model.name}{' with LoRA' if cfg.lora.rank else ''} "
        f"is ~{size_text(one)}; save_every={ck.save_every}, keep_checkpoints={ck.keep}: {at_once} "
        f"at once); {fix}, or choose an output_dir with more free space"
    )


def resume_fit_problem(cfg: RunConfig, shape: RunShape) -> str | None:
    """A resume on another layout asks the planner first: this machine's GPUs (gpu_budget_gb, else
    the CUDA device's memory; none on CPU: nothing to plan) and host RAM against the run's model and
    seq_len."""
    problem = layout_change.plan_problem(
        shape.geometry,
        shape.seq_len,
        shape.world,
        planning_gpu_gb(cfg.memory.gpu_budget_gb),
        psutil.virtual_memory().total / GB,
        shape.per_node,
    )
    return None if problem is None else f"resume: {problem}"


def check_sources(cfg: RunConfig, vocab: int) -> None:
    """The data source and eval_data's (data/), and the synthetic task's rules (its shortest
    seq_len): what `train` and `rehearse` ask before any process starts."""
    data.check_data_source(cfg, vocab)
    data.check_eval_source(cfg, vocab)
    if "synthetic" in (cfg.data.source, cfg.eval.data):
        SyntheticRetrieval(cfg.train.seq_len, vocab, cfg.train.seed)


def preflight(
    cfg: RunConfig, world_size: int, per_node: int | None = None
) -> tuple[RunShape, dict | None]:
    """(the run's shape, checkpoint meta to resume from or None). Raises ValueError on bad input.
    `per_node` as in `validate`."""
    if problem := host_problem(cfg):
        raise ValueError(problem)
    shape = validate(cfg, world_size, per_node)
    geom = shape.geometry
    tier = (shape.text, world_size, shape.per_node, geom.num_params, shape.placement)
    if problem := nvme_space_problem(cfg, *tier):
        raise ValueError(problem)
    check_reporter(cfg.logging.report_to, cfg.train.output_dir)  # W&B's host probed before the data
    rope_coverage(cfg, shape.hf_config)
    check_sources(cfg, shape.text.vocab_size)
    if cfg.eval.answer_loss or cfg.eval.recall:
        key = "eval_recall" if cfg.eval.recall else "eval_answer_loss"
        answer_sessions(
            cfg, limit=1, names=(key, "eval_data")
        )  # eval_data holds answers (its first one is read)
    meta = resume.check_run_dir(cfg, world_size)
    if (
        meta is not None
        and meta.get("layout_change")
        and (problem := resume_fit_problem(cfg, shape))
    ):
        raise ValueError(problem)
    if meta is not None and (problem := stored_reference_problem(cfg.train)):
        raise ValueError(problem)  # before the engine: the stored pass names another reference
    if not torch.cuda.is_available() and (
        problem := cpu_model_problem(cfg, psutil.virtual_memory().total, geom)
    ):
        raise ValueError(problem)  # after the resume fit: that refusal names the length that fits
    if problem := disk_problem(cfg, geom, meta):
        raise ValueError(problem)
    return shape, meta
