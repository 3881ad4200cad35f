"""Worker for test_hf_trainer.py: 2 steps of a plain `transformers.Trainer` or TRL's `SFTTrainer`
through `ds_longctx.integrations.hf_trainer`, on the token rows `ds-longctx train` reads for the
same run-config options; evaluates the first step's rows before training (`eval_on_start`); rank 0
writes what the test compares.

    torchrun --nproc_per_node 2 tests/distributed/hf_trainer_worker.py \\
        --trainer trainer|sft|sft_text --out FILE -- <run-config options as for ds-longctx train>
    torchrun --nproc_per_node N tests/distributed/hf_trainer_worker.py \\
        --trainer masks|weights --cases JSON --out FILE -- <run-config options>

`sft_text`: SFTTrainer on a `datasets.Dataset` of the --data folder's texts (a `text` column, TRL
tokenizes it), with the args `training_args` makes for our rows (the documented route, unchanged),
no eval. `masks`: for each case of JSON ({name: {"trainer": "sft"|"trainer", "args": {...}, "rows":
[...]}}), that trainer on
a `datasets.Dataset` of the rows (a fresh model each); FILE: {name: [per train-loader batch:
input_ids, the labels the
loss reads (hf_loss.batch_labels), position_ids]}.
`weights`: SFTTrainer on the rows of JSON's case "train" for the run's steps; FILE (torch.save): the
logged losses and grad norms and, per optimizer step, every full gradient before the optimizer step.

FILE (JSON): global_step, log_history, the DeepSpeed engine's train_batch_size, len(train loader),
the rows, whether the ranks of each SP group read the same first batch, and how many documents the
Ulysses attention kept apart in the last step's row.
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--trainer", choices=["trainer", "sft", "sft_text", "masks", "weights"], required=True
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases")
    ap.add_argument("run", nargs=argparse.REMAINDER)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    from ds_longctx.config import RunConfig
    from ds_longctx.data.rows import RowOrder, step_samples
    from ds_longctx.integrations import hf_trainer as longctx
    from ds_longctx.run import lever_order

    def planned_again(*args, **kwargs):
        raise AssertionError("the trainer planned the placement again, not build_model's shape")

    lever_order.run_placement = planned_again  # every trainer here takes build_model's model

    cfg = RunConfig.from_cli([x for x in a.run if x != "--"])
    if a.trainer in ("masks", "weights"):
        with open(a.cases) as f:
            cases = json.load(f)
        (token_sets if a.trainer == "masks" else train_grads)(cfg, cases, a.out)
        longctx.finish()
    extra = dict(
        report_to="none",
        logging_steps=1,
        eval_on_start=True,
        eval_strategy="no",
        save_strategy="no",
    )
    if a.trainer.startswith("sft"):
        from trl import SFTConfig, SFTTrainer

        cls, args = SFTTrainer, longctx.training_args(cfg, SFTConfig, **extra)
        kw = {"processing_class": AutoTokenizer.from_pretrained(cfg.data.tokenizer)}
    else:
        cls, args, kw = Trainer, longctx.training_args(cfg, TrainingArguments, **extra), {}
    model = longctx.build_model(cfg)
    if a.trainer == "sft_text":
        text_only(cls, cfg, model, args, kw, a.out)
        return
    train = longctx.rows_dataset(cfg)
    dp = dist.get_world_size() // cfg.parallel.sp_size
    order = RowOrder(len(train), cfg.train.seed, cfg.data.shuffle)
    per_step = cfg.train.micro_batch * cfg.train.grad_accum
    first = [order.row_of_sample(i) for r in range(dp) for i in step_samples(0, per_step, r, dp)]
    trainer = longctx.trainer(
        cls,
        cfg,
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=train.select(first),
        **kw,
    )
    trainer.train()

    st, cu = trainer.longctx_state, trainer.longctx.attn.cu_seqlens  # the documents of step 2's row
    loader = trainer.get_train_dataloader()
    batch = next(iter(loader))["input_ids"]
    peers = [torch.empty_like(batch) for _ in range(st.sp_size)]
    dist.all_gather(peers, batch, group=st.sp_group)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(
                {
                    "global_step": trainer.state.global_step,
                    "log_history": trainer.state.log_history,
                    "train_batch_size": trainer.model_wrapped.train_batch_size(),
                    "steps_per_epoch": len(loader),
                    "sp_peers_same": all(torch.equal(p, batch) for p in peers),
                    "dp": st.dp_size,
                    "n_rows": len(train),
                    "documents": 1 if cu is None else len(cu) - 1,
                },
                f,
            )
    longctx.finish()


def text_only(cls, cfg, model, args, kw: dict, out: str) -> None:
    """2 steps of SFTTrainer on the folder's texts as a text dataset; rank 0 writes global_step, the
    logged losses and the args' dataset_kwargs as the trainer saw them."""
    from pathlib import Path

    import datasets
    import torch.distributed as dist

    from ds_longctx.integrations import hf_trainer as longctx

    texts = [f.read_text() for f in sorted(Path(cfg.data.source).glob("*.txt"))]
    args.eval_on_start = False
    trainer = longctx.trainer(
        cls,
        cfg,
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"text": texts}),
        **kw,
    )
    trainer.train()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "global_step": trainer.state.global_step,
                    "dataset_kwargs": trainer.args.dataset_kwargs,
                    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                },
                f,
            )
    longctx.finish()


