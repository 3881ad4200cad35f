"""Export round trip on CPU: 2 steps with SP=2 (ZeRO-3, fp32, YaRN), checkpoint, `ds-longctx
export`, then `AutoModelForCausalLM.from_pretrained` of the export gives the engine's logits
(export_worker.sp_logits: the SP forward of the trained engine, gathered) on the same input, and
keeps the training RoPE."""

import pytest
import torch

from tests.distributed.export_worker import YARN
from tests.helpers import rel_err, run_cli, torchrun

pytestmark = pytest.mark.slow


def test_export_loads_with_from_pretrained_and_gives_the_engines_logits(tmp_path):
    run = tmp_path / "run"
    torchrun(2, ["tests/distributed/export_worker.py", "--out", str(run)])
    out = tmp_path / "hf"
    res = run_cli(["export", "--checkpoint", str(run), "--out", str(out)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not list(tmp_path.glob("hf.tmp-*"))
    saved = list(
        tmp_path.rglob("config.json")
    )  # the checkpoint's and the export's: no key of ours reaches the Hub
    assert len(saved) >= 2 and not [p for p in saved if "_ds_longctx" in p.read_text()]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.float32
    rp = model.config.rope_parameters
    assert {k: rp[k] for k in YARN} == YARN  # the RoPE the engine trained with
    ref = torch.load(run / "engine_logits.pt")
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"]).logits
    assert logits.shape == ref["logits"].shape
    assert rel_err(logits, ref["logits"]) <= 1e-5, rel_err(logits, ref["logits"])

    # the untrained model is far away: the comparison would notice a missed load
    fresh = AutoModelForCausalLM.from_config(model.config)
    with torch.no_grad():
        assert rel_err(fresh(input_ids=ref["input_ids"]).logits, ref["logits"]) > 1e-2
