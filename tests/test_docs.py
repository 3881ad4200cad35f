"""README.md and docs/*.md say only what the repository can show.

- README: at most 200 lines, in the order what it is (with the generated results table), install, the two set-up
  commands (the test one is .ci/run's, verbatim), the 1M-token recipe (plan, rehearse, launch), links.
- Numbers: outside the generated blocks (`<!-- results:NAME -->`, rewritten and compared by tests/test_results.py),
  code and link targets, a decimal, a percentage or a number with thousands separators is allowed only where it is
  DERIVED from the committed file that holds it. A number typed by hand fails here.
- docs/calibration.md (one section per calibrated constant) instead: every number of a section is the value of a
  constant the section names, read with ast from the cited ds_longctx module, or is held by a committed file the same
  section cites (see `calibration_problems`).
- Every relative link and every repository path in backticks exists (`tests/x.py::name`: the file defines `name`).
- Every `ds-longctx ...` command parses: its subcommand and flag names are the CLI's own argparse options (train and
  eval: also the run config's keys), found by calling `ds_longctx.cli.main` with parsing stopped at the parser.
"""

from __future__ import annotations

import argparse
import ast
import operator
import re
import shlex
import subprocess
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

import pytest

from tests.helpers import ROOT, bench_planner

DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
WRITTEN = [d for d in DOCS if d != "docs/results.md"]  # docs/results.md is generated whole
CALIBRATION = "docs/calibration.md"  # its own rule: every number read from the code or the file its section cites
# pages another open branch writes (issue 30's code part): a link to one must resolve once it exists
ELSEWHERE = {"docs/architecture.md", "docs/calibration.md"}
NUMBER = re.compile(r"(?<![\w.\-/^])±?\d[\d,]*(?:\.\d+)?%?")
PACKAGES = {"config", "parallel", "levers", "plan", "data", "run", "integrations", "models"}  # ds_longctx/<these>/
TOP = {"ds_longctx", "tests", "benchmarks", "docs", "notebooks", "launch", "ds_configs", ".ci"}


def derived() -> dict:
    """{number as the docs write it: where it comes from} for the few rule constants prose may quote."""
    from ds_longctx.plan.planner import MAX_HEADROOM
    bp = bench_planner()
    return {f"{MAX_HEADROOM:g}": "ds_longctx/plan/planner.py MAX_HEADROOM",
            f"±{bp.GPU_TOL:.0%}": "benchmarks/bench_planner.py GPU_TOL", f"±{bp.HOST_TOL:.0%}": "HOST_TOL"}


def prose(text: str) -> str:
    """`text` without generated blocks, fenced code, code spans, link targets and HTML comments."""
    text = re.sub(r"<!-- results:(\w+) -->.*?<!-- /results:\1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"<!--.*?-->", "", re.sub(r"\]\([^)]*\)", "]", text), flags=re.S)


def claimed(text: str) -> list:
    """The numbers of `text` that state a quantity: decimals, percentages, thousands-separated numbers."""
    out = []
    for tok in NUMBER.findall(text):
        core = tok.lstrip("±").rstrip("%")
        if tok.endswith("%") or "." in core or re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", core):
            out.append(tok)
    return out


def read(rel: str) -> str:
    return (ROOT / rel).read_text()


def test_readme_is_short_and_in_order():
    text = read("README.md")
    assert len(text.splitlines()) <= 200
    heads = [h for h in re.findall(r"^## (.+)$", text, re.M)]
    order = [text.index(s) for s in ("<!-- results:readme -->", "## Install", "## The two commands",
                                     "## A million tokens", "**1. Plan**", "**2. Rehearse**", "**3. Launch**",
                                     "## Documentation")]
    assert order == sorted(order), heads
    assert text.index("<!-- results:readme -->") < text.index("\n## ")  # the table is in the opening section
    assert 'pip install -e ".[gpu]"' in text


