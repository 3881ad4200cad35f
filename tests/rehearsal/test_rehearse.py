"""`ds-longctx rehearse` on CPU: one process plays ranks of a world of 8 (qwen3-tiny: 2 layers, 8
query / 2 KV heads, hidden 64, head_dim 16, vocab 512), the symmetric world's collectives, their
byte counts against a hand count, the `--layers` extrapolation, and what a rehearsal refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

REQUIRED = (
    "config",
    "rank",
    "world",
    "seq_len",
    "layers",
    "placement",
    "peak_gpu_bytes",
    "planned_gpu_bytes",
    "gpu_budget_bytes",
    "host_rss_bytes",
    "planned_host_bytes_per_process",
    "compute_seconds_per_step",
    "predicted_seconds_per_step",
    "optimizer_seconds_per_step",
    "link",
    "commit",
    "device",
)
SEQ = 512


def write_config(
    d: Path, model: str = "qwen3-tiny", gpus: int | None = 8, extra: str = "", nodes: int = 1
) -> Path:
    world = f"  nodes: {nodes}\n  gpus_per_node: {gpus}\n" if gpus else ""
    path = d / "run.yaml"
    path.write_text(
        f"model:\n  name: {model}\n  dtype: fp32\ntrain:\n  seq_len: {SEQ}\n  output_dir: "
        f"{d / 'run'}\nparallel:\n  sp_size: 8\n{world}optimizer:\n  torch_adam: true\n{extra}"
    )
    return path


def rows_of(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def world8(tmp_path_factory):
    """One `--rank roles` rehearsal of a world of 8 (ranks 0 and 7: the first and last of the one SP
    group)."""
    d = tmp_path_factory.mktemp("rehearse8")
    cfg = write_config(d)
    out = d / "rehearsal.jsonl"
    res = run_cli(
        ["rehearse", "--cpu", "--config", str(cfg), "--rank", "roles", "--out", str(out)],
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return cfg, rows_of(out), res


def test_a_rehearsal_of_a_world_of_8_plays_each_role_and_reports_every_field(world8):
    cfg, rows, res = world8
    assert [r["rank"] for r in rows] == [0, 7]
    for r in rows:
        assert set(REQUIRED) <= set(r), set(REQUIRED) - set(r)
        assert (r["status"], r["world"], r["seq_len"], r["layers"], r["config"]) == (
            "ok",
            8,
            SEQ,
            "2/2",
            str(cfg),
        )
        assert r["finite"] and all(math.isfinite(x) for x in r["losses"] + r["grad_norms"])
        assert (
            0 < r["optimizer_seconds_per_step"] < max(r["step_seconds"])
        )  # the step's share after the grads
        assert (
            r["compute_seconds_per_step"] > 0
            and r["predicted_seconds_per_step"] >= r["compute_seconds_per_step"]
        )
    assert "first of SP group 0" in rows[0]["role"] and "last of SP group 0" in rows[1]["role"]
    assert "local rank 7" in rows[1]["role"]


def test_every_line_a_rehearsal_prints_says_it_is_a_rehearsal(world8):
    _, _, res = world8
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert lines and all(line.startswith("[rehearsal") for line in lines), [
        line for line in lines if not line.startswith("[rehearsal")
    ][:5]


def test_the_ranks_zero_partition_is_an_eighth_of_the_parameters(world8):
    from tests.helpers import tiny_model

    _, rows, _ = world8
    numels = [p.numel() for p in tiny_model().parameters()]
    for r in rows:
        assert r["params_total"] == sum(numels)
        assert r["params_local"] == sum(
            -(-n // 8) for n in numels
        )  # each tensor's shard, padded to 8 shards


def test_collective_bytes_are_the_hand_counted_volumes(world8):
    """Per step, fp32 (4 bytes): every decoder layer's attention exchanges q, k, v and its output
    three times (forward, checkpoint recompute, backward), each [T = 512/8 tokens, heads, 16]: q and
    output 8 heads, k and v replicated to sp=8 heads (2 KV heads < sp). Every parameter is under
    ZeRO's persistence threshold, so the forward gathers nothing; the gradients are reduce-scattered
    once and the updated parameters gathered once, in full."""
    from tests.helpers import tiny_model

    _, rows, _ = world8
    layers, t, d, hq, sp = 2, SEQ // 8, 16, 8, 8
    a2a = layers * 3 * t * d * 4 * (hq + sp + sp + hq)
    params = sum(p.numel() for p in tiny_model().parameters()) * 4
    for r in rows:
        got = r["collective_bytes_per_step"]
        assert got["all_to_all"] == {"sp": a2a}
        assert got["all_gather"] == {"zero": params}
        assert got["reduce_scatter"] == {"zero": params}
        assert r["cross_node_bytes_per_step"] == 0


def test_the_rows_plan_is_the_planners(world8):
    from ds_longctx.config import RunConfig
    from ds_longctx.levers.placement import PlacementPlan
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.levers import Levers
    from ds_longctx.plan.planner import plan_memory

    cfg_path, rows, _ = world8
    cfg = RunConfig.load(cfg_path)
    plan = plan_memory(
        ModelGeometry.from_name_or_path("qwen3-tiny"),
        SEQ,
        8,
        8,
        Levers.from_run_config(cfg, PlacementPlan.parse("keep:2")),
    )
    assert rows[0]["planned_gpu_bytes"] == int(plan.gpu_peak_bytes)
    assert rows[0]["planned_host_bytes_per_process"] == int(plan.host_peak_bytes / 8)
    assert rows[0]["placement"] == "keep:2"


def test_a_rank_of_node_1_of_a_two_node_world_sees_its_world_and_dp_and_zero_partition(tmp_path):
    """2 nodes x 8, sp 8: dp 2, one SP group per node. Rank 8 (node 1's first) builds with DeepSpeed
    seeing dp 2 (its batch check), and ZeRO-3 shards every tensor over all 16 ranks."""
    from tests.helpers import tiny_model

    cfg, out = write_config(tmp_path, nodes=2), tmp_path / "rehearsal.jsonl"
    res = run_cli(
        ["rehearse", "--cpu", "--config", str(cfg), "--rank", "8", "--out", str(out)], timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (r,) = rows_of(out)
    assert (r["status"], r["rank"], r["world"], r["nodes"], r["gpus_per_node"]) == (
        "ok",
        8,
        16,
        2,
        8,
    )
    assert (r["sp_size"], r["dp_size"], r["train_batch_size"]) == (8, 2, 2)
    assert "first of SP group 1 (ranks 8-15), node 1, local rank 0" in r["role"]
    numels = [p.numel() for p in tiny_model().parameters()]
    assert r["params_total"] == sum(numels)
    assert r["params_local"] == sum(
        -(-n // 16) for n in numels
    )  # each tensor's shard, padded to 16 shards
    assert (
        r["collective_bytes_per_step"]["all_reduce"]["dp"] > 0
        and r["cross_node_bytes_per_step"] > 0
    )


def test_a_rank_past_0_draws_the_weights_rank_0_would_hand_it(tmp_path):
    """The random init is drawn by rank 0 and handed out when its gather ends; the fake world moves
    no data, so a rehearsed rank draws the same values itself. With tied embeddings a rank left with
    torch's N(0, 1) embedding saw logits of about hidden_size and a loss of ~60 (tiny) to ~2,500
    (Qwen3.5-4B); its loss is ln(vocab) as rank 0's."""
    spec = json.loads((ROOT / "ds_longctx/models/qwen3-tiny.json").read_text())
    spec["tie_word_embeddings"] = True
    model = tmp_path / "qwen3-tiny-tied.json"
    model.write_text(json.dumps(spec))
    cfg, out = write_config(tmp_path, model=str(model)), tmp_path / "rehearsal.jsonl"
    res = run_cli(
        ["rehearse", "--cpu", "--config", str(cfg), "--rank", "3", "--out", str(out)], timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (r,) = rows_of(out)
    assert all(abs(loss - math.log(spec["vocab_size"])) < 0.5 for loss in r["losses"]), r["losses"]


def test_layers_runs_some_layers_and_extrapolates_the_bytes_exactly(tmp_path):
    """A 6-layer tiny model: `--layers 3` against all 6. Every layer exchanges the same bytes, so
    the extrapolated all-to-all equals the full run's; the ZeRO collectives (outside the layers
    here) are the whole model's either way."""
    from ds_longctx.run.model import load_hf_config

    hf = load_hf_config("qwen3-tiny").to_dict()
    hf["num_hidden_layers"] = hf["max_window_layers"] = 6
    hf.pop("layer_types", None)
    model = tmp_path / "tiny6.json"  # a geometry file: random weights, as the shipped names
    model.write_text(json.dumps(hf))
    cfg = write_config(tmp_path, model=str(model))
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    logs = {}
    for extra, out in (([], full), (["--layers", "3", "--internode_gbps", "100"], part)):
        res = run_cli(
            [
                "rehearse",
                "--cpu",
                "--config",
                str(cfg),
                "--out",
                str(out),
                *extra,
                "--seq_len",
                "256",
            ],
            timeout=600,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        logs[out] = res.stdout + res.stderr
    (f,), (p,) = rows_of(full), rows_of(part)
    # each step logs the memory so far against the plan, so a rehearsal lost before its row still
    # leaves its numbers; after the last step they are the row's
    gb = lambda b: f"{b / 1e9:.1f} GB"  # noqa: E731
    for row, out, how in (
        (f, full, "every layer run"),
        (p, part, "extrapolated from 3 to 6 layers"),
    ):
        assert f"after step 1, {how}: GPU peak " in logs[out]
        assert (
            f"after step 2, {how}: GPU peak {gb(row['peak_gpu_bytes'])} reserved against the "
            f"plan's {gb(row['planned_gpu_bytes'])}"
        ) in logs[out]
        assert (
            f"host {gb(row['host_rss_bytes'])} against {gb(row['planned_host_bytes_per_process'])}"
            in logs[out]
        )
    assert (
        "GPU left by each layer run (bytes) 0: " in logs[part] and "GPU left by" not in logs[full]
    )
    assert (f["layers"], p["layers"], p["seq_len"]) == ("6/6", "3/6", 256)
    # the row's command plays it again: every option and config override given, less --out
    assert p["command"] == (
        f"ds-longctx rehearse --config {cfg} --rank 0 --layers 3 --steps 3 --internode_gbps 100.0 "
        "--cpu --seq_len 256"
    )
    assert p["layers_run"][0] == 0 and p["layers_run"][-1] == 5 and len(p["layers_run"]) == 3
    assert (
        [int(i) for i in p["layer_gpu_bytes"]]
        == p["layers_run"]
        == [int(i) for i in p["layer_host_bytes"]]
    )
    assert (p["params_total"], p["params_local"]) == (
        f["params_total"],
        f["params_local"],
    )  # all 6 layers built
    assert p["collective_bytes_per_step"] == f["collective_bytes_per_step"]
    assert p["measured"]["compute_seconds_per_step"] < p["compute_seconds_per_step"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rank", "8"], ["--rank 8", "ranks 0..7"]),
        (["--rank", "first"], ["--rank first", "roles"]),
        (["--layers", "1"], ["--layers 1", "give 2 to 2"]),
        (["--steps", "1"], ["--steps 1", "at least 2"]),
        (["--link", "tin-can"], ["--link tin-can", "nvlink-h200"]),
        (["--link_gbps", "0"], ["--link_gbps 0", "Gbit/s"]),
    ],
)
def test_bad_arguments_are_refused_before_any_rank_starts(tmp_path, args, words):
    res = run_cli(
        ["rehearse", "--cpu", "--config", str(write_config(tmp_path)), *args], timeout=120
    )
    assert res.returncode == 2, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("[rehearsal] refused") and all(w in last for w in words), last
    assert "rank 0/8" not in res.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["--gpus", "0"], "--gpus 0: give at least one GPU and one node"),
        (["--nodes", "0"], "--nodes 0: give at least one GPU and one node"),
        (["--gpus", "4"], "--gpus 4: "),
    ],
)
def test_gpus_or_nodes_0_are_refused_not_read_as_not_given(tmp_path, capsys, args, says):
    """`--gpus 0` was read as no --gpus: the config's world of 8 was rehearsed."""
    from ds_longctx.rehearsal.rehearse import main

    assert main(["--cpu", "--config", str(write_config(tmp_path)), *args]) == 2
    assert capsys.readouterr().err.strip().startswith(f"[rehearsal] refused: {says}")


