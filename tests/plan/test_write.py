"""`ds-longctx plan`: exit codes, the files it writes, their agreement with the planner, and the
committed configs."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ds_longctx.config import RunConfig
from ds_longctx.plan import committed as committed_configs
from ds_longctx.plan import write
from ds_longctx.plan.cache_placement import fastest_placement
from ds_longctx.plan.ds_config import build_ds_config
from ds_longctx.plan.planner import GB
from ds_longctx.plan.search import choose, find_max_len
from ds_longctx.run.placement_plan import run_placement
from tests.helpers import ROOT

PLAN_8X80 = ["--model", "qwen3-8b", "--seq_len", "1048576", "--gpus", "8", "--gpu_mem_gb", "80"]


def test_1m_on_8x80_writes_every_file(tmp_path, capsys):
    assert write.main(PLAN_8X80 + ["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(write.FILES + (write.PLAN_MARKER,))
    out = capsys.readouterr().out
    assert "checkpoints" in out and "GB/GPU" in out and "GB host" in out  # the table
    assert "deepspeed --num_gpus 8 --module ds_longctx.train --config run.yaml" in out
    assert (
        "accelerate launch --config_file accelerate.yaml -m ds_longctx.train --config run.yaml"
        in out
    )
    lines = (tmp_path / "launch.txt").read_text().splitlines()
    assert lines[2] == write.REHEARSE and lines[4:] == write.launch_lines(8)
    assert write.REHEARSE in (tmp_path / "plan.txt").read_text()
    run = yaml.safe_load((tmp_path / "run.yaml").read_text().split("\n", 1)[1])
    assert (run["parallel"]["nodes"], run["parallel"]["gpus_per_node"]) == (
        1,
        8,
    )  # the world it was planned for


def test_the_plan_caches_attention_unless_asked_not_to(tmp_path):
    import yaml

    from ds_longctx.levers.placement import PlacementPlan

    argv = [
        "--model",
        "qwen3-8b",
        "--seq_len",
        "1048576",
        "--gpus",
        "8",
        "--gpu_mem_gb",
        "141",
        "--host_mem_gb",
        "560",
    ]
    assert write.main(argv + ["--out", str(tmp_path)]) == 0
    run = yaml.safe_load((tmp_path / "run.yaml").read_text())
    want = fastest_placement(choose("qwen3-8b", 1 << 20, 8, 141, 560), 141, 560).plan.placement
    assert PlacementPlan.parse(run["memory"]["placement"]) == want and want.cached > 0
    assert f"placement per layer: {want.describe()}" in (tmp_path / "plan.txt").read_text()
    assert write.main(argv + ["--no_attention_cache", "--out", str(tmp_path / "plain")]) == 0
    plain = yaml.safe_load((tmp_path / "plain" / "run.yaml").read_text())["memory"]
    assert plain["placement"] is None and plain["attention_cache_layers"] == 0
    assert "--no_attention_cache" in (tmp_path / "plain" / "run.yaml").read_text().splitlines()[0]


def test_find_max_len(capsys):
    args = [
        "--model",
        "qwen3-8b",
        "--gpus",
        "2",
        "--gpu_mem_gb",
        "141",
        "--host_mem_gb",
        "256",
        "--find_max_len",
    ]
    assert write.main(args) == 0
    n = find_max_len("qwen3-8b", 2, 141, 256)
    assert f"longest seq_len that fits = {n:,} tokens" in capsys.readouterr().out
    # nothing fits: the answer (0) first, then what to change, on stderr, and exit 2 (no config can
    # be written)
    assert (
        write.main(["--model", "qwen3-8b", "--gpus", "1", "--gpu_mem_gb", "24", "--find_max_len"])
        == 2
    )
    got = capsys.readouterr()
    assert "longest seq_len that fits = 0 tokens" in got.out
    assert (
        "does not fit 1 x 24 GB GPUs" in got.err
        and "Fix: GPUs of >= " in got.err
        and "No length fits" in got.err
    )
    # what bounds it: the host, even with every lever on
    assert (
        "--find_max_len: no length fits, not even the search's shortest: qwen3-8b at seq_len=1,024"
        in got.err
    )
    assert re.search(
        r"needs [\d.]+ GB/GPU and [\d.]+ GB host, over the budget \(host [\d.]+ > 115.2 GB\)",
        got.err,
    )


@pytest.mark.parametrize(
    "gpus,gpu_gb,host_gb", [(8, 80, 560), (8, 141, 560), (2, 141, 256), (4, 80, 512)]
)
def test_run_yaml_carries_the_planners_choices(tmp_path, gpus, gpu_gb, host_gb):
    n = min(1 << 20, find_max_len("qwen3-8b", gpus, gpu_gb, host_gb))
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                str(n),
                "--gpus",
                str(gpus),
                "--gpu_mem_gb",
                str(gpu_gb),
                "--host_mem_gb",
                str(host_gb),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    c = fastest_placement(choose("qwen3-8b", n, gpus, gpu_gb, host_gb), gpu_gb, host_gb)
    cfg = RunConfig.load(tmp_path / "run.yaml")
    lv, k = c.levers, c.plan.placement.offloaded
    assert (
        cfg.model.name,
        cfg.train.seq_len,
        cfg.parallel.sp_size,
        cfg.train.micro_batch,
        cfg.model.dtype,
    ) == ("qwen3-8b", n, c.sp_size, 1, "bf16")
    assert (
        cfg.memory.chunked_loss,
        cfg.memory.loss_chunk_rows,
        cfg.memory.tiled_mlp,
        cfg.memory.tile_tokens,
    ) == (lv.chunked_loss, lv.loss_chunk_rows, lv.tiled_mlp, lv.tile_tokens)
    assert cfg.memory.activation_checkpointing and cfg.memory.placement == c.plan.placement.spec()
    assert run_placement(cfg, c.plan.geom.layers, gpus, None) == c.plan.placement
    assert cfg.optimizer.offload == lv.optimizer_offload and cfg.optimizer.torch_adam == (
        not lv.optimizer_offload
    )
    # the JSON is build_ds_config of that run config, nothing hand-built
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert ds == build_ds_config(cfg, world_size=gpus, on_gpu=True)
    assert (
        ds["zero_optimization"]["stage"] == 3
        and ds["bf16"]["enabled"]
        and "activation_checkpointing" in ds
    )
    assert ds["sequence_parallel_size"] == c.sp_size
    assert ("offload_optimizer" in ds["zero_optimization"]) == lv.optimizer_offload
    assert ds["activation_checkpointing"]["cpu_checkpointing"] == (k > 0)
    plan_txt = (tmp_path / "plan.txt").read_text()
    assert c.plan.table() in plan_txt and f"{c.plan.gpu_peak_bytes / GB:.1f} GB per GPU" in plan_txt


def test_files_hold_no_absolute_paths_and_are_deterministic(tmp_path):
    for d in ("a", "b"):
        assert write.main(PLAN_8X80 + ["--out", str(tmp_path / d)]) == 0
    for name in write.FILES:
        text = (tmp_path / "a" / name).read_text()
        assert text == (tmp_path / "b" / name).read_text()
        assert str(tmp_path) not in text and "/work" not in text and "/tmp" not in text


def test_committed_configs_regenerate_byte_for_byte(tmp_path):
    write.regenerate_all(tmp_path)
    committed = ROOT / "ds_configs"
    want = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    got = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert got == want, "ds_configs/ holds other files than the generator writes"
    stale = [str(p) for p in want if (committed / p).read_bytes() != (tmp_path / p).read_bytes()]
    assert not stale, (
        f"{stale} differ from the generator: run `python -m ds_longctx.plan --regen-all ds_configs`"
    )
    assert set(committed_configs.COMMITTED) == {p.name for p in committed.iterdir() if p.is_dir()}


def test_fast_and_torch_free(tmp_path):
    code = (
        "import sys; from ds_longctx.plan.write import main; "
        f"rc = main({PLAN_8X80 + ['--out', str(tmp_path)]!r}); "
        "assert rc == 0, rc; assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu_s < 5, (
        f"the plan took {cpu_s:.1f} s of CPU"
    )  # CPU time: the wall clock of a busy CI box varies


def test_the_old_generate_entry_points_write_the_same_plan(tmp_path):
    """`python -m ds_longctx.generate` and `from ds_longctx.plan.generate import main` (the names
    before plan/write.py) and `python -m ds_longctx.plan` write the files `write.main` writes, byte
    for byte."""
    assert write.main(PLAN_8X80 + ["--out", str(tmp_path / "ref")]) == 0
    runs = {
        "module": [
            sys.executable,
            "-m",
            "ds_longctx.generate",
            *PLAN_8X80,
            "--out",
            str(tmp_path / "module"),
        ],
        "plan": [
            sys.executable,
            "-m",
            "ds_longctx.plan",
            *PLAN_8X80,
            "--out",
            str(tmp_path / "plan"),
        ],
        "import": [
            sys.executable,
            "-c",
            "import sys; from ds_longctx.plan.generate import main; "
            f"sys.exit(main({PLAN_8X80 + ['--out', str(tmp_path / 'import')]!r}))",
        ],
    }
    for name, cmd in runs.items():
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        for f in write.FILES:
            assert (tmp_path / name / f).read_bytes() == (tmp_path / "ref" / f).read_bytes(), (
                name,
                f,
            )


PLAN_2X8X80 = [
    "--model",
    "qwen3-8b",
    "--seq_len",
    "1048576",
    "--nodes",
    "2",
    "--gpus",
    "8",
    "--gpu_mem_gb",
    "80",
    "--host_mem_gb",
    "560",
]


def test_two_nodes_write_a_hostfile_a_multinode_accelerate_yaml_and_the_launch_lines(
    tmp_path, capsys
):
    assert write.main(PLAN_2X8X80 + ["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        write.MULTINODE_FILES + (write.PLAN_MARKER,)
    )
    c = fastest_placement(choose("qwen3-8b", 1 << 20, 8, 80, 560, nodes=2), 80, 560)
    cfg = RunConfig.load(tmp_path / "run.yaml")
    assert (
        cfg.parallel.sp_size == c.sp_size == 8 and not cfg.parallel.sp_across_nodes
    )  # SP inside a node
    assert cfg.memory.placement == c.plan.placement.spec() and cfg.train.output_dir.endswith(
        "_2x8gpu"
    )
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert (
        ds == build_ds_config(cfg, world_size=16, on_gpu=True) and ds["train_batch_size"] == 2
    )  # dp over nodes
    launch = (tmp_path / "launch.txt").read_text().splitlines()
    assert [line for line in launch if not line.startswith("#")] == [
        write.REHEARSE,
        *write.launch_lines(8, 2),
    ]
    assert write.launch_lines(8, 2)[:3] == [
        "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 --module ds_longctx.train "
        "--config run.yaml",
        "accelerate launch --config_file accelerate.yaml --machine_rank $NODE_RANK "
        "--main_process_ip $MASTER_ADDR -m ds_longctx.train --config run.yaml",
        "torchrun --nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK --rdzv_backend c10d "
        "--rdzv_endpoint $MASTER_ADDR:29500 -m ds_longctx.train --config run.yaml",
    ]
    assert write.launch_lines(8, 2)[3].startswith(
        "srun --nodes 2 --ntasks-per-node 1 bash -c 'torchrun --nnodes 2"
    )
    plan_txt = (tmp_path / "plan.txt").read_text()
    assert "budget: 2 nodes x 8 x 80 GB GPUs" in plan_txt and "GB host per node" in plan_txt
    assert c.plan.table() in plan_txt and "nodes=2 gpus/node=8 world=16 sp=8 dp=2" in plan_txt
    assert "hostfile" in capsys.readouterr().out


def test_lora_rank_plans_the_adapters_and_reaches_run_yaml(tmp_path):
    """--lora_rank plans a LoRA run: optimizer state only for the adapters, so a longer length fits
    the same GPUs, and run.yaml carries the rank (the run then trains exactly what was planned)."""
    full = find_max_len("qwen3-8b", 2, 141, 256)
    from ds_longctx.plan.levers import Levers

    lora = find_max_len("qwen3-8b", 2, 141, 256, base=Levers(lora_rank=16))
    assert lora > full
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                str(lora),
                "--gpus",
                "2",
                "--gpu_mem_gb",
                "141",
                "--host_mem_gb",
                "256",
                "--lora_rank",
                "16",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    cfg = RunConfig.load(tmp_path / "run.yaml")
    assert (
        cfg.lora.rank == 16
        and "--lora_rank 16" in (tmp_path / "run.yaml").read_text().splitlines()[0]
    )
    assert (
        write.main(["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "2", "--lora_rank", "-1"])
        == 2
    )


def test_plan_into_a_closed_pipe_exits_quietly(tmp_path):
    """`ds-longctx plan ... | head -1`: the reader is gone before the plan prints; no traceback,
    exit 1."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ds_longctx.cli",
            "plan",
            "--model",
            "qwen3-8b",
            "--seq_len",
            "131072",
            "--gpus",
            "2",
            "--gpu_mem_gb",
            "141",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the planner prints anything: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert (tmp_path / "plan.txt").exists()  # the files were still written


