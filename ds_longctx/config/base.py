"""What every config section shares: pydantic settings (unknown keys refused, attribute docstrings as docs)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: `extra="forbid"`, validated on assignment, documented by attribute docstrings.

    Every float is finite (`allow_inf_nan=False`: inf, nan and 1e400, which reads as inf, are refused by name).
    A field's flat key (`--key value`, a flat YAML key) is its name unless its `json_schema_extra` names another
    (`{"flat": "data_layout"}`); config/__init__.py checks that every flat key maps to exactly one field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              protected_namespaces=(), allow_inf_nan=False)
