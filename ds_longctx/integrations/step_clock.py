"""The HF Trainer's step clock: each optimizer step's time and peak reserved GPU memory for its log,
and the memory snapshot of the first steps."""

from __future__ import annotations

# torch and transformers are imported inside the methods that use them: hf_trainer imports this
# module without them.
import time

from ds_longctx.run import memory_snapshot


class StepClock:
    """A TrainerCallback mixin timing each optimizer step (CUDA-synchronized) and its peak reserved
    GPU memory; `read()` hands over what was seen since the last read."""

    snapshot = (
        0,
        None,
    )  # (logging.memory_snapshot_steps, output_dir): record from the first step, dump after N

    def __init__(self):
        self.seconds, self.peak, self.t0 = [], 0, None
        self.recorded = None  # steps since recording began; None: not recording

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        if self.snapshot[0] and self.recorded is None and torch.cuda.is_available():
            # after the Trainer's build: the weights' blocks show no code line
            memory_snapshot.start()
            self.recorded = 0
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        if self.t0 is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.peak = max(self.peak, torch.cuda.max_memory_reserved())
        self.seconds.append(time.perf_counter() - self.t0)
        self.t0 = None
        if self.recorded is not None:
            self.recorded += 1
            if (
                self.recorded == self.snapshot[0]
            ):  # the first N steps of this run (a resumed one too)
                import torch.distributed as dist

                memory_snapshot.dump(
                    self.snapshot[1], dist.get_rank() if dist.is_initialized() else 0, self.recorded
                )
                self.snapshot, self.recorded = (0, None), None  # done: nothing more to record

    def read(self) -> dict:
        import torch

        out = {}
        if self.seconds:
            out["seconds"] = round(sum(self.seconds) / len(self.seconds), 4)
        if torch.cuda.is_available() and self.seconds:
            out["peak_gpu_bytes"] = self.peak
        self.seconds, self.peak = [], 0
        return out


def step_clock():
    """A new StepClock callback."""
    from transformers import TrainerCallback

    return type("LongCtxStepClock", (StepClock, TrainerCallback), {})()
