"""checkpoint/files.py in one process: file ownership, the sha256 manifest against hashlib, the
per-rank check (a changed byte, a payload), weights-only loading that holds for DeepSpeed's own
loads, the install/restore pair, and RNG states that round-trip through a weights-only load."""

import hashlib
import os
import random

import numpy as np
import pytest
import torch

from ds_longctx.checkpoint import files, rng


class Payload:
    """What a crafted checkpoint carries: unpickling it runs a shell command that creates
    `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_owner_of_every_file_a_zero3_save_writes():
    assert files.owner("zero_pp_rank_3_mp_rank_00_model_states.pt") == 3
    assert files.owner("bf16_zero_pp_rank_12_mp_rank_00_optim_states.pt") == 12
    assert files.owner("zero_pp_rank_1_mp_rank_00_optim_states.pt") == 1
    assert files.owner("rng_rank00007.pt") == 7
    assert [files.owner(n) for n in ("config.json", "run.yaml", "mp_rank_00_model_states.pt")] == [
        0,
        0,
        0,
    ]


def test_digest_streams_to_hashlibs_sha256_and_problem_names_file_and_both_digests(tmp_path):
    blob = os.urandom(files._CHUNK * 2 + 12345)  # three chunks, the last partial
    (tmp_path / "zero_pp_rank_1_mp_rank_00_optim_states.bin").write_bytes(blob)
    meta = {
        "format": 2,
        "files": files.entries(tmp_path, ["zero_pp_rank_1_mp_rank_00_optim_states.bin"]),
    }
    want = hashlib.sha256(blob).hexdigest()
    assert meta["files"]["zero_pp_rank_1_mp_rank_00_optim_states.bin"] == {
        "bytes": len(blob),
        "sha256": want,
    }
    assert files.problem(tmp_path, meta, 1) is None and files.problem(tmp_path, meta, 0) is None
    changed = bytearray(blob)
    changed[len(blob) // 2] ^= 0xFF  # same size, one byte different
    (tmp_path / "zero_pp_rank_1_mp_rank_00_optim_states.bin").write_bytes(bytes(changed))
    found = hashlib.sha256(bytes(changed)).hexdigest()
    assert files.problem(tmp_path, meta, 0) is None  # rank 0 does not own it
    says = files.problem(tmp_path, meta, 1)
    assert (
        says.startswith("zero_pp_rank_1_mp_rank_00_optim_states.bin: sha256 ")
        and want in says
        and found in says
    )


def test_a_file_the_save_did_not_write_is_refused(tmp_path):
    (tmp_path / "run.yaml").write_text("x")
    meta = {"format": 2, "files": files.entries(tmp_path, ["run.yaml"])}
    files.check_sizes(tmp_path, meta, "resume", "use an earlier tag")
    (tmp_path / "zero_pp_rank_9_mp_rank_00_model_states.pt").write_bytes(b"x")
    with pytest.raises(
        files.CheckpointError,
        match="holds zero_pp_rank_9_mp_rank_00_model_states.pt, which its save did not write",
    ):
        files.check_sizes(tmp_path, meta, "resume", "use an earlier tag")


def test_a_payload_is_named_by_the_check_and_by_the_load_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "rng_rank00001.pt"
    torch.save({"torch": torch.get_rng_state(), "x": Payload(marker)}, path)
    meta = {"format": 2, "files": files.entries(tmp_path, ["rng_rank00001.pt"])}
    assert files.unsafe_globals(path) == ["posix.system"]
    assert files.problem(tmp_path, meta, 1).startswith(
        "rng_rank00001.pt asks to run posix.system when loaded"
    )
    with pytest.raises(
        files.CheckpointError, match=r"rng_rank00001.pt asks to run posix.system when loaded"
    ):
        files.load(path)
    assert not marker.exists()


def test_weights_only_loads_hold_for_deepspeeds_own_loads_and_restore_what_was_there(
    tmp_path, monkeypatch
):
    """DeepSpeed 0.19.8's TorchCheckpointEngine.load and zero_to_fp32 pass weights_only=False:
    outside the block a
    payload runs (the marker appears), inside it torch refuses it; after the block the environment
    and torch's safe-globals list are what they were (a user's own entries and
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD included)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.utils import zero_to_fp32

    marker = tmp_path / "marker"
    evil = tmp_path / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save({"module": {}, "x": Payload(marker)}, evil)
    TorchCheckpointEngine().load(str(evil))
    assert marker.exists()  # the hazard this module closes
    marker.unlink()

    class Mine:
        pass

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    torch.serialization.add_safe_globals([Mine])
    try:
        before = set(torch.serialization.get_safe_globals())
        with files.weights_only_loads():
            assert os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] == "1"
            for load in (
                lambda: TorchCheckpointEngine().load(str(evil)),
                lambda: zero_to_fp32.parse_model_states([str(evil)]),
            ):
                with pytest.raises(Exception) as e:
                    load()
                assert "posix.system" in files.refusal(e.value, "it")
        assert not marker.exists()
        assert set(torch.serialization.get_safe_globals()) == before
        assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"
        assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals([g for g in before if g is not Mine])


def test_deepspeeds_zero3_optimizer_state_loads_weights_only(tmp_path):
    """What stage3._rigid_state_dict saves (a ZeroStageEnum, a LossScaler, tensors) passes; numpy's
    pickled RNG (format 1) only where the legacy RNG globals are allowed."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    state = {
        "optimizer_state_dict": {
            "zero_stage": ZeroStageEnum.weights,
            "loss_scaler": LossScaler(1.0),
            "fp32_flat_groups": [torch.arange(4.0)],
        },
        "ds_version": "0.19.8",
    }
    torch.save(state, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    got = files.load(tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
    assert got["zero_stage"] is ZeroStageEnum.weights and got["loss_scaler"].cur_scale == 1.0
    assert torch.equal(got["fp32_flat_groups"][0], torch.arange(4.0))
    torch.save({"numpy": np.random.get_state()}, tmp_path / "rng_rank00000.pt")
    with pytest.raises(files.CheckpointError, match="_reconstruct"):
        files.load(tmp_path / "rng_rank00000.pt")
    assert files.load(tmp_path / "rng_rank00000.pt", legacy_rng=True)["numpy"][0] == "MT19937"


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    """The RNG file holds tensors and numbers: a weights-only load with nothing allowed beyond
    DeepSpeed's two classes restores torch's, python's and numpy's generators (the next draws equal
    the draws after the save)."""
    torch.manual_seed(3), random.seed(4), np.random.seed(5)
    np.random.standard_normal()  # numpy now holds a cached gaussian (has_gauss = 1)
    torch.save(rng.rng_state(), tmp_path / "rng_rank00000.pt")
    want = (torch.rand(3), random.random(), np.random.standard_normal(2))
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    assert files.unsafe_globals(tmp_path / "rng_rank00000.pt") == []
    rng.set_rng_state(files.load(tmp_path / "rng_rank00000.pt"))
    got = (torch.rand(3), random.random(), np.random.standard_normal(2))
    assert torch.equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2])


def test_format_1_rng_state_restores_as_format_2_does(tmp_path):
    """A format-1 RNG file (numpy's tuple, pickled) and its conversion (rng.numpy_state) set one
    state."""
    np.random.seed(11)
    np.random.standard_normal()
    legacy = np.random.get_state()
    want = np.random.standard_normal(3)
    for numpy_part in (legacy, rng.numpy_state(legacy)):
        np.random.seed(0)
        rng.set_rng_state(
            {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_part}
        )
        assert np.array_equal(np.random.standard_normal(3), want)
