"""The peers of bench_peers.py as data and as the process each rank runs: TRL's FSDP2 +
context-parallel recipe (trl_fsdp2_cp) and TRL's DeepSpeed ALST recipe (alst), as the TRL guide
gives them (see bench_peers.py's docstring).

    python benchmarks/bench_peers_worker.py SYSTEM --model M --seq_len L --steps S --gpus G \\
        --run_dir DIR

bench_peers.py launches this file on every rank (`accelerate launch` or `torchrun`); it builds the
recipe's SFTTrainer on a random-init model of the shipped geometry and writes
`<run_dir>/rank<r>.jsonl`: the config the trainer saw (rank 0), each optimizer step's seconds
(cuda-synchronized, on_step_begin to on_step_end), GPU peaks and RSS, the logged losses, and an
error line if it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

PEERS = ("trl_fsdp2_cp", "alst")


# ----------------------------------------------------------------------------- the peers' recipes,
# as data TRL examples/deepspeed_configs/zero3.json (the guide's ALST recipe passes it as
# SFTConfig(deepspeed=...)), plus the bf16 Ulysses gradient communication of TRL's
# examples/accelerate_configs/alst_ulysses_4gpu.yaml: DeepSpeed's own
# default is fp32 (runtime/engine.py uses `seq_parallel_communication_data_type` whenever sp > 1).
ALST_DS_CONFIG = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "none"},
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "seq_parallel_communication_data_type": "bf16",
}


# ----------------------------------------------------------------------------- the peers' recipes,
# as data
def fsdp2_cp_accelerate_config(gpus: int) -> dict:
    """TRL examples/accelerate_configs/context_parallel_2gpu.yaml for `gpus` processes: FSDP2, wrap
    per decoder layer (TRANSFORMER_BASED_WRAP reads the model's _no_split_modules), rank 0 loads and
    broadcasts, no FSDP activation checkpointing (the trainer's gradient checkpointing does it: one
    of the two, not both), bf16 mixed precision (accelerate keeps fp32 parameters and computes in
    bf16), and the whole node as one context-parallel group."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP",
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "fsdp_config": {
            "fsdp_activation_checkpointing": False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_version": 2,
        },
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "bf16",
        "num_machines": 1,
        "num_processes": gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
        "parallelism_config": {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": 1,
            "parallelism_config_tp_size": 1,
            "parallelism_config_cp_size": gpus,
        },
    }


def peer_recipe(system: str, seq_len: int, steps: int, gpus: int, run_dir: Path) -> dict:
    """Everything a peer run is configured with (the worker builds from this; `config` records
    it)."""
    sft = {
        "output_dir": str(run_dir / "trainer"),
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": 1e-5,
        "bf16": True,
        "seed": 0,
        "max_length": seq_len,
        "packing": False,
        "dataset_kwargs": {"skip_prepare_dataset": True},
        # TRL's default: the fused LM head, logits in row tiles (the guide's chunked loss)
        "loss_type": "nll",
        # the guide's `offload`: each checkpointed layer's input in pinned host memory (transformers
        # >= 5.16); use_reentrant=False is transformers 5's default, spelled out so no version falls
        # back to reentrant
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"offload": True, "use_reentrant": False},
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    if system == "trl_fsdp2_cp":
        return {
            "launcher": "accelerate launch --config_file accelerate.yaml",
            "accelerate_config": fsdp2_cp_accelerate_config(gpus),
            "sft_config": {**sft, "pad_to_multiple_of": 2 * gpus},
        }  # CP shards in 2*cp chunks (load balance)
    if system == "alst":
        return {
            "launcher": "torchrun",
            "deepspeed_config": ALST_DS_CONFIG,
            "parallelism_config": {
                "sp_size": gpus,
                "sp_backend": "deepspeed",
                "sp_seq_length_is_variable": True,
                "sp_attn_implementation": "sdpa",
            },
            "tiled_mlp": False,  # ALST's TiledMLP: not exposed by TRL, accelerate or transformers
            "sft_config": {
                **sft,
                "pad_to_multiple_of": gpus,
                "deepspeed": str(run_dir / "ds_config.json"),
            },
        }
    raise ValueError(f"system {system!r} has no peer recipe; peers are {PEERS}")


