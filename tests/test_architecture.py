"""The package's shape, read from its source with `ast` (nothing imported): layers import only
downward (docs/architecture.md), no import circle, no module over 400 lines, no function over 80."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ds_longctx"
# the floors, lowest first (code_layers.json, beside docs/architecture.md): a module imports its own
# package and the packages on lower floors, nothing beside or above it
FLOORS = json.loads((ROOT / "code_layers.json").read_text())
LAYERS = tuple(
    tuple(name for name, f in FLOORS.items() if f == floor)
    for floor in sorted(set(FLOORS.values()))
)
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
    """(line, dotted module) of every ds_longctx import in `path`, at module level or inside a
    function; `from X import y` counts as X.y where y is a module."""
    here = dotted(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                out.append(
                    (
                        node.lineno,
                        f"{base}.{a.name}" if is_module(f"{base}.{a.name}", root) else base,
                    )
                )
    return [
        (line, name) for line, name in out if name == "ds_longctx" or name.startswith("ds_longctx.")
    ]


def layer(name: str) -> str | None:
    """The layer of a dotted module (its first name under ds_longctx), None for the root package."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(root: Path = ROOT) -> list[str]:
    """One line per import of the package under `root` that does not run down the layers: file,
    line, both layers."""
    bad = []
    order = " -> ".join("/".join(names) for names in LAYERS)
    for path in modules(root):
        src = layer(dotted(path, root))
        for line, target in imported(path, root):
            dst = layer(target)
            if dst is None or dst == src:
                continue
            if src not in RANK or dst not in RANK:
                bad.append(
                    f"{path.relative_to(root)}:{line}: {src} or {dst} has no layer in LAYERS "
                    f"({order})"
                )
            elif RANK[dst] >= RANK[src]:
                where = "above" if RANK[dst] > RANK[src] else "beside"
                bad.append(
                    f"{path.relative_to(root)}:{line}: imports {target}: layer {src} imports layer "
                    f"{dst}, {where} it (layers, lowest first: {order})"
                )
    return bad


def test_every_layer_imports_only_the_layers_below_it():
    bad = upward_imports()
    assert not bad, "imports that do not run down the layers:\n" + "\n".join(bad)


def test_every_module_and_package_has_a_layer():
    top = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in modules()} - {"__init__"}
    assert top <= set(RANK), f"not in tests/test_architecture.py LAYERS: {sorted(top - set(RANK))}"


def test_the_check_finds_an_upward_import_inside_a_function(tmp_path):
    """The check itself: an import of run/ inside a function of parallel/ is reported with its file,
    line and both layers (a copy of the package with one function added)."""
    import shutil

    shutil.copytree(PACKAGE, tmp_path / "ds_longctx", ignore=shutil.ignore_patterns("__pycache__"))
    victim = tmp_path / "ds_longctx" / "parallel" / "sharding.py"
    victim.write_text(
        victim.read_text() + "\n\ndef _late():\n    from ds_longctx.run import engine\n"
    )
    line = victim.read_text().count("\n")
    assert upward_imports(tmp_path) == [
        f"ds_longctx/parallel/sharding.py:{line}: imports ds_longctx.run.engine: layer parallel "
        "imports layer run, "
        "above it (layers, lowest first: families -> parallel -> levers/data -> config/corpora -> "
        "plan -> "
        f"checkpoint -> run -> integrations/rehearsal -> cli/train/eval/generate)"
    ]


def import_circles(root: Path = ROOT) -> list[str]:
    """One line per import circle of the package under `root` (module-level and function-level
    imports alike), each named by its modules in import order with the line of every import in it,
    e.g. `a (a.py:3) -> b (b.py:9) -> a`."""
    edges: dict = {}
    for path in modules(root):
        here = dotted(path, root)
        for line, target in imported(path, root):
            if target != here and is_module(target, root):
                edges.setdefault(here, {}).setdefault(target, (path.relative_to(root), line))
    circles, seen, done = [], set(), set()

    def visit(node: str, trail: list) -> None:
        if node in trail:
            loop = trail[trail.index(node) :] + [node]
            key = frozenset(loop)
            if key not in seen:
                seen.add(key)
                circles.append(
                    " -> ".join(
                        f"{a} ({edges[a][b][0]}:{edges[a][b][1]})" for a, b in zip(loop, loop[1:])
                    )
                    + f" -> {node}"
                )
            return
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, trail + [node])
        done.add(node)

    for start in sorted(edges):
        visit(start, [])
    return circles


def test_no_import_circle():
    circles = import_circles()
    assert not circles, (
        "import circles (move what both sides need into a module below them):\n"
        + "\n".join(circles)
    )


