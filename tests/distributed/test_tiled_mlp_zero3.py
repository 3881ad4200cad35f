"""Tiled MLP under real DeepSpeed ZeRO-3: 2 CPU processes over gloo, every param partitioned.

The reference is the same engine without tiling, in the same processes: same weights
(helpers.tiny_model's per-name draw before deepspeed.initialize, no zero.Init: identical on both
ranks), same batch on both ranks. Two steps each, so step 2 also checks that the reduce of step 1
left nothing behind. Checked: the loss, and every full gradient (`safe_get_full_grad` after
`engine.backward`, before `engine.step`), fp32: rel <= 1e-6 at step 1. Step 2 gets 1e-4: AdamW's
first update is about lr * sign(grad), so elements whose grad is near zero move differently on 1e-7
grad differences, and step 2 starts from weights that are not bitwise equal (measured: 4e-6). A grad
that ZeRO failed to reduce would be off by O(1); a naive tile loop that accumulates every tile into
`.grad` fails here outright (ZeRO-3's epilogue asserts each param is in the bucket once). Variants:
no checkpointing, torch's non-reentrant and reentrant checkpoint, DeepSpeed's checkpoint, the
MLP as a DeepSpeed z3-leaf module, the per-tile path (an MLP whose Linear has its own forward), and
tiled MLP applied in place after 2 plain steps (as benchmarks/bench_levers.py toggles levers), with
a prefetch bucket of one Linear so DeepSpeed's stale trace has the MLP weights in flight when the
tiled MLP first runs; that run goes 5 steps against 5 plain ones, losses within 1e-4 from step 2 on.

Gathers: DeepSpeed all-gathers are counted over each step's forward + backward. With a config that
keeps nothing gathered between module calls (the steady state of a model larger than the reuse
window), 2 and 8 tiles must give the same count (the per-tile path gave 74 and 182 here); the
per-tile path gathers more than the gated one. Also checked: DeepSpeed's fetch trace is still
complete after the backward of step 2 (a trace mismatch would have invalidated it; for the in-place
run, step 5 after the re-recorded step 4), and no MLP weight of the gated path is left gathered
after a forward or a backward.

    pytest -q -m slow tests/distributed/test_tiled_mlp_zero3.py

The file is also the worker script the test starts under torchrun (one process per rank):

    torchrun --nproc_per_node 2 tests/distributed/test_tiled_mlp_zero3.py OUT_DIR
"""

import json
import os
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
import torch

from tests.helpers import rel_err, tiny_config, tiny_model, torchrun

pytestmark = pytest.mark.slow
WORLD = 2
TOL = (1e-6, 1e-4)  # step 1, steps 2+
TILE_TOKENS = 16  # batch [2, 37]: 74 rows -> 5 tiles, the last of 10 rows
LEAN = {
    "stage3_max_reuse_distance": 0,
    "stage3_prefetch_bucket_size": 0,
}  # every module fetch gathers
ONE_LINEAR_PREFETCH = {"stage3_prefetch_bucket_size": 64 * 160, "stage3_max_reuse_distance": 0}
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
    },  # partition every param
    "steps_per_print": 10**9,
}


class Variant(NamedTuple):
    tile: Optional[int] = None  # tile_tokens; None: no tiled MLP
    ckpt: Optional[str] = None  # activation checkpointing
    form: str = "gated"  # "gated" (Qwen3MLP), "z3_leaf" (the MLP a z3 leaf), "per_tile"
    zero: dict = {}  # zero_optimization overrides
    steps: int = 2
    apply_at: int = 0  # apply_tiled_mlp before this step (0: before deepspeed.initialize)


VARIANTS = {
    "plain": Variant(steps=5),
    "tiled": Variant(TILE_TOKENS),
    "tiled+ckpt": Variant(TILE_TOKENS, "non_reentrant"),
    "tiled+reentrant_ckpt": Variant(TILE_TOKENS, "reentrant"),
    "tiled+ds_ckpt": Variant(TILE_TOKENS, "deepspeed"),
    "tiled+z3_leaf_mlp": Variant(TILE_TOKENS, form="z3_leaf"),
    "per_tile": Variant(TILE_TOKENS, form="per_tile"),
    "tiled:2/lean": Variant(37, zero=LEAN),
    "tiled:8/lean": Variant(10, zero=LEAN),
    "plain->tiled": Variant(TILE_TOKENS, zero=ONE_LINEAR_PREFETCH, steps=5, apply_at=2),
}
GATHERS_ONCE = [n for n, v in VARIANTS.items() if v.tile and v.form == "gated" and not v.apply_at]


class OwnForwardLinear(torch.nn.Linear):
    """A Linear subclass with its own forward (as LoRA has): the tiled MLP then calls the MLP per
    tile."""

    def forward(self, x):
        return super().forward(x)


def _count_all_gathers(counter: list) -> None:
    """Count every all-gather DeepSpeed issues (fetches, prefetches, GatheredParameters) in
    counter[0]."""
    import deepspeed.comm.comm as ds_comm

    for name in ("all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced"):

        def counted(*args, _orig=getattr(ds_comm.cdb, name), **kwargs):
            counter[0] += 1
            return _orig(*args, **kwargs)

        setattr(ds_comm.cdb, name, counted)


