"""checkpoint/universal.py's checks of a universal form, in one process on a form written here
(safetensors' own save_file, the manifest's sizes and sha256 from hashlib): a manifest's step or
optimizer step out of reason, and a file of the wrong length, each refused in one line naming the
file, before any tensor is read; a SIGINT while one is written leaves no partial; a stop or a
kill while one replaces another leaves a complete one."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ds_longctx.checkpoint import universal
from ds_longctx.checkpoint.layout import CheckpointError

PARAMS = {"w": [3, 4], "b": [5]}


def write_param(base: Path, name: str, numel: int) -> None:
    tensors = {
        k: torch.arange(numel, dtype=torch.float32) + i for i, k in enumerate(universal.KEYS)
    }
    save_file(tensors, str(base / universal.param_file(name)))


def write_manifest(tag: Path, **changes) -> dict:
    base = universal.universal_dir(tag)
    entries = {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in base.glob("*.safetensors")
    }
    manifest = {
        "format": universal.FORMAT,
        "tag": tag.name,
        "step": 2,
        "optimizer_step": 2.0,
        "source": {"world_size": 2, "sp_size": 2, "dp_size": 1},
        "files": entries,
        "params": [
            {"name": n, "shape": s, "numel": s[0] * (s[1:] or [1])[0], "group": 0}
            for n, s in PARAMS.items()
        ],
        **changes,
    }
    (base / universal.MANIFEST).write_text(json.dumps(manifest))
    return manifest


@pytest.fixture
def tag(tmp_path):
    """checkpoints/step2 with the universal form of a 2-parameter model, laid out as written."""
    t = tmp_path / "run" / "checkpoints" / "step2"
    universal.universal_dir(t).mkdir(parents=True)
    for name, shape in PARAMS.items():
        write_param(universal.universal_dir(t), name, shape[0] * (shape[1:] or [1])[0])
    write_manifest(t)
    return t


@pytest.mark.parametrize(
    "changes, says",
    [
        (
            {"optimizer_step": 1e12},
            "optimizer_step=1000000000000.0 is not a whole number from 0 to the tag's step 2",
        ),
        ({"optimizer_step": -1}, "optimizer_step=-1 is not"),
        ({"optimizer_step": 1.5}, "optimizer_step=1.5 is not"),
        ({"optimizer_step": "2"}, "optimizer_step='2' is not"),
        ({"optimizer_step": True}, "optimizer_step=True is not"),
        (
            {"step": 10**12, "optimizer_step": 10**12},
            "step=1000000000000 is not the tag's step (2)",
        ),
    ],
)
def test_a_manifest_step_out_of_reason_is_refused_naming_the_file_and_the_key(tag, changes, says):
    assert universal.read_manifest(tag, 2)["optimizer_step"] == 2.0  # the form as written is taken
    write_manifest(tag, **changes)
    path = universal.universal_dir(tag) / universal.MANIFEST
    with pytest.raises(CheckpointError) as e:
        universal.read_manifest(tag, 2)
    assert str(e.value).startswith(f"reshard: {str(path)!r}: {says}"), e.value
    assert str(e.value).endswith(
        f"`ds-longctx checkpoint reshard {tag.parent.parent} --tag step2` "
        f"writes it from the checkpoint (replacing what is there)"
    )


def test_a_universal_file_of_the_wrong_length_is_refused_naming_it_and_both_sizes(tag):
    """A file cut short (its manifest entry unchanged), and one rewritten one element short with its
    entry to match (whose slices the load would otherwise fail on): each named with what was
    expected and what was found."""
    manifest = universal.read_manifest(tag, 2)
    assert universal.universal_problem(tag, manifest) is None
    w = universal.universal_dir(tag) / universal.param_file("w")
    size = w.stat().st_size
    w.write_bytes(w.read_bytes()[:-4])
    assert universal.universal_problem(tag, manifest) == (
        f"{str(w)!r} is {size - 4:,} bytes, manifest.json says {size:,}: not what its conversion "
        f"wrote"
    )
    write_param(w.parent, "w", 11)
    manifest = write_manifest(tag)
    assert universal.universal_problem(tag, manifest) == (
        f"{str(w)!r}: exp_avg has shape [11], manifest.json says [12] (the parameter's elements)"
    )


def test_sigint_while_writing_a_universal_form_leaves_nothing_but_what_was_there(tag, monkeypatch):
    """`checkpoint reshard` stopped by a real SIGINT while the ranks' files are read (its line says
    "nothing written"): the partial `.tmp-universal` is removed, the universal form already there
    unchanged. The source checkpoint's checks and reads are stubbed; the files are real."""
    import os
    import signal

    base = universal.universal_dir(tag)
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    monkeypatch.setattr(universal.files, "problem", lambda *a, **k: None)
    groups = [[(n, tuple(s)) for n, s in PARAMS.items()]]
    monkeypatch.setattr(universal, "_source_groups", lambda *a: (groups, 2))
    laid_out = []

    def interrupted(path):
        laid_out.extend(sorted(p.name for p in (tag / universal.PARTIAL).iterdir()))
        os.kill(os.getpid(), signal.SIGINT)  # Python's handler raises KeyboardInterrupt
        return [], [], 0.0

    monkeypatch.setattr(universal, "_rank_pieces", interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            universal.write_universal(tag, {"step": 2, "run": {"world_size": 2}})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert laid_out == sorted(universal.param_file(n) for n in PARAMS)  # the partial existed
    assert sorted(p.name for p in tag.iterdir()) == [universal.UNIVERSAL]
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_checkpoint_reshard_removes_the_partial_and_its_line_says_so(
    tag, monkeypatch, capsys, sig
):
    """`ds-longctx checkpoint reshard` (convert.main) gets a real SIGTERM or SIGINT while the ranks'
    files are read: exit 128 + the signal, one line saying nothing was written, no `.tmp-universal`
    left, the universal form already there unchanged, the handlers put back. The source checkpoint's
    reading is stubbed as above."""
    import os
    import signal

    from ds_longctx.checkpoint import convert

    signum = getattr(signal, sig)
    base = universal.universal_dir(tag)
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    monkeypatch.setattr(convert, "find_checkpoint", lambda root, t, what: (tag, {"step": 2}))
    monkeypatch.setattr(convert.run_lock, "take", lambda *a, **k: None)
    monkeypatch.setattr(universal.files, "problem", lambda *a, **k: None)
    monkeypatch.setattr(
        universal, "_source_groups", lambda *a: ([[(n, tuple(s)) for n, s in PARAMS.items()]], 2)
    )
    laid_out = []

    def stopped(path):
        laid_out.extend(sorted(p.name for p in (tag / universal.PARTIAL).iterdir()))
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)  # a second one while the partial is removed waits
        return [], [], 0.0

    monkeypatch.setattr(universal, "_rank_pieces", stopped)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    code = convert.main(["reshard", str(tag.parent.parent), "--tag", tag.name])
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert code == 128 + signum
    assert capsys.readouterr().err.splitlines()[-1] == (  # below the progress bar's line
        f"checkpoint reshard stopped by {sig}: nothing written (its partial universal form "
        f"removed, the checkpoint unchanged); run it again to write it"
    )
    assert laid_out == sorted(universal.param_file(n) for n in PARAMS)
    assert sorted(p.name for p in tag.iterdir()) == [universal.UNIVERSAL]
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before


