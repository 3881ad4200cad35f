"""Short chat sessions about the Python standard library's functions: their signatures and first
docstring lines. Writes stdlib_chat.jsonl beside this file (`python docs/examples/stdlib_chat.py`);
the README's first hour trains on it."""

import importlib
import inspect
import json
import random
import re
from pathlib import Path

NAMES = [
    "json.dumps",
    "json.loads",
    "textwrap.wrap",
    "textwrap.dedent",
    "textwrap.shorten",
    "shlex.split",
    "shlex.quote",
    "bisect.bisect_left",
    "bisect.insort",
    "heapq.heappush",
    "heapq.nlargest",
    "heapq.merge",
    "os.path.join",
    "os.path.splitext",
    "os.makedirs",
    "shutil.copytree",
    "shutil.rmtree",
    "glob.glob",
    "fnmatch.fnmatch",
    "itertools.islice",
    "itertools.groupby",
    "itertools.accumulate",
    "functools.reduce",
    "functools.lru_cache",
    "collections.namedtuple",
    "re.sub",
    "re.findall",
    "re.split",
    "base64.b64encode",
    "hashlib.pbkdf2_hmac",
    "zlib.compress",
    "gzip.open",
    "csv.reader",
    "tempfile.mkdtemp",
    "time.strftime",
    "math.isclose",
    "statistics.median",
    "random.sample",
    "difflib.unified_diff",
    "urllib.parse.urlencode",
    "subprocess.run",
    "sorted",
    "enumerate",
    "zip",
    "round",
    "open",
    "print",
    "max",
]
rng = random.Random(0)
rows = []
for name in NAMES:
    mod, _, attr = name.rpartition(".")
    obj = getattr(importlib.import_module(mod or "builtins"), attr)
    try:
        sig = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", f"{name}{inspect.signature(obj)}")
    except (TypeError, ValueError):
        continue
    doc = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ")
    if not doc or len(sig) > 300:
        continue
    ask = rng.choice(
        ["What are the parameters of {}?", "How do I call {}?", "Which arguments does {} take?"]
    )
    rows.append(
        {
            "messages": [
                {"role": "user", "content": ask.format(f"`{name}`")},
                {"role": "assistant", "content": f"`{sig}`"},
                {"role": "user", "content": "What does it do?"},
                {"role": "assistant", "content": doc[:400]},
            ]
        }
    )
print(len(rows))
with open(Path(__file__).with_suffix(".jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
