"""The resumes of the NVMe optimizer (`memory.nvme_optimizer`) that cannot carry its state are
refused at preflight, before any engine (checkpoint/nvme_state.py), on a checkpoint made here: only
its meta.json and, for one saved with the NVMe optimizer, DeepSpeed's `offloaded_tensors/` copy of
the swap files. No libaio, no process. The exact resumes: tests/distributed/test_nvme_resume.py."""

import json

import pytest

from ds_longctx.checkpoint import files
from ds_longctx.checkpoint.layout import FORMAT, LATEST, META, ckpt_root
from ds_longctx.config import RunConfig, resume_keys
from tests.helpers import refused

SWAP = [
    "offloaded_tensors/rank00/exp_avg-0_24.tensor.swp",
    "offloaded_tensors/rank01/0_24.tensor.swp",
]


def checkpoint(out, saved_nvme: bool, swap_files: bool) -> None:
    """`out`/checkpoints/step2 as a world-2, SP=2 run saved it (its meta.json; the swap files'
    copy where the run kept its optimizer state on NVMe)."""
    kw = dict(output_dir=str(out), sp_size=2, optimizer_offload=True, steps=2)
    if saved_nvme:
        kw.update(nvme_path=str(out.parent / "nvme"), nvme_optimizer=True)
    run = resume_keys.stored_values(RunConfig(**kw))
    run.update(world_size=2, sp_size=2, dp_size=1)
    tag = ckpt_root(out) / "step2"
    tag.mkdir(parents=True)
    for rank in ("rank00", "rank01") if saved_nvme else ():
        (tag / "offloaded_tensors" / rank).mkdir(parents=True)
    for name in SWAP if swap_files else ():
        (tag / name).write_bytes(b"\0" * 4096)
    manifest = files.entries(tag, SWAP if swap_files else [])
    meta = {"format": FORMAT, "step": 2, "tag": "step2", "run": run, "data": {}, "files": manifest}
    (tag / META).write_text(json.dumps(meta))
    (ckpt_root(out) / LATEST).write_text("step2")


def resume(out, nvme: bool, **kw) -> dict:
    kw = dict(output_dir=str(out), sp_size=2, optimizer_offload=True, steps=4, resume=True, **kw)
    if nvme:
        kw.update(nvme_path=str(out.parent / "nvme2"), nvme_optimizer=True)
    return kw


def test_a_checkpoint_saved_without_the_nvme_optimizer_is_not_resumed_with_it(tmp_path):
    out = tmp_path / "run"
    checkpoint(out, saved_nvme=False, swap_files=False)
    refused(
        out,
        [
            f"{str(ckpt_root(out) / 'step2')!r} was saved without memory.nvme_optimizer",
            "resume with --nvme_optimizer false",
        ],
        2,
        **resume(out, nvme=True),
    )


def test_swapped_optimizer_state_is_not_resumed_without_the_nvme_optimizer(tmp_path):
    out = tmp_path / "run"
    checkpoint(out, saved_nvme=True, swap_files=True)
    refused(
        out,
        [
            "holds its optimizer state in NVMe swap files (offloaded_tensors/)",
            "resume with --optimizer_offload true --nvme_optimizer true and an --nvme_path",
        ],
        2,
        **resume(out, nvme=False),
    )


@pytest.mark.parametrize("swap_files", [False, True])
def test_the_nvme_optimizer_state_is_not_resharded(tmp_path, swap_files):
    """4 processes at SP=2 are dp 2 where the checkpoint had dp 1: a resharded resume (the global
    batch may change here)."""
    out = tmp_path / "run"
    checkpoint(out, saved_nvme=True, swap_files=swap_files)
    msg = refused(
        out,
        [
            "a resume at another layout does not carry the NVMe optimizer's state",
            "resume at the saved layout (world_size 2, sp_size 2)",
        ],
        4,
        **resume(out, nvme=True, allow_batch_change=True),
    )
    assert ("--nvme_optimizer false" in msg) == (not swap_files), msg


def test_an_export_of_swapped_master_weights_is_refused_before_any_load(tmp_path):
    """zero_to_fp32 reads the ZeRO files, where a swapped sub-group's master weights are empty."""
    from ds_longctx.checkpoint.export import export
    from ds_longctx.checkpoint.layout import CheckpointError

    out = tmp_path / "run"
    checkpoint(out, saved_nvme=True, swap_files=True)
    with pytest.raises(CheckpointError, match=r"keeps master weights in NVMe swap files"):
        export(str(out), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()