def main(out_dir: str) -> None:
    """One rank of the comparison, under torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    come from the environment torchrun sets (read by deepspeed.init_distributed); writes
    OUT_DIR/rank{RANK}.json."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == WORLD and "MASTER_PORT" in os.environ, (
        "start this under torchrun --nproc_per_node 2"
    )
    os.environ["DS_ACCELERATOR"] = "cpu"
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.ops
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.utils import safe_get_full_grad, set_z3_leaf_modules

    from ds_longctx.levers.tiled_mlp import apply_tiled_mlp

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip a 66 s JIT build on CPU
    deepspeed.init_distributed(dist_backend="gloo")
    gathers = [0]
    _count_all_gathers(gathers)
    ids = torch.randint(
        0, tiny_config().vocab_size, (2, 37), generator=torch.Generator().manual_seed(3)
    )

    results, info = {}, {}
    for name, v in VARIANTS.items():
        model = tiny_model(
            seed=0
        )  # the engine's per-name draw: the same weights on every rank and variant
        mlps = [layer.mlp for layer in model.model.layers]
        if v.form == "per_tile":
            for mlp in mlps:
                mlp.up_proj.__class__ = OwnForwardLinear
        if v.form == "z3_leaf":
            set_z3_leaf_modules(model, [type(mlps[0])])
        if v.ckpt:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": v.ckpt == "reentrant"}
            )
        if (
            v.ckpt == "deepspeed"
        ):  # the layer recompute of DeepSpeed's checkpoint (engine.py's offload path)
            deepspeed.checkpointing.configure(
                None, deepspeed_config={**DS_CONFIG, "activation_checkpointing": {}}
            )
            for layer in model.model.layers:
                layer._gradient_checkpointing_func = deepspeed.checkpointing.checkpoint
        config = {**DS_CONFIG, "zero_optimization": {**DS_CONFIG["zero_optimization"], **v.zero}}
        if v.tile and not v.apply_at:
            assert apply_tiled_mlp(model, v.tile) == 2
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )
        coordinator = engine.optimizer.parameter_offload.get_param_coordinator()
        mlp_params = [p for mlp in mlps for p in mlp.parameters()]

        def mlp_gathered() -> int:
            return sum(p.ds_status != ZeroParamStatus.NOT_AVAILABLE for p in mlp_params)

        steps, info[name] = [], []
        for step in range(v.steps):
            if v.tile and v.apply_at and step == v.apply_at:
                assert apply_tiled_mlp(engine.module, v.tile) == 2
            gathers[0] = 0
            loss = engine(input_ids=ids, labels=ids).loss
            after_forward = mlp_gathered()
            engine.backward(loss)
            info[name].append(
                {
                    "all_gathers": gathers[0],
                    "trace_complete": coordinator.is_complete_trace(),
                    "mlp_gathered": [after_forward, mlp_gathered()],
                }
            )
            grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
            engine.step()
            steps.append((loss.detach(), grads))
        results[name] = steps

    report = {}
    for name in VARIANTS:
        for step, ((loss, grads), (loss_ref, grads_ref)) in enumerate(
            zip(results[name], results["plain"])
        ):
            assert grads.keys() == grads_ref.keys()
            errs = {n: rel_err(grads[n], grads_ref[n], norm="max") for n in grads_ref}
            report[f"{name}/step{step}"] = {
                "step": step,
                "loss": rel_err(loss, loss_ref, norm="max"),
                "max_grad": max(errs.values()),
                "worst": max(errs, key=errs.get),
            }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"errors": report, "info": info}))
    # leave together, groups torn down (as grad_worker.py does)
    from ds_longctx.parallel.parallel_state import leave

    leave(0)  # barrier, groups torn down, no teardown


def test_tiled_mlp_matches_plain_under_zero3(tmp_path):
    torchrun(WORLD, ["tests/distributed/test_tiled_mlp_zero3.py", str(tmp_path)])
    for rank in range(WORLD):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        report, info = got["errors"], got["info"]
        assert len(report) == sum(v.steps for v in VARIANTS.values())
        for case, errs in report.items():
            tol = TOL[min(errs["step"], 1)]
            assert errs["loss"] <= tol and errs["max_grad"] <= tol, (rank, case, errs)
        for name, steps in info.items():
            assert steps[1]["trace_complete"] or VARIANTS[name].apply_at, (rank, name, steps)
        assert info["plain->tiled"][4]["trace_complete"], (
            rank,
            info["plain->tiled"],
        )  # step 4 re-recorded it
        for name in GATHERS_ONCE:
            assert all(s["mlp_gathered"] == [0, 0] for s in info[name]), (rank, name, info[name])
        two, eight = info["tiled:2/lean"], info["tiled:8/lean"]
        assert [s["all_gathers"] for s in two] == [s["all_gathers"] for s in eight], (
            rank,
            two,
            eight,
        )
        assert info["per_tile"][0]["all_gathers"] > info["tiled"][0]["all_gathers"], (rank, info)


if __name__ == "__main__":
    main(sys.argv[1])
