#!/bin/bash
# Issue 58's GPU run: Qwen3-8B at the longest length the plan finds for one GPU + 128 GB host + a small local disk
# (the disk tier, levers/disk_tier.py), 1 step. It records the GPU, host and disk peaks, the disk bytes written and
# the step time against the plan. Run it from the repo root on one GPU with the wheels installed (bash
# .whl/install.sh), e.g. detached:
#   RES=/tmp/res/disk_tier RUN_DIR=/tmp/dt launch/detach.sh bash benchmarks/disk_tier.sh
#   RUN_DIR=/tmp/dt launch/wait.sh 540; tar czf $OUT/res.tgz -C /tmp/res disk_tier
#
#   1. measure NVME_PATH's write / read bandwidth (1 GB, O_DIRECT where allowed), recorded there
#   2. the host-only plan's longest length (no disk) and the disk plan's (--nvme_gb NVME_GB), files in $RES/plan
#   3. train STEPS steps (2) on the disk plan, with no checkpoint saved; the step time is the last step's
#      (the first also compiles: torch.compile's graphs, FlashAttention 4's kernels). Sampled every 0.5 s: the disk's used bytes under
#      NVME_PATH and the node's used host memory. From the disk's /proc/diskstats: sectors written and read, and
#      its busy seconds (time with an I/O in flight), a step's average.
#   4. $RES/disk_tier.json and $RES/disk_tier.md: measured against planned (GPU +-10%, host +-15%, step +-15%)
#
# Knobs (env): GPU_MEM_GB (this GPU's, from nvidia-smi), HOST_MEM_GB (128), NVME_PATH (/tmp/ds_longctx_nvme),
# NVME_GB (50), GPU (h200 or h100, from nvidia-smi), MODEL (qwen3-8b), STEPS (2).
# Qwen3-8B on 1 x 80 GB (H100) + 128 GB host plans nothing, with or without a 50 GB disk: the optimizer state alone
# is 131 GB. Run it on an H200 (141 GB: 264,192 tokens planned, against 157,696 host-only), or give NVME_GB >= 200.
# On CPU, the check that the script runs: MODEL=qwen3-tiny GPU_MEM_GB=2 HOST_MEM_GB=3 NVME_GB=1 ... (the steps
# train on the CPU; no layer is planned on disk).
set -uo pipefail
RES=${RES:-${OUT:?set OUT or RES}}
MODEL=${MODEL:-qwen3-8b} HOST_MEM_GB=${HOST_MEM_GB:-128} NVME_GB=${NVME_GB:-50} STEPS=${STEPS:-2}
NVME_PATH=${NVME_PATH:-/tmp/ds_longctx_nvme}
SMI=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
GPU_MEM_GB=${GPU_MEM_GB:-$(awk -F', ' '{printf "%d", $2 * 1.048576 / 1000}' <<< "$SMI")}
GPU=${GPU:-$(grep -oiE 'h100|h200' <<< "$SMI" | tr A-Z a-z)}
mkdir -p "$RES" "$NVME_PATH"
LOG="$RES/log.txt"
echo "disk_tier: $(date -u +%FT%TZ) commit ${DS_LONGCTX_COMMIT:-?} $MODEL on ${SMI:-no GPU} ($GPU_MEM_GB GB)" \
     "+ $HOST_MEM_GB GB host + $NVME_GB GB of $NVME_PATH" | tee "$LOG"
df -h "$NVME_PATH" | tail -1 | awk '{print "disk: " $4 " free of " $2 " on " $1 " (NVME_GB should stay below the free space)"}' \
  | tee -a "$LOG"
CLI=(python3 -m ds_longctx.cli)
MACHINE=(--model "$MODEL" --gpus 1 --gpu_mem_gb "$GPU_MEM_GB" --host_mem_gb "$HOST_MEM_GB" --find_max_len)
[[ -n $GPU ]] && MACHINE+=(--gpu "$GPU")

# ---------------------------------------------------------------- 1-2. bandwidth, then the two plans
"${CLI[@]}" plan "${MACHINE[@]}" 2>&1 | head -1 | tee "$RES/host_only.txt" | tee -a "$LOG"
rm -rf "$RES/plan"
"${CLI[@]}" plan "${MACHINE[@]}" --nvme_path "$NVME_PATH" --nvme_gb "$NVME_GB" --measure_nvme --out "$RES/plan" \
  > "$RES/plan.log" 2>&1 || { cat "$RES/plan.log" | tee -a "$LOG"; exit 2; }
head -14 "$RES/plan.log" | tee -a "$LOG"

# ---------------------------------------------------------------- 3. STEPS steps, sampled
DEV=$(basename "$(df --output=source "$NVME_PATH" | tail -1)")
sectors() { awk -v d="$DEV" '$3 == d {print $10, $6, $13}' /proc/diskstats; }  # written, read, busy ms
used_host() { awk '/MemTotal/ {t=$2} /MemAvailable/ {a=$2} END {print (t - a) * 1024}' /proc/meminfo; }
W0=$(sectors); H0=$(used_host)
( peak_d=0; peak_h=0
  while :; do
    d=$(du -sb "$NVME_PATH" 2>/dev/null | cut -f1); h=$(used_host)
    (( d > peak_d )) && peak_d=$d; (( h > peak_h )) && peak_h=$h
    echo "$peak_d $peak_h" > "$RES/peaks.txt"; sleep 0.5
  done ) &
SAMPLER=$!
t0=$SECONDS
"${CLI[@]}" train --nproc 1 --config "$RES/plan/run.yaml" --steps "$STEPS" --save_every 0 --report_to none \
  --output_dir "$RES/run" 2>&1 | tr '\r' '\n' | grep -v -E '^\s*$' | tail -40 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
