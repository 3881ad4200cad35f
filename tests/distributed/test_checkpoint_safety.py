"""Checkpoints on CPU (ZeRO-3, 2 gloo processes, SP=2, fp32): a pickle payload in a checkpoint is
refused by resume, eval and export without running; a same-size change to rank 1's optimizer file is
named with its rank and both digests; a checkpoint written before digests (format 1, made here the
way the old code wrote it) still resumes to the straight run's losses, exports its weights and
converts to format 2.

One 4-step run (saves at steps 2 and 4) serves every test, each on its own copy."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from ds_longctx.checkpoint import files
from ds_longctx.checkpoint.layout import CheckpointError, ckpt_root
from ds_longctx.config import RunConfig
from tests.helpers import read_metrics, run_cli

pytestmark = pytest.mark.slow
RUN = [
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "64",
    "--sp_size",
    "2",
    "--dtype",
    "fp32",
    "--lr",
    "1e-3",
]


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("safety") / "run"
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *RUN,
            "--steps",
            "4",
            "--save_every",
            "2",
            "--output_dir",
            str(out),
        ],
        output_dir=out,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def copy_at(run, dest, tag="step2"):
    """A copy of the run whose latest checkpoint is `tag` (later tags dropped; a resume cuts
    metrics.jsonl there)."""
    shutil.copytree(run, dest)
    root = ckpt_root(dest)
    for p in root.glob("step*"):
        if int(p.name[4:]) > int(tag[4:]):
            shutil.rmtree(p)
    (root / "latest").write_text(tag)
    return root / tag


def rewrite(tag_dir, name, change):
    """Load file `name` (it is ours: trusted), apply `change` to it, save it, and fix meta.json's
    size and digest as a crafter would."""
    state = torch.load(tag_dir / name, weights_only=False)
    change(state)
    torch.save(state, tag_dir / name)
    meta = json.loads((tag_dir / "meta.json").read_text())
    meta["files"].update(files.entries(tag_dir, [name]))
    (tag_dir / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["rng_rank00001.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
def test_a_pickle_payload_is_refused_by_resume_eval_and_export_and_never_runs(run, tmp_path, name):
    from ds_longctx.checkpoint.export import export
    from ds_longctx.run.eval_checkpoint import eval_inputs
    from ds_longctx.run.preflight import preflight

    marker = tmp_path / "marker"
    tag = copy_at(run, tmp_path / "run")
    rewrite(tag, name, lambda state: state.update(x=Payload(marker)))
    says = f"{name} asks to run posix.system when loaded"
    cfg = RunConfig.from_cli(
        [*RUN, "--steps", "6", "--resume", "--output_dir", str(tmp_path / "run")]
    )
    for what, call in (
        ("resume", lambda: preflight(cfg, 2)),
        (
            "eval",
            lambda: eval_inputs(["--checkpoint", str(tmp_path / "run"), "--data", "synthetic"], 2),
        ),
        ("export", lambda: export(str(tmp_path / "run"), str(tmp_path / "hf"))),
    ):
        with pytest.raises(CheckpointError) as e:
            call()
        assert str(e.value).startswith(f"{what}: checkpoint {str(tag)!r} is refused: {says}"), str(
            e.value
        )
    if name.startswith("zero_"):  # the command end to end, once: exit 2, the line last
        res = run_cli(
            [
                "train",
                "--nproc",
                "2",
                *RUN,
                "--steps",
                "6",
                "--resume",
                "--output_dir",
                str(tmp_path / "run"),
            ]
        )
        assert res.returncode == 2 and says in res.stderr.strip().splitlines()[-1], res.stderr[
            -3000:
        ]
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_a_latest_leading_to_another_run_is_refused_by_every_command_touching_nothing_of_it(
    run, tmp_path
):
    """`latest` of our run names another run's checkpoint (relative, then absolute): resume, eval,
    export and checkpoint convert each exit 2 naming our `latest` and its value; the other run's
    files stay as they were and nothing is exported."""
    copy_at(run, tmp_path / "ours")
    other = tmp_path / "other"
    copy_at(run, other, tag="step4")
    with open(other / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "loss": 0.5, "secret": "OTHER-RUN"}\n')
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    latest = ckpt_root(tmp_path / "ours") / "latest"
    for value in ("../../other/checkpoints/step4", str(ckpt_root(other) / "step4")):
        latest.write_text(value)
        for cmd in (
            [
                "train",
                "--nproc",
                "2",
                *RUN,
                "--steps",
                "6",
                "--resume",
                "--output_dir",
                str(tmp_path / "ours"),
            ],
            ["eval", "--checkpoint", str(tmp_path / "ours"), "--data", "synthetic"],
            ["export", "--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")],
            ["checkpoint", "convert", str(tmp_path / "ours"), "--tag", value],
        ):
            res = run_cli(cmd)
            last = (
                res.stderr.strip().splitlines()
                or [f"(none; rc {res.returncode}, stdout {res.stdout[-300:]})"]
            )[-1]
            assert (
                res.returncode == 2
                and repr(value) in last
                and "not a checkpoint of this run" in last
            ), (cmd, last)
            assert "OTHER-RUN" not in res.stdout + res.stderr
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before and not (
        tmp_path / "hf"
    ).exists()


def test_a_same_size_change_to_rank_1s_optimizer_file_is_named_with_rank_file_and_digests(
    run, tmp_path
):
    """The bytes change, the size and the zip directory do not: before, rank 1's load failed inside
    DeepSpeed and rank 0 reported gloo's 'Connection closed by peer'."""
    tag = copy_at(run, tmp_path / "run")
    part = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    want = json.loads((tag / "meta.json").read_text())["files"][part.name]["sha256"]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor's bytes
    part.write_bytes(bytes(data))
    found = files.digest(part)
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *RUN,
            "--steps",
            "6",
            "--resume",
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert (
        f"could not be loaded (rank 1: {part.name}: sha256 {found}, the manifest (meta.json) says "
        f"{want}: the file changed after it was written)"
    ) in last, last
    assert "Connection closed by peer" not in res.stderr and "Traceback" not in res.stderr