def whole_save(monkeypatch) -> None:
    """write_universal's source stubbed: a 2-rank save of PARAMS whose fp32 masters are all 7 (its
    checks and reads), so a write completes."""
    monkeypatch.setattr(universal.files, "problem", lambda *a, **k: None)
    groups = [[(n, tuple(s)) for n, s in PARAMS.items()]]
    monkeypatch.setattr(universal, "_source_groups", lambda *a: (groups, 2))
    flat = torch.full((sum(universal.partition(n, 2) for n in (12, 5)),), 7.0)
    state = {"exp_avg": flat * 2, "exp_avg_sq": flat * 3}
    monkeypatch.setattr(universal, "_rank_pieces", lambda path: ([flat], [state], 2.0))


def complete(tag: Path) -> float:
    """The fp32 master's first element of the complete universal form of `tag` (every file checked
    against its manifest first)."""
    assert universal.universal_problem(tag, universal.read_manifest(tag, 2)) is None
    return float(universal.read_slices(tag, "w", 0, 1, ("fp32",))["fp32"][0])


def test_a_stop_or_a_kill_between_the_renames_leaves_a_complete_universal_form(tag, monkeypatch):
    """Replacing a universal form renames it aside (.old-universal), renames the new one in, then
    deletes the old. A stop (KeyboardInterrupt) at the second rename puts the old form back at once;
    a kill after the first leaves the old form aside, which the next resume (recover_universal, rank
    0) puts back and the next reshard replaces; a kill while the old one is deleted leaves a
    half-deleted .old-universal that the next recover removes beside the complete new form."""
    import os

    base, old = universal.universal_dir(tag), tag / universal.REPLACED
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    whole_save(monkeypatch)
    meta = {"step": 2, "run": {"world_size": 2, "sp_size": 2, "dp_size": 1}}
    replace = os.replace

    def stopped(src, dst):
        if Path(src).name == universal.PARTIAL:
            raise KeyboardInterrupt
        replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(universal.os, "replace", stopped)
        with pytest.raises(KeyboardInterrupt):
            universal.write_universal(tag, meta)
    assert sorted(p.name for p in tag.iterdir()) == [universal.UNIVERSAL]
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before
    for then in ("resume", "reshard"):  # killed after the first rename: nothing after it runs
        with monkeypatch.context() as m:
            m.setattr(universal, "_replace", lambda tmp, out, old: os.replace(out, old))
            universal.write_universal(tag, meta)
        assert sorted(p.name for p in tag.iterdir()) == sorted(
            [universal.PARTIAL, universal.REPLACED]
        )
        if then == "resume":
            assert universal.recover_universal(tag)
            assert {p.name: p.read_bytes() for p in base.iterdir()} == before
            assert complete(tag) == 0.0  # the fixture's form, whole
        else:
            universal.write_universal(tag, meta)
            assert sorted(p.name for p in tag.iterdir()) == [universal.UNIVERSAL]
            assert complete(tag) == 7.0
    # killed while the old form is deleted: its manifest already gone
    old.mkdir()
    (old / universal.param_file("b")).write_bytes(before["b.safetensors"])
    assert universal.recover_universal(tag) and complete(tag) == 7.0
    assert sorted(p.name for p in tag.iterdir()) == [universal.UNIVERSAL]
