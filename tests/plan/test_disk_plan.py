"""The disk tier in the planner (torch-free): the issue's two targets, the disk terms against the
host offload's, the DeepSpeed ZeRO-Infinity blocks, the disk keys' refusals and the bandwidth
record."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from ds_longctx.config import RunConfig
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.parallel import direct_io
from ds_longctx.plan import disk_args, disk_terms, write
from ds_longctx.plan.disk_binds import what_binds
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.plan.planner import GB, Levers, plan_memory
from ds_longctx.plan.search import choose, find_max_len

QWEN = "qwen3-8b"


def test_one_141gb_gpu_128gb_host_and_2000gb_disk_plans_a_million_tokens():
    host_only = find_max_len(QWEN, 1, 141, 128)
    n = find_max_len(QWEN, 1, 141, 128, nvme_gb=2000)
    assert n >= 1_000_000 > host_only
    plan = choose(QWEN, n, 1, 141, 128, nvme_gb=2000).plan
    assert plan.placement.on_disk > 0 and plan.levers.nvme_optimizer
    assert plan.host_peak_bytes <= 0.9 * 128 * GB and plan.gpu_peak_bytes <= 0.9 * 141 * GB
    assert 0 < plan.disk_bytes <= 0.9 * 2000 * GB
    # what stops the next length is named
    assert what_binds(QWEN, n + 1024, 1, 141, 128, nvme_gb=2000).startswith("the GPU working set")


def test_8x80gb_with_2tb_host_and_16tb_disk_is_bound_by_the_gpu_working_set():
    n = find_max_len(QWEN, 8, 80, 2000, nvme_gb=16000)
    assert n >= find_max_len(QWEN, 8, 80, 2000)
    if n < 8_000_000:  # the target; where it is not reached the plan must say why
        why = what_binds(QWEN, 8_000_000, 8, 80, 2000, nvme_gb=16000)
        assert why.startswith("the GPU working set") and "attn_bwd" in why, why


def test_disk_layers_move_their_checkpoints_from_host_to_disk_byte_for_byte():
    lv = Levers(pinned_pool=True, tiled_layer=True, tiled_mlp=True, optimizer_offload=True)
    L, T = 36, 131072

    def at(spec):
        return plan_memory(QWEN, T, 1, 1, replace(lv, placement=PlacementPlan.parse(spec)))

    host, disk = at("offload:30,keep:6"), at("disk:20,offload:10,keep:6")
    E = T * 4096 * 2  # one layer input, bf16
    assert disk.term("checkpoints").disk_bytes == disk.disk_bytes == 20 * E
    assert host.term("checkpoints").host_bytes - disk.term("checkpoints").host_bytes == 20 * E
    assert disk.term("disk_bounce_buffers").host_bytes == 2 * E
    assert disk.gpu_peak_bytes == host.gpu_peak_bytes and L == 36


def test_nvme_optimizer_and_params_go_into_the_deepspeed_json_only_when_asked(tmp_path):
    kw = dict(
        model=QWEN, seq_len=1024, optimizer_offload=True, offload_params=True, torch_adam=False
    )
    plain = build_ds_config(RunConfig(**kw), 1, True)
    assert "aio" not in plain and plain["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    cfg = RunConfig(**kw, nvme_path=str(tmp_path), nvme_optimizer=True, nvme_params=True)
    ds = build_ds_config(cfg, 1, True)
    z = ds["zero_optimization"]
    assert z["offload_optimizer"]["device"] == z["offload_param"]["device"] == "nvme"
    assert z["offload_optimizer"]["nvme_path"] == z["offload_param"]["nvme_path"] == str(tmp_path)
    assert "aio" in ds and z["sub_group_size"] == 10**8


def test_disk_keys_are_refused_with_the_value_and_the_fix(tmp_path, capsys):
    afile = tmp_path / "a_file"
    afile.write_text("")
    with pytest.raises(
        ValueError, match=r"nvme_path='.*a_file/x' cannot be written.*a_file is a file"
    ):
        RunConfig(model=QWEN, seq_len=1024, nvme_path=str(afile / "x"))
    with pytest.raises(ValueError, match="needs nvme_path"):
        RunConfig(model=QWEN, seq_len=1024, placement="disk:36")
    args = ["--model", QWEN, "--gpus", "1", "--seq_len", "1024", "--nvme_path", str(afile / "x")]
    assert write.main(args) == 2
    assert "--nvme_path" in capsys.readouterr().err
    no_path = ["--model", QWEN, "--gpus", "1", "--seq_len", "1024", "--nvme_gb", "5"]
    assert write.main([*no_path, "--out", str(tmp_path / "o")]) == 2
    assert "give --nvme_path DIR too" in capsys.readouterr().err
    assert write.main([*args[:-1], str(tmp_path)]) == 2
    assert "without --nvme_gb" in capsys.readouterr().err


def test_a_disk_plan_writes_run_files_that_load_and_name_the_disk(tmp_path, capsys, monkeypatch):
    out, nvme = tmp_path / "plan", tmp_path / "nvme"
    monkeypatch.setattr(disk_args, "free_bytes", lambda p: 100 * GB)  # whatever this disk has
    args = ["--model", QWEN, "--gpus", "1", "--gpu_mem_gb", "141", "--host_mem_gb", "128"]
    assert write.main([*args, "--find_max_len"]) == 0
    host_only = int(
        re.search(r"= ([\d,]+) tokens", capsys.readouterr().out).group(1).replace(",", "")
    )
    disk = ["--nvme_path", str(nvme), "--nvme_gb", "50", "--find_max_len", "--out", str(out)]
    assert write.main([*args, *disk]) == 0
    cfg = RunConfig.load(out / "run.yaml")
    assert cfg.train.seq_len > host_only and cfg.memory.nvme_path == str(nvme)
    assert PlacementPlan.parse(cfg.memory.placement).on_disk > 0
    text = (out / "plan.txt").read_text()
    assert "disk tier:" in text and "assumed" in text and "what binds next" in text


def test_bandwidth_is_measured_recorded_and_otherwise_labelled_assumed(tmp_path):
    assert direct_io.recorded_bandwidth(str(tmp_path)) is direct_io.ASSUMED
    assert "assumed" in direct_io.ASSUMED.describe()
    bw = direct_io.measure_bandwidth(str(tmp_path), nbytes=8 << 20, chunk=4 << 20)
    assert bw.write_gbs > 0 and bw.read_gbs > 0 and bw.source.startswith("measured on")
    assert direct_io.recorded_bandwidth(str(tmp_path)) == bw
    assert (
        json.loads((tmp_path / direct_io.BANDWIDTH_FILE).read_text())["write_gbs"] == bw.write_gbs
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [direct_io.BANDWIDTH_FILE]


def test_the_step_prediction_adds_only_the_io_a_layer_cannot_hide():
    lv = Levers(pinned_pool=True, tiled_layer=True, tiled_mlp=True, optimizer_offload=True)
    T, n = 131072, 20
    plan = plan_memory(QWEN, T, 1, 1, replace(lv, placement=PlacementPlan.parse("disk:20,keep:16")))
    E = T * 4096 * 2  # one disk layer's checkpoint: written once in forward, read once in backward
    bw = direct_io.Bandwidth(1.0, 2.0, "test")
    w, r = E / 1e9, E / 2e9  # seconds a layer
    ckpt_s, other_s, _ = disk_terms.disk_seconds(plan, bw)
    assert ckpt_s == pytest.approx(n * (w + r)) and other_s == 0
    # layers' compute 36 s: 0.25 s of forward and 0.75 s of backward a layer
    line = disk_terms.disk_seconds(plan, bw, 40.0, 36.0)[2]
    exposed = n * (max(0, w - 0.25) + max(0, r - 0.75))
    assert exposed > 0 and f"predicted step with the disk: {40 + exposed:.1f} s" in line
    # a disk as fast as the compute hides all of it
    fast = disk_terms.disk_seconds(plan, direct_io.Bandwidth(100.0, 100.0, "test"), 40.0, 36.0)[2]
    assert "predicted step with the disk: 40.0 s" in fast
