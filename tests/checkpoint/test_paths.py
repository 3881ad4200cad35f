"""checkpoint/paths.py and the save around it, in one process: every path read out of a run's files
stays inside the run (a `latest` or tag leading elsewhere, a manifest entry or link leading out, a
renamed tag), checked with an audit hook that records every file opened; partial saves set aside or
refused; a save whose write fails (a full disk) fails in one line and leaves the previous
checkpoint; the launcher's repeated-signal rule; which model names a LoRA export ships the base
of."""

import errno
import json
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ds_longctx.checkpoint import paths, resume, save
from ds_longctx.checkpoint.files import CheckpointError
from ds_longctx.checkpoint.layout import ckpt_root
from ds_longctx.config import RunConfig
from ds_longctx.parallel.disk import PARTIAL_MARKER, make_partial
from ds_longctx.run import stops

_opened: list = []
_watching = [False]


def _audit(event, args):
    if _watching[0] and event == "open" and isinstance(args[0], (str, bytes, Path)):
        _opened.append(str(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `opened_within`


def fake_tag(root: Path, tag: str, secret: str = "") -> Path:
    """A tag directory with a format-2 meta.json listing one small file (what find_checkpoint checks
    first)."""
    d = root / tag
    d.mkdir(parents=True)
    (d / "run.yaml").write_text(secret or "model: qwen3-tiny\n")
    meta = {
        "format": 2,
        "step": int(tag[4:]) if tag[4:].isdigit() else 0,
        "tag": tag,
        "run": {},
        "files": {"run.yaml": {"bytes": (d / "run.yaml").stat().st_size, "sha256": "0" * 64}},
    }
    (d / "meta.json").write_text(json.dumps(meta))
    (root / "latest").write_text(tag)
    return d


@pytest.fixture
def two_runs(tmp_path):
    """Our run (checkpoints/step2) and another user's run beside it holding a secret in every
    file."""
    ours, other = tmp_path / "ours" / "checkpoints", tmp_path / "other" / "checkpoints"
    fake_tag(ours, "step2")
    fake_tag(other, "step9", secret="SECRET-OF-ANOTHER-RUN\n")
    (other / "latest").write_text("SECRET-OF-ANOTHER-RUN")
    return ours, other


def refused(root: Path, tag=None):
    """find_checkpoint's refusal, asserting it opened nothing outside `root`."""
    _opened.clear()
    _watching[0] = True
    try:
        with pytest.raises(CheckpointError) as e:
            resume.find_checkpoint(root, tag, what="eval")
    finally:
        _watching[0] = False
    outside = [
        p
        for p in _opened
        if not Path(p).resolve().is_relative_to(root.resolve())
        and "site-packages" not in p
        and "python3" not in p
    ]
    assert outside == [], outside
    assert "SECRET" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize(
    "value",
    [
        "../../other/checkpoints/step9",
        "/etc",
        "step2/../../../other/checkpoints/step9",
        "..",
        "step2\x00x",
        "step2/",
    ],
)
def test_a_latest_that_leads_out_of_the_run_is_refused_naming_file_and_value(two_runs, value):
    ours, other = two_runs
    (ours / "latest").write_text(value.replace("/etc", str(other / "step9")))
    msg = refused(ours)
    assert (
        str(ours / "latest") in msg and "not a checkpoint of this run" in msg and "['step2']" in msg
    )


def test_a_latest_link_or_tag_link_leading_out_is_refused_unread(two_runs):
    ours, other = two_runs
    (ours / "latest").unlink()
    (ours / "latest").symlink_to(other / "latest")
    assert "leads out of" in refused(ours)
    (ours / "latest").unlink()
    (ours / "step5").symlink_to(other / "step9")
    (ours / "latest").write_text("step5")
    assert "'step5'" in refused(ours)
    assert "'step5'" in refused(ours, "step5")  # the same through resume_tag / --tag


def test_a_manifest_entry_or_a_file_link_leading_out_is_refused(two_runs):
    ours, other = two_runs
    meta = json.loads((ours / "step2" / "meta.json").read_text())
    meta["files"]["../../../other/checkpoints/step9/run.yaml"] = {"bytes": 22, "sha256": "0" * 64}
    (ours / "step2" / "meta.json").write_text(json.dumps(meta))
    assert "lists the file" in refused(ours)
    del meta["files"]["../../../other/checkpoints/step9/run.yaml"]
    (ours / "step2" / "meta.json").write_text(json.dumps(meta))
    (ours / "step2" / "run.yaml").unlink()
    (ours / "step2" / "run.yaml").symlink_to(other / "step9" / "run.yaml")
    assert "leads out of checkpoint" in refused(ours)


def test_a_renamed_tag_names_what_it_expected_and_what_it_found(two_runs):
    ours, _ = two_runs
    (ours / "step2").rename(ours / "mine")
    assert "tag 'step2' does not exist" in refused(ours) and "available: []" in refused(ours)
    msg = refused(ours, "mine")
    assert "saved as tag 'step2'" in msg and "rename it back to 'step2'" in msg
    meta = json.loads((ours / "mine" / "meta.json").read_text())
    for tampered in (
        "../../other/checkpoints/step9",
        str(other_run_tag := ours.parent.parent / "b"),
        7,
    ):
        (ours / "mine" / "meta.json").write_text(json.dumps({**meta, "tag": tampered}))
        msg = refused(
            ours, "mine"
        )  # a meta.json whose tag no save writes: never "rename it back" to that
        assert f"names tag {str(tampered)!r}, which no save writes (step<N>)" in msg, msg
        assert "rename it back" not in msg
    assert not other_run_tag.exists()


def test_partial_saves_are_set_aside_and_foreign_ones_refused_never_removed(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    fake_tag(root, "step2")
    make_partial(root / ".tmp-step4")
    assert paths.partial_saves(root) == [root / ".tmp-step4"]
    with caplog.at_level("INFO", logger="ds_longctx"):
        resume.set_aside(root)
    assert "never completed" in caplog.text and ".tmp-step4" in caplog.text
    (root / ".tmp-mine").mkdir()
    (root / ".tmp-mine" / "notes.txt").write_text("a user's")
    with pytest.raises(CheckpointError, match="did not make it"):
        resume.set_aside(root)
    assert (root / ".tmp-mine" / "notes.txt").read_text() == "a user's"


def fake_engine(root: Path, fail: OSError | None):
    """What save() asks of an engine in a world of one; DeepSpeed's save writes one file or raises
    `fail`."""

    def save_checkpoint(save_dir, tag, client_state, save_latest):
        if fail is not None:
            raise fail
        (Path(save_dir) / tag / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"x" * 10)

    config = SimpleNamespace(to_json_file=lambda p: Path(p).write_text("{}"))
    return SimpleNamespace(
        sample_offset=0,
        state=SimpleNamespace(rank=0, world_size=1, sp_size=1, dp_size=1),
        ds=SimpleNamespace(save_checkpoint=save_checkpoint),
        model=SimpleNamespace(config=config),
    )


def test_a_save_that_hits_a_full_disk_fails_in_one_line_and_keeps_the_last_checkpoint(tmp_path):
    cfg = RunConfig.from_cli(["--output_dir", str(tmp_path / "run"), "--keep_checkpoints", "2"])
    root = ckpt_root(cfg.train.output_dir)
    save.save(fake_engine(root, None), cfg, 2, {"data": 1})
    assert paths.read_latest(root) == "step2" and not (root / "step2" / PARTIAL_MARKER).exists()
    full = OSError(errno.ENOSPC, "No space left on device", str(root / ".tmp-step4" / "x.pt"))
    with pytest.raises(CheckpointError) as e:
        save.save(fake_engine(root, full), cfg, 4, {"data": 1})
    msg = str(e.value)
    assert "save of step 4 failed: no space left on " in msg and "free)" in msg
    assert "(step2) is unchanged" in msg and "\n" not in msg
    assert paths.read_latest(root) == "step2" and not (root / ".tmp-step4").exists()
    resume.find_checkpoint(root)  # still complete and loadable


def test_the_launcher_waits_for_a_save_and_abandons_only_on_a_deliberate_repeat(
    tmp_path, monkeypatch, capsys
):
    status = tmp_path / "status.txt"
    forwarded, killed, clock = [], [], [100.0]
    monkeypatch.setattr(stops.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stops, "kill_children", lambda: killed.append(clock[0]))
    s = stops.LauncherSignals(str(status), lambda signum, frame: forwarded.append(signum))

    def press(at):
        clock[0] = at
        s(signal.SIGINT, None)

    press(100.0)  # the first: to the workers
    status.write_text("saving step 6")
    for t in (100.1, 100.2, 100.3):  # a mashed key: one press
        press(t)
    assert forwarded == [signal.SIGINT] and not killed and "waiting" not in capsys.readouterr().err
    press(101.0)  # told what runs, and how to abandon it
    assert "the workers are saving step 6; waiting for them" in capsys.readouterr().err
    press(112.0)  # past the window: told again, nothing killed
    press(113.0)  # within it: abandoned
    assert killed == [113.0] and forwarded == [signal.SIGINT] * 2 and s.abandoned == "saving step 6"


# every refusal that asks the user to delete or remove something, and why that thing is inside what
# the run owns
REMOVALS = {
    "remove it and write the values out": "the YAML anchor on a line of the user's own config file",
    "remove the tag": "the YAML tag on a line of the user's own config file",
    "remove it, or": "a file inside the checkpoint's tag directory that its save did not write",
    "remove the link or use an earlier tag": "a link inside the checkpoint's tag directory",
    "remove the key": (
        "router_aux_loss_coef in the user's own run config, on a model without experts"
    ),
    "remove it (or set $": (
        "a converted model's entry of the model cache, named after its GGUF, left incomplete"
    ),
}


def test_no_refusal_asks_to_delete_anything_outside_the_run():
    """Read from the source (ast): the literal parts of every message raised that say delete /
    remove / rm are the reviewed REMOVALS, each naming something inside the run directory or the
    user's own config file."""
    import ast
    import re

    root = Path(__file__).resolve().parents[2] / "ds_longctx"
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    for m in re.finditer(r"[^;:(]*\b(delete|remove|rm)\b[^;)]*", part.value, re.I):
                        found.add(m.group(0).strip())
    assert found <= set(REMOVALS), sorted(found - set(REMOVALS))


def test_a_lora_export_ships_the_base_exactly_where_the_run_had_no_weights(tmp_path, monkeypatch):
    """ships_base reads a model name as training did (resolve_model): a shipped geometry or a config
    file has no weights elsewhere, so its export carries the base; a local checkpoint folder, even
    one named like a preset, is the base to point at."""
    from ds_longctx.checkpoint.export import ships_base

    assert ships_base("qwen3-tiny") and ships_base("Qwen/Qwen3-8B")
    (tmp_path / "my.json").write_text('{"model_type": "qwen3"}')
    assert ships_base(str(tmp_path / "my.json"))
    (tmp_path / "qwen3-tiny").mkdir()
    (tmp_path / "qwen3-tiny" / "config.json").write_text('{"model_type": "qwen3"}')
    monkeypatch.chdir(tmp_path)
    assert not ships_base("qwen3-tiny") and not ships_base(str(tmp_path / "qwen3-tiny"))
