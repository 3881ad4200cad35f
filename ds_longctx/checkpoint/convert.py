"""`ds-longctx checkpoint convert | reshard`: a checkpoint rewritten in place.

    # every format-1 tag under it, or one:
    ds-longctx checkpoint convert OUTPUT_DIR [--tag step300]
    # the universal form of the latest tag, or of one:
    ds-longctx checkpoint reshard OUTPUT_DIR [--tag step300]

`reshard` writes the layout-free form a resume at another world size, sp size or dp size reads
(checkpoint/universal.py), ahead of the job so its GPUs do not wait for it; it prints the time and
the peak host memory it took.

Format 1 recorded each file's size only and pickled each rank's RNG state with numpy's
(checkpoint/layout.py). The conversion loads each RNG file weights-only, with numpy's array globals
allowed for that file alone (what numpy's RNG state pickles to, nothing that runs code), rewrites it
as tensors and numbers, hashes every file (sha256, one read of each: checkpoint/files.py's cost) and
writes meta.json as format 2, atomically, last. DeepSpeed's own files are not rewritten; a file that
asks for any other global is refused, naming it, and nothing is changed. It holds the run's lock
(checkpoint/run_lock.py): a run that is writing there is named and the conversion refused.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import signal
import sys
import time
from pathlib import Path

import torch

from ds_longctx.checkpoint import files, paths, rng, run_lock
from ds_longctx.checkpoint.layout import CKPT_SUBDIR, FORMAT, CheckpointError
from ds_longctx.checkpoint.resume import find_checkpoint
from ds_longctx.checkpoint.save import write_meta
from ds_longctx.checkpoint.universal import universal_dir, write_universal


def tags(directory: str, tag: str | None) -> list:
    """The tag directories `convert` reads: `tag`, or every complete one, under a run's output_dir
    or its checkpoints/ directory."""
    p = Path(directory)
    root = p / CKPT_SUBDIR if (p / CKPT_SUBDIR).is_dir() else p
    if tag is not None:
        return [
            root / paths.check_tag(tag, f"--tag ({paths.shown(tag)})", "checkpoint convert", root)
        ]
    found = [root / n for n in paths.tag_names(root)]
    if not found:
        raise CheckpointError(
            f"checkpoint convert: no checkpoint tag (stepN) in {str(root)!r}; pass a run's "
            f"output_dir"
        )
    return found


def convert_tag(tag_dir: Path) -> bool:
    """Rewrite one format-1 tag as format 2 (module doc); False when it is format 2 already."""
    _, meta = find_checkpoint(tag_dir.parent, tag_dir.name, what="checkpoint convert")
    if meta["format"] == FORMAT:
        return False
    bad = files.problem(tag_dir, meta, None)
    if bad:
        raise CheckpointError(
            f"checkpoint convert: {str(tag_dir)!r} is not converted ({bad}); nothing changed"
        )
    for name in sorted(meta["files"]):
        if name.startswith("rng_rank") and name.endswith(".pt"):
            state = files.load(tag_dir / name, legacy_rng=True)
            if not isinstance(state.get("numpy"), dict):
                state["numpy"] = rng.numpy_state(state["numpy"])
            tmp = tag_dir / f"{name}.tmp"
            torch.save(state, tmp)
            tmp.replace(tag_dir / name)
    meta["files"] = files.entries(tag_dir, meta["files"], show=True)
    meta["format"] = FORMAT
    write_meta(tag_dir, meta)
    return True


class Stopped(BaseException):
    """SIGTERM or SIGINT inside `stop_raises`: the block's cleanup runs (write_universal removes its
    partial)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_raises():
    """Within the block the first SIGTERM or SIGINT raises Stopped and later ones wait for its
    cleanup; the previous handlers come back after."""
    got = []

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def reshard_tag(root: Path, tag: str | None) -> str:
    """Write the universal form of `tag` (None: latest) under checkpoints/ `root`; its one-line
    report."""

    tag_dir, meta = find_checkpoint(root, tag, what="checkpoint reshard")
    t0 = time.perf_counter()
    manifest = write_universal(tag_dir, meta, show=True)
    size = sum(e["bytes"] for e in manifest["files"].values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return (
        f"{universal_dir(tag_dir)}: {len(manifest['params'])} parameters, {size / 1e9:.2f} GB, "
        "written in "
        f"{time.perf_counter() - t0:.1f} s (files checked and hashed included); peak host RSS "
        f"{peak / 1e9:.2f} GB"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="ds-longctx checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action",
        choices=["convert", "reshard"],
        help="convert: format 1 -> format 2, in place; reshard: write a tag's universal form",
    )
    p.add_argument("checkpoint", help="a run's output_dir (or its checkpoints/ directory)")
    p.add_argument(
        "--tag",
        default=None,
        help="one tag, e.g. step300 (default: convert every tag, reshard the latest)",
    )
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        found = tags(a.checkpoint, a.tag)
        lock = run_lock.take(
            found[0].parent.parent, "convert it once that run has ended"
        )  # it rewrites files there
        try:
            if a.action == "reshard":
                with stop_raises():
                    line = reshard_tag(found[0].parent, a.tag)
                print(line, flush=True)
            for t in found if a.action == "convert" else []:
                print(
                    f"{t}: {'converted to format 2' if convert_tag(t) else 'already format 2'}",
                    flush=True,
                )
        finally:
            if lock is not None:
                lock.release()
    except ValueError as e:  # CheckpointError, RunLockError
        print(f"refused: {e}", file=sys.stderr)
        return 2
    except Stopped as e:
        stopped = e.signum  # printed once `e` and the progress bar its frames hold are gone
    else:
        return 0
    print(
        f"\ncheckpoint reshard stopped by {signal.Signals(stopped).name}: nothing written (its "
        f"partial universal form removed, the checkpoint unchanged); run it again to write it",
        file=sys.stderr,
        flush=True,
    )
    return 128 + stopped


if __name__ == "__main__":
    sys.exit(main())
