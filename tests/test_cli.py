"""The `ds-longctx` command (ds_longctx/cli.py): its hand-over to torchrun passes the workers'
arguments as given, and it dispatches its subcommands."""

import importlib

import pytest

from ds_longctx.run.launch import torchrun_args


@pytest.mark.parametrize(
    "run_args",
    [
        [
            "--checkpoint",
            "runs/a",
            "--data",
            "synthetic",
            "--nproc",
            "2",
        ],  # eval's --nproc (torchrun: --nproc-per-node)
        [
            "--max",
            "3",
            "--node",
            "1",
            "--module",
            "x",
            "--",
            "--nnodes",
            "4",
        ],  # prefixes and names of torchrun's options
        [],
    ],
    ids=["eval_nproc", "torchrun_option_names", "none"],
)
def test_the_workers_arguments_are_not_parsed_by_torchrun(run_args):
    from torch.distributed.run import config_from_args

    args = torchrun_args(2, run_args, "ds_longctx.eval")
    config, cmd, cmd_args = config_from_args(args)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 1, 2)
    assert args.module and args.training_script == "ds_longctx.eval"
    assert cmd_args[-len(run_args) - 2 :] == ["-m", "ds_longctx.eval", *run_args], cmd_args
    assert args.master_addr == "127.0.0.1" and 0 < args.master_port < 65536


def test_cli_dispatches_plan(tmp_path):
    from ds_longctx.cli import main

    with pytest.raises(SystemExit) as e:
        main(
            [
                "plan",
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1048576",
                "--gpus",
                "8",
                "--gpu_mem_gb",
                "80",
                "--out",
                str(tmp_path),
            ]
        )
    assert e.value.code == 0 and (tmp_path / "run.yaml").is_file()


LONG_NAME = "a" * 300  # past NAME_MAX: every look at such a path raises OSError (ENAMETOOLONG)


@pytest.mark.parametrize("key", ["output_dir", "data"])
def test_train_refuses_a_path_it_cannot_look_at_in_one_line(key, tmp_path, capsys):
    """A name too long for the file system ended `ds-longctx train` in an OSError traceback (exit
    1)."""
    from ds_longctx.cli import main

    paths = {"output_dir": str(tmp_path / "out"), key: str(tmp_path / LONG_NAME)}
    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", "1", *(x for k, v in paths.items() for x in (f"--{k}", v))])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            "File name too long; give a path this machine can use (output_dir, "
            "data, tokenizer, eval_data)"
        )
    )


def test_a_length_the_synthetic_task_cannot_fill_is_refused_before_any_worker(tmp_path, capsys):
    """seq_len 1 (or `--seq_len true`, read as 1 before) passed every check here and was refused by
    each worker after torchrun started them."""
    from ds_longctx.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", "1", "--seq_len", "8", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1] == (
        "refused before start: seq_len=8 is too short for 8 synthetic queries; use seq_len >= 40"
    )
    assert "torch/distributed" not in err and not (tmp_path / "out").exists()


def test_nproc_given_twice_is_refused(capsys):
    """argparse kept the last --nproc silently."""
    from ds_longctx.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", "1", "--nproc=2"])
    assert e.value.code == 2 and "--nproc is given 2 times; keep one" in capsys.readouterr().err


def test_a_model_whose_training_state_the_cpu_host_cannot_hold_is_refused_before_any_worker(
    tmp_path, capsys, monkeypatch
):
    """`ds-longctx train --nproc 8 --config <an 8-GPU plan of Qwen3-8B>` on a CPU machine started 8
    workers that spent minutes building the model before anything failed."""
    import collections

    import torch

    from ds_longctx.cli import main
    from ds_longctx.run import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(
        preflight.psutil, "virtual_memory", lambda: collections.namedtuple("Mem", "total")(64e9)
    )
    for budget in (
        [],
        ["--gpu_budget_gb", "80"],
    ):  # a plan for GPUs carries a budget: refused the same
        with pytest.raises(SystemExit) as e:
            main(
                [
                    "train",
                    "--nproc",
                    "1",
                    "--model",
                    "qwen3-8b",
                    "--seq_len",
                    "64",
                    *budget,
                    "--output_dir",
                    str(tmp_path / "o"),
                ]
            )
        assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
            "its 8.19B parameters take >= 131.1 GB of host RAM across the ranks (16 bytes each: "
            "weights, grads and "
            "Adam state), more than this machine's 64.0 GB; train it on GPUs (`ds-longctx plan` "
            "says what fits), or a smaller model here (e.g. --model qwen3-tiny)"
        )
    from ds_longctx.config import RunConfig

    assert (
        preflight.cpu_model_problem(RunConfig(model="qwen3-8b", lora_rank=8, dtype="bf16"), 64e9)
        is None
    )  # 16 GB