def to_format_1(tag_dir):
    """Rewrite a format-2 tag as the code before digests wrote it: RNG states pickled with numpy's
    tuple (its `_rng_state`: {"torch", "python", "numpy": np.random.get_state()}), meta.json format
    1 with sizes only."""
    meta = json.loads((tag_dir / "meta.json").read_text())
    for name in meta["files"]:
        if name.startswith("rng_rank"):
            state = torch.load(tag_dir / name, weights_only=True)
            n = state["numpy"]
            state["numpy"] = (
                n["bit_generator"],
                n["key"].numpy().astype(np.uint32),
                n["pos"],
                n["has_gauss"],
                n["gauss"],
            )
            torch.save(state, tag_dir / name)
    meta.update(format=1, files={n: (tag_dir / n).stat().st_size for n in meta["files"]})
    (tag_dir / "meta.json").write_text(json.dumps(meta, indent=1))


def test_a_checkpoint_from_before_digests_resumes_exports_and_converts(run, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from ds_longctx.checkpoint.convert import main as convert
    from ds_longctx.checkpoint.export import export
    from ds_longctx.run.eval_checkpoint import eval_inputs

    old = copy_at(run, tmp_path / "old")
    to_format_1(old)
    assert files.unsafe_globals(
        old / "rng_rank00000.pt"
    )  # numpy's: only the legacy path may read it
    # resume: steps 3-4 give the straight run's losses bit for bit (its RNG restored from numpy's
    # pickle)
    res = run_cli(
        [
            "train",
            "--nproc",
            "2",
            *RUN,
            "--steps",
            "4",
            "--resume",
            "--output_dir",
            str(tmp_path / "old"),
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "written before checkpoints held digests (format 1)" in res.stderr
    assert [r["loss"] for r in read_metrics(tmp_path / "old")] == [
        r["loss"] for r in read_metrics(run)
    ]
    # eval accepts it (its workers load as resume's did); export writes its weights
    old = copy_at(run, tmp_path / "old2")
    to_format_1(old)
    eval_inputs(["--checkpoint", str(tmp_path / "old2"), "--data", "synthetic"], 2)
    dest = export(str(tmp_path / "old2"), str(tmp_path / "hf"))
    with files.weights_only_loads():
        want = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root(run)), tag="step2")
    from safetensors.torch import load_file

    got = load_file(str(dest / "model.safetensors"))
    want = {
        k.removeprefix("model."): v for k, v in want.items()
    }  # the engine's LossHead holds the HF model as .model
    assert (
        got.keys() <= want.keys() and len(got) >= len(want) - 1
    )  # lm_head.weight may be tied to the embedding
    assert all(torch.equal(got[k], want[k]) for k in got)
    # convert: format 2, every digest right, the RNG files what the new code writes for the same
    # state
    assert convert(["convert", str(tmp_path / "old2")]) == 0
    meta = json.loads((old / "meta.json").read_text())
    assert meta["format"] == 2 and files.problem(old, meta, None) is None
    for r in (0, 1):
        a = files.load(old / f"rng_rank{r:05d}.pt")
        b = files.load(ckpt_root(run) / "step2" / f"rng_rank{r:05d}.pt")
        assert torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"]
        assert (
            torch.equal(a["numpy"]["key"], b["numpy"]["key"])
            and a["numpy"]["pos"] == b["numpy"]["pos"]
        )


def test_an_export_that_cannot_write_ends_in_one_line_and_leaves_nothing(run, tmp_path):
    """A write that fails part-way (the file-size limit here: EFBIG, as a full disk gives ENOSPC)
    and a read-only --out (where this machine has a read-only mount: /proc/sys in a container) are
    refused naming the path, with no half-written directory left."""
    import subprocess
    import sys

    from ds_longctx.checkpoint.export import check_out
    from tests.helpers import ROOT, cpu_env

    limit = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536)); from ds_longctx.cli import "
        "main; main(sys.argv[1:])"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            limit,
            "export",
            "--checkpoint",
            str(run),
            "--out",
            str(tmp_path / "hf"),
        ],
        env=cpu_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"export refused: export: writing {str(tmp_path / 'hf')!r} failed: ")
    assert "File too large" in last
    assert last.endswith("nothing was left there; free space or choose another --out")
    assert list(tmp_path.iterdir()) == []
    if not os.access("/proc/sys", os.W_OK):
        with pytest.raises(
            CheckpointError,
            match=r"--out '/proc/sys/hf' cannot be written .*choose a "
            r"writable --out",
        ):
            check_out("/proc/sys/hf")


