"""The `ds-longctx` command (ds_longctx/cli.py): its hand-over to torchrun passes the workers' arguments as given, and
it dispatches its subcommands."""

import pytest

from ds_longctx.cli import torchrun_args


@pytest.mark.parametrize("run_args", [
    ["--checkpoint", "runs/a", "--data", "synthetic", "--nproc", "2"],  # eval's --nproc (torchrun: --nproc-per-node)
    ["--max", "3", "--node", "1", "--module", "x", "--", "--nnodes", "4"],  # prefixes and names of torchrun's options
    [],
], ids=["eval_nproc", "torchrun_option_names", "none"])
def test_the_workers_arguments_are_not_parsed_by_torchrun(run_args):
    from torch.distributed.run import config_from_args
    args = torchrun_args(2, run_args, "ds_longctx.eval")
    config, cmd, cmd_args = config_from_args(args)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 1, 2)
    assert args.module and args.training_script == "ds_longctx.eval"
    assert cmd_args[-len(run_args) - 2:] == ["-m", "ds_longctx.eval", *run_args], cmd_args
    assert args.master_addr == "127.0.0.1" and 0 < args.master_port < 65536


def test_cli_dispatches_plan(tmp_path):
    from ds_longctx.cli import main
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "qwen3-8b", "--seq_len", "1048576", "--gpus", "8", "--gpu_mem_gb", "80", "--out",
              str(tmp_path)])
    assert e.value.code == 0 and (tmp_path / "run.yaml").is_file()
