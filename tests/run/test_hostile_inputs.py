"""Hostile values refused when the config is read or before anything starts, each in one line that
names the value and the fix: non-finite or absurd hyperparameters, a model `plan` refuses (the same
words from `train`), an output_dir holding another run, a broken config.json, a model directory
without its weights."""

import json

import pytest
from pydantic import ValidationError

from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import RUN_CONFIGS, RUN_MARKER, ckpt_root
from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.parallel.disk import mark_written
from ds_longctx.plan.write import main as plan_main
from ds_longctx.run.preflight import preflight
from tests.helpers import ROOT, run_cli

TINY = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text())


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--lr", "inf"],
            "optimizer.lr: Input should be a finite number (got 'inf'; give a finite number)",
        ),
        (["--lr", "1e400"], "optimizer.lr: Input should be a finite number (got '1e400'"),
        (["--lr", "nan"], "optimizer.lr: Input should be a finite number"),
        (["--lr", "-1e-4"], "optimizer.lr: Input should be greater than 0"),
        (["--lr", "10"], "optimizer.lr: Input should be less than or equal to 1 (got 10)"),
        (
            ["--weight_decay", "5"],
            "optimizer.weight_decay: Input should be less than or equal to 1",
        ),
        (
            ["--weight_decay", "-0.1"],
            "optimizer.weight_decay: Input should be greater than or equal to 0",
        ),
        (["--grad_clip", "inf"], "optimizer.grad_clip: Input should be a finite number"),
        (
            ["--warmup_steps", "-5"],
            "optimizer.warmup_steps: Input should be greater than or equal to 0",
        ),
        (
            ["--optimizer_offload_ratio", "nan"],
            "optimizer.offload_ratio: Input should be a finite number",
        ),
        (
            ["--collective_timeout_s", "1e400"],
            "parallel.collective_timeout_s: Input should be a finite number",
        ),
        (
            ["--collective_timeout_s", "0.001"],
            "parallel.collective_timeout_s: Input should be greater than or equal to 1",
        ),
        (["--seed", "-1"], "train.seed: Input should be greater than or equal to 0"),
        (["--seed", str(2**32)], "train.seed: Input should be less than 4294967296"),
        (["--lora_alpha", "inf"], "lora.alpha: Input should be a finite number"),
        (["--gpu_budget_gb", "inf"], "memory.gpu_budget_gb: Input should be a finite number"),
    ],
)
def test_non_finite_or_absurd_hyperparameters_are_refused_when_the_config_is_read(argv, says):
    with pytest.raises(ValidationError) as e:
        RunConfig.from_cli(argv)
    assert says in format_validation_error(e.value)


def test_lr_inf_exits_2_before_any_worker_starts(tmp_path):
    out = tmp_path / "out"
    res = run_cli(
        ["train", "--nproc", "2", "--sp_size", "2", "--lr", "inf", "--output_dir", str(out)],
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .strip()
        .startswith("optimizer.lr: Input should be a finite number")
    )
    assert not out.exists()


def test_train_refuses_a_model_plan_refuses_in_plans_words(tmp_path, capsys):
    """A BERT config.json: `plan` refused it in one line, `train` ended in AttributeError
    (num_key_value_heads)."""
    from transformers import BertConfig

    path = tmp_path / "bert.json"
    BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    ).to_json_file(str(path))
    assert plan_main(["--model", str(path), "--seq_len", "128", "--gpus", "1"]) == 2
    plan_says = capsys.readouterr().err.strip().splitlines()[-1].removeprefix("ds-longctx plan: ")
    with pytest.raises(ValueError) as e:
        preflight(RunConfig(model=str(path), output_dir=str(tmp_path / "out")), 1)
    assert (
        str(e.value)
        == plan_says
        == (
            f"{path}: model_type='bert' is not modelled; the planner knows dense "
            "['qwen3', 'qwen2', 'llama', 'mistral'], hybrid ['qwen3_5', "
            "'qwen3_5_text'] and the mixtures of experts ['qwen3_moe', 'mixtral']"
        )
    )


def test_a_null_max_position_embeddings_is_refused_by_plan_and_train_in_the_same_words(
    tmp_path, capsys
):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY | {"max_position_embeddings": None}))
    assert plan_main(["--model", str(path), "--seq_len", "128", "--gpus", "1"]) == 2
    plan_says = capsys.readouterr().err.strip().splitlines()[-1].removeprefix("ds-longctx plan: ")
    with pytest.raises(ValueError) as e:
        preflight(RunConfig(model=str(path), output_dir=str(tmp_path / "out")), 1)
    assert (
        str(e.value)
        == plan_says
        == (
            f"{path}: max_position_embeddings is null, which transformers' qwen3 config "
            f"cannot build; give it as a whole number >= 1, or leave the key out for its "
            f"default (fix the config)"
        )
    )


