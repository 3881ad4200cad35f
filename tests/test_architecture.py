"""The package's shape, read from its source with `ast` (nothing imported): layers import only downward
(docs/architecture.md), no module over 400 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ds_longctx"
# lowest first; a module imports its own package and the layers below it, nothing beside or above it
LAYERS = (("parallel",), ("levers", "data"), ("config",), ("plan",), ("run",), ("integrations",),
          ("cli", "train", "eval", "generate"))
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def modules(root: Path = ROOT) -> list[Path]:
    return sorted((root / "ds_longctx").rglob("*.py"))


def dotted(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    """Whether dotted `name` is a module or package of the source tree under `root`."""
    p = root.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every ds_longctx import in `path`, at module level or inside a function; `from X
    import y` counts as X.y where y is a module."""
    here = dotted(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                out.append((node.lineno, f"{base}.{a.name}" if is_module(f"{base}.{a.name}", root) else base))
    return [(line, name) for line, name in out if name == "ds_longctx" or name.startswith("ds_longctx.")]


def layer(name: str) -> str | None:
    """The layer of a dotted module (its first name under ds_longctx), None for the root package."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(root: Path = ROOT) -> list[str]:
    """One line per import of the package under `root` that does not run down the layers: file, line, both layers."""
    bad = []
    order = " -> ".join("/".join(names) for names in LAYERS)
    for path in modules(root):
        src = layer(dotted(path, root))
        for line, target in imported(path, root):
            dst = layer(target)
            if dst is None or dst == src:
                continue
            if src not in RANK or dst not in RANK:
                bad.append(f"{path.relative_to(root)}:{line}: {src} or {dst} has no layer in LAYERS ({order})")
            elif RANK[dst] >= RANK[src]:
                where = "above" if RANK[dst] > RANK[src] else "beside"
                bad.append(f"{path.relative_to(root)}:{line}: imports {target}: layer {src} imports layer {dst}, "
                           f"{where} it (layers, lowest first: {order})")
    return bad


def test_every_layer_imports_only_the_layers_below_it():
    bad = upward_imports()
    assert not bad, "imports that do not run down the layers:\n" + "\n".join(bad)


def test_every_module_and_package_has_a_layer():
    top = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in modules()} - {"__init__"}
    assert top <= set(RANK), f"not in tests/test_architecture.py LAYERS: {sorted(top - set(RANK))}"


def test_the_check_finds_an_upward_import_inside_a_function(tmp_path):
    """The check itself: an import of run/ inside a function of parallel/ is reported with its file, line and both
    layers (a copy of the package with one function added)."""
    import shutil
    shutil.copytree(PACKAGE, tmp_path / "ds_longctx", ignore=shutil.ignore_patterns("__pycache__"))
    victim = tmp_path / "ds_longctx" / "parallel" / "sharding.py"
    victim.write_text(victim.read_text() + "\n\ndef _late():\n    from ds_longctx.run import engine\n")
    line = victim.read_text().count("\n")
    assert upward_imports(tmp_path) == [
        f"ds_longctx/parallel/sharding.py:{line}: imports ds_longctx.run.engine: layer parallel imports layer run, "
        f"above it (layers, lowest first: parallel -> levers/data -> config -> plan -> run -> integrations -> "
        f"cli/train/eval/generate)"]


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split along a seam a reader would name): {long}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_over_80_lines(path):
    long = [f"{n.name} (line {n.lineno}): {n.end_lineno - n.lineno + 1} lines"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


# names that several modules define on purpose, each read with its module's name
SHARED_NAMES = {"main": "each command module's entry point", "parser": "each command's argument parser",
                "start": "fake_world.start / memory_snapshot.start", "stop": "fake_world.stop / memory_snapshot.stop",
                "load": "checkpoint.load (a run's checkpoint) / checkpoint_files.load (one file)"}


def test_a_public_function_or_class_name_is_defined_once():
    """One name, one thing: a public function or class of the package is defined at one module's top level."""
    where: dict = {}
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("_") and node.name not in SHARED_NAMES:
                where.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"names defined in several modules (give each thing its own name): {twice}"