W1=$(sectors)
echo "train: exit $rc, $((SECONDS - t0)) s; scratch left under $NVME_PATH: $(ls -A "$NVME_PATH" | grep -c ds_longctx-disk)" \
  | tee -a "$LOG"

# ---------------------------------------------------------------- 4. measured against planned
RC=$rc STEPS=$STEPS W0=${W0:-} W1=${W1:-} H0=$H0 RES=$RES NVME_PATH=$NVME_PATH python3 - <<'EOF' | tee -a "$LOG"
import json, os, re
res = os.environ["RES"]
plan = open(f"{res}/plan/plan.txt").read()
def grab(pattern, text=plan, cast=float):
    m = re.search(pattern, text)
    return (m.group(1) if cast is str else cast(m.group(1).replace(",", ""))) if m else None
planned = {
    "seq_len": grab(r"longest seq_len that fits: ([\d,]+)", cast=int),
    "host_only_seq_len": grab(r"= ([\d,]+) tokens", open(f"{res}/host_only.txt").read(), int),
    "gpu_gb": grab(r"planned: ([\d.]+) GB per GPU"), "host_gb": grab(r"planned: [\d.]+ GB per GPU, ([\d.]+) GB host"),
    "disk_gb": grab(r"disk tier: ([\d.]+) GB on nvme_path"), "placement": grab(r"placement per layer: (\S+)", cast=str),
    "step_s": grab(r"predicted step with the disk: ([\d.]+) s") or grab(r"predicted step on \w+ .*?: ([\d.]+) s"),
    "bandwidth": grab(r"at ([\d.]+ GB/s write, [\d.]+ GB/s read \(.*?\)\))", cast=str),
}
rows = [json.loads(line) for line in open(f"{res}/run/metrics.jsonl")] if os.path.exists(f"{res}/run/metrics.jsonl") else []
peak_d, peak_h = (int(x) for x in open(f"{res}/peaks.txt").read().split()) if os.path.exists(f"{res}/peaks.txt") else (0, 0)
w0, w1 = (os.environ[k].split() for k in ("W0", "W1"))
d = [int(b) - int(a) for a, b in zip(w0, w1)] if w0 and w1 else None  # sectors written, read; busy ms
n = int(os.environ["STEPS"])
measured = {
    "exit": int(os.environ["RC"]),
    "gpu_gb": rows[-1]["peak_gpu_bytes"] / 1e9 if rows else None,
    "host_rss_gb": rows[-1]["host_rss_bytes"] / 1e9 if rows else None,
    "host_used_gb": (peak_h - int(os.environ["H0"])) / 1e9,
    "disk_peak_gb": peak_d / 1e9,
    "disk_written_gb_per_step": d[0] * 512 / 1e9 / n if d else None,
    "disk_read_gb_per_step": d[1] * 512 / 1e9 / n if d else None,
    "disk_busy_s_per_step": d[2] / 1e3 / n if d else None,  # wall seconds with an I/O in flight
    "first_step_s": rows[0]["seconds"] if rows else None,
    "disk_wait_s": rows[-1].get("disk_wait_s") if rows else None,  # compute blocked on the disk
    "disk_gpu_stall_s": rows[-1].get("disk_gpu_stall_s") if rows else None,  # the GPU's, inside put / get
    "optimizer_s": rows[-1].get("optimizer_s") if rows else None,
    "step_s": rows[-1]["seconds"] if rows else None,
}
def vs(m, p, tol):
    return None if m is None or not p else f"{100 * (m / p - 1):+.1f}% ({'within' if abs(m / p - 1) <= tol else 'OUTSIDE'} {tol:.0%})"
check = {"gpu": vs(measured["gpu_gb"], planned["gpu_gb"], 0.10), "host": vs(measured["host_used_gb"], planned["host_gb"], 0.15),
         "disk": vs(measured["disk_peak_gb"], planned["disk_gb"], 0.15), "step": vs(measured["step_s"], planned["step_s"], 0.15)}
json.dump({"planned": planned, "measured": measured, "vs_plan": check}, open(f"{res}/disk_tier.json", "w"), indent=2)
md = ["| | planned | measured | vs plan |", "|---|---|---|---|"]
for k, pk, mk in (("GPU peak GB", "gpu_gb", "gpu_gb"), ("host GB", "host_gb", "host_used_gb"),
                  ("disk peak GB", "disk_gb", "disk_peak_gb"), ("step s", "step_s", "step_s")):
    md.append(f"| {k} | {planned[pk]} | {measured[mk] if measured[mk] is None else round(measured[mk], 2)} | {check[k.split()[0].lower()]} |")
md.append(f"| disk written / read GB a step | | {measured['disk_written_gb_per_step']} / {measured['disk_read_gb_per_step']} | |")
md.append(f"| disk busy s a step (an I/O in flight) | | {measured['disk_busy_s_per_step']} | |")
md.append(f"| first step s (compiles) | | {measured['first_step_s']} | |")
md.append(f"| last step's wait on the disk s | | {measured['disk_wait_s']} | |")
md.append(f"| last step's GPU time inside disk put / get s | | {measured['disk_gpu_stall_s']} | |")
opt_planned = grab(r"optimizer ([\d.]+)")
md.append(f"| last step's optimizer s | {opt_planned} | {measured['optimizer_s']} | |")
head = (f"{planned['seq_len']:,} tokens with the disk tier vs {planned['host_only_seq_len']:,} host-only; placement "
        f"{planned['placement']}; bandwidth {planned['bandwidth']}; train exit {measured['exit']}")
open(f"{res}/disk_tier.md", "w").write(head + "\n\n" + "\n".join(md) + "\n")
print(head); print("\n".join(md))
EOF
exit "$rc"
