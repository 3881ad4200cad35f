"""README.md and docs/*.md say only what the repository can show.

- README: at most 200 lines, in the order what it is (with the generated results table), install,
  the two set-up commands (the test one is .ci/run's, verbatim), the 1M-token recipe (plan,
  rehearse, launch), links.
- Numbers: outside the generated blocks (`<!-- results:NAME -->`, rewritten and compared by
  tests/test_results.py), code and link targets, a decimal, a percentage or a number with thousands
  separators is allowed only where it is DERIVED from the committed file that holds it. A number
  typed by hand fails here.
- docs/calibration.md has its own number rule (tests/test_docs_calibration.py).
- Every relative link and every repository path in backticks exists (`tests/x.py::name`: the file
  defines `name`).
- Every `ds-longctx ...` command parses: its subcommand and flag names are the CLI's own argparse
  options (train and eval: also the run config's keys), found by calling `ds_longctx.cli.main` with
  parsing stopped at the parser.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess

import pytest

from tests.helpers import ROOT, bench_planner

DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
WRITTEN = [d for d in DOCS if d != "docs/results.md"]  # docs/results.md is generated whole
# its own rule: every number read from the code or the file its section cites
CALIBRATION = "docs/calibration.md"
# pages another open branch writes (issue 30's code part): a link to one must resolve once it exists
ELSEWHERE = {"docs/architecture.md", "docs/calibration.md"}
NUMBER = re.compile(r"(?<![\w.\-/^])±?\d[\d,]*(?:\.\d+)?%?")
PACKAGES = {
    "config",
    "parallel",
    "levers",
    "plan",
    "data",
    "run",
    "integrations",
    "models",
}  # ds_longctx/<these>/
TOP = {"ds_longctx", "tests", "benchmarks", "docs", "notebooks", "launch", "ds_configs", ".ci"}


def derived() -> dict:
    """{number as the docs write it: where it comes from} for the few rule constants prose may
    quote."""
    from ds_longctx.plan.planner import MAX_HEADROOM

    bp = bench_planner()
    return {
        f"{MAX_HEADROOM:g}": "ds_longctx/plan/planner.py MAX_HEADROOM",
        f"±{bp.GPU_TOL:.0%}": "benchmarks/bench_planner.py GPU_TOL",
        f"±{bp.HOST_TOL:.0%}": "HOST_TOL",
    }


def prose(text: str) -> str:
    """`text` without generated blocks, fenced code, code spans, link targets and HTML comments."""
    text = re.sub(r"<!-- results:(\w+) -->.*?<!-- /results:\1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"<!--.*?-->", "", re.sub(r"\]\([^)]*\)", "]", text), flags=re.S)


def claimed(text: str) -> list:
    """The numbers of `text` that state a quantity: decimals, percentages, thousands-separated
    numbers."""
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
    order = [
        text.index(s)
        for s in (
            "<!-- results:readme -->",
            "## Install",
            "## The two commands",
            "## A million tokens",
            "**1. Plan**",
            "**2. Rehearse**",
            "**3. Launch**",
            "## Documentation",
        )
    ]
    assert order == sorted(order), heads
    assert text.index("<!-- results:readme -->") < text.index(
        "\n## "
    )  # the table is in the opening section
    assert 'pip install -e ".[gpu]"' in text


def test_the_two_set_up_commands_and_ci_run_the_same_line():
    blocks = re.findall(r"```bash\n(.*?)```", read("README.md"), re.S)
    one_line = [
        b.strip()
        for b in blocks
        if b.strip().startswith("python3 -m venv") and "\n" not in b.strip()
    ]
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
    hand = [
        (i, n)
        for i, line in enumerate(prose(read(rel)).splitlines(), 1)
        for n in claimed(line)
        if n not in ok
    ]
    assert not hand, (
        f"{rel}: numbers typed by hand {hand}: quote measurements through a generated block "
        f"(<!-- results:NAME -->, benchmarks/results_tables.py) or derive them here (DERIVED)"
    )


def test_a_number_typed_into_prose_is_caught():
    text = read("README.md").replace(
        "## Install\n", "## Install\n\nA step takes 21.9 s, 4% faster, at 131,072.\n"
    )
    assert claimed(prose(text)) == ["21.9", "4%", "131,072"]
    assert (
        claimed(
            prose("<!-- results:readme -->\n21.9 s\n<!-- /results:readme -->\n`1.5` ```\n2.5\n```")
        )
        == []
    )


def links_and_paths(rel: str) -> list:
    text = read(rel)
    code = re.sub(r"```.*?```", "", text, flags=re.S)
    links = [
        t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", code) if not re.match(r"\w+:", t)
    ]
    spans = re.findall(r"`([^`\s]+)`", code)
    return [("link", (ROOT / rel).parent / t) for t in links if t] + [("span", s) for s in spans]


def repo_path(span: str):
    """The repository path a code span names, or None: it starts with a top-level directory (or is a
    file at the root), or with a ds_longctx subpackage (`run/train.py`); `<placeholders>` and globs
    name no one file."""
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
            if (
                not item.resolve().exists()
                and item.resolve().relative_to(ROOT).as_posix() not in ELSEWHERE
            ):
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
    """Raised in place of parsing: carries the parser a subcommand would parse its arguments
    with."""

    def __init__(self, parser):
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(sub: str, monkeypatch) -> argparse.ArgumentParser:
    """The argparse parser `ds-longctx SUB ...` parses with (the CLI's own, caught before it parses
    anything)."""
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
    """Every `ds-longctx ...` command of a page: fenced lines (joined at a trailing backslash, a `#
    comment` cut) and code spans."""
    text = read(rel)
    out = [
        s for s in re.findall(r"`(ds-longctx [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    ]
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line).strip()
            if "ds-longctx " in line:
                out.append(line[line.index("ds-longctx ") :].split(" && ")[0].split(" | ")[0])
    return out


def check_command(cmd: str, parsers: dict) -> list:
    """What of `cmd` the CLI does not know: its subcommand, a nested subcommand, or a flag."""
    from ds_longctx.config.run import DOTTED, FLAT

    words = [
        w.strip("[]") for w in shlex.split(cmd)[1:] if w not in ("...", "[--key", "value", "...]")
    ]
    if not words or words[0] not in parsers:
        return [f"subcommand {words[:1]}"]
    parser, sub = parsers[words[0]], words[0]
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
    parsers = {
        sub: parser_of(sub, monkeypatch)
        for sub in (
            "train",
            "demo",
            "plan",
            "rehearse",
            "data",
            "export",
            "checkpoint",
            "eval",
            "plot",
            "models",
        )
    }
    found, bad = 0, []
    for rel in DOCS:
        for cmd in commands(rel):
            found += 1
            if problems := check_command(cmd, parsers):
                bad.append((rel, cmd, problems))
    assert found >= 20 and not bad, bad
    assert check_command("ds-longctx plan --gpus 8 --gpu_mem 80", parsers) == [
        "--gpu_mem"
    ]  # no abbreviations
    assert check_command("ds-longctx train --nproc 2 --seqlen 9", parsers) == ["--seqlen"]
    assert check_command("ds-longctx lint", parsers) == ["subcommand ['lint']"]


def test_every_flag_the_prose_names_is_an_option(monkeypatch):
    """A code span that starts with `--` (`--skip_bad_rows true`) names an option of some subcommand
    or a run-config key."""
    from ds_longctx.config.run import DOTTED, FLAT

    known = {f"--{k}" for k in (*FLAT, *DOTTED, "config")}
    todo = [
        parser_of(sub, monkeypatch)
        for sub in (
            "train",
            "plan",
            "rehearse",
            "data",
            "export",
            "checkpoint",
            "eval",
            "plot",
            "models",
        )
    ]
    while todo:
        p = todo.pop()
        known |= set(p._option_string_actions)
        todo += [
            c
            for a in p._actions
            if isinstance(a, argparse._SubParsersAction)
            for c in a.choices.values()
        ]
    spans = [
        (rel, s.split()[0].split("=")[0])
        for rel in WRITTEN
        for s in re.findall(r"`(--[\w.-]+[^`]*)`", re.sub(r"```.*?```", "", read(rel), flags=re.S))
    ]
    assert len(spans) >= 20 and [(r, s) for r, s in spans if s not in known and s != "--key"] == []


def test_docs_are_tracked_or_generated():
    """Every page the README links to is committed (a page only on this machine is no
    documentation)."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    linked = re.findall(r"\]\((docs/[^)#]+)\)", read("README.md"))
    assert [p for p in linked if p not in tracked and p not in ELSEWHERE] == []