def test_the_check_names_an_import_circle_made_inside_a_function(tmp_path):
    """The check itself: units.py importing disk.py inside a function (disk imports units at its
    top) is named, with both lines (a copy of the package with one function added)."""
    import shutil

    shutil.copytree(PACKAGE, tmp_path / "ds_longctx", ignore=shutil.ignore_patterns("__pycache__"))
    victim = tmp_path / "ds_longctx" / "parallel" / "units.py"
    victim.write_text(
        victim.read_text() + "\n\ndef _late():\n    from ds_longctx.parallel import disk\n"
    )
    line = victim.read_text().count("\n")
    disk = tmp_path / "ds_longctx" / "parallel" / "disk.py"
    top = next(
        i
        for i, t in enumerate(disk.read_text().splitlines(), 1)
        if t.startswith("from ds_longctx.parallel.units")
    )
    assert import_circles(tmp_path) == [
        f"ds_longctx.parallel.disk (ds_longctx/parallel/disk.py:{top}) -> "
        "ds_longctx.parallel.units "
        f"(ds_longctx/parallel/units.py:{line}) -> ds_longctx.parallel.disk"
    ]


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines (split along a seam a reader would name): {long}"
    )


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_over_80_lines(path):
    functions = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    long = [
        f"{n.name} (line {n.lineno}): {n.end_lineno - n.lineno + 1} lines"
        for n in functions
        if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


# names that several modules define on purpose, each read with its module's name
SHARED_NAMES = {
    "main": "each command module's entry point",
    "parser": "each command's argument parser",
    "start": "fake_world.start / memory_snapshot.start",
    "stop": "fake_world.stop / memory_snapshot.stop",
    "load": "resume.load (a run's checkpoint) / files.load (one file)",
}


def test_a_public_function_or_class_name_is_defined_once():
    """One name, one thing: a public function or class of the package is defined at one module's top
    level."""
    where: dict = {}
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and not node.name.startswith("_")
                and node.name not in SHARED_NAMES
            ):
                where.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"names defined in several modules (give each thing its own name): {twice}"


# ----------------------------------------------------------------------------- the rule, not its
# history
DATE = re.compile(r"\b20\d\d-\d\d-\d\d")
SESSION = re.compile(
    r"session[_ ]?(?:20\d\d|h\d{3}x)|\b\d{8}T\d{4}\b|\b(?:GPU|device) session\b", re.I
)
DOTTED = re.compile(r"\bds_longctx(?:\.\w+)+")
REPO_PATH = re.compile(
    r"\b((?:parallel|levers|data|config|plan|checkpoint|run|rehearsal|integrations|tests|benchmarks|"
    r"launch|notebooks|docs|ds_longctx|ds_configs)/[\w./-]*\.(?:py|md|sh|ipynb|yaml|json|jsonl))(?![\w/])"
)
CALIBRATION = re.compile(r"docs/calibration\.md#([\w-]+)")


def docstring_ids(tree: ast.AST) -> set:
    """id() of every docstring constant (module, class, function) in `tree`."""
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def prose(path: Path):
    """(line, kind, text) of every comment, docstring and other string constant (a note a user
    reads) of a module."""
    src = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], "comment", tok.string
    tree = ast.parse(src)
    docs = docstring_ids(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n.lineno, "docstring" if id(n) in docs else "string", n.value


def top_level_names(module: Path) -> set:
    names = set()
    for n in ast.parse(module.read_text()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def dotted_problem(name: str, root: Path = ROOT) -> str | None:
    """Why dotted `name` (ds_longctx.x.y) names nothing in the source tree, or None."""
    parts = name.split(".")
    i = max(k for k in range(1, len(parts) + 1) if is_module(".".join(parts[:k]), root))
    if i == len(parts):
        return None
    p = root.joinpath(*parts[:i])
    module = p / "__init__.py" if p.is_dir() else p.with_suffix(".py")
    if parts[i] in top_level_names(module):
        return None
    return f"{'.'.join(parts[:i])} has no module or name {parts[i]!r}"


def history_notes(root: Path = ROOT) -> list[str]:
    """One line per comment, docstring or note of the package that names a date or a session, a
    dotted ds_longctx path or a repository file that does not exist, or a docs/calibration.md anchor
    it lacks."""
    anchors = (
        set(re.findall(r"^## (\S+)$", (root / "docs" / "calibration.md").read_text(), re.M))
        if (root / "docs" / "calibration.md").is_file()
        else set()
    )
    bad = []
    for path in modules(root):
        where = path.relative_to(root)
        for line, kind, text in prose(path):
            for what, rx in (("a date", DATE), ("a session", SESSION)):
                if m := rx.search(text):
                    bad.append(
                        f"{where}:{line}: a {kind} names {what} ({m.group(0)!r}); state the rule "
                        f"and cite docs/calibration.md#<anchor>"
                    )
            if kind != "string":
                bad += [
                    f"{where}:{line}: a {kind} names {m.group(0)}: {why}"
                    for m in DOTTED.finditer(text)
                    if (why := dotted_problem(m.group(0), root))
                ]
            bad += [
                f"{where}:{line}: a {kind} names {m.group(1)}, which does not exist"
                for m in REPO_PATH.finditer(text)
                if not any((base / m.group(1)).exists() for base in (root, root / "ds_longctx"))
            ]
            bad += [
                f"{where}:{line}: a {kind} cites docs/calibration.md#{m.group(1)}, which has no "
                "such section"
                for m in CALIBRATION.finditer(text)
                if m.group(1) not in anchors
            ]
    return bad


def test_docstrings_comments_and_notes_state_the_rule_not_its_history():
    bad = history_notes()
    assert not bad, "\n".join(bad)


def test_the_history_check_finds_a_date_a_session_a_missing_module_and_a_missing_anchor(tmp_path):
    """The check itself, on a copy of the package with one offending line of each kind."""
    import shutil

    shutil.copytree(PACKAGE, tmp_path / "ds_longctx", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    victim = tmp_path / "ds_longctx" / "parallel" / "sharding.py"
    victim.write_text(
        victim.read_text() + "\n# measured 2026-11-30 in session_2026-11-30_h200x2-20261130T2256\n"
        "# see ds_longctx.planner.plan_memory and run/gpu_budget.py\n"
        "# calibrated: see docs/calibration.md#no-such-anchor\n"
    )
    got = "\n".join(history_notes(tmp_path))
    for want in (
        "names a date ('2026-11-30')",
        "names a session ('session_2026",
        "names ds_longctx.planner.plan_memory",
        "names run/gpu_budget.py, which does not exist",
        "#no-such-anchor, which has no such section",
    ):
        assert want in got, got
