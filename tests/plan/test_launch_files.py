"""The launch files `ds-longctx plan` writes (plan/launch_files.py) go through the launchers' own
code: accelerate loads accelerate.yaml, DeepSpeed's runner reads the hostfile, and accelerate launch
and torchrun parse the multi-node launch lines, each in a dry run that starts nothing."""

from __future__ import annotations

import json

import yaml

from ds_longctx.plan import write
from tests.plan.test_write import PLAN_2X8X80, PLAN_8X80


def test_accelerate_yaml_is_accelerates_deepspeed_format(tmp_path):
    assert write.main(PLAN_8X80 + ["--out", str(tmp_path)]) == 0
    acc = yaml.safe_load((tmp_path / "accelerate.yaml").read_text())
    assert acc == write.accelerate_config(8)
    assert acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 8
    ds_file = acc["deepspeed_config"]["deepspeed_config_file"]
    assert (
        ds_file == "ds_config.json" and (tmp_path / ds_file).is_file()
    )  # relative to the YAML's directory
    assert "mixed_precision" not in acc  # accelerate refuses it beside a deepspeed_config_file
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    loaded = load_config_from_file(str(tmp_path / "accelerate.yaml"))
    assert loaded.distributed_type == DistributedType.DEEPSPEED and loaded.num_processes == 8


def test_the_multinode_hostfile_goes_through_deepspeeds_runner(tmp_path, monkeypatch):
    """A dry run of `deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8`: DeepSpeed's own
    parser, resource filter and pdsh command builder, up to the command it would run (nothing is
    started)."""
    import base64

    from deepspeed.launcher import runner
    from deepspeed.launcher.multinode_runner import PDSHRunner

    assert write.main(PLAN_2X8X80 + ["--out", str(tmp_path)]) == 0
    monkeypatch.chdir(tmp_path)  # launch.txt: run from the plan's directory
    args = runner.parse_args(write.launch_lines(8, 2)[0].split()[1:])
    pool = runner.fetch_hostfile(args.hostfile)
    assert dict(pool) == {"node-0": 8, "node-1": 8}
    active = runner.apply_num_nodes_and_gpus(
        runner.parse_inclusion_exclusion(pool, args.include, args.exclude),
        args.num_nodes,
        args.num_gpus,
    )
    args.master_addr = "node-0"  # the runner would ask node-0 over ssh (`hostname -I`)
    world_info = runner.encode_world_info(active)
    assert json.loads(base64.urlsafe_b64decode(world_info)) == {
        "node-0": list(range(8)),
        "node-1": list(range(8)),
    }
    cmd = PDSHRunner(args, world_info).get_cmd({}, active)[0]
    assert cmd[cmd.index("-w") + 1] == "node-0,node-1" and f"cd {tmp_path};" in cmd
    assert cmd[-3:] == ["ds_longctx.train", "--config", "run.yaml"] and "--module" in cmd
    assert (
        "--node_rank=%n" in cmd and "--master_port=29500" in cmd
    )  # pdsh fills in each node's rank


def test_the_multinode_accelerate_yaml_goes_through_accelerate_launch(tmp_path, monkeypatch):
    """accelerate 1.15 loads the YAML, and its `accelerate launch` argument processing (a dry run:
    the same
    functions up to torchrun's arguments, nothing started) turns node 1's launch line into torchrun
    on 8 processes of 2 nodes at node 0's address."""
    import torch.distributed.run as distrib_run
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import (
        _filter_args,
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils import DistributedType
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    assert write.main(PLAN_2X8X80 + ["--out", str(tmp_path)]) == 0
    loaded = load_config_from_file(str(tmp_path / "accelerate.yaml"))
    assert loaded.distributed_type == DistributedType.DEEPSPEED
    assert (loaded.num_machines, loaded.num_processes, loaded.machine_rank) == (2, 16, 0)
    assert loaded.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
    monkeypatch.chdir(tmp_path)
    line = (
        write.launch_lines(8, 2)[1].replace("$NODE_RANK", "1").replace("$MASTER_ADDR", "10.0.0.1")
    )
    args, defaults, _ = _validate_launch_command(
        launch_command_parser().parse_args(line.split()[2:])
    )
    assert args.use_deepspeed and defaults.num_machines == 2
    args.deepspeed_fields_from_accelerate_config = ",".join(
        defaults.deepspeed_config
    )  # as launch_command does
    cmd, env = prepare_deepspeed_cmd_env(args)
    assert (
        cmd is None and env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "ds_config.json"
    )  # torchrun on this node
    t = _filter_args(
        args,
        distrib_run.get_args_parser(),
        [
            "--training_script",
            args.training_script,
            "--training_script_args",
            args.training_script_args,
        ],
    )
    assert (t.nnodes, t.nproc_per_node, t.node_rank, t.rdzv_endpoint) == (
        "2",
        "8",
        1,
        "10.0.0.1:29500",
    )
    assert (t.module, t.training_script, t.training_script_args) == (
        True,
        "ds_longctx.train",
        ["--config", "run.yaml"],
    )


def test_the_multinode_torchrun_line_parses_as_two_nodes_of_8():
    from torch.distributed.run import config_from_args, get_args_parser

    line = (
        write.launch_lines(8, 2)[2].replace("$NODE_RANK", "1").replace("$MASTER_ADDR", "10.0.0.1")
    )
    config, cmd, cmd_args = config_from_args(get_args_parser().parse_args(line.split()[1:]))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 8)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("c10d", "10.0.0.1:29500")
    assert cmd_args[-3:] == ["ds_longctx.train", "--config", "run.yaml"]


def test_the_single_node_launch_txt_has_a_torchrun_line_of_8_processes(tmp_path):
    """README says launch.txt holds deepspeed, torchrun and accelerate lines; one node's had no
    torchrun line."""
    from torch.distributed.run import config_from_args, get_args_parser

    assert (
        write.main(
            ["--model", "qwen3-8b", "--seq_len", "131072", "--gpus", "8", "--out", str(tmp_path)]
        )
        == 0
    )
    (line,) = [
        x for x in (tmp_path / "launch.txt").read_text().splitlines() if x.startswith("torchrun ")
    ]
    config, cmd, cmd_args = config_from_args(get_args_parser().parse_args(line.split()[1:]))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 1, 8)
    assert cmd_args[-3:] == ["ds_longctx.train", "--config", "run.yaml"]
