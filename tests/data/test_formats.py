"""data/formats.py's FORMAT_TABLE is the one place the row formats are named: config accepts each
record's name, a scan recognises a row of its keys, train_on and the layout follow the record, and
no other module compares a format with a name of its own."""

import ast
import json
from pathlib import Path

import pytest

from ds_longctx.config.run import RunConfig
from ds_longctx.config.train import TrainConfig
from ds_longctx.data import formats, resolve_layout
from ds_longctx.data.scan_source import scan_files
from ds_longctx.data.tokenize import default_train_on

SAMPLE = {  # one valid value per key a record requires
    "text": "one two",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    "prompt": "p",
    "completion": "c",
    "input_ids": [1, 2, 3],
}
SFT = [r for r in formats.FORMAT_TABLE if r.objective == "sft"]


@pytest.mark.parametrize("rec", SFT, ids=lambda r: r.name)
def test_each_format_is_accepted_by_config_recognised_by_scan_and_trained_as_its_record_says(
    rec, tmp_path
):
    cfg = RunConfig.from_cli(["--data_format", rec.name, "--seq_len", "256"])
    assert cfg.data.format == rec.name
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({k: SAMPLE[k] for k in rec.required("text")}) + "\n")
    scan = scan_files("json", [str(f)], "text")  # auto: the first row's keys decide
    assert (scan.mode, scan.rows, scan.bad) == (rec.name, 1, 0)
    assert list(scan.columns())[: len(rec.keys)] == list(rec.required("text"))
    assert default_train_on(cfg, rec.name) == rec.trains
    assert resolve_layout(cfg, rec.name) == rec.layout


def test_the_other_objectives_formats_are_accepted_and_tokenize_through_their_function():
    for rec in formats.FORMAT_TABLE:
        assert TrainConfig(objective=rec.objective).objective == rec.objective
        assert callable(rec.tokens_fn()), rec.name


def test_an_unknown_format_is_refused_naming_the_tables_formats():
    with pytest.raises(ValueError) as e:
        RunConfig.from_cli(["--data_format", "chat"])
    assert all(repr(name) in str(e.value) for name in ("auto", *formats.ROW_FORMATS))
    with pytest.raises(ValueError) as e:
        formats.row_format("chat")
    assert all(repr(r.name) in str(e.value) for r in formats.FORMAT_TABLE)


def _format_literals(node, names: set) -> bool:
    """Whether a comparison sets a format variable (fmt, mode, format) beside a format's name."""
    sides = [node.left, *node.comparators]
    var = any(
        (isinstance(s, ast.Name) and s.id in ("fmt", "mode", "format"))
        or (isinstance(s, ast.Attribute) and s.attr in ("fmt", "mode", "format"))
        for s in sides
    )
    consts = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)]
    return var and any(c.value in names for c in consts)


def test_no_module_but_formats_compares_a_format_with_its_name_or_keys_a_dict_by_format():
    names = {r.name for r in formats.FORMAT_TABLE}
    home = Path(formats.__file__)
    found = []
    for path in sorted(home.parents[1].rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            keyed = isinstance(node, ast.Dict) and len(node.keys) >= 2  # {format: ...}
            keyed = keyed and all(
                isinstance(k, ast.Constant) and k.value in names for k in node.keys
            )
            if keyed or (isinstance(node, ast.Compare) and _format_literals(node, names)):
                found.append(f"{path.relative_to(home.parents[2])}:{node.lineno}")
    assert not found, f"format names outside data/formats.py's FORMAT_TABLE: {found}"
