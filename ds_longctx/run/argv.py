"""A worker's command line: the launcher's arguments dropped, the run config parsed (or the process refused).

    cfg = parse_config(sys.argv[1:], world_size, per_node)   # train, eval, rehearse, the HF Trainer integration
"""

from __future__ import annotations

import os
import sys

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


def parse_config(argv: list[str], world_size: int | None = None, per_node: int | None = None):
    """RunConfig from argv, or exit 2 with a readable message (before anything heavy is imported). `--help` / `-h`
    prints the train entry's usage and every field (section, flat and dotted key, type, default, doc) and exits 0.
    `world_size`, `per_node`: the processes the run is launched on, in all and per node (its planned world and
    sp_size are checked against them first), None where not known."""
    from pydantic import ValidationError  # pydantic and the config: not imported by `ds-longctx plan`'s path

    from ds_longctx.config import RunConfig, format_validation_error
    argv = strip_launcher_args(argv)
    if "--help" in argv or "-h" in argv:
        from ds_longctx.run import train  # its docstring is the usage; train imports this module
        print(train.__doc__ + "\n" + RunConfig.help_text())
        sys.exit(0)
    try:
        return RunConfig.from_cli(argv, world_size, per_node)
    except ValidationError as e:
        refuse(format_validation_error(e), int(os.environ.get("RANK", "0")))
    except (ValueError, FileNotFoundError) as e:
        refuse(f"invalid run config: {e}", int(os.environ.get("RANK", "0")))