def test_plan_train_and_rehearse_read_a_bare_name_that_is_also_a_local_folder_as_the_folder(
    tmp_path, capsys, monkeypatch
):
    """`train` took the shipped preset first, `plan` the folder (config/model.resolve_model: one
    reading)."""
    import json

    from ds_longctx.cli import main
    from ds_longctx.config import SHIPPED_MODELS_DIR, RunConfig
    from ds_longctx.config.model import resolve_model
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.rehearsal.rehearse import main as rehearse_main
    from ds_longctx.run.model import load_hf_config, random_init

    preset = SHIPPED_MODELS_DIR / "qwen3-tiny.json"
    (tmp_path / "qwen3-tiny").mkdir()
    (tmp_path / "qwen3-tiny" / "config.json").write_text(
        json.dumps(json.loads(preset.read_text()) | {"num_hidden_layers": 3})
    )
    monkeypatch.chdir(tmp_path)
    note = f"the local folder here, not the shipped preset qwen3-tiny; pass {preset} for the preset"
    assert resolve_model("qwen3-tiny").note == note and resolve_model("./qwen3-tiny").note is None
    assert resolve_model("qwen3-tiny").label == f"qwen3-tiny ({note})"
    assert [
        ModelGeometry.from_name_or_path(m).layers
        for m in ("qwen3-tiny", "./qwen3-tiny", str(preset))
    ] == [3, 3, 2]
    assert [
        load_hf_config(m).num_hidden_layers for m in ("qwen3-tiny", "./qwen3-tiny", str(preset))
    ] == [3, 3, 2]
    assert (random_init("qwen3-tiny"), random_init(str(preset))) == (False, True)
    assert (
        main_exit(main, ["plan", "--model", "qwen3-tiny", "--seq_len", "1024", "--gpus", "1"]) == 0
    )
    assert capsys.readouterr().out.splitlines()[0] == f"model qwen3-tiny: {note}"
    weights = (
        "model='qwen3-tiny' holds a config.json but no weights (no model.safetensors / "
        "pytorch_model.bin, no "
        "*.safetensors); copy the weights there, or pass qwen3-tiny/config.json to train from "
        "random init"
    )
    assert (
        main_exit(main, ["train", "--nproc", "1", "--model", "qwen3-tiny", "--output_dir", "out"])
        == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"refused before start: {weights}"
    (tmp_path / "run.yaml").write_text("model: qwen3-tiny\nseq_len: 256\ngpus_per_node: 1\n")
    assert rehearse_main(["--cpu", "--config", "run.yaml"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"[rehearsal] refused: {weights}"
    assert RunConfig(model=str(preset)).model.name == str(preset)


def test_a_hub_id_is_planned_as_the_preset_of_its_shape_and_refused_by_a_run(capsys):
    from ds_longctx.config import RunConfig
    from ds_longctx.config.model import resolve_model

    assert (resolve_model("Qwen/Qwen3-8B").name, resolve_model("Qwen/Qwen3-8B").hub) == (
        "qwen3-8b",
        True,
    )
    with pytest.raises(
        ValueError,
        match=r"model='Qwen/Qwen3-8B' is a Hub id, which a run does not download: `hf "
        r"download Qwen/Qwen3-8B --local-dir DIR` and pass DIR \(or qwen3-8b, the "
        r"preset of its shape with random weights\)",
    ):
        RunConfig(model="Qwen/Qwen3-8B")


def main_exit(main, argv: list) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def test_every_command_is_one_record_that_help_lists_and_main_dispatches(capsys, monkeypatch):
    """cli.COMMANDS is the one list: each entry point resolves to a function, `ds-longctx --help`
    lists exactly the records with their help lines, and `ds-longctx NAME ARGS` calls NAME's entry
    with ARGS."""
    import re

    from ds_longctx import cli

    entries = {name: c.resolve() for name, c in cli.COMMANDS.items()}
    assert all(callable(f) for f in entries.values()) and "train" in entries and "plan" in entries
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    listed = re.search(r"^  \{([a-z,]+)\}$", out, re.M).group(1).split(",")
    assert listed == list(cli.COMMANDS)
    flat = " ".join(out.split())  # argparse wraps the help lines
    assert all(f"{name} {' '.join(c.help.split())}" in flat for name, c in cli.COMMANDS.items())
    called = []
    for name, c in cli.COMMANDS.items():
        module, _, function = c.entry.partition(":")
        target = cli if module == cli.HERE else importlib.import_module(module)
        monkeypatch.setattr(target, function, lambda args, name=name: called.append((name, args)))
        with pytest.raises(SystemExit):
            cli.main([name, "--x", "1"])
    assert called == [(name, ["--x", "1"]) for name in cli.COMMANDS]
