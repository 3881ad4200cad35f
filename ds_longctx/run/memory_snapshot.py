"""What holds the GPU memory at a step's peak: the CUDA allocator's history for a run's first steps
(logging.memory_snapshot_steps: N), dumped per rank to `output_dir/memory/` as a snapshot pickle
and a peak table by allocating code line. Layout and method: docs/design/run.md."""

from __future__ import annotations

# torch is imported inside the functions that use it: reading a dumped snapshot needs none.
import logging
import pickle
from collections import defaultdict
from pathlib import Path

log = logging.getLogger("ds_longctx")

OURS = ("ds_longctx", "transformers", "deepspeed", "peft", "flash_attn", "liger_kernel")
MAX_ENTRIES = 2_000_000


def start(max_entries: int = MAX_ENTRIES) -> None:
    """Record every allocation from now on (Python stacks; the allocator keeps the last
    `max_entries` events). Allocation stacks only: `context="all"` fails under non-reentrant
    checkpoint (docs/calibration.md#memory-snapshot-context)."""
    import torch

    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=max_entries
    )


def stop() -> None:
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)


def origin(frames: list) -> str:
    """`file:line in function` of the innermost frame in our stack of libraries (else the innermost
    frame)."""
    if not frames:
        return "(allocated before recording began)"
    pick = next(
        (f for f in frames if any(f"/{name}/" in f.get("filename", "") for name in OURS)), frames[0]
    )
    path = pick.get("filename", "?")
    for name in OURS:
        if f"/{name}/" in path:
            path = name + "/" + path.rsplit(f"/{name}/", 1)[1]
            break
    return f"{path}:{pick.get('line', '?')} in {pick.get('name', '?')}"


def peak_table(snapshot: dict, device: int = 0, held: bool = False) -> dict:
    """{"peak_bytes", "event", "events", "groups": [(origin, bytes, blocks), ...]} at the moment the
    most bytes were alive on `device` (`held=True`: until their free completed)."""
    end_state = ("active_allocated", "active_pending_free") if held else ("active_allocated",)
    live = {}  # addr -> (size, frames): the blocks alive at the end
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        addr = seg["address"]
        for b in seg.get("blocks", []):
            if b.get("state") in end_state:
                live[addr] = (b["size"], b.get("frames", []))
            addr += b["size"]
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    # the event that ends each block's life: free_requested, or free_completed when no request was
    # recorded (or held)
    ends, last_alloc, requested = (
        {},
        {},
        {},
    )  # end event index -> frames of the alloc before it at that address
    for i, e in enumerate(events):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            last_alloc[addr] = e.get("frames", [])
            requested.pop(addr, None)
        elif action == "free_requested":
            requested[addr] = i
            if not held:
                ends[i] = last_alloc.get(addr, e.get("frames", []))
        elif action == "free_completed":
            frames = last_alloc.pop(addr, e.get("frames", []))
            if held or requested.pop(addr, None) is None:
                ends[i] = frames
    total = sum(size for size, _ in live.values())
    best, best_at, best_live = total, len(events), dict(live)
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":  # before this event the block did not exist
            if addr in live:
                total -= live.pop(addr)[0]
        elif i in ends:  # before this event the block was alive
            live[addr] = (e["size"], ends[i])
            total += e["size"]
        else:
            continue
        if total > best:
            best, best_at, best_live = total, i, dict(live)
    groups = defaultdict(lambda: [0, 0])
    for size, frames in best_live.values():
        g = groups[origin(frames)]
        g[0] += size
        g[1] += 1
    ordered = sorted(((k, v[0], v[1]) for k, v in groups.items()), key=lambda t: -t[1])
    return {"peak_bytes": best, "event": best_at, "events": len(events), "groups": ordered}


