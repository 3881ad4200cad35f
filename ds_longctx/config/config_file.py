"""A run-config file's text -> its data, read strictly: what the file says is what the run gets.

    # a dict (or whatever the top level is); ValueError naming the file and line:
    data = read_config_file("run.yaml")

Rules (each refusal names the file, the line and the fix):
- at most MAX_BYTES (1 MiB; a run config is a few KiB), checked before anything is parsed;
- a key given twice in one mapping, at any depth (`lr` twice, two `optimizer:` sections), is refused
  naming its dotted path and both lines: YAML and JSON parsers keep the last silently;
- YAML anchors and aliases (`&name`, `*name`, `<<: *name`) are refused: a run config never needs
  them, and aliases expand (billion laughs);
- YAML tags beyond the safe loader's (`!!python/object`, `!custom`) are refused, naming the tag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ds_longctx.parallel.json_keys import DuplicateKey, loads_unique

MAX_BYTES = 1 << 20


def read_config_file(path: Union[str, Path]) -> Any:
    """The parsed content of the YAML (.yaml / .yml) or JSON file `path` (module doc's rules).
    OSError for a file that cannot be opened; ValueError for everything else that is wrong with
    it."""
    kind = "YAML" if str(path).endswith((".yaml", ".yml")) else "JSON"
    with open(
        path, "rb"
    ) as f:  # read one byte past the cap: a device or FIFO never streams in whole
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        size = Path(path).stat().st_size
        said = (
            f"{size / 2**20:.1f} MiB" if size > MAX_BYTES else f"more than {MAX_BYTES // 2**20} MiB"
        )
        raise ValueError(
            f"config {path} is {said}, over the {MAX_BYTES // 2**20} MiB a run config may be (one "
            "is a few KiB); check that this is the run config, or write one with `ds-longctx plan "
            "--out`"
        )
    try:
        text = raw.decode()
        return _yaml(text, path) if kind == "YAML" else _json(text, path)
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        if isinstance(e, _Refused):
            raise ValueError(str(e)) from None
        first = " ".join(x.strip() for x in str(e).strip().splitlines())[:300] or type(e).__name__
        raise ValueError(
            f"config {path} could not be read as {kind} ({first}); fix the file, or write a new "
            f"one with `ds-longctx plan --out`"
        ) from None


class _Refused(ValueError):
    """A rule of this module broken: its message is the whole refusal."""


def _twice(path, key: str, first: Optional[int], second: Optional[int]) -> _Refused:
    lines = f" (lines {first} and {second})" if first != second else f" (line {first})"
    lines = lines if first and second else ""
    return _Refused(f"config {path}: key {key} appears twice{lines}; keep one")


# ----------------------------------------------------------------------------- YAML
class _PlainDumper(yaml.SafeDumper):
    """Writes a value seen twice out again instead of as an anchor and alias, which
    `read_config_file` refuses."""

    def ignore_aliases(self, data) -> bool:
        return True


def yaml_text(data) -> str:
    """`data` as YAML that `read_config_file` reads back: keys in their order, no anchors."""
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False)


def _yaml(text: str, path) -> Any:
    loader = _StrictLoader(text)
    loader.where = path
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases, unknown tags and duplicate keys (module doc), on
    the composed nodes before any value is constructed."""

    where: Any = None

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"config {self.where} line {line} uses a YAML alias (*{event.anchor}); write the "
                f"values out"
            )
        if getattr(event, "anchor", None) is not None:
            raise _Refused(
                f"config {self.where} line {line} defines a YAML anchor (&{event.anchor}); a run "
                f"config has no use for one: remove it and write the values out"
            )
        return super().compose_node(parent, index)

    def construct_document(self, node):
        self._check(node, "")
        return super().construct_document(node)

    def _check(self, node, at: str) -> None:
        """Every node under `node` (dotted path `at`): a known tag, and no mapping key twice."""
        if node.tag not in self.yaml_constructors or node.tag is None:
            raise _Refused(
                f"config {self.where} line {node.start_mark.line + 1} uses the YAML tag "
                f"{node.tag!r}; a run config holds plain keys and values: remove the tag"
            )
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, v in node.value:
                self._check(k, at)
                key = f"{at}.{k.value}" if at else str(k.value)
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        raise _twice(self.where, key, seen[k.value], k.start_mark.line + 1)
                    seen[k.value] = k.start_mark.line + 1
                self._check(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check(item, f"{at}[{i}]")


# ----------------------------------------------------------------------------- JSON
def _json(text: str, path) -> Any:
    try:
        return loads_unique(text)  # the one rule (parallel/json_keys.py)
    except DuplicateKey as e:
        raise _twice(path, e.path, e.first, e.second) from None
