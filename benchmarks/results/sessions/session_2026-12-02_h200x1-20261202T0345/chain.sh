#!/bin/bash
# session 14, the last device minutes: pytest tests/gpu at HEAD in four processes side by side (every test once),
# logs straight under $OUT (a call cut off still brings them back)
set -uo pipefail
mkdir -p $OUT/res
git log --oneline -1 > $OUT/res/commit.txt 2>&1
A="partial_optimizer_offload or offload_on_vs_off or memory_snapshot"
B="optimizer_state_at_build or tiled_layer_on_gpu or every_lever"
P="python3 -m pytest -q -rs -p no:cacheprovider --durations=10"
date -u +%T > $OUT/res/times.txt
MASTER_PORT=29611 $P tests/gpu/test_gpu.py -k "$A" > $OUT/res/gpu_a.log 2>&1 &
MASTER_PORT=29622 $P tests/gpu/test_gpu.py -k "$B" > $OUT/res/gpu_b.log 2>&1 &
MASTER_PORT=29633 $P tests/gpu/test_gpu.py tests/gpu/test_fused_ops_gpu.py -k "not ($A or $B)" > $OUT/res/gpu_c.log 2>&1 &
MASTER_PORT=29644 $P tests/gpu/test_attention_gpu.py > $OUT/res/gpu_d.log 2>&1 &
wait
date -u +%T >> $OUT/res/times.txt
for f in $OUT/res/gpu_?.log; do echo "== $f"; tail -n 4 "$f"; done