@pytest.mark.parametrize("when", ["before", "during"])
def test_an_export_onto_a_full_disk_is_one_line_with_exit_2(
    run, tmp_path, capsys, monkeypatch, when
):
    """Free space short of the model: refused before the first byte; ENOSPC while the weights are
    written (faked in save_pretrained): the path, the bytes needed and free, in one line; nothing
    left at --out."""
    import errno

    from transformers import PreTrainedModel

    from ds_longctx.checkpoint import export

    dest = tmp_path / "hf"
    if when == "before":
        monkeypatch.setattr(export, "free_bytes", lambda path: 900)
    else:

        def full(self, path, **kw):
            raise OSError(
                errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(path, "model.safetensors")
            )

        monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    assert export.main(["--checkpoint", str(run), "--out", str(dest)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    if when == "before":
        assert last.startswith(
            f"export refused: export: --out {str(dest)!r} needs ~"
        ) and last.endswith(
            f"and {tmp_path} has 900 bytes free; choose an --out on a filesystem with more space"
        ), last
    else:
        from ds_longctx.parallel.disk import mount_point

        assert (
            last.startswith(
                f"export refused: export: writing {str(dest)!r} failed: no space left on "
                f"{mount_point(tmp_path)} writing {tmp_path}/hf.tmp-"
            )
            and "safetensors (needs ~" in last
        )
        assert last.endswith("free); nothing was left there; free space or choose another --out"), (
            last
        )
    assert list(tmp_path.iterdir()) == []