def stream_table(snapshot: dict, device: int = 0) -> list:
    """[(stream, reserved, allocated, segments, top origin), ...] largest first: the allocator's
    segments by owning stream."""
    rows = defaultdict(lambda: [0, 0, 0, defaultdict(int)])
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        r = rows[seg.get("stream", 0)]
        r[0] += seg.get("total_size", sum(b["size"] for b in seg.get("blocks", [])))
        r[1] += seg.get(
            "allocated_size",
            sum(b["size"] for b in seg.get("blocks", []) if b.get("state") == "active_allocated"),
        )
        r[2] += 1
        for b in seg.get("blocks", []):
            if b.get("frames"):
                r[3][origin(b["frames"])] += b["size"]
    traced = defaultdict(
        lambda: defaultdict(int)
    )  # stream -> origin -> bytes allocated there in the window
    traces = snapshot.get("device_traces", [])
    for e in traces[device] if device < len(traces) else []:
        if e.get("action") == "alloc" and e.get("frames"):
            traced[e.get("stream", 0)][origin(e["frames"])] += e.get("size", 0)
    out = []
    for stream, (reserved, allocated, n, by) in rows.items():
        by = by or traced.get(
            stream, {}
        )  # nothing alive there now: who allocated on it during the window
        top = max(by.items(), key=lambda kv: kv[1])[0] if by else "(no recorded stacks)"
        out.append((stream, reserved, allocated, n, top))
    return sorted(out, key=lambda t: -t[1])


def format_table(
    table: dict,
    rank: int,
    steps: int,
    top: int = 40,
    held: dict | None = None,
    streams: list | None = None,
) -> str:
    gib = 2**30
    lines = [
        f"rank {rank}: allocated bytes alive at the highest point of the first {steps} step(s) "
        "(event "
        f"{table['event']} of {table['events']} recorded): {table['peak_bytes'] / gib:.2f} GiB",
        f"{'GiB':>9} {'blocks':>7}  allocated at",
    ]

    def rows(t: dict) -> None:
        for where, size, n in t["groups"][:top]:
            lines.append(f"{size / gib:9.3f} {n:7d}  {where}")
        rest = t["groups"][top:]
        if rest:
            lines.append(
                f"{sum(s for _, s, _ in rest) / gib:9.3f} {sum(n for _, _, n in rest):7d}  "
                f"({len(rest)} more places)"
            )

    rows(table)
    if held is not None:
        lines += [
            "",
            "held (freed blocks still waiting for another stream's work count until it has run) "
            f"at its highest point (event {held['event']}): {held['peak_bytes'] / gib:.2f} GiB",
            f"{'GiB':>9} {'blocks':>7}  allocated at",
        ]
        rows(held)
    if streams:
        lines += [
            "",
            "reserved by stream at the end of the window (a stream's cached blocks serve that "
            "stream only)",
            f"{'stream':>16} {'reserved GiB':>12} {'allocated GiB':>13} {'segments':>8}  most "
            "bytes from",
        ]
        for stream, reserved, allocated, n, where in streams:
            lines.append(
                f"{stream:>16} {reserved / gib:12.3f} {allocated / gib:13.3f} {n:8d}  {where}"
            )
    return "\n".join(lines) + "\n"


def dump(out_dir: Path, rank: int, steps: int) -> Path:
    """Write this rank's snapshot and peak table, stop recording; returns the table's path."""
    import torch

    snap = torch.cuda.memory._snapshot()
    stop()
    d = Path(out_dir) / "memory"
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"rank{rank}_snapshot.pickle").open("wb") as f:
        pickle.dump(snap, f)
    path = d / f"rank{rank}_peak.txt"
    dev = torch.cuda.current_device()
    path.write_text(
        format_table(
            peak_table(snap, dev),
            rank,
            steps,
            held=peak_table(snap, dev, held=True),
            streams=stream_table(snap, dev),
        )
    )
    log.info(
        "memory snapshot of steps 1-%d: %s (and %s)", steps, path, d / f"rank{rank}_snapshot.pickle"
    )
    return path
