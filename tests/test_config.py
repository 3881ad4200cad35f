"""Run config and up-front validation: bad input is refused before any work, naming the value and the fix."""

import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from ds_longctx.parallel import attention

from ds_longctx.parallel import ulysses
from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.run.engine import load_hf_config, validate
from ds_longctx.parallel.parallel_state import check_sp_size, valid_sp_sizes
from tests.conftest import ROOT, cpu_env


def test_yaml_and_cli_round_trip(tmp_path):
    cfg = RunConfig(model="qwen3-tiny", seq_len=128, sp_size=2, lr=3e-4)
    path = tmp_path / "run.yaml"
    cfg.dump(path)
    assert RunConfig.load(path) == cfg
    again = RunConfig.from_cli(["--config", str(path), "--steps", "7", "--lr=1e-3", "--chunked-loss", "false"])
    assert (again.steps, again.lr, again.chunked_loss, again.seq_len) == (7, 1e-3, False, 128)


def test_unknown_key_in_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: qwen3-tiny\nseq_lenn: 64\n")
    with pytest.raises(ValidationError) as e:
        RunConfig.load(path)
    msg = format_validation_error(e.value)
    assert "seq_lenn" in msg and "seq_len" in msg  # names the bad key and lists the known ones


def test_unknown_cli_option_is_refused():
    with pytest.raises(ValueError, match="unknown option --sp_siz; known keys: .*sp_size"):
        RunConfig.from_cli(["--sp-siz", "2"])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(attn_backend="flash3"), "attn_backend='flash3' is unknown; use one of"),
    (dict(seq_len=2, sp_size=4), "seq_len=2 is shorter than sp_size=4"),
    (dict(seq_len=65, sp_size=2), "use seq_len=64 or 66"),
    (dict(model="no-such-model"), "model='no-such-model' is neither a shipped geometry"),
    (dict(activation_offload=True, activation_checkpointing=False), "set activation_checkpointing: true"),
    (dict(offload_layers=-1), "offload_layers=-1 must be >= 0"),
    (dict(attention_cache_layers=-2), "attention_cache_layers=-2 must be >= 0 or 'all'"),
    (dict(attention_cache_layers=1, activation_checkpointing=False), "set activation_checkpointing: true or "
                                                                      "attention_cache_layers: 0"),
])
def test_bad_values_name_the_fix(kwargs, needle):
    with pytest.raises(ValidationError) as e:
        RunConfig(**kwargs)
    assert needle in format_validation_error(e.value)


@pytest.mark.parametrize("sp,world,needle", [
    (3, 4, "sp_size=3 does not divide world_size=4; use one of [1, 2, 4]"),
    (16, 16, "sp_size=16 must divide num_attention_heads=8"),
])
def test_sp_size_that_fits_neither_world_nor_heads(sp, world, needle):
    cfg = RunConfig(model="qwen3-tiny", seq_len=48 * 16, sp_size=sp)
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        validate(cfg, world)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(attention_cache_layers=3), "attention_cache_layers=3 is more than the model's 2 layers"),
    (dict(attention_cache_layers=2, activation_offload=True, offload_layers=1),
     "keep attention_cache_layers + offload_layers <= 2, or attention_cache_layers: all"),
    (dict(attention_cache_layers=1, activation_offload=True, offload_layers="all"), "overlaps offload_layers=all"),
    (dict(attention_cache_layers="all", activation_offload=True, offload_layers="auto"), "is circular"),
])
def test_attention_cache_against_the_model_and_offload(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("+", r"\+")):
        validate(RunConfig(model="qwen3-tiny", seq_len=64, **kwargs), 1)


def test_valid_sp_sizes_include_kv_replication():
    # tiny Qwen3: 8 query heads, 2 KV heads -> sp 4 and 8 replicate KV heads
    assert valid_sp_sizes(8, 8, 2) == [1, 2, 4, 8]
    check_sp_size(4, 4, 8, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        check_sp_size(2, 2, 6, 3)


def test_flash_attn_asked_but_missing():
    if attention.flash_attn_available():
        pytest.skip("flash-attn installed")
    with pytest.raises(ValueError, match="flash-attn is not installed; `pip install ds-longctx\\[flash\\]`"):
        attention.resolve_backend("flash_attn")


def test_model_whose_attention_cannot_be_wrapped():
    cfg = load_hf_config("qwen3-tiny")

    class NoInterface:  # e.g. a remote-code model with its own attention
        _supports_attention_backend = False

    with pytest.raises(ValueError, match="does not dispatch attention through transformers' AttentionInterface"):
        ulysses.check_wrappable_class(NoInterface, cfg)
    cfg.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="sliding_attention.*disable sliding windows"):
        ulysses.check_wrappable_class(type("M", (), {"_supports_attention_backend": True}), cfg)


def test_cli_refuses_before_starting_workers():
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "ds_longctx.cli", "train", "--nproc", "2", "--sp_size", "3",
                          "--seq_len", "96"], env=cpu_env(), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2
    assert "sp_size=3 does not divide world_size=2" in res.stderr
    assert "torch.distributed.run" not in res.stderr  # no worker was started
    assert time.perf_counter() - t < 60
