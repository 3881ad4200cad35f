"""docs/calibration.md (one section per calibrated constant): every number of a section is the value
of a constant the section names, read with ast from the cited ds_longctx module, or is held by a
committed file the same section cites (`calibration_problems`). The other docs' number rule:
tests/test_docs.py."""

from __future__ import annotations

import ast
import operator
import re
import subprocess
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

from tests.helpers import ROOT
from tests.test_docs import CALIBRATION, TOP, read, repo_path

CAL_NUMBER = re.compile(
    r"(?<![\w.^])([-+±−]?)(\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?)(%?)(?![\w]|\.\d)"
)
FILE_NUMBER = re.compile(r"(?<![\w.])[-+]?(\d+(?:[,_]\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?)")
ASSIGNED = re.compile(r"^([A-Z][A-Z0-9_]*) = (.+)$")
BINOPS = {
    ast.Div: operator.truediv,
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
}


def calibration_numbers(line: str) -> list:
    """The quantities of a prose line (code spans already blanked): decimals, percentages,
    thousands-separated and exponent numbers, with a sign and either end of a range (`1.05-1.15`);
    integers count nothing, names (`Qwen3-0.6B`, `H200`, session ids) hold none."""
    out = []
    for sign, core, pct in CAL_NUMBER.findall(line):
        if pct or "." in core or "e" in core or "," in core:
            out.append(sign.replace("−", "-") + core + pct)
    return out


def quantity(token: str):
    """(|value|, decimals written) of a number as a doc or a file writes it: separators dropped, a %
    read as the number itself, an exponent counted into the decimals."""
    core = token.lstrip("-+±−").rstrip("%").replace(",", "").replace("_", "")
    mantissa, _, exp = core.lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) - int(exp or 0)
    return abs(Decimal(core)), max(decimals, 0)


def held(value: Decimal, decimals: int, numbers: set) -> bool:
    """Whether a file number with as many decimals or more rounds to `value` at the decimals
    written."""
    step, near = Decimal(1).scaleb(-decimals), Decimal(1).scaleb(-decimals) / 2
    return any(
        d >= decimals
        and abs(v - value) <= near
        and value in (v.quantize(step, ROUND_HALF_UP), v.quantize(step, ROUND_HALF_EVEN))
        for v, d in numbers
    )


def file_numbers(path) -> set:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return set()
    return {quantity(m.group(0)) for m in FILE_NUMBER.finditer(text)}


def evaluate(node):
    """The value of a constant expression (literals, tuples, + - * /, a unary minus); a ValueError
    otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(evaluate(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
        return BINOPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise ValueError(ast.dump(node))


def module_constants(path) -> dict:
    """{NAME: the expression node} of a module's top-level `NAME = value` assignments."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            out[node.targets[0].id] = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
        ):
            out[node.target.id] = node.value
    return out


def same_value(written: str, node) -> bool:
    """Whether a doc's `NAME = value` states the code's value; a `...` in a written tuple stands for
    the elements the code has between the written first and last ones."""
    doc = evaluate(ast.parse(written, mode="eval").body)
    code = evaluate(node)
    if isinstance(doc, tuple) and Ellipsis in doc:
        i = doc.index(Ellipsis)
        head, tail = doc[:i], doc[i + 1 :]
        return (
            isinstance(code, tuple)
            and len(code) >= len(head) + len(tail)
            and code[: len(head)] == head
            and (not tail or code[-len(tail) :] == tail)
        )
    return doc == code


def committed_files() -> set:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def cited_files(spans: list, tracked: set, root=ROOT) -> list:
    """The committed files a section's code spans cite: a path, every file under a directory, every
    match of a glob (paths read under `root`: the repository, or a test's tmp tree)."""
    out = []
    for span in spans:
        path = span.split("::")[0].rstrip("/")
        if "<" in path or " " in path:
            continue
        if "*" in path:
            matches = sorted(root.glob(path)) if path.split("/")[0] in TOP else []
        else:
            one = repo_path(span)
            matches = [root / one.relative_to(ROOT)] if one is not None else []
        for m in matches:
            for f in sorted([m] if m.is_file() else m.rglob("*")):
                if f.is_file() and f.relative_to(root).as_posix() in tracked:
                    out.append(f)
    return out


def blank_code(text: str) -> str:
    """`text` without code spans and link targets, each replaced by the newlines it held (line
    numbers kept)."""
    keep = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    return re.sub(
        r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", keep, re.sub(r"<!--.*?-->", keep, text, flags=re.S))
    )


