"""Live CPU allocations at the peak of a torch.profiler chrome trace (profile_memory, with_stack), by backward node,
allocating op and innermost project frame.

    python cpu_trace_analyze.py trace.json T H hv·dv [first timestamp of the step]
"""

import json
import sys
from collections import defaultdict

OURS = ("ds_longctx", "transformers", "deepspeed")


def where_each_allocation(spans: list, mems: list) -> dict:
    """id(memory event) -> (innermost project frame, innermost op, enclosing backward node), per thread."""
    by_tid = defaultdict(list)
    for s in spans:
        by_tid[s["tid"]].append(s)
    out = {}
    for tid, opened in by_tid.items():
        opened.sort(key=lambda s: (s["ts"], -s["dur"]))
        stack, j = [], 0
        for m in sorted((m for m in mems if m["tid"] == tid), key=lambda m: m["ts"]):
            while j < len(opened) and opened[j]["ts"] <= m["ts"]:  # open every span started by now
                while stack and stack[-1]["ts"] + stack[-1]["dur"] < opened[j]["ts"]:
                    stack.pop()
                stack.append(opened[j])
                j += 1
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < m["ts"]:  # close the ended ones
                stack.pop()
            ops = [s["name"] for s in stack if s.get("cat") == "cpu_op"]
            py = [
                s["name"]
                for s in stack
                if s.get("cat") == "python_function" and any(k in s["name"] for k in OURS)
            ]
            bw = [s["name"] for s in stack if "evaluate_function" in s["name"]]
            out[id(m)] = (
                py[-1] if py else "-",
                ops[-1] if ops else "-",
                bw[-1].split(": ")[-1] if bw else "",
            )
    return out


def main(path: str, T: int, H: int, U: int, step0: float) -> None:
    events = json.load(open(path))["traceEvents"]
    E, UU = T * H * 2, T * U * 2
    spans = [e for e in events if e.get("ph") == "X"]
    mems = [
        e
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    ]
    where = where_each_allocation(spans, mems)
    mems.sort(key=lambda m: m["ts"])
    live, total, best, best_i, best_live = {}, 0, -1, 0, {}
    for i, m in enumerate(
        mems
    ):  # the live set after each event; the largest from the step's start on
        addr, size = m["args"]["Addr"], m["args"]["Bytes"]
        if size > 0:
            live[addr] = (size, where.get(id(m)))
            total += size
        elif addr in live:
            total -= live.pop(addr)[0]
        if total > best and m["ts"] >= step0:
            best, best_i, best_live = total, i, dict(live)
    print(
        f"peak {best / 1e6:.1f} MB at event {best_i} of {len(mems)}; E=T·H·2={E / 1e6:.2f} MB, "
        f"U=T·hv·dv·2={UU / 1e6:.2f} MB"
    )
    groups = defaultdict(lambda: [0, 0])
    for size, at in best_live.values():
        key = at if size >= min(E, UU) / 8 else ("(small)", "", "")
        groups[key][0] += size
        groups[key][1] += 1
    for (frame, op, node), (size, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:45]:
        print(
            f"{size / 1e6:9.2f} MB {n:4d}  {size / E:6.2f} E {size / UU:6.2f} U  {node:28s} {op:28s} {frame[:110]}"
        )


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]) if len(sys.argv) > 5 else 0.0,
    )
