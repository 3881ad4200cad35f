"""A worker's command line: the launcher's arguments dropped, the run config parsed (or the process refused).

cfg = parse_config(sys.argv[1:], world_size, per_node, usage)   # train, rehearse, cli, the HF Trainer
"""

from __future__ import annotations

import os
import sys

from pydantic import ValidationError

from ds_longctx.config import RunConfig, format_validation_error
from ds_longctx.run.refuse import refuse


def strip_launcher_args(argv: list[str]) -> list[str]:
    """Drop `--local_rank=N` / `--local-rank N` that the deepspeed launcher appends (LOCAL_RANK is in env)."""
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
    """RunConfig from argv, or exit 2 with a readable message (before anything heavy is imported). `--help` / `-h`
    prints `usage` (the caller's, e.g. the train entry's docstring) and every field (section, flat and dotted key,
    type, default, doc) and exits 0. `world_size`, `per_node`: the processes the run is launched on, in all and per
    node (its planned world and sp_size are checked against them first), None where not known."""
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
