"""Live CPU allocations at the peak of a torch.profiler chrome trace (profile_memory, with_stack), by backward node,
allocating op and innermost project frame. Usage: trace.json T H hv·dv [first timestamp of the step]."""
import json, sys, bisect
from collections import defaultdict
tr = json.load(open(sys.argv[1]))
ev = tr["traceEvents"] if isinstance(tr, dict) else tr
T, H, U = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])  # tokens, hidden, hv*dv
E, UU = T * H * 2, T * U * 2
spans = [e for e in ev if e.get("ph") == "X"]
mems = [e for e in ev if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
print(len(spans), "spans", len(mems), "memory events", file=sys.stderr)
# timeline per tid: open spans by start; for each memory event, spans containing it on the same tid
by_tid = defaultdict(list)
for s in spans:
    by_tid[s["tid"]].append(s)
for l in by_tid.values():
    l.sort(key=lambda s: (s["ts"], -s["dur"]))
# sweep: merge memory events into each tid's span list
out = {}
for tid, l in by_tid.items():
    ms = sorted((m for m in mems if m["tid"] == tid), key=lambda m: m["ts"])
    st, j = [], 0
    for m in ms:
        while j < len(l) and l[j]["ts"] <= m["ts"]:
            while st and st[-1]["ts"] + st[-1]["dur"] < l[j]["ts"]:
                st.pop()
            st.append(l[j]); j += 1
        while st and st[-1]["ts"] + st[-1]["dur"] < m["ts"]:
            st.pop()
        ops = [s["name"] for s in st if s.get("cat") == "cpu_op"]
        py = [s["name"] for s in st if s.get("cat") == "python_function" and any(k in s["name"] for k in ("ds_longctx", "transformers", "deepspeed"))]
        bw = [s["name"] for s in st if "evaluate_function" in s["name"]]
        out[id(m)] = (py[-1] if py else "-", ops[-1] if ops else "-", bw[-1].split(": ")[-1] if bw else "")
mems.sort(key=lambda m: m["ts"])
live, total, best, best_i, best_live = {}, 0, -1, 0, None
step0 = float(sys.argv[5]) if len(sys.argv) > 5 else 0
for i, m in enumerate(mems):
    a, b = m["args"]["Addr"], m["args"]["Bytes"]
    if b > 0:
        live[a] = (b, out.get(id(m)), m["ts"]); total += b
    else:
        if a in live:
            total -= live.pop(a)[0]
    if total > best and m["ts"] >= step0:
        best, best_i, best_live = total, i, dict(live)
print(f"peak {best/1e6:.1f} MB at event {best_i} of {len(mems)}; E=T·H·2={E/1e6:.2f} MB, U=T·hv·dv·2={UU/1e6:.2f} MB")
g = defaultdict(lambda: [0, 0])
for b, where, ts in best_live.values():
    k = where if b >= min(E, UU) / 8 else ("(small)", "", "")
    g[k][0] += b; g[k][1] += 1
for k, (b, n) in sorted(g.items(), key=lambda kv: -kv[1][0])[:45]:
    print(f"{b/1e6:9.2f} MB {n:4d}  {b/E:6.2f} E {b/UU:6.2f} U  {k[2]:28s} {k[1]:28s} {k[0][:110]}")