def test_a_length_the_synthetic_task_cannot_fill_is_refused_before_any_rank_as_train_refuses_it(
    tmp_path, capsys, monkeypatch
):
    """The child of a rank failed on it with a traceback."""
    from ds_longctx.cli import main as cli_main
    from ds_longctx.rehearsal import rehearse

    says = "seq_len=8 is too short for 8 synthetic queries; use seq_len >= 40"
    monkeypatch.setattr(rehearse, "run_child", lambda *a: pytest.fail("a rank started"))
    assert rehearse.main(["--cpu", "--config", str(write_config(tmp_path)), "--seq_len", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"[rehearsal] refused: {says}"
    with pytest.raises(SystemExit) as e:
        cli_main(["train", "--nproc", "1", "--seq_len", "8", "--output_dir", str(tmp_path / "out")])
    assert (
        e.value.code == 2
        and capsys.readouterr().err.strip().splitlines()[-1] == f"refused before start: {says}"
    )


def test_a_config_without_its_world_needs_gpus(tmp_path):
    res = run_cli(
        ["rehearse", "--cpu", "--config", str(write_config(tmp_path, gpus=None))], timeout=120
    )
    assert res.returncode == 2
    assert "--gpus G" in res.stderr.strip().splitlines()[-1]


def test_without_cuda_a_rehearsal_is_refused_in_seconds_naming_the_gpu_it_needs(tmp_path):
    """A fresh interpreter (nothing pre-imported), no GPU visible: exit 2 before any model is built,
    in under 10 s."""
    import subprocess
    import sys
    import time

    from tests.helpers import cpu_env

    t0 = time.perf_counter()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds_longctx.cli",
            "rehearse",
            "--config",
            str(write_config(tmp_path)),
        ],
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    seconds = time.perf_counter() - t0
    assert res.returncode == 2, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("[rehearsal] refused") and "needs a CUDA GPU" in last and "--cpu" in last
    ), last
    assert "rank 0/8" not in res.stdout and seconds < 10, seconds


