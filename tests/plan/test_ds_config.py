"""The DeepSpeed JSON is a pure function of the run config."""

from ds_longctx.config import RunConfig
from ds_longctx.plan.ds_config import build_ds_config, hf_trainer_ds_config


def test_batch_math_and_precision():
    cfg = RunConfig(sp_size=2, micro_batch=1, seq_len=256)
    ds = build_ds_config(cfg, world_size=8, on_gpu=True)
    assert ds["train_batch_size"] == 4 and ds["sequence_parallel_size"] == 2  # dp = 8 / 2
    assert ds["bf16"]["enabled"] and ds["zero_optimization"]["stage"] == 3
    assert not build_ds_config(cfg, world_size=8, on_gpu=False)["bf16"]["enabled"]  # fp32 on CPU


def test_offload_blocks():
    cfg = RunConfig(activation_offload=True, optimizer_offload=True)
    gpu = build_ds_config(cfg, world_size=2, on_gpu=True)
    assert gpu["activation_checkpointing"]["cpu_checkpointing"] is True
    assert gpu["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "torch_adam" not in gpu["optimizer"]["params"]
    # on CPU the checkpoints are already in host memory (and DeepSpeed's CPU->CPU copy path crashes)
    assert (
        build_ds_config(cfg, world_size=2, on_gpu=False)["activation_checkpointing"][
            "cpu_checkpointing"
        ]
        is False
    )


def test_hf_trainer_config_is_the_same_json_less_train_batch_size():
    """The HF Trainer checks train_batch_size against world x micro (no SP); DeepSpeed derives micro
    x world / sp."""
    cfg = RunConfig(sp_size=2, micro_batch=1, seq_len=256, warmup_steps=3)
    ds, trainer = build_ds_config(cfg, 8, True), hf_trainer_ds_config(cfg, 8, True)
    assert "train_batch_size" not in trainer and trainer == {
        k: v for k, v in ds.items() if k != "train_batch_size"
    }


def test_partial_offload_sizes_sub_groups_from_the_geometry_given_else_reads_it(monkeypatch):
    """offload_ratio < 1: sub_group_size is one rank's partition over OFFLOAD_SUB_GROUPS; with the
    run's geometry given (RunShape.geometry) the model is not read again."""
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.zero_buffers import OFFLOAD_SUB_GROUPS

    cfg = RunConfig(model="qwen3-8b", optimizer_offload=True, optimizer_offload_ratio=0.5)
    geom = ModelGeometry.from_name_or_path("qwen3-8b")
    read = build_ds_config(cfg, 8, True)
    one_rank = sum(-(-n // 8) for n in geom.param_numels())
    assert read["zero_optimization"]["sub_group_size"] == -(-one_rank // OFFLOAD_SUB_GROUPS)

    def no_read(name):
        raise AssertionError(f"read {name} again")

    monkeypatch.setattr(ModelGeometry, "from_name_or_path", no_read)
    assert build_ds_config(cfg, 8, True, geom) == read
    assert (
        hf_trainer_ds_config(cfg, 8, True, geom)["zero_optimization"] == read["zero_optimization"]
    )
