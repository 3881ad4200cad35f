"""A pydantic ValidationError of the run config as the lines a user reads: one per problem, without
pydantic's URLs.

    except ValidationError as e:
        raise ValueError(format_validation_error(e)) from None

An unknown key names the nearest known one (config/keys.py); a type or range error shows the value
given.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from ds_longctx.config.keys import unknown_key
from ds_longctx.config.train import whole_number_hint


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, without pydantic's URLs: what a user reads before anything runs."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(str(unknown_key(repr(loc))))
        elif (
            loc
            and e["type"] != "value_error"
            and "input" in e
            and not isinstance(e["input"], (dict, BaseModel))
        ):
            # a type or range error: the value given beside what was expected (our own checks name
            # it themselves)
            hint = {
                "bool_parsing": "; use true or false",
                "bool_type": "; use true or false",
                "finite_number": "; give a finite number",
            }.get(e["type"], "")
            if e["type"] == "int_parsing" and isinstance(
                e["input"], str
            ):  # `128k`, `1e6`: the number it means
                hint = whole_number_hint(e["input"])
            lines.append(f"{loc}: {msg} (got {e['input']!r}{hint})")
        else:
            lines.append(f"{loc}: {msg}" if loc else msg)
    return "invalid run config:\n  " + "\n  ".join(lines)