def test_a_gpu_smaller_than_the_plan_is_refused_naming_both(tmp_path, monkeypatch):
    """With CUDA (faked): a GPU under the plan's per-GPU figure is refused, both named; a larger one
    passes."""
    import argparse
    from types import SimpleNamespace

    import torch

    from ds_longctx.rehearsal import rehearse, world

    cfg, _ = rehearse.rehearsal_config(["--config", str(write_config(tmp_path))])
    shape = world.check(cfg, 8, 8)
    need = world.planned(cfg, shape).gpu_peak_bytes
    a = argparse.Namespace(cpu=False, config="run.yaml", completion_len=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    problems = []
    for total in (need - 1e8, need + 1e8):
        gpu = SimpleNamespace(name="Tiny GPU", total_memory=int(total))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, gpu=gpu: gpu)
        problems.append(rehearse.memory_problem(a, cfg, shape))
    small, large = problems
    assert large is None and "Tiny GPU" in small, problems
    assert (
        f"has {(need - 1e8) / 1e9:.1f} GB, less than the plan's {need / 1e9:.1f} GB per GPU"
        in small
    )


def test_a_tiny_plan_is_compared_in_gb_not_in_percent():
    """qwen3-tiny's plan (1.7 GB: mostly the CUDA context) against a CPU rehearsal's 0 GB is not
    "-100%"."""
    from ds_longctx.rehearsal.world import PERCENT_FROM, vs_plan

    assert vs_plan(0, 1.7e9) == "-1.70 GB" and vs_plan(0.45e9, 0.3e9) == "+0.15 GB"
    assert vs_plan(72.7e9, 70.1e9) == "+3.7%" and vs_plan(0, PERCENT_FROM) == "-100.0%"


