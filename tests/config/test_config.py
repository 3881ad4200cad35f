"""Run config and up-front validation: bad input is refused before any work, naming the value and
the fix."""

import json
import os
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.config.model import CONFIG_FILE_MAX
from ds_longctx.parallel import attention, ulysses
from ds_longctx.parallel.parallel_state import check_sp_size, local_world_size, valid_sp_sizes
from ds_longctx.plan.geometry import ModelGeometry
from ds_longctx.run.model import load_hf_config
from ds_longctx.run.preflight import validate
from tests.helpers import ROOT, cpu_env, run_cli


def test_yaml_and_cli_round_trip(tmp_path):
    cfg = RunConfig(model="qwen3-tiny", seq_len=128, sp_size=2, lr=3e-4)
    path = tmp_path / "run.yaml"
    cfg.dump(path)
    assert RunConfig.load(path) == cfg
    again = RunConfig.from_cli(
        ["--config", str(path), "--steps", "7", "--lr=1e-3", "--chunked-loss", "false"]
    )
    assert (
        again.train.steps,
        again.optimizer.lr,
        again.memory.chunked_loss,
        again.train.seq_len,
    ) == (7, 1e-3, False, 128)


def test_unknown_key_in_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: qwen3-tiny\nseq_lenn: 64\n")
    with pytest.raises(ValidationError) as e:
        RunConfig.load(path)
    msg = format_validation_error(e.value)
    assert "seq_lenn" in msg and "seq_len" in msg  # names the bad key and lists the known ones


def test_unknown_cli_option_is_refused():
    with pytest.raises(ValueError) as e:
        RunConfig.from_cli(["--sp-siz", "2"])
    # the nearest key first, a few close ones, where to see all: not the ~60 keys before the answer
    msg = str(e.value)
    assert msg.startswith("unknown option --sp_siz; nearest: --sp_size") and msg.endswith(
        "ds-longctx train --help"
    )
    assert len(msg) < 200 and "tensorboard" not in msg, msg