def calibration_problems(text: str, rel: str = CALIBRATION, root=ROOT, tracked=None) -> list:
    """Every number of a calibration page that neither the code nor a cited file holds, each as
    `rel:line: ...` saying how to fix it; and every `NAME = value` span whose NAME its section's
    modules lack or whose value differs. `tracked`: the committed paths under `root` (git's, by
    default)."""
    tracked, problems = committed_files() if tracked is None else tracked, []
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("## ")]
    for a, b in zip([0, *starts], [*starts, len(lines)]):
        section = "\n".join(lines[a:b])
        spans = re.findall(r"`([^`]+)`", section)
        files = cited_files(spans, tracked, root)
        constants = {}
        for f in files:
            if f.suffix == ".py" and f.is_relative_to(root / "ds_longctx"):
                constants.update({k: (f, v) for k, v in module_constants(f).items()})
        named = {
            n for s in spans for n in re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", s) if n in constants
        }
        allowed = set()
        for name in named:
            for node in ast.walk(constants[name][1]):
                if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                    allowed.add(abs(Decimal(repr(node.value))))
            try:
                value = evaluate(constants[name][1])
            except ValueError:
                continue
            if type(value) in (int, float):
                allowed.add(abs(Decimal(repr(value))))
        for span in spans:
            if m := ASSIGNED.match(span):
                name, written = m.groups()
                if name not in constants:
                    problems.append(
                        f"{rel}: `{span}`: no cited ds_longctx module assigns {name}: cite the "
                        "module"
                    )
                elif not same_value(written, constants[name][1]):
                    problems.append(
                        f"{rel}: `{span}`: the code has {name} = "
                        f"{ast.unparse(constants[name][1])}: write the code's value"
                    )
        numbers = set().union(*(file_numbers(f) for f in files)) if files else set()
        for i, line in enumerate(blank_code(section).splitlines(), a + 1):
            for token in calibration_numbers(line):
                value, decimals = quantity(token)
                if value in allowed or held(value, decimals, numbers):
                    continue
                problems.append(
                    f"{rel}:{i}: {token} is neither a constant this section names nor in a file it "
                    "cites "
                    f"({', '.join(f.relative_to(root).as_posix() for f in files[:6]) or 'none'}"
                    f"{', ...' if len(files) > 6 else ''}): cite the committed file that holds it, "
                    f"or write the figures that file holds instead, or drop it"
                )
    return problems


def test_every_calibration_number_is_read_from_the_code_or_a_cited_file():
    problems = calibration_problems(read(CALIBRATION))
    assert not problems, "\n".join(problems)


def test_a_calibration_number_no_cited_file_holds_is_caught(tmp_path):
    """Built in tmp: a module, two committed result files, one uncommitted, and a page of two
    sections. A number its section's files hold passes; a % computed from two of a file's figures, a
    number only another section's file holds, one only an uncommitted file holds, more decimals than
    the file has, and a constant's value the code lacks fail, each with its line and how to fix
    it."""
    (tmp_path / "ds_longctx/plan").mkdir(parents=True)
    (tmp_path / "ds_longctx/plan/planner.py").write_text("PROCESS_HOST_GIB = 2.25\nOTHER = 7.5\n")
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/a.md").write_text(
        "| run | reserved GB | predicted GB |\n| a | 71.53 | 64.0 |\n"
    )
    (tmp_path / "benchmarks/results/b.md").write_text("host 2.214 GiB per rank, 131072 tokens\n")
    (tmp_path / "benchmarks/results/c.md").write_text("3.3\n")
    tracked = {"ds_longctx/plan/planner.py", "benchmarks/results/a.md", "benchmarks/results/b.md"}
    page = (
        "# Calibration\n\n## one\n\n`plan/planner.py`: `PROCESS_HOST_GIB = 2.25`. Reserved 71.5 GB "
        "against\n"
        "64.0 at 131,072 tokens (`benchmarks/results/a.md`, `benchmarks/results/b.md`); 2.21 GiB "
        "host.\n\n## two\n\nThe plan at 64.0 (`benchmarks/results/a.md`).\n"
    )
    assert calibration_problems(page, "x.md", tmp_path, tracked) == []
    # a constant's value where its section does not name the constant is a typed number
    assert calibration_problems(
        page.replace("plan at 64.0", "plan at 2.25"), "x.md", tmp_path, tracked
    )
    bad = {
        # 71.53 / 64.0 - 1: computed, held by no file
        "Reserved 71.5 GB": "Reserved 11.8% more, 71.5 GB",
        # b.md, another section's file: not here
        "## two\n\nThe plan": "## two\n\nThe plan 71.53 and 2.214",
        "2.21 GiB host": "2.21 GiB host, 3.3 s",  # only in c.md, which is not committed
        "64.0 at": "64.00 at",  # more decimals than the file has
        "`PROCESS_HOST_GIB = 2.25`": "`PROCESS_HOST_GIB = 2.5`, `MISSING = 1.5`",
    }
    for before, after in bad.items():
        problems = calibration_problems(page.replace(before, after), "x.md", tmp_path, tracked)
        assert problems and all(p.startswith("x.md") for p in problems), (after, problems)
        assert all(
            "cite the committed file" in p
            or "write the code's value" in p
            or "cite the module" in p
            for p in problems
        ), problems
    lines = calibration_problems(
        page.replace("## two\n\nThe plan", "## two\n\nThe plan 71.53 and 2.214"),
        "x.md",
        tmp_path,
        tracked,
    )
    assert [p.split(": ")[0:2] for p in lines] == [
        [
            "x.md:10",
            "2.214 is neither a constant this section names nor "
            "in a file it cites (benchmarks/results/a.md)",
        ]
    ]
    assert (
        len(
            calibration_problems(
                page.replace(
                    "`PROCESS_HOST_GIB = 2.25`", "`PROCESS_HOST_GIB = 2.5`, `MISSING = 1.5`"
                ),
                "x.md",
                tmp_path,
                tracked,
            )
        )
        == 2
    )
    assert calibration_numbers(
        "1.03-1.06 and -3.4% to +1.6% at 131,072 on Qwen3-0.6B, H200, 2e-5, 36 layers"
    ) == ["1.03", "1.06", "-3.4%", "+1.6%", "131,072", "2e-5"]
    assert held(*quantity("5%"), {quantity("4.98")}) and not held(
        *quantity("5.0%"), {quantity("5")}
    )
