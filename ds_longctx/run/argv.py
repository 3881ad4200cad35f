"""A worker's command line: launcher arguments dropped, the run config parsed or refused."""

from __future__ import annotations

import os
import sys

from pydantic import ValidationError

from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.run.refuse import refuse


def strip_launcher_args(argv: list[str]) -> list[str]:
    """Drop the deepspeed launcher's `--local_rank N`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.startswith(("--local_rank", "--local-rank")):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def parse_config(
    argv: list[str], world_size: int | None = None, per_node: int | None = None, usage: str = ""
):
    """RunConfig from argv, or exit 2 with a readable message. `--help` prints `usage` and every
    field. `world_size`, `per_node`: the launched processes, None where unknown."""
    argv = strip_launcher_args(argv)
    if "--help" in argv or "-h" in argv:
        print((usage + "\n" if usage else "") + RunConfig.help_text())
        sys.exit(0)
    try:
        return RunConfig.from_cli(argv, world_size, per_node)
    except ValidationError as e:
        refuse(format_validation_error(e), int(os.environ.get("RANK", "0")))
    except (ValueError, FileNotFoundError) as e:
        refuse(f"invalid run config: {e}", int(os.environ.get("RANK", "0")))