def case_trainer(cfg, case: dict, **extra):
    """The trainer of one case: SFTTrainer (or Trainer) through `longctx.trainer`, a fresh model,
    the case's rows."""
    import datasets
    from transformers import AutoTokenizer, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    from ds_longctx.integrations import hf_trainer as longctx

    sft = case["trainer"] == "sft"
    args = longctx.training_args(
        cfg,
        SFTConfig if sft else TrainingArguments,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        **case.get("args", {}),
        **extra,
    )
    return longctx.trainer(
        SFTTrainer if sft else Trainer,
        cfg,
        model=longctx.build_model(cfg),
        args=args,
        train_dataset=datasets.Dataset.from_list(case["rows"]),
        processing_class=AutoTokenizer.from_pretrained(cfg.data.tokenizer),
    )


def token_sets(cfg, cases: dict, out: str) -> None:
    """Per case, every train-loader batch as the loss reads it (module docstring: masks)."""
    from accelerate.state import AcceleratorState

    from ds_longctx.integrations.hf_loss import batch_labels

    got = {}
    for name, case in cases.items():
        # one Accelerator (DeepSpeed's) per trainer; the process group stays
        AcceleratorState._reset_state()
        trainer = case_trainer(cfg, case)
        got[name] = [
            {
                "input_ids": b["input_ids"].tolist(),
                "labels": batch_labels(b).tolist(),
                "position_ids": None
                if b.get("position_ids") is None
                else b["position_ids"].tolist(),
            }
            for b in trainer.get_train_dataloader()
        ]
    with open(out, "w") as f:
        json.dump(got, f)


def train_grads(cfg, cases: dict, out: str) -> None:
    """Train case "train"; rank 0 saves the logged losses and grad norms and each step's full
    gradients."""
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import safe_get_full_grad

    grads, step = [], DeepSpeedEngine.step

    def capture(
        engine, *args, **kwargs
    ):  # at the step's boundary, before the optimizer (collective under ZeRO-3)
        if engine.is_gradient_accumulation_boundary():
            grads.append(
                {
                    n: safe_get_full_grad(p).detach().clone()
                    for n, p in engine.module.named_parameters()
                }
            )
        return step(engine, *args, **kwargs)

    DeepSpeedEngine.step = capture
    trainer = case_trainer(cfg, cases["train"])
    trainer.train()
    train = [h for h in trainer.state.log_history if "loss" in h]
    if dist.get_rank() == 0:
        torch.save(
            {
                "losses": [h["loss"] for h in train],
                "grad_norms": [h["grad_norm"] for h in train],
                "grads": grads,
                "global_step": trainer.state.global_step,
            },
            out,
        )


if __name__ == "__main__":
    main()