def test_a_rehearsal_refuses_checkpoints_eval_and_export(monkeypatch):
    """In a process playing a rank, the three places a run writes or measures something of its own
    refuse."""
    import torch.distributed as dist

    from ds_longctx.checkpoint import export, save
    from ds_longctx.checkpoint.layout import CheckpointError
    from ds_longctx.parallel import fake_world
    from ds_longctx.run import evaluate

    before = dist.all_to_all_single
    fake_world.start(rank=5, world_size=8, per_node=8)
    try:
        for call, err in (
            (lambda: save.save(None, None, 1, {}), RuntimeError),
            (lambda: evaluate.evaluate(None, None, 1, 1), RuntimeError),
            (lambda: export.export("runs/x", str(ROOT / "nowhere")), CheckpointError),
        ):
            with pytest.raises(err, match="rehearsal"):
                call()
    finally:
        fake_world.stop()
    assert dist.all_to_all_single is before and not dist.is_initialized()


def test_the_symmetric_worlds_collectives_against_a_hand_reference():
    """Rank 3 of 8: every output is what 8 ranks holding rank 3's tensors would get; the originals
    come back."""
    import os

    import torch
    import torch.distributed as dist

    from ds_longctx.parallel import fake_world

    before = {
        n: getattr(dist, n)
        for n in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    }
    env_before = os.environ.get("RANK")
    log = fake_world.start(rank=3, world_size=8, per_node=4)
    try:
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"]) == (
            "3",
            "3",
            "0",
        )
        x = torch.randn(5)
        out = torch.full((40,), float("nan"))
        dist.all_gather_into_tensor(out, x)
        assert torch.equal(out, x.repeat(8))
        inp = torch.randn(40)
        rs = torch.full((5,), float("nan"))
        dist.reduce_scatter_tensor(rs, inp)  # SUM
        assert torch.allclose(rs, 8 * inp[15:20])
        dist.reduce_scatter_tensor(rs, inp, op=dist.ReduceOp.AVG)
        assert torch.equal(rs, inp[15:20])
        group = dist.new_group([0, 1, 2, 3])  # rank 3 is its 4th
        a = torch.randn(4, 3)
        b = torch.full((4, 3), float("nan"))
        dist.all_to_all_single(b, a, group=group)
        assert torch.equal(b, a[3].expand(4, 3))
        t = torch.tensor([2.0, -1.0])
        dist.all_reduce(t)
        assert torch.equal(t, torch.tensor([16.0, -8.0]))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        assert torch.equal(t, torch.tensor([16.0, -8.0]))
        assert log.bytes[("all_gather", tuple(range(8)))] == 40 * 4
        assert log.bytes[("reduce_scatter", tuple(range(8)))] == 2 * 40 * 4
        assert log.bytes[("all_to_all", (0, 1, 2, 3))] == 12 * 4
        assert (
            log.bytes[("all_reduce", tuple(range(8)))] == 8
            and log.bytes[("all_reduce", (0, 1, 2, 3))] == 8
        )
    finally:
        fake_world.stop()
    assert {n: getattr(dist, n) for n in before} == before and os.environ.get("RANK") == env_before
