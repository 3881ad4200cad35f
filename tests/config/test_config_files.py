"""Config files and command lines mean what they say: a file that is no config, a key or option
given twice, YAML aliases and tags, blank text and empty paths are each refused naming the file,
line or option and the fix."""

import re

import pytest
from pydantic import ValidationError

from ds_longctx.config import RunConfig, format_validation_error
from tests.helpers import run_cli


def test_config_files_that_are_not_configs_are_refused_naming_the_file_and_the_fix(tmp_path):
    """RunConfig.load: a directory, malformed YAML or JSON, an empty file (which would train the
    default toy model without a word) and a section spelled with a list are ValueErrors naming the
    file or key; `memory:` with nothing under it is an empty section (the defaults)."""
    cases = {
        "bad.yaml": ("model: [unclosed\n- x: : :\n", "could not be read as YAML"),
        "bad.json": ('{"model": ', "could not be read as JSON"),
        "empty.yaml": ("", "is empty; give at least model"),
        "list.yaml": ("train: [1, 2]\n", "train: [1, 2] is not a mapping"),
        "top.yaml": ("- 1\n", "must hold a mapping of keys"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=re.escape(says)) as e:
            RunConfig.load(tmp_path / name)
        assert name in str(e.value) or "train" in name or "list" in name
    with pytest.raises(ValueError, match="is a directory; give its run.yaml"):
        RunConfig.load(tmp_path)
    (tmp_path / "null.yaml").write_text("model: qwen3-tiny\nmemory:\n")
    assert RunConfig.load(tmp_path / "null.yaml").memory == RunConfig().memory
    (tmp_path / "no_model.yaml").write_text(
        "train:\n  seq_len: 128\n"
    )  # would train the toy default
    with pytest.raises(ValueError, match="no_model.yaml names no model; add `model: qwen3-8b`"):
        RunConfig.load(tmp_path / "no_model.yaml")
    assert (
        RunConfig.load(tmp_path / "no_model.yaml", model="qwen3-tiny").train.seq_len == 128
    )  # --model given


@pytest.mark.parametrize(
    "name, text, says",
    [
        (
            "top.yaml",
            "model: qwen3-tiny\nlr: 1e-3\nsteps: 4\nlr: 5e-4\n",
            "key lr appears twice (lines 2 and 4)",
        ),
        (
            "nested.yaml",
            "model: qwen3-tiny\noptimizer:\n  lr: 1e-3\n  warmup_steps: 2\n  lr: 5e-4\n",
            "key optimizer.lr appears twice (lines 3 and 5)",
        ),
        (
            "section.yaml",
            "model: qwen3-tiny\noptimizer:\n  lr: 1e-3\ntrain:\n  steps: 4\noptimizer:\n  "
            "warmup_steps: 2\n",
            "key optimizer appears twice (lines 2 and 6)",
        ),
        (
            "flow.yaml",
            "model: qwen3-tiny\noptimizer: {lr: 1e-3, 'lr': 5e-4}\n",
            "key optimizer.lr appears twice (line 2)",
        ),
        (
            "nested.json",
            '{"model": "qwen3-tiny",\n "optimizer": {"lr": 1e-3,\n   "warmup_steps": 2,\n   "lr": '
            "5e-4}}\n",
            "key optimizer.lr appears twice (lines 2 and 4)",
        ),
        (
            "section.json",
            '{"optimizer": {"lr": 1e-3},\n "model": "qwen3-tiny",\n "optimizer": {"warmup_steps": '
            "2}}\n",
            "key optimizer appears twice (lines 1 and 3)",
        ),
    ],
)
def test_a_key_given_twice_in_a_file_is_refused_naming_its_path_and_both_lines(
    tmp_path, name, text, says
):
    """YAML and JSON parsers keep the last of two equal keys without a word (a second `optimizer:`
    drops the first)."""
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as e:
        RunConfig.load(tmp_path / name)
    assert str(e.value) == f"config {tmp_path / name}: {says}; keep one"


def test_yaml_aliases_tags_and_oversized_files_are_refused(tmp_path):
    """Aliases expand (billion laughs) and a run config never needs them; tags beyond plain values
    are refused naming the line; the size cap is checked before parsing. A dump (which repeats equal
    values) reads back."""
    cases = {
        "alias.yaml": (
            "model: qwen3-tiny\ntrain: &t {seq_len: 64}\neval: *t\n",
            "line 2 defines a YAML anchor (&t)",
        ),
        "merge.yaml": (
            "model: qwen3-tiny\noptimizer:\n  <<: *base\n",
            "line 3 uses a YAML alias (*base); write the values out",
        ),
        "tag.yaml": (
            "model: !!python/object/apply:os.system [echo]\n",
            "line 1 uses the YAML tag 'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
        "big.yaml": (
            "model: qwen3-tiny\n" + "# padding\n" * 120_000,
            "is 1.1 MiB, over the 1 MiB a run config may be",
        ),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=re.escape(f"config {tmp_path / name} {says}")):
            RunConfig.load(tmp_path / name)
    cfg = RunConfig(
        model="qwen3-tiny",
        lora_target_modules=["q_proj"],
        rope_scaling={"rope_type": "yarn", "factor": 2.0},
    )
    cfg.dump(tmp_path / "run.yaml")
    assert (
        "&" not in (tmp_path / "run.yaml").read_text()
        and RunConfig.load(tmp_path / "run.yaml") == cfg
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--lr", "1e-3", "--steps", "4", "--lr", "5e-4"],
            "optimizer.lr is given twice on the command line: --lr 1e-3 and --lr 5e-4; keep one",
        ),
        (
            ["--lr", "1e-3", "--optimizer.lr=5e-4"],
            "optimizer.lr is given twice on the command line: --lr 1e-3 and "
            "--optimizer.lr 5e-4; keep one",
        ),
        (["--config", "a.yaml", "--config", "b.yaml"], "config is given twice on the command line"),
    ],
)
def test_an_option_given_twice_on_the_command_line_is_refused_naming_both(argv, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        RunConfig.from_cli(argv)


@pytest.mark.parametrize("case", ["file", "option"])
def test_ds_longctx_train_refuses_a_doubled_key_in_its_last_line(tmp_path, case):
    (tmp_path / "run.yaml").write_text(
        "model: qwen3-tiny\nseq_len: 64\noptimizer:\n  lr: 1e-3\n  lr: 5e-4\n"
    )
    args = (
        ["--config", str(tmp_path / "run.yaml")]
        if case == "file"
        else ["--seq_len", "64", "--train.seq_len", "64"]
    )
    res = run_cli(
        ["train", "--nproc", "1", *args, "--output_dir", str(tmp_path / "out")], timeout=120
    )
    assert res.returncode == 2, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    want = (
        "key optimizer.lr appears twice (lines 4 and 5)"
        if case == "file"
        else "train.seq_len is given twice"
    )
    assert want in last and not (tmp_path / "out").exists(), res.stderr[-2000:]


def test_every_key_is_in_one_resume_class(monkeypatch):
    """config/resume_keys.py: a new field must be placed (fixed by the checkpoint, or this run's to
    change)."""
    from ds_longctx.config import resume_keys

    resume_keys._check_classes()
    monkeypatch.setattr(resume_keys, "FLAT", {**resume_keys.FLAT, "new_key": ("train", "new_key")})
    with pytest.raises(TypeError, match=r"unclassified \['new_key'\]"):
        resume_keys._check_classes()


def test_a_config_or_model_path_that_cannot_be_opened_names_it_and_the_fix(tmp_path):
    """A missing --config said only `[Errno 2] No such file or directory`; a name too long for the
    file system (--config or --model) was an OSError traceback."""
    for path, why in (
        (tmp_path / "missing.yaml", "No such file or directory"),
        (tmp_path / ("a" * 300 + ".yaml"), "File name too long"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"^config {path}: {why}; give the path of a run config \(.yaml or "
            rf".json; `ds-longctx plan --out DIR` writes DIR/run.yaml\)$",
        ):
            RunConfig.from_cli(["--config", str(path)])
    with pytest.raises(ValidationError) as e:
        RunConfig.from_cli(["--model", str(tmp_path / ("a" * 300))])
    assert "File name too long; pass a shipped geometry" in format_validation_error(e.value)


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--output_dir="],
            "train.output_dir: '' is blank; give a value (every key",
        ),  # wrote the run into the cwd
        (
            ["--output_dir", "  "],
            "train.output_dir: '  ' is blank; give a value",
        ),  # into a folder named '  '
        (["--data="], "data.source: '' is blank; give a value"),  # read the cwd as the data
        (["--eval_data="], "eval.data: '' is blank; give a value or null"),
        (["--tokenizer="], "data.tokenizer: '' is blank; give a value or null"),
    ],
)
def test_blank_text_is_refused_not_read_as_the_current_directory(argv, says):
    with pytest.raises(ValidationError) as e:
        RunConfig.from_cli(argv)
    assert says in format_validation_error(e.value)


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--config="],
            "--config '' names no file; give the path of a run config",
        ),  # the toy model trained instead
        (["--seq_len", "64", "--"], "unexpected argument '--'; options are --key value"),
    ],
)
def test_an_empty_config_path_or_a_bare_double_dash_is_refused(argv, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        RunConfig.from_cli(argv)