def test_the_launchs_world_size_is_checked_before_the_seq_len_rule(tmp_path):
    """Given the processes it runs on (from_cli / load), the config names the sp_size they cannot
    hold before the seq_len it does not divide; without them, the seq_len rule is what it can
    say."""
    want = (
        "sp_size=3 does not divide world_size=2; try one of [1, 2] or launch a multiple of 3 "
        "processes"
    )
    path = tmp_path / "run.yaml"
    path.write_text("model: qwen3-tiny\nsp_size: 3\n")
    for make in (
        lambda: RunConfig.from_cli(["--sp_size", "3"], world_size=2),
        lambda: RunConfig.from_cli(["--config", str(path)], world_size=2),
        lambda: RunConfig.load(path, world_size=2),
    ):
        with pytest.raises(ValidationError) as e:
            make()
        assert want in str(e.value) and "seq_len" not in format_validation_error(e.value)
    with pytest.raises(ValidationError, match="seq_len=256 is not divisible by sp_size=3"):
        RunConfig.from_cli(["--sp_size", "3"])
    assert RunConfig.from_cli(["--sp_size", "2"], world_size=4).parallel.sp_size == 2


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(attn_backend="flash3"), "attn_backend='flash3' is unknown; use one of"),
        (dict(seq_len=2, sp_size=4), "seq_len=2 is shorter than sp_size=4"),
        (dict(seq_len=65, sp_size=2), "use seq_len=64 or 66"),
        (dict(model="no-such-model"), "model='no-such-model' is neither a shipped geometry"),
        (
            dict(activation_offload=True, activation_checkpointing=False),
            "set activation_checkpointing: true",
        ),
        (dict(offload_layers=-1), "offload_layers=-1 must be >= 0"),
        (dict(attention_cache_layers=-2), "attention_cache_layers=-2 must be >= 0 or 'all'"),
        (
            dict(attention_cache_layers=1, activation_checkpointing=False),
            "set activation_checkpointing: true or attention_cache_layers: 0",
        ),
        (
            dict(eval_data="synthetic", eval_rows=0),
            "eval_rows=0 must be >= 1 (held-out rows per evaluation, e.g. eval_rows: 8",
        ),
        (dict(eval_data="synthetic", eval_every=-2), "eval_every=-2 must be >= 0"),
        (dict(eval_data="synthetic", eval_buckets=0), "eval_buckets=0 must be >= 1"),
        (
            dict(eval_every=10),
            "eval_every=10 is set but eval_data is not; add --eval_data synthetic",
        ),
        (
            dict(eval_data="synthetic", seq_len=64, eval_buckets=65),
            "eval_buckets=65 is more than seq_len=64 positions: "
            "a bucket needs at least one; use eval_buckets <= 64",
        ),
        # pydantic's own type and range errors carry the value given (and, for a bool, the two
        # accepted)
        (
            dict(optimizer_state_at_build="maybe"),
            "optimizer.state_at_build: Input should be a valid boolean, unable to "
            "interpret input (got 'maybe'; use true or false)",
        ),
        (dict(seq_len=-5), "train.seq_len: Input should be greater than 0 (got -5)"),
        (dict(lr="abc"), "(got 'abc')"),
        (
            dict(seq_len="128k"),
            "(got '128k'; give the whole number, e.g. 131072 or 128000)",
        ),  # and not a guess
        (
            dict(steps="1e3"),
            "(got '1e3'; give the whole number, e.g. 1000)",
        ),  # YAML reads 1e3 as a string
    ],
)
def test_bad_values_name_the_fix(kwargs, needle):
    with pytest.raises(ValidationError) as e:
        RunConfig(**kwargs)
    assert needle in format_validation_error(e.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--seq_len", "true"],
        ["--lr", "yes"],
        ["--offload_layers", "true"],
        ["--gpu_budget_gb", "false"],
        ["--sp_size", "true"],
    ],
)
def test_a_boolean_where_a_number_goes_is_refused_not_read_as_1(argv, tmp_path):
    """pydantic reads true as 1: `--seq_len true` trained 1 token, `lr: yes` trained at lr 1."""
    key = argv[0][2:]
    (tmp_path / "run.yaml").write_text(f"model: qwen3-tiny\n{key}: {argv[1]}\n")
    for make in (lambda: RunConfig.from_cli(argv), lambda: RunConfig.load(tmp_path / "run.yaml")):
        with pytest.raises(ValidationError) as e:
            make()
        assert "is a boolean, not a number; give a number" in format_validation_error(e.value)
    assert (
        RunConfig.from_cli(["--overwrite", "true", "--chunked_loss", "false"]).train.overwrite
        is True
    )


@pytest.mark.parametrize(
    "sp,world,needle",
    [
        (3, 4, "sp_size=3 does not divide world_size=4; try one of [1, 2, 4]"),
        (16, 16, "sp_size=16 must divide num_attention_heads=8"),
    ],
)
def test_sp_size_that_fits_neither_world_nor_heads(sp, world, needle):
    cfg = RunConfig(model="qwen3-tiny", seq_len=48 * 16, sp_size=sp)
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        validate(cfg, world)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (
            dict(attention_cache_layers=3),
            "attention_cache_layers=3 is more than the model's 2 layers",
        ),
        (
            dict(attention_cache_layers=2, activation_offload=True, offload_layers=1),
            "keep attention_cache_layers + offload_layers <= 2, or attention_cache_layers: all",
        ),
        (
            dict(attention_cache_layers=1, activation_offload=True, offload_layers="all"),
            "overlaps offload_layers=all",
        ),
        (
            dict(attention_cache_layers="all", activation_offload=True, offload_layers="auto"),
            "is circular",
        ),
    ],
)
def test_attention_cache_against_the_model_and_offload(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("+", r"\+")):
        validate(RunConfig(model="qwen3-tiny", seq_len=64, **kwargs), 1)