LLAMA31 = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def test_llama3_rope_past_its_trained_context_is_refused_by_plan_and_train_in_the_same_words(
    tmp_path, capsys
):
    from ds_longctx.cli import main

    path = tmp_path / "llama31.json"
    path.write_text(json.dumps(LLAMA31))
    says = (
        f"model {path}: seq_len=262,144 is past its trained context 131,072, where rope_scaling "
        "'auto' sets YaRN "
        "over its config's own RoPE scaling (rope_type='llama3'), which YaRN does not stack on; "
        "use seq_len <= "
        "131,072, or set model.rope_scaling to 'none' (positions past 131,072 untrained) or an "
        f"explicit rope_parameters dict"
    )
    plan = [
        "--model",
        str(path),
        "--gpus",
        "1",
        "--gpu_mem_gb",
        "141",
        "--out",
        str(tmp_path / "plan"),
    ]
    assert plan_main(plan + ["--seq_len", "262144"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"ds-longctx plan: {says}"
    assert not (tmp_path / "plan").exists()
    with pytest.raises(SystemExit) as e:
        main(
            [
                "train",
                "--nproc",
                "1",
                "--model",
                str(path),
                "--seq_len",
                "262144",
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )
    assert (
        e.value.code == 2
        and capsys.readouterr().err.strip().splitlines()[-1] == f"refused before start: {says}"
    )
    assert plan_main(plan + ["--find_max_len"]) == 0
    assert (
        "longest seq_len that fits = 131,072 tokens (searched up to the trained context: "
        in capsys.readouterr().out
    )
    assert "seq_len: 131072" in (tmp_path / "plan" / "run.yaml").read_text()


def test_a_broken_config_json_and_a_model_dir_without_weights_name_the_file_and_the_fix(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "qwen3", "hidden_size": ')
    with pytest.raises(
        ValueError, match=rf"{broken}/config.json is not a JSON config .*pass an HF config.json"
    ):
        preflight(RunConfig(model=str(broken), output_dir=str(tmp_path / "out")), 1)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(
        ValueError,
        match=rf"model='{bare}' holds a config.json but no weights .*copy the weights "
        rf"there, or pass {bare}/config.json to train from random init",
    ):
        preflight(RunConfig(model=str(bare), output_dir=str(tmp_path / "out")), 1)
    (bare / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a": "model-00001-of-00002.safetensors",
                    "b": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    (bare / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"names 1 shard\(s\) missing from .*model-00002-of-00002.safetensors"
    ):
        preflight(RunConfig(model=str(bare), output_dir=str(tmp_path / "out")), 1)
    assert not (tmp_path / "out").exists()


def test_an_output_dir_holding_another_run_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.yaml").write_text("seq_len: 4096\n")
    (out / "ds_config.json").write_text("{}")
    mark_written(
        out, RUN_MARKER, RUN_CONFIGS
    )  # as a run writes them (run/train_loop.write_run_files)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (ckpt_root(out) / "step2").mkdir(parents=True)
    (ckpt_root(out) / "step2" / "meta.json").write_text(
        '{"files": {}}'
    )  # a save's (what overwrite deletes)
    (ckpt_root(out) / "latest").write_text("step2")
    with pytest.raises(ValueError) as e:
        preflight(RunConfig(output_dir=str(out)), 1)
    assert str(e.value) == (
        f"output_dir={str(out)!r} already holds checkpoints (latest step2), run.yaml, "
        f"ds_config.json, metrics.jsonl (2 lines) of another run; pass --resume to continue that "
        f"run, --overwrite to replace it (its checkpoints deleted, its metrics kept aside), or "
        f"choose a new output_dir"
    )
    cfg = RunConfig(output_dir=str(out), overwrite=True)
    assert preflight(cfg, 1)[1] is None
    assert (out / "run.yaml").read_text() == "seq_len: 4096\n"  # the check writes nothing
    resume.clear_previous_run(cfg)  # what rank 0 does before the run writes
    assert not ckpt_root(out).exists() and (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("changed", ["never a run's", "a run's, edited since"])
def test_a_users_own_run_yaml_and_ds_config_are_never_called_a_runs_nor_replaced(tmp_path, changed):
    """run.yaml and ds_config.json in output_dir that RUN_MARKER does not record as a run's (a
    user's own, or a run's edited since) are refused by a fresh run with and without --overwrite,
    never suggesting --overwrite, and kept byte for byte; a run's own are replaced
    (test_an_output_dir_holding_another_run_is_refused_unless_overwrite)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.yaml").write_text("seq_len: 4096\n")
    (out / "ds_config.json").write_text("{}")
    if changed == "a run's, edited since":
        mark_written(out, RUN_MARKER, RUN_CONFIGS)
        (out / "run.yaml").write_text("seq_len: 8192  # mine now\n")
        (out / "ds_config.json").write_text('{"mine": 1}')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for overwrite in (False, True):
        with pytest.raises(ValueError) as e:
            preflight(RunConfig(output_dir=str(out), overwrite=overwrite), 1)
        assert str(e.value) == (
            f"output_dir={str(out)!r} holds run.yaml and ds_config.json, which no run wrote "
            f"there (or changed since): your own, which a run would replace; keep them "
            f"elsewhere (a run writes its own copies here) or choose another output_dir"
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError, match="overwrite with resume: .*drop one of them"):
        preflight(RunConfig(output_dir=str(out), overwrite=True, resume=True), 1)


def test_overwrite_is_not_carried_into_the_run_yaml_a_run_writes(tmp_path):
    """run.yaml is what `--config` reruns: a permission to delete a run must not come back with
    it."""
    RunConfig(overwrite=True, seq_len=128).dump(tmp_path / "run.yaml")
    again = RunConfig.load(tmp_path / "run.yaml")
    assert again.train.overwrite is False and again.train.seq_len == 128


@pytest.mark.parametrize(
    "kw, says",
    [
        (
            dict(seq_len=10**12),
            "micro_batch=1 x seq_len=1000000000000 = 1,000,000,000,000 tokens per step",
        ),
        (dict(micro_batch=10**9), "micro_batch=1000000000 x seq_len=256"),
        (dict(tokenize_num_proc=10**6), "tokenize_num_proc=1000000: this machine has"),
    ],
)
def test_sizes_past_what_the_host_can_hold_or_run_are_refused_before_anything_is_built(
    tmp_path, kw, says
):
    """A step's rows beyond the host's RAM ran out of memory in the data pipeline (seq_len 1e12: 8
    TB asked) or ran for minutes (micro_batch 1e9); a process per document past the cores forks that
    many."""
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=says):
        preflight(RunConfig(output_dir=str(tmp_path / "out"), **kw), 1)
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "out").exists()


def test_the_run_yaml_and_ds_config_a_run_writes_are_its_own_to_replace(tmp_path):
    """What rank 0 writes before step 1 (train_loop.write_run_files) is recorded as the run's: a
    later fresh run with --overwrite passes the check and replaces it."""
    from types import SimpleNamespace

    from ds_longctx.run.train_loop import write_run_files

    out = tmp_path / "out"
    cfg = RunConfig(output_dir=str(out))
    engine = SimpleNamespace(
        state=SimpleNamespace(rank=0, world_size=1, sp_size=1, dp_size=1),
        ds_config={"bf16": {"enabled": False}},
    )
    write_run_files(cfg, engine, out, 0)
    assert sorted(p.name for p in out.iterdir()) == sorted((*RUN_CONFIGS, RUN_MARKER))
    with pytest.raises(ValueError, match="already holds run.yaml, ds_config.json of another run"):
        preflight(cfg, 1)
    assert preflight(RunConfig(output_dir=str(out), overwrite=True), 1)[1] is None


def test_an_output_dir_inside_a_checkpoint_is_refused(tmp_path):
    tag = ckpt_root(tmp_path / "other") / "step2"
    tag.mkdir(parents=True)
    (tag / "meta.json").write_text('{"files": {}}')
    for out in (tag, tag / "sub" / "run"):
        with pytest.raises(ValueError) as e:
            preflight(RunConfig(output_dir=str(out)), 1)
        assert str(e.value) == (
            f"output_dir={str(out)!r} is inside {str(tag)!r}, a checkpoint, whose files its "
            f"meta.json records; choose an output_dir outside every run's checkpoints/"
        )
    assert sorted(p.name for p in tag.iterdir()) == ["meta.json"]


def test_a_tensorboard_path_that_is_not_a_directory_is_refused_before_start(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "tensorboard").write_text("a user's file\n")
    with pytest.raises(ValueError) as e:
        preflight(RunConfig(output_dir=str(out), overwrite=True), 1)
    assert str(e.value) == (
        f"{out / 'tensorboard'} is not a directory, so TensorBoard's events cannot go there; move "
        f"it out of the output_dir, or report_to: none"
    )
    assert preflight(RunConfig(output_dir=str(out), overwrite=True, report_to="none"), 1)[1] is None
    assert (out / "tensorboard").read_text() == "a user's file\n"
