"""What every config section shares: pydantic settings (unknown keys refused, attribute docstrings
as docs)."""

from __future__ import annotations

from typing import ClassVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from ds_longctx.parallel.disk import user_path


class Section(BaseModel):
    """A config section: `extra="forbid"`, validated on assignment, documented by attribute
    docstrings.

    Every float is finite (`allow_inf_nan=False`: inf, nan and 1e400, which reads as inf, are
    refused by name), no number is a boolean (pydantic reads `true` as 1: `--seq_len true` or `lr:
    yes` would run), and no text is blank
    (`--output_dir=` wrote the run into the current directory, `--data=` read it as the data).
    A field's flat key (`--key value`, a flat YAML key) is its name unless its `json_schema_extra`
    names another (`{"flat": "data_layout"}`); config/__init__.py checks that every flat key maps to
    exactly one field."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
        protected_namespaces=(),
        allow_inf_nan=False,
    )
    USER_PATHS: ClassVar[
        tuple
    ] = ()  # fields holding a user's path: resolved once (parallel/disk.user_path)

    @field_validator("*", mode="after")
    @classmethod
    def _resolve_user_path(cls, v, info: ValidationInfo):
        return user_path(v) if info.field_name in cls.USER_PATHS and isinstance(v, str) else v

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number_nor_blank_text(cls, v, info: ValidationInfo):
        if isinstance(v, (bool, str)):
            kinds = {cls.model_fields[info.field_name].annotation}
            kinds |= set(get_args(next(iter(kinds))))
            if isinstance(v, bool) and kinds & {int, float} and bool not in kinds:
                raise ValueError(
                    f"{str(v).lower()} is a boolean, not a number; give a number (every key's "
                    f"type: ds-longctx train --help)"
                )
            if isinstance(v, str) and not v.strip() and str in kinds:
                raise ValueError(
                    f"{v!r} is blank; give a value"
                    + (" or null" if type(None) in kinds else "")
                    + " (every key: ds-longctx train --help)"
                )
        return v