def test_valid_sp_sizes_include_kv_replication():
    # tiny Qwen3: 8 query heads, 2 KV heads -> sp 4 and 8 replicate KV heads
    assert valid_sp_sizes(8, 8, 2) == [1, 2, 4, 8]
    check_sp_size(4, 4, 8, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        check_sp_size(2, 2, 6, 3)


def test_an_sp_group_may_not_straddle_nodes_unless_allowed(monkeypatch):
    # 2 nodes of 2 processes: sp=4 would put one SP group on both nodes
    cfg = RunConfig(model="qwen3-tiny", seq_len=64, sp_size=4)
    with pytest.raises(
        ValueError,
        match=r"sp_size=4 does not divide the 2 processes per node.*try one of \[1, 2\] "
        r"per node, or set sp_across_nodes: true",
    ):
        validate(cfg, 4, per_node=2)
    validate(
        cfg.model_copy(
            update={"parallel": cfg.parallel.model_copy(update={"sp_across_nodes": True})}
        ),
        4,
        2,
    )
    validate(
        RunConfig(model="qwen3-tiny", seq_len=64, sp_size=2), 4, per_node=2
    )  # inside a node: fine
    # the processes per node come from the launcher: torchrun's LOCAL_WORLD_SIZE, deepspeed's
    # LOCAL_SIZE
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert local_world_size(4) == 4  # no launcher: one node
    monkeypatch.setenv("LOCAL_SIZE", "2")
    assert local_world_size(4) == 2
    with pytest.raises(ValueError, match="processes per node"):
        validate(cfg, 4)
    # a world that sp does not divide keeps its own message (one node)
    assert valid_sp_sizes(8, 8, 2, per_node=4) == [1, 2, 4]
    with pytest.raises(
        ValueError,
        match=r"sp_size=3 does not divide world_size=8; try one of \[1, 2, 4\] or launch",
    ):
        check_sp_size(3, 8, 8, 2, per_node=4)


def test_flash_attn_asked_but_missing():
    if attention.flash_attn_available():
        pytest.skip("flash-attn installed")
    with pytest.raises(
        ValueError, match="flash-attn is not installed; `pip install ds-longctx\\[flash\\]`"
    ):
        attention.resolve_backend("flash_attn")


def test_model_whose_attention_cannot_be_wrapped():
    cfg = load_hf_config("qwen3-tiny")

    class NoInterface:  # e.g. a remote-code model with its own attention
        _supports_attention_backend = False

    with pytest.raises(
        ValueError, match="does not dispatch attention through transformers' AttentionInterface"
    ):
        ulysses.check_wrappable_class(NoInterface, cfg)
    cfg.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="chunked_attention.*give full_attention for those layers"):
        ulysses.check_wrappable_class(type("M", (), {"_supports_attention_backend": True}), cfg)


def test_a_sliding_window_layer_runs_full_causal_within_its_window_and_refuses_past_it():
    import torch

    from ds_longctx.parallel.parallel_state import ParallelState

    attend = ulysses.UlyssesAttention(ParallelState.single(), 2, 2)
    q = torch.randn(1, 2, 8, 4)
    out, _ = attend(None, q, q, q, None, sliding_window=8)
    assert out.shape == (1, 8, 2, 4)
    with pytest.raises(
        ValueError,
        match=r"a sliding-window layer \(window 4\) at sequence length 8: this attention "
        r"is full causal; use seq_len <= 4",
    ):
        attend(None, q, q, q, None, sliding_window=4)


@pytest.mark.parametrize(
    "seq_len", [["--seq_len", "96"], []], ids=["seq_len_divisible", "seq_len_not_divisible"]
)
def test_cli_refuses_before_starting_workers(seq_len):
    """sp_size 3 on 2 processes names the process count, also where seq_len (the default 256) is not
    a multiple of 3: the sp_size is what to change."""
    t = time.perf_counter()
    res = run_cli(["train", "--nproc", "2", "--sp_size", "3", *seq_len], timeout=120)
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.strip() == (
        "sp_size=3 does not divide world_size=2; try one of [1, 2] or launch a multiple of 3 "
        "processes"
    )
    assert "seq_len" not in res.stderr
    assert "torch.distributed.run" not in res.stderr  # no worker was started
    assert time.perf_counter() - t < 60