def write_recipe_files(system: str, recipe: dict, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if system == "trl_fsdp2_cp":
        import yaml

        (run_dir / "accelerate.yaml").write_text(
            yaml.safe_dump(recipe["accelerate_config"], sort_keys=False)
        )
    if system == "alst":
        (run_dir / "ds_config.json").write_text(
            json.dumps(recipe["deepspeed_config"], indent=2) + "\n"
        )
    (run_dir / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")


# ----------------------------------------------------------------------------- the peers' worker
# (one per rank)
def tiny_tokenizer():
    """SFTTrainer insists on a tokenizer (for pad/eos ids) even when the rows are token ids
    already."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def observed(trainer) -> dict:
    """What the trainer really runs with, read at train start (after accelerate/DeepSpeed prepared
    the model)."""
    acc, model, args = trainer.accelerator, trainer.model, trainer.args
    pc = acc.parallelism_config
    layer = next((m for m in model.modules() if getattr(m, "gradient_checkpointing", False)), None)
    out = {
        "distributed_type": str(acc.distributed_type),
        "mixed_precision": str(acc.mixed_precision),
        "parallelism": {
            k: getattr(pc, k, None)
            for k in (
                "dp_replicate_size",
                "dp_shard_size",
                "cp_size",
                "cp_backend",
                "sp_size",
                "sp_backend",
            )
        }
        if pc
        else None,
        "attn_implementation": model.config._attn_implementation,
        "rope_parameters": model.config.rope_parameters,
        "max_position_embeddings": model.config.max_position_embeddings,
        "checkpoint_func": repr(getattr(layer, "_gradient_checkpointing_func", None))[:300],
        "gradient_checkpointing_kwargs": getattr(args, "gradient_checkpointing_kwargs", None),
        "activation_offloading": getattr(args, "activation_offloading", None),
        "loss_type": args.loss_type,
        "optim": str(args.optim),
        "max_grad_norm": args.max_grad_norm,
        "trainable_param_dtype": str(next(p.dtype for p in model.parameters() if p.requires_grad)),
    }
    fsdp = getattr(acc.state, "fsdp_plugin", None)
    if fsdp is not None:
        out["fsdp_plugin"] = {
            k: repr(getattr(fsdp, k, None))
            for k in (
                "fsdp_version",
                "reshard_after_forward",
                "cpu_ram_efficient_loading",
                "activation_checkpointing",
                "transformer_cls_names_to_wrap",
                "mixed_precision_policy",
            )
        }
    ds = getattr(acc.state, "deepspeed_plugin", None)
    if ds is not None:
        out["deepspeed_config"] = json.loads(json.dumps(ds.deepspeed_config, default=str))
    return out


def worker(a) -> None:
    rank = int(os.environ.get("RANK", "0"))
    path = Path(a.run_dir) / f"rank{rank}.jsonl"

    def emit(**row):
        with path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    try:
        train_peer(a, rank, emit)
    except Exception as e:
        emit(event="error", error=f"{type(e).__name__}: {e}"[:500])
        raise


def train_peer(a, rank: int, emit) -> None:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from ds_longctx.levers.rope import apply_rope_scaling
    from ds_longctx.run.model import load_hf_config

    recipe = peer_recipe(a.worker, a.seq_len, a.steps, a.gpus, Path(a.run_dir))
    hf_cfg = load_hf_config(a.model)
    # YaRN as ds_longctx sets it (yarn_rope_parameters + max_position_embeddings): the recipes pass
    # the same dict as model_init_kwargs={"rope_parameters": ...}, which needs a checkpoint to load;
    # here the model is built from config
    apply_rope_scaling(hf_cfg, a.seq_len)
    kwargs = dict(recipe["sft_config"])
    if a.worker == "alst":
        from accelerate import ParallelismConfig
        from accelerate.utils import DeepSpeedSequenceParallelConfig

        pc = recipe["parallelism_config"]
        kwargs["parallelism_config"] = ParallelismConfig(
            sp_size=pc["sp_size"],
            sp_backend=pc["sp_backend"],
            sp_handler=DeepSpeedSequenceParallelConfig(
                sp_seq_length_is_variable=pc["sp_seq_length_is_variable"],
                sp_attn_implementation=pc["sp_attn_implementation"],
            ),
        )
    # before the model: sets the device, and for ALST makes the ZeRO-3 config live, so from_config
    # below builds the model under deepspeed.zero.Init (born partitioned, as from_pretrained would
    # load it)
    args = SFTConfig(**kwargs)
    if a.worker == "alst":
        from ds_longctx.run.model import init_weights

        model = AutoModelForCausalLM.from_config(
            hf_cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
        init_weights(
            model, seed=0, std=hf_cfg.initializer_range
        )  # per-name draws under GatheredParameters
    else:
        # drawn on this rank's GPU (fast), then handed over on CPU as from_pretrained would:
        # accelerate upcasts to fp32,
        # shards on meta and broadcasts rank 0's weights (fsdp_cpu_ram_efficient_loading)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(
                hf_cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
            )
        model.to("cpu")
    # the steps' reserved memory starts from what training holds, not the build's leftovers
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    rows = np.random.default_rng(0).integers(
        0, hf_cfg.vocab_size, size=(a.steps * a.gpus, a.seq_len)
    )
    data = Dataset.from_dict({"input_ids": [r.tolist() for r in rows]})

    class StepTimer(TrainerCallback):
        trainer = None

        def on_train_begin(self, args, state, control, **kw):
            if rank == 0:
                emit(event="config", **observed(self.trainer))

        def on_step_begin(self, args, state, control, **kw):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            emit(
                event="step",
                step=state.global_step,
                seconds=round(time.perf_counter() - self.t0, 4),
                peak_reserved=torch.cuda.max_memory_reserved(),
                peak_allocated=torch.cuda.max_memory_allocated(),
                ru_maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            )

        def on_log(self, args, state, control, logs=None, **kw):
            if rank == 0 and logs:
                emit(
                    event="log",
                    step=state.global_step,
                    **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                )

    timer = StepTimer()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tiny_tokenizer(),
        callbacks=[timer],
    )
    timer.trainer = trainer
    trainer.train()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("worker", choices=PEERS, metavar="SYSTEM", help=f"one of {PEERS}")
    ap.add_argument(
        "--model", required=True, help="a shipped geometry (ds_longctx/models/<name>.json)"
    )
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--run_dir", required=True)
    worker(ap.parse_args())


if __name__ == "__main__":
    main()