def test_tiled_layer_is_picked_when_needed_kept_when_asked_and_refused_with_lora(tmp_path, capsys):
    """The search adds the tiled layer by itself where nothing fits without it (the longest length
    on 2 x 141 GB + 256 GB), `--tiled_layer` forces it on at any length (run.yaml carries it), with
    --lora_rank it is refused before any search (exit 2)."""
    hw = ["--model", "qwen3-8b", "--gpus", "2", "--gpu_mem_gb", "141", "--host_mem_gb", "256"]
    assert write.main(hw + ["--find_max_len", "--out", str(tmp_path / "max")]) == 0
    out = capsys.readouterr().out
    assert "tiled_layer=True: needed to fit" in out
    assert RunConfig.load(tmp_path / "max" / "run.yaml").memory.tiled_layer
    assert (
        write.main(hw + ["--seq_len", "131072", "--tiled_layer", "--out", str(tmp_path / "asked")])
        == 0
    )
    assert "tiled_layer=True: as asked" in capsys.readouterr().out
    cfg = RunConfig.load(tmp_path / "asked" / "run.yaml")
    assert cfg.memory.tiled_layer and cfg.memory.tiled_mlp and cfg.memory.tile_tokens == 4096
    assert write.main(hw + ["--seq_len", "131072", "--tiled_layer", "--lora_rank", "16"]) == 2
    assert "--tiled_layer with --lora_rank 16" in capsys.readouterr().err