@pytest.mark.parametrize(
    "cmd", [["-m", "ds_longctx.cli", "train", "--help"], ["-m", "ds_longctx.train", "--help"]]
)
def test_help_lists_every_field_with_its_doc_and_default(cmd):
    from ds_longctx.config import FLAT, SECTIONS

    res = subprocess.run(
        [sys.executable, *cmd], env=cpu_env(), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = " ".join(res.stdout.split())  # help wraps long docs
    for flat, (sec, name) in FLAT.items():
        field = SECTIONS[sec].model_fields[name]
        assert f"--{flat} (--{sec}.{name})" in text, flat
        assert field.description and " ".join(field.description.split())[:60] in text, flat
        assert f"default {field.get_default(call_default_factory=True)!r}" in text
    assert "--nproc" in text or cmd[1] == "ds_longctx.train"
    from ds_longctx.config.model import SHIPPED_MODELS_DIR

    shipped = sorted(p.stem for p in SHIPPED_MODELS_DIR.glob("*.json"))
    assert len(shipped) >= 6 and all(
        f" {name}," in text or f" {name})" in text for name in shipped
    ), shipped


def test_flat_dotted_and_sectioned_spellings_are_one_config(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "model: qwen3-tiny\nseq_len: 128\nsp_size: 2\noffload_layers: 1\ndata_layout: pack\n"
        "keep_checkpoints: 5\n"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "model: {name: qwen3-tiny}\ntrain: {seq_len: 128}\nparallel: {sp_size: 2}\n"
        "memory: {offload_layers: 1}\ndata: {layout: pack}\ncheckpoint: {keep: 5}\n"
    )
    dotted = RunConfig(
        **{
            "model.name": "qwen3-tiny",
            "train.seq_len": 128,
            "parallel.sp_size": 2,
            "memory.offload_layers": 1,
            "data.layout": "pack",
            "checkpoint.keep": 5,
        }
    )
    a, b = RunConfig.load(flat), RunConfig.load(nested)
    assert a == b == dotted and a.memory.offload_layers == 1 and a.checkpoint.keep == 5
    cli = RunConfig.from_cli(
        [
            "--config",
            str(nested),
            "--train.seq_len",
            "256",
            "--lr",
            "3e-4",
            "--memory.placement",
            "offload:1,cache:1",
            "--offload_layers",
            "0",
        ]
    )
    assert (cli.train.seq_len, cli.optimizer.lr, cli.memory.placement) == (
        256,
        3e-4,
        "offload:1,cache:1",
    )
    placed = tmp_path / "placed.yaml"
    placed.write_text("model: qwen3-tiny\nplacement: offload:1,cache:1\n")
    cleared = RunConfig.from_cli(
        ["--config", str(placed), "--placement", "null", "--tokenizer", "7"]
    )
    assert (
        cleared.memory.placement is None and cleared.data.tokenizer == "7"
    )  # null unsets, other text stays text
    # a dump is sectioned and loads back equal; its flat view names every flat key once
    a.dump(tmp_path / "again.yaml")
    from ds_longctx.config import FLAT

    assert RunConfig.load(tmp_path / "again.yaml") == a and list(a.flat()) == list(FLAT)


def test_the_old_two_field_offload_spelling_still_reads():
    assert RunConfig(activation_offload=True).memory.offload_layers == "all"
    assert RunConfig(activation_offload=True, offload_layers=4).memory.offload_layers == 4
    assert (
        RunConfig(activation_offload=False, offload_layers="all").memory.offload_layers == 0
    )  # old dumps
    with pytest.raises(ValidationError, match="activation_offload=false with offload_layers=3"):
        RunConfig(activation_offload=False, offload_layers=3)


@pytest.mark.parametrize("where", ["file", "cli", "nested"])
def test_unknown_key_names_the_nearest_known_key(tmp_path, where):
    path = tmp_path / "run.yaml"
    if where == "cli":
        with pytest.raises(
            ValueError, match=r"^unknown option --offload_layer; nearest: --offload_layers \("
        ):
            RunConfig.from_cli(["--offload_layer", "2"])
        return
    path.write_text("memory:\n  tiled_mpl: true\n" if where == "nested" else "micro_bach: 2\n")
    with pytest.raises(ValidationError) as e:
        RunConfig.load(path)
    want = "nearest: memory.tiled_mlp" if where == "nested" else "nearest: micro_batch"
    assert want in format_validation_error(e.value)


def test_a_key_in_the_wrong_section_names_its_section(tmp_path):
    """`train: {lr: ...}` was pointed at train.seq_len (spelled nearest), not at optimizer.lr."""
    path = tmp_path / "run.yaml"
    for text, want in (
        ("train:\n  lr: 0.001\n", "unknown key 'train.lr'; nearest: optimizer.lr ("),
        ("model:\n  name: qwen3-tiny\n  seq_len: 64\n", "nearest: train.seq_len ("),
        ("data:\n  data_layout: pack\n", "nearest: data.layout ("),
    ):
        path.write_text(text)
        with pytest.raises(ValidationError) as e:
            RunConfig.load(path, model="qwen3-tiny")
        assert want in format_validation_error(e.value)
    with pytest.raises(
        ValueError, match=r"^unknown option --optimizer.sp_size; nearest: --parallel.sp_size \("
    ):
        RunConfig.from_cli(["--optimizer.sp_size", "2"])


def test_hf_trainer_names_point_at_ours():
    """A key spelled as the HF Trainer / TRL spell it names our key (by spelling alone save_steps
    would get steps)."""
    from ds_longctx.config.keys import FLAT, HF_NAMES

    assert set(HF_NAMES.values()) <= set(FLAT) and not set(HF_NAMES) & set(FLAT)
    with pytest.raises(
        ValueError,
        match=r"^unknown option --save_steps; nearest: --save_every \(the HF Trainer's "
        r"save_steps\); every key",
    ):
        RunConfig.from_cli(["--save_steps", "2"])
    with pytest.raises(ValidationError) as e:
        RunConfig(learning_rate=1e-4)
    assert "nearest: lr (the HF Trainer's learning_rate)" in format_validation_error(e.value)


def test_a_key_given_twice_with_two_values_is_refused():
    with pytest.raises(
        ValidationError, match="train.seq_len is given twice: seq_len=128 and train.seq_len=256"
    ):
        RunConfig(seq_len=128, train={"seq_len": 256})
    assert RunConfig(seq_len=128, train={"seq_len": 128}).train.seq_len == 128


def test_fa4_is_gated_by_head_dim(monkeypatch):
    """FA4 (faked present on a faked Hopper GPU): `auto` takes it only at verified head dims and
    says why not otherwise; asked for below 64 it is refused naming the fix."""
    from ds_longctx.parallel import attention

    monkeypatch.setattr(attention.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(attention, "fa4_available", lambda: True)
    assert attention.resolve_backend("auto", 128).backend == "fa4"
    assert attention.resolve_backend("auto").backend == "fa4"  # head_dim unknown: as before
    c = attention.resolve_backend("auto", 64)
    assert (
        c.backend == "sdpa"
        and c.sdpa_kernels[0] == "CUDNN_ATTENTION"
        and "not verified at head_dim 64" in c.reason
    )
    assert "not yet verified" in attention.resolve_backend("fa4", 96).reason
    with pytest.raises(
        ValueError, match="attn_backend='fa4' at head_dim=16.*use attn_backend='sdpa'"
    ):
        attention.resolve_backend("fa4", 16)
    from transformers import Qwen3Config

    assert (
        attention.model_head_dim(Qwen3Config(hidden_size=256, num_attention_heads=8, head_dim=128))
        == 128
    )
    assert attention.model_head_dim(load_hf_config("qwen3-tiny-d128")) == 128


def test_a_config_json_file_is_a_model_and_other_files_are_refused(tmp_path):
    """model: an HF config.json file of any name (random init, like a shipped geometry), read alike
    by the config and the planner; a JSON file without a model_type, a file that is not JSON, or one
    too large to be a config (not read) is refused naming what it needs."""
    for name in (
        "llama.json",
        "llama.cfg",
    ):  # any file name, as from_pretrained and the planner take it
        good = tmp_path / name
        good.write_text(
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": 64,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "intermediate_size": 128,
                    "vocab_size": 256,
                }
            )
        )
        assert RunConfig(model=str(good)).model.name == str(good)
        assert ModelGeometry.from_name_or_path(good).hidden == 64
    big = (
        tmp_path / "model.safetensors"
    )  # sparse: its size says it is no config, nothing of it is read
    big.write_text('{"model_type": "llama"}')
    os.truncate(big, CONFIG_FILE_MAX + 1)
    with pytest.raises(ValueError, match="larger than any config.json"):
        ModelGeometry.from_name_or_path(big)
    for name, text in (
        ("weights.json", '{"hidden_size": 64}'),
        ("list.json", "[1, 2]"),
        ("bad.json", "{not json"),
        ("notes.txt", "x"),
        ("model.safetensors", None),
    ):
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        with pytest.raises(ValidationError) as e:
            RunConfig(model=str(p))
        assert f"model='{p}' is a file but not an HF config.json" in format_validation_error(
            e.value
        )


