"""A tokenizer directory runs no code: every `from_pretrained` of a user's directory passes
trust_remote_code=False (data/tokenize.open_tokenizer for tokenizers), so one whose
tokenizer_config.json has `auto_map` is refused in one line, without transformers' "run the custom
code? [y/N]" prompt, even on a terminal."""

import ast
import json
import os
import pty
import select
import sys
import time

from tests.corpus import make_tokenizer
from tests.helpers import ROOT, cpu_env


def test_every_auto_class_from_pretrained_in_the_package_passes_trust_remote_code_false():
    calls = []
    for path in sorted((ROOT / "ds_longctx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id.startswith("Auto")
            ):
                kw = {k.arg: k.value for k in node.keywords}
                ok = (
                    isinstance(kw.get("trust_remote_code"), ast.Constant)
                    and kw["trust_remote_code"].value is False
                )
                calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", ok))
    assert len(calls) >= 3 and all(ok for _, ok in calls), calls


def test_a_tokenizer_with_auto_map_is_refused_on_a_terminal_without_a_prompt(tmp_path):
    """The load every command makes (open_tokenizer), on a pseudo-terminal, of a tokenizer asking
    for its own class (evil.py): refused in one line, no prompt, evil.py never imported. (Which
    commands load through it: the ast test above and data/tokenize.load_tokenizer's callers.)"""
    tok = make_tokenizer(tmp_path / "tok")
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    config.pop("tokenizer_class", None)
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    (tok / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    code = (
        "import sys\nfrom ds_longctx.data.tokenize import open_tokenizer\ntry:\n"
        f"    open_tokenizer({str(tok)!r})\nexcept ValueError as e:\n    sys.exit(f'refused: "
        "{e}')\n"
    )
    argv = [sys.executable, "-c", code]
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the terminal
        os.chdir(ROOT)
        os.execve(sys.executable, argv, cpu_env())
    text, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            text += chunk
    else:
        os.kill(pid, 9)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out = text.decode(errors="replace").replace("\r\n", "\n")
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert code == 1 and last == (
        f"refused: tokenizer={str(tok)!r} asks to run Python of its own "
        f"(auto_map in its tokenizer_config.json), which ds_longctx never runs; pass a "
        f"tokenizer whose class transformers ships (`tokenizer.save_pretrained` of a loaded one)"
    ), out
    assert "[y/N]" not in out and not (tmp_path / "ran").exists()
