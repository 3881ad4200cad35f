"""hf_trainer.py and hf_loss.py without processes: the TrainingArguments it builds agree with the
run's DeepSpeed JSON field by field (what transformers checks them against), a clashing value is
refused with the key to change, a dataset's completion_mask makes TRL train the completion, padding
never trains, and importing the module imports no torch. The trainers themselves:
tests/distributed/test_hf_trainer.py."""

import subprocess
import sys

import pytest
from transformers import TrainingArguments

from ds_longctx.config import RunConfig
from ds_longctx.integrations.hf_args import training_kwargs
from ds_longctx.plan.ds_config import hf_trainer_ds_config
from tests.helpers import ROOT, cpu_env


def kwargs_for(cfg, args_cls=TrainingArguments, **user):
    return training_kwargs(
        cfg, hf_trainer_ds_config(cfg, world_size=4, on_gpu=False), args_cls, user
    )


def test_fields_match_the_deepspeed_json():
    cfg = RunConfig(
        sp_size=2,
        lr=3e-4,
        weight_decay=0.1,
        grad_clip=0.5,
        warmup_steps=7,
        steps=11,
        seed=5,
        micro_batch=1,
        output_dir="runs/x",
        save_every=4,
    )
    kw = kwargs_for(cfg, report_to="none")
    ds, opt = kw["deepspeed"], kw["deepspeed"]["optimizer"]["params"]
    assert "train_batch_size" not in ds and ds["sequence_parallel_size"] == 2
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    )
    assert (
        kw["learning_rate"],
        kw["weight_decay"],
        [kw["adam_beta1"], kw["adam_beta2"]],
        kw["adam_epsilon"],
    ) == (opt["lr"], opt["weight_decay"], opt["betas"], opt["eps"])
    assert kw["max_grad_norm"] == ds["gradient_clipping"] == 0.5
    assert (
        kw["warmup_steps"] == 7
        and "scheduler" not in ds
        and kw["lr_scheduler_type"] == "constant_with_warmup"
    )
    assert kw["bf16"] is ds["bf16"]["enabled"] is False and kw["fp16"] is False
    assert (kw["max_steps"], kw["seed"], kw["output_dir"], kw["save_steps"]) == (11, 5, "runs/x", 4)
    assert kw["gradient_checkpointing"] is False and kw["accelerator_config"] == {
        "use_configured_state": True
    }
    assert kw["report_to"] == "none" and "max_length" not in kw


def test_a_clashing_value_is_refused_naming_the_run_config_key():
    cfg = RunConfig(lr=1e-4)
    with pytest.raises(
        ValueError,
        match=r"learning_rate=0\.001 \(the run config says 0\.0001; change optimizer\.lr\)",
    ):
        kwargs_for(cfg, learning_rate=1e-3)
    with pytest.raises(ValueError, match="gradient_checkpointing=True"):
        kwargs_for(cfg, gradient_checkpointing=True)
    assert kwargs_for(cfg, learning_rate=1e-4)["learning_rate"] == 1e-4  # the same value is fine


def test_sft_config_gets_the_rows_length_and_skips_trls_preparation():
    trl = pytest.importorskip("trl")
    cfg = RunConfig(seq_len=4096)
    kw = kwargs_for(cfg, trl.SFTConfig)
    assert kw["max_length"] == 4096 and kw["dataset_kwargs"] == {"skip_prepare_dataset": True}
    assert (
        kwargs_for(cfg, trl.SFTConfig, dataset_kwargs={})["dataset_kwargs"] == {}
    )  # TRL tokenizes text itself


def test_a_text_dataset_is_given_back_to_trl_to_tokenize(monkeypatch):
    """`trainer` drops the skip of TRL's preparation that `training_args` set for our rows where a
    dataset holds text (no input_ids); our rows and a caller's own dataset_kwargs stay as they
    are."""
    from types import SimpleNamespace

    import datasets

    from ds_longctx.integrations import hf_trainer
    from ds_longctx.integrations.hf_args import SKIP_PREPARE

    seen = []
    monkeypatch.setattr(
        hf_trainer, "trainer_class", lambda cls: lambda run_config, **kw: seen.append(kw) or kw
    )
    text = datasets.Dataset.from_dict({"text": ["w1 w2", "w3"]})
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]]})
    for dataset, given, want in (
        (text, SKIP_PREPARE, {}),
        (rows, SKIP_PREPARE, SKIP_PREPARE),
        (text, {"dataset_text_field": "text"}, {"dataset_text_field": "text"}),
    ):
        args = SimpleNamespace(dataset_kwargs=dict(given))
        hf_trainer.trainer(object, None, args=args, train_dataset=dataset)
        assert args.dataset_kwargs == want, (dataset.column_names, given)
    args = SimpleNamespace(dataset_kwargs=dict(SKIP_PREPARE))
    hf_trainer.trainer(object, None, args=args, train_dataset=rows, eval_dataset=text)
    assert args.dataset_kwargs == {} and len(seen) == 4


def test_a_completion_mask_column_turns_trls_completion_only_loss_on(monkeypatch):
    """TRL builds labels from a tokenized dataset's completion_mask only under
    completion_only_loss=True (left None it decides False there): `trainer` sets it, and leaves a
    value the caller gave."""
    from types import SimpleNamespace

    import datasets

    from ds_longctx.integrations import hf_trainer

    monkeypatch.setattr(hf_trainer, "trainer_class", lambda cls: lambda run_config, **kw: kw)
    masked = datasets.Dataset.from_dict({"input_ids": [[1, 2]], "completion_mask": [[0, 1]]})
    plain = datasets.Dataset.from_dict({"input_ids": [[1, 2]]})
    for dataset, given, want in ((masked, None, True), (masked, False, False), (plain, None, None)):
        args = SimpleNamespace(completion_only_loss=given)
        hf_trainer.trainer(object, None, args=args, train_dataset=dataset)
        assert args.completion_only_loss is want, (dataset.column_names, given)


def test_an_untokenized_dataset_at_the_loader_is_refused_naming_the_fix():
    """A text dataset whose TRL preparation was skipped (a trainer not built by `longctx.trainer`)
    would reach the collator without input_ids: refused, naming longctx.trainer and
    dataset_kwargs."""
    from types import SimpleNamespace

    import datasets

    from ds_longctx.integrations.hf_trainer import LongCtxTrainerMixin

    text = datasets.Dataset.from_dict({"text": ["w1 w2"]})
    with pytest.raises(
        ValueError,
        match=r"the training dataset has no input_ids \(columns \['text'\]\).*"
        r"longctx\.trainer.*dataset_kwargs=\{\}",
    ):
        LongCtxTrainerMixin._longctx_rows(SimpleNamespace(), text, "training")


def test_padding_never_trains():
    """`batch_labels`: the labels the loss reads; without labels the tokens, never where
    attention_mask is 0."""
    import torch

    from ds_longctx.integrations.hf_loss import batch_labels

    ids = torch.tensor([[5, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert batch_labels({"input_ids": ids, "attention_mask": mask}).tolist() == [[5, 6, 7, -100]]
    assert batch_labels(
        {"input_ids": ids, "labels": torch.tensor([[-100, 6, 7, 0]]), "attention_mask": mask}
    ).tolist() == [[-100, 6, 7, -100]]
    assert batch_labels({"input_ids": ids}).tolist() == [[5, 6, 7, 0]]


def test_import_is_torch_free():
    code = (
        "import sys, ds_longctx.integrations.hf_trainer; assert 'torch' not in sys.modules, 'torch "
        "imported'"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=cpu_env(), cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
