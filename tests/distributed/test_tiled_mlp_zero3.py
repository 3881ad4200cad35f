"""Tiled MLP under real DeepSpeed ZeRO-3: 2 CPU processes over gloo, every param partitioned.

The reference is the same engine without tiling, in the same processes: same weights (seeded before
deepspeed.initialize, no zero.Init), same batch on both ranks. Two steps each, so step 2 also checks that
the reduce of step 1 left nothing behind. Checked: the loss, and every full gradient
(`safe_get_full_grad` after `engine.backward`, before `engine.step`), fp32: rel <= 1e-6 at step 1. Step 2
gets 1e-4: AdamW's first update is about lr * sign(grad), so elements whose grad is near zero move
differently on 1e-7 grad differences, and step 2 starts from weights that are not bitwise equal (measured:
4e-6). A grad that ZeRO failed to reduce would be off by O(1); a naive tile loop that accumulates every
tile into `.grad` fails here outright (ZeRO-3's epilogue asserts each param is in the bucket once).
Variants: no checkpointing, torch's non-reentrant and reentrant checkpoint, DeepSpeed's checkpoint.

    pytest -q -m slow tests/distributed/test_tiled_mlp_zero3.py
"""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow
WORLD = 2
TOL = (1e-6, 1e-4)   # step 1, step 2
TILE_TOKENS = 16            # batch [2, 37]: 74 rows -> 5 tiles, the last of 10 rows
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},   # partition every param
    "steps_per_print": 10**9,
}
# name -> (tile_tokens, activation checkpointing)
VARIANTS = {"plain": (None, None), "tiled": (TILE_TOKENS, None), "tiled+ckpt": (TILE_TOKENS, "non_reentrant"),
            "tiled+reentrant_ckpt": (TILE_TOKENS, "reentrant"), "tiled+ds_ckpt": (TILE_TOKENS, "deepspeed")}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.ops
    from deepspeed.utils import safe_get_full_grad
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import ds_longctx
    from ds_longctx.tiled_mlp import apply_tiled_mlp

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False    # skip a 66 s JIT build on CPU
    deepspeed.init_distributed(dist_backend="gloo")
    cfg_dict = json.loads((Path(ds_longctx.__file__).parent / "models" / "qwen3-tiny.json").read_text())
    ids = torch.randint(0, cfg_dict["vocab_size"], (2, 37), generator=torch.Generator().manual_seed(3))

    results = {}
    for name, (tile, ckpt) in VARIANTS.items():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config.from_dict(cfg_dict)).train()
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ckpt == "reentrant"})
        if ckpt == "deepspeed":     # the layer recompute of DeepSpeed's checkpoint (engine.py's offload path)
            deepspeed.checkpointing.configure(None, deepspeed_config={**DS_CONFIG, "activation_checkpointing": {}})
            for layer in model.model.layers:
                layer._gradient_checkpointing_func = deepspeed.checkpointing.checkpoint
        if tile:
            assert apply_tiled_mlp(model, tile) == 2
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
        steps = []
        for _ in range(2):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
            engine.step()
            steps.append((loss.detach(), grads))
        results[name] = steps

    report = {}
    for name in VARIANTS:
        for step, ((loss, grads), (loss_ref, grads_ref)) in enumerate(zip(results[name], results["plain"])):
            assert grads.keys() == grads_ref.keys()
            errs = {n: rel_err(grads[n], grads_ref[n]) for n in grads_ref}
            report[f"{name}/step{step}"] = {"step": step, "loss": rel_err(loss, loss_ref),
                                            "max_grad": max(errs.values()), "worst": max(errs, key=errs.get)}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    deepspeed.comm.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tiled_mlp_matches_plain_under_zero3(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(report) == 2 * len(VARIANTS)
        for case, errs in report.items():
            tol = TOL[errs["step"]]
            assert errs["loss"] <= tol and errs["max_grad"] <= tol, (rank, case, errs)
