"""The HF Trainer path's resume loads weights-only: `LongCtxTrainerMixin.train` runs the Trainer's
train inside checkpoint/files.weights_only_loads, so DeepSpeed's own loader (what transformers'
deepspeed_load_checkpoint ends in: TorchCheckpointEngine.load, weights_only=False) refuses a payload
instead of running it."""

import os

import pytest
import torch

from ds_longctx.integrations.hf_trainer import LongCtxTrainerMixin


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class ResumingTrainer:
    """The part of transformers.Trainer.train a DeepSpeed resume runs: the engine's checkpoint
    load."""

    def train(self, resume_from_checkpoint):
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine,
        )

        return TorchCheckpointEngine().load(resume_from_checkpoint)


def test_the_trainers_resume_refuses_a_payload_and_reads_a_plain_state(tmp_path):
    cls = type("LongCtxResumingTrainer", (LongCtxTrainerMixin, ResumingTrainer), {})
    trainer = cls.__new__(
        cls
    )  # the mixin's __init__ builds levers on a real model; train() needs none of it
    plain, evil, marker = tmp_path / "plain.pt", tmp_path / "evil.pt", tmp_path / "marker"
    torch.save({"module": {"w": torch.ones(2)}}, plain)
    torch.save({"module": {}, "x": Payload(marker)}, evil)
    assert torch.equal(trainer.train(str(plain))["module"]["w"], torch.ones(2))
    with pytest.raises(Exception, match="posix.system"):
        trainer.train(str(evil))
    assert not marker.exists() and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
