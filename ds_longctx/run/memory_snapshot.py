"""What holds the GPU memory at a step's peak: the CUDA allocator's history, recorded for the first steps of a run.

    logging.memory_snapshot_steps: 2      # run config; 0 (default) records nothing

Recording starts before the engine is built (so the weights' and optimizer state's blocks carry the code line that
made them) and stops after step N. Then each rank writes, under `output_dir/memory/`:
    rank<r>_snapshot.pickle   torch.cuda.memory._snapshot(): drag it onto https://pytorch.org/memory_viz
    rank<r>_peak.txt          the blocks alive at the recorded window's highest allocated moment, grouped by the
                              code line that allocated them (the innermost frame in ds_longctx, transformers,
                              deepspeed, peft, flash_attn or liger; else the innermost frame), largest first
The planner's terms (plan/planner.py) name the same tensors: this is how a plan that misses is traced to a term.

`peak_table` reads a snapshot dict and needs no GPU: it walks the trace backwards from the blocks alive at snapshot
time (an `alloc` event: the block did not exist before it; a `free_completed` event: it did), so the live set at
every event of the window is exact even when the ring buffer dropped the oldest events.
"""

from __future__ import annotations

import logging
import pickle
from collections import defaultdict
from pathlib import Path

log = logging.getLogger("ds_longctx")

OURS = ("ds_longctx", "transformers", "deepspeed", "peft", "flash_attn", "liger_kernel")
MAX_ENTRIES = 2_000_000


def start(max_entries: int = MAX_ENTRIES) -> None:
    """Record every allocation from now on (Python stacks; the allocator keeps the last `max_entries` events).

    Stacks of allocations only (`context="alloc"`): with `context="all"` (frees' stacks too), torch 2.11 fails a
    custom autograd Function recomputed by non-reentrant checkpoint (ZeRO-3's linear in every checkpointed layer:
    `SystemError: ... returned NULL without setting an exception`), with or without torch.compile;
    benchmarks/probe_memory_snapshot.py, results in benchmarks/results/memory_snapshot_probe_2026-11-30.txt
    (pytorch/pytorch#179536 is the same error). What holds memory at the peak needs only the allocations' stacks."""
    import torch
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=max_entries)


def stop() -> None:
    import torch
    torch.cuda.memory._record_memory_history(enabled=None)


def origin(frames: list) -> str:
    """`file:line in function` of the innermost frame in our stack of libraries (else the innermost frame)."""
    if not frames:
        return "(allocated before recording began)"
    pick = next((f for f in frames if any(f"/{name}/" in f.get("filename", "") for name in OURS)), frames[0])
    path = pick.get("filename", "?")
    for name in OURS:
        if f"/{name}/" in path:
            path = name + "/" + path.rsplit(f"/{name}/", 1)[1]
            break
    return f"{path}:{pick.get('line', '?')} in {pick.get('name', '?')}"


def peak_table(snapshot: dict, device: int = 0) -> dict:
    """{"peak_bytes", "event", "events", "groups": [(origin, bytes, blocks), ...] largest first} for the moment of the
    window at which the most bytes were allocated on `device` (blocks alive at snapshot time included)."""
    live = {}  # addr -> (size, frames): the blocks alive at the end
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        addr = seg["address"]
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                live[addr] = (b["size"], b.get("frames", []))
            addr += b["size"]
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    made_by, last_alloc = {}, {}  # free event index -> frames of the alloc before it at that address
    for i, e in enumerate(events):
        if e.get("action") == "alloc":
            last_alloc[e.get("addr")] = e.get("frames", [])
        elif e.get("action") == "free_completed":
            made_by[i] = last_alloc.pop(e.get("addr"), e.get("frames", []))
    total = sum(size for size, _ in live.values())
    best, best_at, best_live = total, len(events), dict(live)
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":  # before this event the block did not exist
            if addr in live:
                total -= live.pop(addr)[0]
        elif action == "free_completed":  # before this event the block was alive
            live[addr] = (e["size"], made_by[i])
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


def format_table(table: dict, rank: int, steps: int, top: int = 40) -> str:
    gib = 2 ** 30
    lines = [f"rank {rank}: allocated bytes alive at the highest point of the first {steps} step(s) (event "
             f"{table['event']} of {table['events']} recorded): {table['peak_bytes'] / gib:.2f} GiB",
             f"{'GiB':>9} {'blocks':>7}  allocated at"]
    for where, size, n in table["groups"][:top]:
        lines.append(f"{size / gib:9.3f} {n:7d}  {where}")
    rest = table["groups"][top:]
    if rest:
        lines.append(f"{sum(s for _, s, _ in rest) / gib:9.3f} {sum(n for _, _, n in rest):7d}  "
                     f"({len(rest)} more places)")
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
    path.write_text(format_table(peak_table(snap, torch.cuda.current_device()), rank, steps))
    log.info("memory snapshot of steps 1-%d: %s (and %s)", steps, path, d / f"rank{rank}_snapshot.pickle")
    return path
