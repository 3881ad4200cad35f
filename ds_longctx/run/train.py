"""Per-process training entry: one process per GPU (or CPU rank), started by a launcher.

    torchrun --nproc_per_node 2 -m ds_longctx.train --config run.yaml [--key value ...]
    deepspeed --num_gpus 2 --module ds_longctx.train --config run.yaml
    accelerate launch --config_file accelerate.yaml -m ds_longctx.train --config run.yaml
    ds-longctx train --nproc 2 --sp_size 2  # starts the processes for you
    ... --save_every 100                    # checkpoints in <output_dir>/checkpoints
    ... --resume                            # resume the latest one (layouts: checkpoint/layout.py)

Writes `<output_dir>/metrics.jsonl`: one JSON line per optimizer step
(step, loss, tokens, seconds, tokens_per_s, peak_gpu_bytes, host_rss_bytes, skipped_rows: the data's
rows left out as bad under data.skip_bad_rows, the same on every line), and with eval_data one line
per evaluation (step, eval_loss, eval_tokens, eval_rows, eval_seconds: every eval_every steps and
after the last) whose per-position curve goes to `<output_dir>/eval_curve.jsonl` (run/evaluate.py),
and TensorBoard events in `<output_dir>/tensorboard` when torch.utils.tensorboard imports. SIGTERM
or SIGINT: every rank stops at the next step boundary, saves a checkpoint and exits 0 (`ds-longctx
train` itself 143 / 130). A NaN/inf loss stops the run (exit 1) before its optimizer step. A refusal
(bad config, bad data, an unusable checkpoint) exits 2 on every rank. Each of these ends with one
line (run/refuse.py, run/stops.py). A worker whose launcher dies ends itself. `--help` lists every
run-config field.
"""

from __future__ import annotations

# train_loop (torch, deepspeed) is imported in main once the config is known good: bad input
# is refused without them.
import logging
import os
import sys

from ds_longctx.levers.disk_tier import DiskTierError
from ds_longctx.parallel.parallel_state import local_world_size
from ds_longctx.run.argv import parse_config
from ds_longctx.run.refuse import record_failure
from ds_longctx.run.run_log import guarded_output
from ds_longctx.run.stops import StopRequest, watch_launcher


def main(argv: list[str] | None = None) -> None:
    watch_launcher()  # from the first moment: a killed launcher must not leave this worker running
    signals = (
        StopRequest().install()
    )  # SIGTERM / SIGINT from here on: stop at a step boundary, save
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    cfg = parse_config(
        sys.argv[1:] if argv is None else argv, world, local_world_size(world), usage=__doc__
    )
    with (
        guarded_output()
    ):  # a terminal that goes away (`| tee` ended by Ctrl-C) ends nothing: run/run_log.py
        logging.basicConfig(
            level=logging.INFO if rank == 0 else logging.WARNING, format="[ds_longctx] %(message)s"
        )
        os.environ.setdefault(
            "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"
        )  # before torch is imported

        # torch and deepspeed: once the config is known good
        from ds_longctx.run.train_loop import fail, train

        try:
            train(cfg, signals, rank, world)
        except DiskTierError as e:  # a full disk mid-step: the checkpoints stay intact
            fail(f"stopped: {e}; the last saved checkpoint is as it was", rank)
        except Exception as e:  # a collective that timed out, among others: for the launcher
            record_failure(e)
            raise


if __name__ == "__main__":
    main()
