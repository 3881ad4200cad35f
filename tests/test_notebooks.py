"""The notebooks (notebooks/*.ipynb) execute top to bottom on CPU, from the committed result files,
and say what they print.

- Each one runs without an error, and the text each code cell prints is the text committed with it:
  a result file that changed without the notebook being run again fails here (re-run it: `jupyter
  nbconvert --to notebook --execute --inplace notebooks/NAME.ipynb`).
- Its prose quotes its output: a `code span` in a markdown cell that holds a decimal, a percentage
  or "N of M" (and no "/": not a path) is a quote, and must appear verbatim in what that notebook
  prints.
- What its prose names exists: a `ds_longctx.…` name resolves (module, then attributes), and a
  repository path (a span with a "/", no spaces, no wildcard) is a tracked file or directory.

The figures the notebooks save (notebooks/*.png) are put back as they were after each run.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
QUOTE = re.compile(
    r"\d\.\d|\d%|\d of \d"
)  # a decimal, a percentage or "N of M": a number the notebook measured
_runs: dict = {}


def executed(name: str):
    """(committed, executed) notebook `name`, run once per session in notebooks/ with the python3
    kernel."""
    if name not in _runs:
        path = ROOT / "notebooks" / f"{name}.ipynb"
        committed = nbformat.read(path, as_version=4)
        fresh = nbformat.read(path, as_version=4)
        figures = {p: p.read_bytes() for p in (ROOT / "notebooks").glob("*.png")}
        try:
            NotebookClient(
                fresh,
                timeout=600,
                kernel_name="python3",
                resources={"metadata": {"path": str(ROOT / "notebooks")}},
            ).execute()
        finally:
            for p, data in figures.items():
                p.write_bytes(data)
        _runs[name] = committed, fresh
    return _runs[name]


def printed(cell) -> str:
    """The text a code cell printed (stdout / stderr streams and plain-text results; figures left
    out)."""
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "execute_result" and "text/plain" in o.data:
            out.append(o.data["text/plain"])
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
    return "".join(out)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent that is a module, not a package
        return False


def spans(nb) -> list[str]:
    """The `code spans` of the markdown cells, a line break inside one read as a space (as markdown
    renders it)."""
    return [
        " ".join(s.split())
        for c in nb.cells
        if c.cell_type == "markdown"
        for s in re.findall(r"`([^`]+)`", c.source)
    ]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_prints_what_is_committed(name):
    committed, fresh = executed(name)
    assert fresh.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{name}: no python3 kernelspec"
    )
    code = [(a, b) for a, b in zip(committed.cells, fresh.cells) if a.cell_type == "code"]
    assert code and all(b.get("execution_count") for _, b in code)
    for i, (was, now) in enumerate(code):
        assert not [o for o in now.outputs if o.output_type == "error"], printed(now)
        assert printed(now) == printed(was), (
            f"{name}.ipynb code cell {i} prints otherwise than committed; re-run it: jupyter "
            "nbconvert --to notebook "
            f"--execute --inplace notebooks/{name}.ipynb\n--- committed:\n{printed(was)}\n--- "
            f"now:\n{printed(now)}"
        )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_prose_quotes_its_output(name):
    _, fresh = executed(name)
    text = "".join(printed(c) for c in fresh.cells if c.cell_type == "code")
    quotes = [s for s in spans(fresh) if QUOTE.search(s) and "/" not in s]
    missing = [q for q in quotes if q not in text]
    assert not missing, f"{name}.ipynb quotes what it does not print: {missing}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_names_what_exists(name):
    _, fresh = executed(name)
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for span in spans(fresh):
        if re.fullmatch(r"ds_longctx(\.\w+)+", span):
            parts = span.split(".")
            mod = next(i for i in range(len(parts), 0, -1) if _is_module(".".join(parts[:i])))
            obj = importlib.import_module(".".join(parts[:mod]))
            for attr in parts[mod:]:
                assert hasattr(obj, attr), f"{name}.ipynb names {span}: {attr} is not in {obj}"
                obj = getattr(obj, attr)
        elif "/" in span and not re.search(r"[\s*]", span):
            path = span.rstrip("/")
            assert any(f == path or f.startswith(path + "/") for f in tracked), (
                f"{name}.ipynb names {span}"
            )
