"""TRL's SFTTrainer with ds_longctx's levers on a folder of text files: the files (books) joined end
to end and cut into rows of exactly seq_len tokens (`data_layout: concat`, the seed guide's shape),
Ulysses SP, the chunked loss, the placement plan (checkpoint / offload / attention cache) and the
planner's DeepSpeed config.

    ds-longctx plan --model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --out my_run
    accelerate launch --config_file my_run/accelerate.yaml launch/trl_sft.py \\
        --config my_run/run.yaml --data books/ --tokenizer Qwen3-8B/
    deepspeed --num_gpus 8 launch/trl_sft.py --config my_run/run.yaml --data books/ \\
        --tokenizer Qwen3-8B/
    # offline: a tokenizer qwen3-tiny's vocab covers
    ds-longctx data prepare --stdlib --out corpus/ --vocab_size 512
    torchrun --nproc_per_node 2 launch/trl_sft.py --model qwen3-tiny --sp_size 2 --seq_len 512 \\
        --steps 5 --data corpus/ --tokenizer corpus/tokenizer --output_dir runs/trl_tiny

Arguments are the run config's, as `python -m ds_longctx.train` takes them (`--help` lists them):
`--config run.yaml`
and any `--key value` override. Rank 0 prints one JSON line per logged step ({"step", "loss", ...});
the loss of each step is the one `ds-longctx train` writes for the same run config
(tests/distributed/test_hf_trainer.py). As any HF Trainer run it reports where `--report_to` says
(TensorBoard where installed), saves checkpoints every `--save_every` steps, and saves the model and
tokenizer in `--output_dir` at the end. The lines marked `# ds_longctx` are all that differs from a
plain SFTTrainer script.
"""

import json
import sys


def main(argv=None):
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from ds_longctx.integrations import hf_trainer as longctx  # ds_longctx

    cfg = longctx.run_config(
        sys.argv[1:] if argv is None else argv
    )  # ds_longctx: --config run.yaml --key value ...

    class PrintLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                print(json.dumps({"step": state.global_step, **logs}), flush=True)

    args = longctx.training_args(
        cfg, SFTConfig, logging_steps=1
    )  # ds_longctx: saves, reports as the run config says
    tokenizer = longctx.tokenizer(
        cfg
    )  # ds_longctx: --tokenizer, else the model directory's (as ds-longctx train)
    model = longctx.build_model(cfg)  # ds_longctx
    train_dataset = longctx.rows_dataset(cfg)  # ds_longctx
    trainer = longctx.trainer(
        SFTTrainer,
        cfg,
        model=model,
        args=args,
        train_dataset=train_dataset,  # ds_longctx
        processing_class=tokenizer,
        callbacks=[PrintLogs()],
    )
    trainer.train()
    # the weights (gathered from ZeRO-3) and the tokenizer in output_dir, as any HF Trainer run
    trainer.save_model()
    longctx.finish()  # ds_longctx: every rank done, groups torn down, exit 0


if __name__ == "__main__":
    main()