@pytest.mark.parametrize(
    "kw, says, fix, flag_says",
    [
        (
            dict(tiled_layer=True, lora_rank=8),
            "tiled_layer with lora_rank=8",
            "set tiled_layer: false",
            "--tiled_layer with --lora_rank 8",
        ),
        (
            dict(optimizer_offload=True, optimizer_offload_ratio=0.5, lora_rank=8),
            "optimizer_offload_ratio=0.5 with lora_rank=8",
            "set optimizer_offload_ratio: 1",
            "--optimizer_offload_ratio 0.5 with --lora_rank 8",
        ),
        (
            dict(optimizer_offload=True, offload_params=True, lora_rank=16),
            "offload_params with lora_rank=16",
            "set offload_params: false, or lora_rank: 0",
            "--offload_params with --lora_rank 16",
        ),
        (
            dict(optimizer_offload=True, offload_params=True, optimizer_offload_ratio=0.25),
            "offload_params with optimizer_offload_ratio=0.25",
            "or optimizer_offload_ratio: 1",
            "--offload_params with --optimizer_offload_ratio 0.25",
        ),
    ],
)
def test_levers_that_do_not_go_together_are_refused_alike_by_config_planner_and_plan(
    kw, says, fix, flag_says, capsys
):
    """One rule (config/run.lever_conflict), three askers: the run config, the planner (plan_memory)
    and `ds-longctx plan`'s arguments refuse the same combinations with the same words, the last
    spelled as its flags."""
    from ds_longctx.plan import write
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.planner import Levers, plan_memory

    with pytest.raises(ValidationError) as e:
        RunConfig(model="qwen3-tiny", **kw)
    config_says = format_validation_error(e.value)
    assert says in config_says and fix in config_says
    with pytest.raises(ValueError) as e:
        plan_memory(ModelGeometry.from_name_or_path("qwen3-tiny"), 4096, 1, 1, Levers(**kw))
    assert str(e.value) in config_says
    flags = []  # `plan` decides the optimizer offload itself (a ratio asks for it): no flag for it
    for k, v in kw.items():
        flags += (
            [] if k == "optimizer_offload" else [f"--{k}"] if v is True else [f"--{k}", f"{v:g}"]
        )
    assert write.main(["--model", "qwen3-8b", "--seq_len", "4096", "--gpus", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert flag_says in err and "drop one of them" in err, err
