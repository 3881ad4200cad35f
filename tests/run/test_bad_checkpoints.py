"""A resume or an export that cannot go on is refused before anything expensive starts, with a
message that names the checkpoint, the key and the fix, and leaves output_dir exactly as it was: a
missing, interrupted, truncated or changed checkpoint, settings that differ from the run's, a run
with nothing left to train, a fresh run over checkpoints, checkpoints that would not fit the disk.
Cases that need a real multi-process checkpoint are in tests/distributed/test_resume.py."""

import contextlib
import json
import os
from pathlib import Path

import pytest

from ds_longctx.checkpoint import files as checkpoint_files
from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import FORMAT, CheckpointError, ckpt_root
from ds_longctx.config import RunConfig, resume_keys
from tests.helpers import refused


def fake_checkpoint(out: Path, step: int = 3, world: int = 2, sp: int = 2, **run_overrides) -> Path:
    """A complete-looking checkpoint (meta.json + one sized file) as checkpoint/save.save writes
    it."""
    cfg = RunConfig(output_dir=str(out))
    run = resume_keys.stored_values(cfg) | run_overrides
    run.update(world_size=world, sp_size=sp, dp_size=world // sp)
    root = ckpt_root(out)
    tag = root / f"step{step}"
    tag.mkdir(parents=True)
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").write_bytes(b"x" * 100)
    meta = {
        "format": FORMAT,
        "step": step,
        "tag": tag.name,
        "run": run,
        "data": {},
        "files": checkpoint_files.entries(tag, ["zero_pp_rank_0_mp_rank_00_optim_states.json"]),
    }
    (tag / "meta.json").write_text(json.dumps(meta))
    (root / "latest").write_text(tag.name)
    return tag


def test_resume_without_a_checkpoint(tmp_path):
    refused(
        tmp_path / "out", ["resume", "no checkpoint in", "save_every > 0"], resume=True, steps=6
    )


def test_resume_with_latest_missing(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag.parent / "latest").unlink()
    refused(
        tmp_path / "out",
        ["latest' is missing", "['step3']", "resume_tag"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_resume_from_a_tag_that_does_not_exist(tmp_path):
    fake_checkpoint(tmp_path / "out")
    refused(
        tmp_path / "out",
        ["tag 'step9' does not exist", "available: ['step3']"],
        resume=True,
        resume_tag="step9",
        steps=12,
        sp_size=2,
        world=2,
    )


def test_resume_from_an_interrupted_save(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "meta.json").unlink()
    refused(
        tmp_path / "out",
        ["step3", "is incomplete", "no meta.json", "use an earlier tag"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_resume_from_a_truncated_checkpoint(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").write_bytes(b"x" * 40)
    refused(
        tmp_path / "out",
        [
            "corrupt",
            "zero_pp_rank_0_mp_rank_00_optim_states.json has 40 bytes, 100 were written",
            "use an earlier tag",
        ],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_resume_from_a_checkpoint_with_a_missing_file(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").unlink()
    refused(
        tmp_path / "out",
        ["corrupt", "optim_states.json is missing"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_resume_with_another_world_size_and_global_batch(tmp_path):
    fake_checkpoint(tmp_path / "out", world=2, sp=2)
    refused(
        tmp_path / "out",
        [
            "trained 1 sequences a step (dp 1 x micro_batch 1 x grad_accum 1)",
            "this run trains 2 (dp 2 x micro_batch 1 x grad_accum 1)",
            "--allow_batch_change true",
        ],
        resume=True,
        steps=6,
        sp_size=2,
        world=4,
    )


def test_resume_with_another_sp_size_keeping_the_batch_is_a_reshard(tmp_path):
    fake_checkpoint(tmp_path / "out", world=2, sp=2)
    cfg = RunConfig(output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=1, grad_accum=1)
    meta = resume.check_run_dir(cfg, 1)
    assert meta["layout_change"].startswith(
        "resume: layout world 2 = sp 2 x dp 1 -> world 1 = sp 1 x dp 1"
    )


def test_resume_with_changed_settings(tmp_path):
    """Keys that make the model, its numerics or the data order are refused, each named with both
    values; the lr, the step count and the levers may change (run/resume_changes.py applies
    them)."""
    fake_checkpoint(tmp_path / "out")
    msg = refused(
        tmp_path / "out",
        [
            "resume: this run changes model.dtype 'auto' -> 'bf16', train.seq_len 256 -> 512 "
            "from checkpoint",
            "resume with the checkpoint's values (its run.yaml) or start a new output_dir",
        ],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
        seq_len=512,
        dtype="bf16",
        lr=1e-3,
    )
    assert "lr" not in msg
    cfg = RunConfig(
        output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=2, lr=1e-3, offload_layers=1
    )
    meta = resume.check_run_dir(cfg, 2)
    changed = resume_keys.compare(meta["run"], cfg)[1]
    assert resume_keys.changed_line(changed, meta["step"]) == (
        "resume: changed since step 3: steps 3 -> 6, lr 0.0001 -> 0.001, offload_layers 0 -> 1"
    )


@pytest.mark.parametrize(
    "kw, says",
    [
        (
            {"optimizer_offload": True, "optimizer_offload_ratio": 0.5},
            "optimizer.offload_ratio 1 -> 0.5 (the optimizer "
            "state is saved in the old split's sub-groups",
        ),
        (
            {"torch_adam": False},
            "optimizer.torch_adam True -> False (the saved Adam state is carried into another "
            "implementation only for optimizer_offload)",
        ),
        ({"attn_backend": "sdpa_math"}, "kernels.attn_backend 'auto' -> 'sdpa_math'"),
        ({"rope_scaling": "none"}, "model.rope_scaling 'auto' -> 'none'"),
    ],
)
def test_resume_refuses_a_change_that_cannot_be_honoured_naming_why(tmp_path, kw, says):
    fake_checkpoint(tmp_path / "out")
    msg = refused(
        tmp_path / "out",
        [f"resume: this run changes {says}"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
        **kw,
    )
    assert "optimizer.offload " not in msg  # the offload itself may change (run/resume_changes.py)


def test_resume_with_changed_lora_and_from_a_checkpoint_older_than_lora(tmp_path):
    fake_checkpoint(tmp_path / "out", lora_rank=8)
    refused(
        tmp_path / "out",
        ["lora.rank 8 -> 4"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
        lora_rank=4,
    )
    old = fake_checkpoint(
        tmp_path / "old"
    )  # written before the lora keys existed: they held their defaults
    meta = json.loads((old / "meta.json").read_text())
    meta["run"] = {
        k: v for k, v in meta["run"].items() if not k.startswith("lora_") and k != "steps"
    }
    (old / "meta.json").write_text(json.dumps(meta))
    cfg = RunConfig(output_dir=str(tmp_path / "old"), resume=True, steps=6, sp_size=2)
    assert resume_keys.compare(resume.check_run_dir(cfg, 2)["run"], cfg) == (
        [],
        [],
    )  # steps then: not known
    refused(
        tmp_path / "old",
        ["lora.rank 0 -> 4"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
        lora_rank=4,
    )


def test_resume_from_a_checkpoint_that_stored_fewer_keys_compares_its_run_yaml(tmp_path):
    """Keys its meta.json lacks (compared since) are read from the checkpoint's run.yaml, not
    assumed default."""
    tag = fake_checkpoint(tmp_path / "out")
    RunConfig(rope_scaling="none", steps=3).dump(tag / "run.yaml")
    meta = json.loads((tag / "meta.json").read_text())
    meta["run"] = {k: v for k, v in meta["run"].items() if k not in ("rope_scaling", "steps")}
    meta["files"].update(checkpoint_files.entries(tag, ["run.yaml"]))
    (tag / "meta.json").write_text(json.dumps(meta))
    cfg = RunConfig(
        output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=2, rope_scaling="none"
    )
    saved = resume_keys.saved_values(resume.check_run_dir(cfg, 2)["run"], tag / "run.yaml")
    assert resume_keys.compare(saved, cfg) == ([], [("steps", 3, 6)])
    refused(
        tmp_path / "out",
        ["model.rope_scaling 'none' -> 'auto'"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_resume_with_nothing_left_to_train(tmp_path):
    fake_checkpoint(tmp_path / "out", step=6)
    refused(
        tmp_path / "out",
        ["at step 6 and steps=6", "set steps above 6"],
        resume=True,
        steps=6,
        sp_size=2,
        world=2,
    )


def test_fresh_run_into_a_directory_with_checkpoints(tmp_path):
    fake_checkpoint(tmp_path / "out")
    refused(
        tmp_path / "out", ["already holds checkpoints (latest step3)", "--resume", "new output_dir"]
    )


def test_overwrite_deletes_only_checkpoints_this_project_wrote(tmp_path):
    """--overwrite deletes checkpoints/ where every file in it is a save's; a file no save wrote
    (beside the tags, or inside one) is refused by name before anything starts, and stays."""
    tag = fake_checkpoint(tmp_path / "out")
    (tag.parent / "zero_to_fp32.py").write_text("# DeepSpeed's script, copied by its save\n")
    (tag.parent / "notes.txt").write_text("mine")
    (tag / "extra.bin").write_bytes(b"x")
    refused(
        tmp_path / "out",
        [
            "overwrite deletes",
            "checkpoints' only where every file in it is a checkpoint's",
            "checkpoints/notes.txt, checkpoints/step3/extra.bin, which no save wrote",
            "move those out of it, or choose a new output_dir",
        ],
        overwrite=True,
    )
    cfg = RunConfig(output_dir=str(tmp_path / "out"), overwrite=True)
    with pytest.raises(CheckpointError, match="checkpoints/notes.txt"):
        resume.clear_previous_run(cfg)
    (tag.parent / "notes.txt").unlink()
    (tag / "extra.bin").unlink()
    assert resume.check_run_dir(cfg, 1) is None
    resume.clear_previous_run(cfg)
    assert not ckpt_root(tmp_path / "out").exists()


def test_checkpoints_that_do_not_fit_the_free_space_are_refused(tmp_path, monkeypatch):
    """save_every > 0: keep_checkpoints + 1 checkpoints at once (plan/planner.disk_checkpoint_bytes
    each: 12 bytes per trained parameter, fp32 on CPU: qwen3-tiny 2.0 MB) against output_dir's free
    space, with the keep that fits."""
    from ds_longctx.run import preflight as pre

    monkeypatch.setattr(pre, "free_bytes", lambda path: 5_000_000)
    refused(
        tmp_path / "out",
        [
            f"output_dir={str(tmp_path / 'out')!r}: its checkpoints need ~6.1 MB more and its "
            f"filesystem has 5.0 MB free (one checkpoint of qwen3-tiny is ~2.0 MB; save_every=2, "
            f"keep_checkpoints=2: 3 at once); set keep_checkpoints 1 (2 at once while a save is "
            f"written), or choose an output_dir with more free space"
        ],
        save_every=2,
        steps=6,
        dtype="fp32",
    )
    monkeypatch.setattr(pre, "free_bytes", lambda path: 3_000_000)
    refused(
        tmp_path / "out",
        ["no two checkpoints fit there"],
        save_every=2,
        steps=6,
        dtype="fp32",
        lora_rank=0,
    )


def test_resume_tag_without_resume(tmp_path):
    refused(tmp_path / "out", ["resume_tag='step3'", "--resume true"], resume_tag="step3")


def test_resume_with_changed_data(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    meta = json.loads((tag / "meta.json").read_text()) | {"data": {"kind": "files", "n_rows": 10}}
    with pytest.raises(
        CheckpointError, match=r"data changed since checkpoint .*resume with the same data"
    ):
        resume.load(None, tag, meta, {"kind": "files", "n_rows": 11})


def test_export_refusals(tmp_path):
    from ds_longctx.checkpoint.export import export

    with pytest.raises(CheckpointError, match="no checkpoint in .*save_every > 0"):
        export(str(tmp_path), str(tmp_path / "hf"))
    fake_checkpoint(tmp_path / "run")
    with pytest.raises(
        CheckpointError, match=r"tag 'step5' does not exist.*available: \['step3'\]"
    ):
        export(str(tmp_path / "run"), str(tmp_path / "hf"), tag="step5")
    with pytest.raises(
        CheckpointError, match=r"--merged folds LoRA adapters .*lora_rank 0.*drop --merged"
    ):
        export(str(tmp_path / "run"), str(tmp_path / "hf"), merged=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(
        CheckpointError,
        match="'.*busy' already exists and is not an empty directory; choose a new path",
    ):
        export(str(tmp_path / "run"), str(tmp_path / "busy"))
    assert not (tmp_path / "hf").exists() and os.listdir(tmp_path / "busy") == ["x"]


@pytest.mark.parametrize("moment", ["config", "files"])
def test_an_export_whose_tag_is_pruned_while_it_reads_names_the_kept_tags(
    tmp_path, monkeypatch, moment
):
    """A running train prunes the tag export reads (its directory removed as save._prune does), at
    the config read or at the files' check: one line naming the tag and the tags still there, exit
    2, nothing at --out."""
    import shutil

    import transformers

    from ds_longctx.checkpoint import export as ex

    old = fake_checkpoint(tmp_path / "run", step=3)
    fake_checkpoint(tmp_path / "run", step=5)
    real_config, real_problem = transformers.AutoConfig.from_pretrained, ex.files.problem

    def prune():
        shutil.rmtree(old)

    def config(path, **kw):
        if moment == "config":
            prune()
            return real_config(path, **kw)
        return transformers.Qwen3Config()

    def problem(tag_dir, meta, *a, **kw):
        prune()
        return real_problem(tag_dir, meta, *a, **kw)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", config)
    monkeypatch.setattr(ex.files, "problem", problem)
    err = tmp_path / "err.txt"
    with open(err, "w") as f, contextlib.redirect_stderr(f):
        code = ex.main(
            ["--checkpoint", str(tmp_path / "run"), "--tag", "step3", "--out", str(tmp_path / "hf")]
        )
    lines = err.read_text().splitlines()
    root = ckpt_root(tmp_path / "run")
    assert code == 2 and lines == [
        f"export refused: export: checkpoint 'step3' in {str(root)!r} was removed while export "
        "read it "
        "(2 of its 2 files gone: a run writing there keeps only its newest keep_checkpoints "
        "tags); export "
        "the latest (now 'step5', --tag left out) or a kept tag (step5), or export once that run "
        "has ended"
    ], lines
    assert not (tmp_path / "hf").exists()


def test_eval_out_never_appends_to_a_users_own_metrics(tmp_path):
    """`eval --out DIR` appends to DIR's metrics.jsonl only where a run or an earlier eval made it
    (their markers); a user's own is refused before anything starts, and kept."""
    from types import SimpleNamespace

    from ds_longctx.run.eval_checkpoint import EVAL_MARKER, eval_inputs, write_lines

    tag = fake_checkpoint(tmp_path / "run", world=1, sp=1)
    RunConfig(output_dir=str(tmp_path / "run")).dump(tag / "run.yaml")
    meta = json.loads((tag / "meta.json").read_text())
    meta["files"].update(checkpoint_files.entries(tag, ["run.yaml"]))  # as a save lists it
    (tag / "meta.json").write_text(json.dumps(meta))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text('{"my": 1}\n')
    argv = ["--checkpoint", str(tmp_path / "run"), "--data", "synthetic", "--out"]
    with pytest.raises(ValueError) as e:
        eval_inputs(argv + [str(mine)], 1)
    assert str(e.value) == (
        f"eval: --out {mine} holds metrics.jsonl, which no run or eval of this project wrote "
        f"there, and eval appends its lines to them; choose another --out"
    )
    assert (mine / "metrics.jsonl").read_text() == '{"my": 1}\n'
    cfg, _, tag_dir, meta, out = eval_inputs(argv + [str(tmp_path / "evals")], 1)
    result = SimpleNamespace(
        loss=1.0,
        tokens=64,
        rows=1,
        metrics_row=lambda step, **kw: {"step": step},
        curve_row=lambda step, **kw: {"step": step},
    )
    assert write_lines(result, ([], []), out, tag_dir, meta, cfg) is None
    assert (out / EVAL_MARKER).is_file()
    assert eval_inputs(argv + [str(out)], 1)[4] == out  # an earlier eval's lines: appended to
