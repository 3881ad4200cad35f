#!/bin/bash
# GPU checks in one device call (run from the repository root on the device, after the wheels are installed):
#   the GPU tests (log), then the attention-kernel benchmark. Writes everything under $OUT.
#   bash benchmarks/gpu_checks.sh [SEQ_LENS]        (default 131072,524288)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch; print('gpus', torch.cuda.device_count(), torch.cuda.get_device_name())" | tee "$OUT/env.txt"
python3 -c "from ds_longctx.parallel import attention; print('fa4', attention.fa4_available())" | tee -a "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
python3 benchmarks/bench_attention.py --seq_lens "${1:-131072,524288}" --out "$OUT" 2>&1 | tail -8