def test_plans_a_model_from_its_config_json_file(tmp_path, capsys):
    """Another family, weights not here: Llama-3.1-8B's config.json (32 layers, 14,336 MLP, 128,256
    vocab, no q/k norm) as a file: planned like a shipped geometry, the run config names the file
    (train random-inits from it)."""
    cfg = tmp_path / "llama-3.1-8b.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
            }
        )
    )
    out = tmp_path / "plan"
    assert (
        write.main(
            [
                "--model",
                str(cfg),
                "--seq_len",
                "131072",
                "--gpus",
                "2",
                "--gpu_mem_gb",
                "141",
                "--host_mem_gb",
                "256",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = (out / "plan.txt").read_text()
    assert "T=65,536" in text and "qk_norm_saved" not in text  # Llama has no q/k norms
    P = (
        32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096)
        + 2 * 128256 * 4096
        + 4096
    )
    assert f"{2 * -(-P // 2) / 1e9:.2f}" in next(
        line for line in text.splitlines() if line.startswith("params_bf16")
    )
    assert f"name: {cfg}" in (out / "run.yaml").read_text()
    # the run directory takes the model's name, not its absolute path (it read
    # runs//tmp/.../llama-3.1-8b.json_...)
    assert (
        yaml.safe_load((out / "run.yaml").read_text())["train"]["output_dir"]
        == "runs/llama-3.1-8b_131072_2gpu"
    )
    ckpt = tmp_path / "My Llama v1.5"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(cfg.read_text())
    assert (
        write.main(
            [
                "--model",
                str(ckpt),
                "--seq_len",
                "131072",
                "--gpus",
                "2",
                "--gpu_mem_gb",
                "141",
                "--host_mem_gb",
                "256",
                "--out",
                str(tmp_path / "p2"),
            ]
        )
        == 0
    )
    assert (
        yaml.safe_load((tmp_path / "p2" / "run.yaml").read_text())["train"]["output_dir"]
        == "runs/My_Llama_v1.5_131072_2gpu"
    )


def test_forced_head_groups_and_parameter_offload_reach_the_plan_and_its_run_config(
    tmp_path, capsys
):
    """`--attn_bwd_head_groups 4 --offload_params` on 2 x 141 GB: the search keeps both (an sp whose
    KV heads per rank 4 groups split), the command line in plan.txt names them, and run.yaml /
    ds_config.json carry them."""
    import json

    import yaml

    out = tmp_path / "plan"
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "262144",
                "--gpus",
                "2",
                "--gpu_mem_gb",
                "141",
                "--attn_bwd_head_groups",
                "4",
                "--offload_params",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    plan = (out / "plan.txt").read_text()
    assert "--attn_bwd_head_groups 4 --offload_params" in plan.splitlines()[0]
    assert "attn_bwd_head_groups=4: as asked" in plan and "offload_params=True: as asked" in plan
    run = yaml.safe_load((out / "run.yaml").read_text())
    assert run["memory"]["attn_bwd_head_groups"] == 4 and run["optimizer"]["offload_params"] is True
    assert (
        json.loads((out / "ds_config.json").read_text())["zero_optimization"]["offload_param"][
            "device"
        ]
        == "cpu"
    )


def test_a_partial_offload_the_search_picks_reaches_run_yaml_and_deepspeeds_config(
    tmp_path, capsys
):
    """1 x 141 GB + 128 GB host: `plan` offloads part of the 8B's optimizer (the whole breaks the
    host), says so, and run.yaml and ds_config.json carry the ratio and the sub-group size it was
    planned at."""
    import json

    import yaml

    from ds_longctx.plan.zero_buffers import offload_sub_group_elems

    out = tmp_path / "plan"
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "65536",
                "--gpus",
                "1",
                "--gpu_mem_gb",
                "141",
                "--host_mem_gb",
                "128",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    c = choose("qwen3-8b", 65536, 1, 141, 128)
    ratio = c.levers.optimizer_offload_ratio
    assert 0 < ratio < 1
    assert "the whole optimizer there breaks the host budget" in (out / "plan.txt").read_text()
    run = yaml.safe_load((out / "run.yaml").read_text())
    assert run["optimizer"]["offload"] is True and run["optimizer"]["offload_ratio"] == ratio
    off = json.loads((out / "ds_config.json").read_text())["zero_optimization"]
    assert off["offload_optimizer"]["ratio"] == ratio
    assert off["sub_group_size"] == offload_sub_group_elems(c.plan.geom, 1)


def test_an_explicit_whole_optimizer_offload_is_kept(tmp_path, capsys):
    """--optimizer_offload_ratio 1 given fixes the share at all of it (it read as "not given", 1
    being the default, so the search still split the optimizer): on 1 x 141 GB + 128 GB host the 8B
    at 65,536 fits only split, so the explicit 1 ends in NoFit with the fix to drop it; with 200 GB
    of host the whole offload is the plan."""
    base = ["--model", "qwen3-8b", "--seq_len", "65536", "--gpus", "1", "--gpu_mem_gb", "141"]
    assert write.main(base + ["--host_mem_gb", "128"]) == 0
    assert "optimizer_offload=True (ratio 0." in capsys.readouterr().out  # the search's own share
    assert write.main(base + ["--host_mem_gb", "128", "--optimizer_offload_ratio", "1"]) == 2
    assert "Fix: drop --optimizer_offload_ratio 1" in capsys.readouterr().err
    out = tmp_path / "whole"
    assert (
        write.main(
            base + ["--host_mem_gb", "200", "--optimizer_offload_ratio", "1", "--out", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert (
        "optimizer_offload=True" in text
        and "(ratio" not in text.split("optimizer_offload=True")[1][:8]
    )
    assert (
        "--optimizer_offload_ratio 1`" in (out / "run.yaml").read_text()
    )  # the command line says it
    assert yaml.safe_load((out / "run.yaml").read_text())["optimizer"]["offload_ratio"] == 1.0


def test_lora_on_a_mixture_of_experts_names_targets_plan_takes(tmp_path, capsys):
    """`--lora_rank 16` on Qwen3-30B-A3B (every layer sparse) ended in a ValueError traceback from
    deep in the search (the default targets name the MLP, which its experts replace), and the fix it
    named, --lora_target_modules, was not an option of plan."""
    moe = ["--model", "qwen3-30b-a3b", "--seq_len", "65536", "--gpus", "8", "--lora_rank", "16"]
    assert write.main(moe) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "use --lora_target_modules q_proj,k_proj,v_proj,o_proj" in err
    assert (
        write.main(
            moe + ["--lora_target_modules", "q_proj,k_proj,v_proj,o_proj", "--out", str(tmp_path)]
        )
        == 0
    )
    run = RunConfig.load(tmp_path / "run.yaml")
    assert (run.lora.rank, run.lora.target_modules) == (
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    assert (
        "--lora_target_modules q_proj,k_proj,v_proj,o_proj" in (tmp_path / "launch.txt").read_text()
    )
    capsys.readouterr()
    for args, says in (
        (["--lora_target_modules", "foo_proj"], "entry 'foo_proj' matches no Linear of the model"),
        (["--lora_target_modules", ","], "entry '' is not a module-name suffix"),
    ):
        assert write.main(moe + args) == 2 and says in capsys.readouterr().err
    assert write.main(moe[:-2] + ["--lora_target_modules", "q_proj"]) == 2
    assert "--lora_target_modules q_proj without --lora_rank" in capsys.readouterr().err


def test_a_plan_of_a_relative_model_directory_runs_from_its_own_directory_and_from_the_root(
    tmp_path, monkeypatch
):
    """`plan --model tiny_qwen3/ --out tiny_run`, then launch.txt's way (from tiny_run/) and from
    where plan ran: the run reads the same model either way (it refused "tiny_qwen3 does not exist"
    from tiny_run/); a hand-written relative path in a config file names the path beside the
    file."""
    from ds_longctx.run.preflight import preflight
    from tests.helpers import tiny_model

    tiny_model().save_pretrained(tmp_path / "tiny_qwen3")
    monkeypatch.chdir(tmp_path)
    assert (
        write.main(
            ["--model", "tiny_qwen3/", "--seq_len", "1024", "--gpus", "1", "--out", "tiny_run"]
        )
        == 0
    )
    (tmp_path / "tiny_run" / "rel.yaml").write_text("model: ../tiny_qwen3\nseq_len: 1024\n")
    for cwd, config in (
        (tmp_path / "tiny_run", "run.yaml"),
        (tmp_path, "tiny_run/run.yaml"),
        (tmp_path / "tiny_run", "rel.yaml"),
        (tmp_path, "tiny_run/rel.yaml"),
    ):
        monkeypatch.chdir(cwd)
        cfg = RunConfig.from_cli(
            ["--config", config, "--output_dir", str(tmp_path / "out"), "--dtype", "fp32"], 1, 1
        )
        shape, _ = preflight(cfg, 1)
        assert Path(cfg.model.name).resolve() == tmp_path / "tiny_qwen3", (
            cwd,
            config,
            cfg.model.name,
        )
        assert shape.hf_config.num_hidden_layers == 2