def test_the_two_set_up_commands_and_ci_run_the_same_line():
    blocks = re.findall(r"```bash\n(.*?)```", read("README.md"), re.S)
    one_line = [b.strip() for b in blocks if b.strip().startswith("python3 -m venv") and "\n" not in b.strip()]
    demo = [b for b in one_line if b.endswith("ds-longctx demo")]
    tests = [b for b in one_line if "pytest" in b]
    assert len(demo) == 1 and len(tests) == 1, one_line
    ci = [ln for ln in read(".ci/run").splitlines() if ln.startswith("python3 -m venv")]
    assert ci == tests, (ci, tests)


def test_the_gpu_extra_pins_flash_attention_4_and_liger():
    import tomllib
    gpu = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]["gpu"]
    pins = {re.split(r"[\[=]", p)[0]: p for p in gpu}
    assert "==" in pins["flash-attn-4"] and "==" in pins["liger-kernel"], gpu


@pytest.mark.parametrize("rel", [d for d in WRITTEN if d != CALIBRATION])
def test_every_number_outside_the_generated_blocks_is_derived(rel):
    ok = derived()
    hand = [(i, n) for i, line in enumerate(prose(read(rel)).splitlines(), 1) for n in claimed(line) if n not in ok]
    assert not hand, (f"{rel}: numbers typed by hand {hand}: quote measurements through a generated block "
                      f"(<!-- results:NAME -->, benchmarks/results_tables.py) or derive them here (DERIVED)")


def test_a_number_typed_into_prose_is_caught():
    text = read("README.md").replace("## Install\n", "## Install\n\nA step takes 21.9 s, 4% faster, at 131,072.\n")
    assert claimed(prose(text)) == ["21.9", "4%", "131,072"]
    assert claimed(prose("<!-- results:readme -->\n21.9 s\n<!-- /results:readme -->\n`1.5` ```\n2.5\n```")) == []


# docs/calibration.md: each `## anchor` section names constants and cites committed files; its numbers come from them.
CAL_NUMBER = re.compile(r"(?<![\w.^])([-+±−]?)(\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?)(%?)(?![\w]|\.\d)")
FILE_NUMBER = re.compile(r"(?<![\w.])[-+]?(\d+(?:[,_]\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?)")
ASSIGNED = re.compile(r"^([A-Z][A-Z0-9_]*) = (.+)$")
BINOPS = {ast.Div: operator.truediv, ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def calibration_numbers(line: str) -> list:
    """The quantities of a prose line (code spans already blanked): decimals, percentages, thousands-separated and
    exponent numbers, with a sign and either end of a range (`1.05-1.15`); integers count nothing, names (`Qwen3-0.6B`,
    `H200`, session ids) hold none."""
    out = []
    for sign, core, pct in CAL_NUMBER.findall(line):
        if pct or "." in core or "e" in core or "," in core:
            out.append(sign.replace("−", "-") + core + pct)
    return out


def quantity(token: str):
    """(|value|, decimals written) of a number as a doc or a file writes it: separators dropped, a % read as the number
    itself, an exponent counted into the decimals."""
    core = token.lstrip("-+±−").rstrip("%").replace(",", "").replace("_", "")
    mantissa, _, exp = core.lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) - int(exp or 0)
    return abs(Decimal(core)), max(decimals, 0)


def held(value: Decimal, decimals: int, numbers: set) -> bool:
    """Whether a file number with as many decimals or more rounds to `value` at the decimals written."""
    step, near = Decimal(1).scaleb(-decimals), Decimal(1).scaleb(-decimals) / 2
    return any(d >= decimals and abs(v - value) <= near and value in (
        v.quantize(step, ROUND_HALF_UP), v.quantize(step, ROUND_HALF_EVEN)) for v, d in numbers)


def file_numbers(path) -> set:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return set()
    return {quantity(m.group(0)) for m in FILE_NUMBER.finditer(text)}


