"""LoRA under ZeRO-3 and Ulysses SP on CPU over gloo, real processes (fp32):

- SP=2 against a plain single-process HF model with the same adapters (tests/levers/test_lora.py's
  apply_lora on helpers.tiny_model): the loss and every adapter gradient (`safe_get_full_grad` of
  the partitioned adapters), rel <= 1e-5; the frozen base has no gradient. The adapters start with B
  drawn (`lora_init=random_b`): with PEFT's B = 0 every A gradient would be 0 and the comparison
  empty for half the adapters.
- the same with every lever on: chunked loss in chunks smaller than a slice, tiled MLP (the per-tile
  path), checkpointing routed through DeepSpeed's checkpoint (the offload path on CPU).
- `ds-longctx train` 2 steps: the base weights in the checkpoint are the initial draw, bit for bit;
  every adapter moved.
- export: 2 steps (export_worker.py, YaRN), `ds-longctx export --merged`;
  `PeftModel.from_pretrained(base, out)` gives the engine's logits (rel <= 1e-5), and so does the
  merged model.
"""

import pytest
import torch

from ds_longctx.config import RunConfig
from ds_longctx.levers.lora import apply_lora, is_adapter
from tests.distributed.test_ulysses import check, run, sample
from tests.helpers import assert_saved_size, read_metrics, rel_err, run_cli, tiny_model, torchrun

pytestmark = pytest.mark.slow
pytest.importorskip("peft")
LORA = {"lora_rank": 4, "lora_alpha": 8, "lora_init": "random_b"}


def reference(ids: torch.Tensor, **lora):
    """HF's own token-mean loss and the adapters' gradients, on one process, the engine's adapters
    (same seed)."""
    model = tiny_model(seed=0, attn="eager")
    apply_lora(model, RunConfig(**lora).lora, seed=0)
    loss = model(input_ids=ids[None], labels=ids[None]).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_lora_sp2_matches_plain_hf(tmp_path):
    got = run(tmp_path, 2, 2, **LORA)
    ref_loss, ref_grads = reference(sample(0), **LORA)
    assert len(ref_grads) == 28 and all(
        is_adapter(n) for n in got["grads"]
    )  # adapters only, none of the base
    assert (
        got["not_partitioned"] == []
    )  # the adapters, made after zero.Init, partitioned by deepspeed.initialize
    assert all(g.abs().sum() > 0 for g in ref_grads.values())
    check(got, ref_loss, ref_grads)


def test_lora_every_lever_on_matches_plain_hf(tmp_path):
    lora = {**LORA, "lora_target_modules": "all-linear"}
    got = run(
        tmp_path,
        2,
        2,
        chunked_loss=True,
        loss_chunk_rows=5,
        tiled_mlp=True,
        tile_tokens=7,
        activation_checkpointing=True,
        activation_offload=True,
        **lora,
    )
    check(got, *reference(sample(0), **lora))


def fp32_state(run_dir):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(run_dir / "checkpoints"))
    return {k.removeprefix("model."): v for k, v in state.items()}


def test_train_keeps_the_base_and_moves_the_adapters(tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            "--sp_size",
            "2",
            "--model",
            "qwen3-tiny",
            "--seq_len",
            "64",
            "--steps",
            "2",
            "--dtype",
            "fp32",
            "--lr",
            "1e-3",
            "--lora_rank",
            "4",
            "--save_every",
            "2",
            "--output_dir",
            str(out),
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [m["step"] for m in read_metrics(out)] == [1, 2]
    assert_saved_size(out / "checkpoints" / "step2", lora_rank=4)
    state = fp32_state(out)
    base = dict(tiny_model(seed=0).named_parameters())
    initial = tiny_model(seed=0)
    apply_lora(initial, RunConfig(lora_rank=4).lora, seed=0)
    start = dict(initial.named_parameters())
    assert set(state) == set(start)
    for name, p in state.items():
        if is_adapter(name):  # every A and B moved (B from 0)
            assert rel_err(p, start[name].detach()) > 1e-4, name
        else:
            assert torch.equal(p, base[name.replace(".base_layer.", ".")].detach()), name


def test_export_adapter_loads_with_peft_and_gives_the_engines_logits(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, out = tmp_path / "run", tmp_path / "hf"
    torchrun(
        2,
        [
            "tests/distributed/export_worker.py",
            "--out",
            str(run_dir),
            "--set",
            "lora_rank=4",
            "--set",
            "lora_alpha=8",
        ],
    )
    res = run_cli(
        ["export", "--checkpoint", str(run_dir), "--out", str(out), "--merged"], timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert {"adapter_config.json", "adapter_model.safetensors", "base", "merged"} <= {
        p.name for p in out.iterdir()
    }
    ref = torch.load(run_dir / "engine_logits.pt")

    base = AutoModelForCausalLM.from_pretrained(str(out / "base"))
    assert all(
        torch.equal(p, q) for p, q in zip(base.parameters(), tiny_model(seed=0).parameters())
    )
    with torch.no_grad():
        base_logits = base(input_ids=ref["input_ids"]).logits
        model = PeftModel.from_pretrained(base, str(out))
        assert model.peft_config["default"].r == 4 and model.peft_config["default"].lora_alpha == 8
        logits = model(input_ids=ref["input_ids"]).logits
        merged = AutoModelForCausalLM.from_pretrained(str(out / "merged"))(
            input_ids=ref["input_ids"]
        ).logits
    assert rel_err(logits, ref["logits"]) <= 1e-5, rel_err(logits, ref["logits"])
    assert rel_err(merged, ref["logits"]) <= 1e-5, rel_err(merged, ref["logits"])
    assert (
        rel_err(base_logits, ref["logits"]) > 1e-4
    )  # the adapters matter: a missed load would show
    # the adapter names its base: PEFT's AutoPeftModel finds it alone
    from peft import AutoPeftModelForCausalLM

    assert model.peft_config["default"].base_model_name_or_path == str((out / "base").resolve())
    with torch.no_grad():
        auto = AutoPeftModelForCausalLM.from_pretrained(str(out))(input_ids=ref["input_ids"]).logits
    assert rel_err(auto, ref["logits"]) <= 1e-5
