"""ds_longctx/families.py is the one home of what differs between model families: every record is
complete, and no other module compares a model_type with a family's name of its own."""

import ast
import json
from pathlib import Path

from ds_longctx import families
from ds_longctx.plan.geometry import ModelGeometry
from tests.test_architecture import docstring_ids

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ds_longctx"
# a family's name that means something else there: GGUF's architecture, Liger's casting mode, the
# config.json a GGUF import writes
OTHER_MEANINGS = {
    "checkpoint/gguf_convert.py": {"llama"},
    "levers/fused_ops.py": {"llama"},
    "checkpoint/real_models.py": {"llama"},
}


def test_every_family_record_is_complete():
    assert families.FAMILIES
    for name, fam in families.FAMILIES.items():
        assert fam.model_type == name and fam.kind in families.KINDS, name
        assert fam.defaults and fam.lora_targets, name
        assert fam.window_rule in (
            families.WINDOW_NONE,
            families.WINDOW_ALWAYS,
            families.WINDOW_FLAG,
            families.WINDOW_FROM_LAYER,
        ), name
        assert set(fam.null_is_fallback) <= {"head_dim", "num_key_value_heads"}, name
        assert bool(fam.composite_types) == (fam.text_key is not None), name
        assert (fam.kind == families.MOE) == bool(fam.moe_defaults) == bool(fam.expert_layout)
        assert fam.router in (families.ROUTE_NORM_FLAG, families.ROUTE_RENORM), name
        assert fam.kind != families.MOE or "router_aux_loss_coef" in fam.moe_defaults, name
        assert all(families.of(t) is fam for t in (name, *fam.composite_types))
    assert families.of("gpt2") is None and families.text_key("qwen3_5") == "text_config"


def test_every_shipped_geometry_is_a_family_of_the_table_and_plans():
    for path in sorted((PACKAGE / "models").glob("*.json")):
        mtype = json.loads(path.read_text())["model_type"]
        assert families.of(mtype) is not None, path.name
        g = ModelGeometry.from_name_or_path(str(path))
        assert g.qk_norm == families.of(mtype).qk_norm, path.name
        assert (g.moe is not None) == (families.of(mtype).kind == families.MOE), path.name
        assert (g.hybrid is not None) == (families.of(mtype).kind == families.HYBRID), path.name


def _family_strings(tree: ast.AST, names: set) -> list:
    """(line, value) of every string constant naming a family, docstrings aside."""
    docs = docstring_ids(tree)
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in names and id(n) not in docs
    ]


def test_no_module_but_the_table_names_a_family():
    names = {t for f in families.FAMILIES.values() for t in (f.model_type, *f.composite_types)}
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "families.py":
            continue
        allowed = OTHER_MEANINGS.get(rel, set())
        hits = _family_strings(ast.parse(path.read_text()), names)
        bad += [f"ds_longctx/{rel}:{line}: {v!r}" for line, v in hits if v not in allowed]
    assert not bad, "family names outside ds_longctx/families.py (ask the table):\n" + "\n".join(
        bad
    )