def evaluate(node):
    """The value of a constant expression (literals, tuples, + - * /, a unary minus); a ValueError otherwise."""
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
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def same_value(written: str, node) -> bool:
    """Whether a doc's `NAME = value` states the code's value; a `...` in a written tuple stands for the elements the
    code has between the written first and last ones."""
    doc = evaluate(ast.parse(written, mode="eval").body)
    code = evaluate(node)
    if isinstance(doc, tuple) and Ellipsis in doc:
        i = doc.index(Ellipsis)
        head, tail = doc[:i], doc[i + 1:]
        return isinstance(code, tuple) and len(code) >= len(head) + len(tail) and code[:len(head)] == head and (
            not tail or code[-len(tail):] == tail)
    return doc == code


def committed_files() -> set:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def cited_files(spans: list, tracked: set, root=ROOT) -> list:
    """The committed files a section's code spans cite: a path, every file under a directory, every match of a glob
    (paths read under `root`: the repository, or a test's tmp tree)."""
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
    """`text` without code spans and link targets, each replaced by the newlines it held (line numbers kept)."""
    keep = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", keep, re.sub(r"<!--.*?-->", keep, text, flags=re.S)))


def calibration_problems(text: str, rel: str = CALIBRATION, root=ROOT, tracked=None) -> list:
    """Every number of a calibration page that neither the code nor a cited file holds, each as `rel:line: ...`
    saying how to fix it; and every `NAME = value` span whose NAME its section's modules lack or whose value differs.
    `tracked`: the committed paths under `root` (git's, by default)."""
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
        named = {n for s in spans for n in re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", s) if n in constants}
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
                    problems.append(f"{rel}: `{span}`: no cited ds_longctx module assigns {name}: cite the module")
                elif not same_value(written, constants[name][1]):
                    problems.append(f"{rel}: `{span}`: the code has {name} = "
                                    f"{ast.unparse(constants[name][1])}: write the code's value")
        numbers = set().union(*(file_numbers(f) for f in files)) if files else set()
        for i, line in enumerate(blank_code(section).splitlines(), a + 1):
            for token in calibration_numbers(line):
                value, decimals = quantity(token)
                if value in allowed or held(value, decimals, numbers):
                    continue
                problems.append(
                    f"{rel}:{i}: {token} is neither a constant this section names nor in a file it cites "
                    f"({', '.join(f.relative_to(root).as_posix() for f in files[:6]) or 'none'}"
                    f"{', ...' if len(files) > 6 else ''}): cite the committed file that holds it, or write the "
                    f"figures that file holds instead, or drop it")
    return problems


def test_every_calibration_number_is_read_from_the_code_or_a_cited_file():
    problems = calibration_problems(read(CALIBRATION))
    assert not problems, "\n".join(problems)


def test_a_calibration_number_no_cited_file_holds_is_caught(tmp_path):
    """Built in tmp: a module, two committed result files, one uncommitted, and a page of two sections. A number its
    section's files hold passes; a % computed from two of a file's figures, a number only another section's file holds,
    one only an uncommitted file holds, more decimals than the file has, and a constant's value the code lacks fail,
    each with its line and how to fix it."""
    (tmp_path / "ds_longctx/plan").mkdir(parents=True)
    (tmp_path / "ds_longctx/plan/planner.py").write_text("PROCESS_HOST_GIB = 2.25\nOTHER = 7.5\n")
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/a.md").write_text("| run | reserved GB | predicted GB |\n| a | 71.53 | 64.0 |\n")
    (tmp_path / "benchmarks/results/b.md").write_text("host 2.214 GiB per rank, 131072 tokens\n")
    (tmp_path / "benchmarks/results/c.md").write_text("3.3\n")
    tracked = {"ds_longctx/plan/planner.py", "benchmarks/results/a.md", "benchmarks/results/b.md"}
    page = ("# Calibration\n\n## one\n\n`plan/planner.py`: `PROCESS_HOST_GIB = 2.25`. Reserved 71.5 GB against\n"
            "64.0 at 131,072 tokens (`benchmarks/results/a.md`, `benchmarks/results/b.md`); 2.21 GiB host.\n\n"
            "## two\n\nThe plan at 64.0 (`benchmarks/results/a.md`).\n")
    assert calibration_problems(page, "x.md", tmp_path, tracked) == []
    # a constant's value where its section does not name the constant is a typed number
    assert calibration_problems(page.replace("plan at 64.0", "plan at 2.25"), "x.md", tmp_path, tracked)
    bad = {"Reserved 71.5 GB": "Reserved 11.8% more, 71.5 GB",  # 71.53 / 64.0 - 1: computed, held by no file
           "## two\n\nThe plan": "## two\n\nThe plan 71.53 and 2.214",  # b.md, another section's file: not here
           "2.21 GiB host": "2.21 GiB host, 3.3 s",  # only in c.md, which is not committed
           "64.0 at": "64.00 at",  # more decimals than the file has
           "`PROCESS_HOST_GIB = 2.25`": "`PROCESS_HOST_GIB = 2.5`, `MISSING = 1.5`"}
    for before, after in bad.items():
        problems = calibration_problems(page.replace(before, after), "x.md", tmp_path, tracked)
        assert problems and all(p.startswith("x.md") for p in problems), (after, problems)
        assert all("cite the committed file" in p or "write the code's value" in p or "cite the module" in p
                   for p in problems), problems
    lines = calibration_problems(page.replace("## two\n\nThe plan", "## two\n\nThe plan 71.53 and 2.214"), "x.md",
                                 tmp_path, tracked)
    assert [p.split(": ")[0:2] for p in lines] == [["x.md:10", "2.214 is neither a constant this section names nor "
                                                                  "in a file it cites (benchmarks/results/a.md)"]]
    assert len(calibration_problems(page.replace("`PROCESS_HOST_GIB = 2.25`", "`PROCESS_HOST_GIB = 2.5`, "
                                                 "`MISSING = 1.5`"), "x.md", tmp_path, tracked)) == 2
    assert calibration_numbers("1.03-1.06 and -3.4% to +1.6% at 131,072 on Qwen3-0.6B, H200, 2e-5, 36 layers") == [
        "1.03", "1.06", "-3.4%", "+1.6%", "131,072", "2e-5"]
    assert held(*quantity("5%"), {quantity("4.98")}) and not held(*quantity("5.0%"), {quantity("5")})

def links_and_paths(rel: str) -> list:
    text = read(rel)
    code = re.sub(r"```.*?```", "", text, flags=re.S)
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", code) if not re.match(r"\w+:", t)]
    spans = re.findall(r"`([^`\s]+)`", code)
    return [("link", (ROOT / rel).parent / t) for t in links if t] + [("span", s) for s in spans]


def repo_path(span: str):
    """The repository path a code span names, or None: it starts with a top-level directory (or is a file at the root),
    or with a ds_longctx subpackage (`run/train.py`); `<placeholders>` and globs name no one file."""
    path = span.split("::")[0].rstrip("/")
    first = path.split("/")[0]
    if "<" in path or "*" in path:
        return None
    if path in ("pyproject.toml", "README.md") or "/" in path and first in TOP:
        return ROOT / path
    return ROOT / "ds_longctx" / path if "/" in path and first in PACKAGES else None


@pytest.mark.parametrize("rel", DOCS)
def test_links_and_paths_exist(rel):
    missing = []
    for kind, item in links_and_paths(rel):
        if kind == "link":
            if not item.resolve().exists() and item.resolve().relative_to(ROOT).as_posix() not in ELSEWHERE:
                missing.append(str(item))
            continue
        path = repo_path(item)
        if path is None:
            continue
        if not path.exists():
            missing.append(item)
        elif "::" in item:
            name = item.split("::")[1].split("[")[0]
            if not re.search(rf"def {re.escape(name)}\b", path.read_text()):
                missing.append(item)
    assert not missing, f"{rel} names what does not exist: {missing}"


class Parsed(Exception):
    """Raised in place of parsing: carries the parser a subcommand would parse its arguments with."""

    def __init__(self, parser):
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(sub: str, monkeypatch) -> argparse.ArgumentParser:
    """The argparse parser `ds-longctx SUB ...` parses with (the CLI's own, caught before it parses anything)."""
    from ds_longctx import cli

    def stop(self, *a, **k):
        raise Parsed(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", stop)
    try:
        cli.main([sub])
    except Parsed as p:
        parser = p.parser
    else:
        raise AssertionError(f"ds-longctx {sub} parsed nothing")
    monkeypatch.undo()
    return parser


def commands(rel: str) -> list:
    """Every `ds-longctx ...` command of a page: fenced lines (joined at a trailing backslash, a `# comment` cut) and
    code spans."""
    text = read(rel)
    out = [s for s in re.findall(r"`(ds-longctx [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line).strip()
            if "ds-longctx " in line:
                out.append(line[line.index("ds-longctx "):].split(" && ")[0].split(" | ")[0])
    return out


def check_command(cmd: str, parsers: dict) -> list:
    """What of `cmd` the CLI does not know: its subcommand, a nested subcommand, or a flag."""
    from ds_longctx.config.run import DOTTED, FLAT
    words = [w.strip("[]") for w in shlex.split(cmd)[1:] if w not in ("...", "[--key", "value", "...]")]
    if not words or words[0] not in parsers:
        return [f"subcommand {words[:1]}"]
    parser, sub = parsers[words[0]], words[0]
    if sub in ("train", "demo"):  # the top parser; its subparser holds their options
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[sub]
    for w in words[1:]:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if nested and w in nested[0].choices:
            parser = nested[0].choices[w]
    bad = []
    for w in words[1:]:
        flag = w.split("=")[0]
        if not flag.startswith("--") or flag == "--key":
            continue
        key = flag[2:].replace("-", "_")
        known = flag in parser._option_string_actions
        config = sub in ("train", "eval") and key in {*FLAT, *DOTTED, "config"}
        if not (known or config):
            bad.append(flag)
    return bad


def test_every_ds_longctx_command_parses(monkeypatch):
    parsers = {sub: parser_of(sub, monkeypatch)
               for sub in ("train", "demo", "plan", "rehearse", "data", "export", "checkpoint", "eval")}
    found, bad = 0, []
    for rel in DOCS:
        for cmd in commands(rel):
            found += 1
            if problems := check_command(cmd, parsers):
                bad.append((rel, cmd, problems))
    assert found >= 20 and not bad, bad
    assert check_command("ds-longctx plan --gpus 8 --gpu_mem 80", parsers) == ["--gpu_mem"]  # no abbreviations
    assert check_command("ds-longctx train --nproc 2 --seqlen 9", parsers) == ["--seqlen"]
    assert check_command("ds-longctx lint", parsers) == ["subcommand ['lint']"]


def test_every_flag_the_prose_names_is_an_option(monkeypatch):
    """A code span that starts with `--` (`--skip_bad_rows true`) names an option of some subcommand or a run-config
    key."""
    from ds_longctx.config.run import DOTTED, FLAT
    known = {f"--{k}" for k in (*FLAT, *DOTTED, "config")}
    todo = [parser_of(sub, monkeypatch) for sub in ("train", "plan", "rehearse", "data", "export", "checkpoint",
                                                     "eval")]
    while todo:
        p = todo.pop()
        known |= set(p._option_string_actions)
        todo += [c for a in p._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices.values()]
    spans = [(rel, s.split()[0].split("=")[0]) for rel in WRITTEN
             for s in re.findall(r"`(--[\w.-]+[^`]*)`", re.sub(r"```.*?```", "", read(rel), flags=re.S))]
    assert len(spans) >= 20 and [(r, s) for r, s in spans if s not in known and s != "--key"] == []


def test_docs_are_tracked_or_generated():
    """Every page the README links to is committed (a page only on this machine is no documentation)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    linked = re.findall(r"\]\((docs/[^)#]+)\)", read("README.md"))
    assert [p for p in linked if p not in tracked and p not in ELSEWHERE] == []
