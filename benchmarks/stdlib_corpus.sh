#!/bin/bash
# The Python standard library as a corpus, end to end (issue 28): prepare it on this machine (its own Python, so its own
# data card), then train the Qwen3-0.6B geometry (random init) on it, packed, at 32,768 tokens for 300 steps, with the
# held-out long documents evaluated every 25 steps (eval loss and the per-position curve). Run from the repo root.
#
# Vocabulary: the model's vocab_size is the tokenizer's (32,000 = 250 x 128; bos/eos ids the tokenizer's), the rest
# is Qwen3-0.6B's geometry (ds_longctx/models/qwen3-0.6b.json: 28 layers, hidden 1024, 16 q / 8 kv heads, tied
# embeddings): 0.47 B parameters instead of 0.6 B, and no logit for an id the data never holds.
#
# One H200 (wheels installed, as every device call: bash .whl/install.sh). Estimated 7-10 min (build ~1-2 min,
# prepare ~1 min, 300 steps of ~1 s, 13 evaluations of 8 rows), so start it detached and collect in two calls:
#   call 1: bash .whl/install.sh && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && \
#           RES=/tmp/stdlib_res RUN_DIR=/tmp/stdlib_job launch/detach.sh bash benchmarks/stdlib_corpus.sh; \
#           RUN_DIR=/tmp/stdlib_job launch/wait.sh 540; cp /tmp/stdlib_res/* "$OUT"/
#   call 2: RUN_DIR=/tmp/stdlib_job launch/wait.sh 540; cp /tmp/stdlib_res/* "$OUT"/     (until it ends)
# then commit the files under benchmarks/results/sessions/<session>/stdlib_corpus_h200/, run
# `python benchmarks/results_merge.py` (stdlib_corpus.jsonl) and point notebooks/stdlib_corpus.ipynb at them.
#
# On CPU (the check that it runs, and the notebook's numbers until the GPU's exist): STDLIB_TINY=1 trains the
# qwen3-tiny geometry (2 layers, hidden 64) at 2,048 tokens for 200 steps on the same whole-stdlib corpus.
#   STDLIB_TINY=1 RES=benchmarks/results/sessions/$(date +%F)/stdlib_corpus_cpu bash benchmarks/stdlib_corpus.sh
# Knobs (env): STEPS, SEQ_LEN, EVAL_EVERY, EVAL_ROWS, EVAL_BUCKETS, LR, WARMUP, VOCAB, BASE_MODEL, ONLY (a few
# document names: a quick corpus), PREPARE_ARGS (more `data prepare` options), WORK (scratch, default
# /tmp/stdlib_corpus).
#
# Writes to $RES (default $OUT): log.txt, data_card.md, data_card.json, model_config.json, run.yaml, metrics.jsonl,
# eval_curve.jsonl, summary.txt (8 files), and prints the summary table last.
set -euo pipefail
RES=${RES:-${OUT:?set OUT or RES}}
WORK=${WORK:-/tmp/stdlib_corpus}
if [[ ${STDLIB_TINY:-0} == 1 ]]; then
  BASE_MODEL=${BASE_MODEL:-qwen3-tiny} SEQ_LEN=${SEQ_LEN:-2048} STEPS=${STEPS:-200} EVAL_EVERY=${EVAL_EVERY:-25}
  EVAL_BUCKETS=${EVAL_BUCKETS:-16} LR=${LR:-3e-3} DTYPE=fp32 PROCS=1
else
  BASE_MODEL=${BASE_MODEL:-qwen3-0.6b} SEQ_LEN=${SEQ_LEN:-32768} STEPS=${STEPS:-300} EVAL_EVERY=${EVAL_EVERY:-25}
  EVAL_BUCKETS=${EVAL_BUCKETS:-32} LR=${LR:-5e-4} DTYPE=bf16 PROCS=8
fi
EVAL_ROWS=${EVAL_ROWS:-8} WARMUP=${WARMUP:-30} VOCAB=${VOCAB:-32000}
mkdir -p "$RES"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$RES/log.txt"
echo "stdlib_corpus: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') base $BASE_MODEL" \
     "seq_len $SEQ_LEN steps $STEPS lr $LR eval every $EVAL_EVERY ($EVAL_ROWS rows, $EVAL_BUCKETS buckets)" | tee "$LOG"

# ---------------------------------------------------------------- 1. the corpus, its tokenizer and its card
t0=$SECONDS
python3 -m ds_longctx.cli data prepare --stdlib --out "$WORK/corpus" --vocab_size "$VOCAB" \
   ${ONLY:+--only "$ONLY"} ${PREPARE_ARGS:-} \
   2>&1 | tr '\r' '\n' | grep -v -E '^\s*$|it/s\]$|char/s\]$' | tee -a "$LOG"
cp "$WORK/corpus/data_card.md" "$WORK/corpus/data_card.json" "$RES/"
echo "prepare: $((SECONDS - t0)) s" | tee -a "$LOG"

# ---------------------------------------------------------------- 2. the model: BASE_MODEL, the tokenizer's vocabulary
python3 benchmarks/model_for_tokenizer.py "$BASE_MODEL" "$WORK/corpus/tokenizer" "$WORK/model.json" | tee -a "$LOG"
cp "$WORK/model.json" "$RES/model_config.json"

# ---------------------------------------------------------------- 3. train, packed, with the held-out eval
t0=$SECONDS
set +e
python3 -m ds_longctx.cli train --nproc 1 --model "$WORK/model.json" --dtype "$DTYPE" --seq_len "$SEQ_LEN" \
   --steps "$STEPS" --lr "$LR" --warmup_steps "$WARMUP" --data "$WORK/corpus/train.jsonl" \
   --tokenizer "$WORK/corpus/tokenizer" --data_layout pack --eval_data "$WORK/corpus/eval.jsonl" \
   --eval_every "$EVAL_EVERY" --eval_rows "$EVAL_ROWS" --eval_buckets "$EVAL_BUCKETS" --log_every 5 \
   --tokenize_num_proc "$PROCS" \
   --data_cache_dir "$WORK/cache" --output_dir "$WORK/run" 2>&1 | tr '\r' '\n' \
   | awk '!/step\/s|s\/step/ || /\| *[0-9]*5\/|100%/' \
   | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "train: exit $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
for f in run.yaml metrics.jsonl eval_curve.jsonl; do
  [[ -f "$WORK/run/$f" ]] && cp "$WORK/run/$f" "$RES/"
done

# ---------------------------------------------------------------- 4. the summary: loss, and near vs far positions
python3 - "$RES" <<'EOF' | tee "$RES/summary.txt"
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
read = lambda f: [json.loads(l) for l in (res / f).read_text().splitlines() if l.strip()] if (res / f).exists() else []
card, metrics, curve = json.loads((res / "data_card.json").read_text()), read("metrics.jsonl"), read("eval_curve.jsonl")
train = [m for m in metrics if "loss" in m]
print(f"corpus: Python {card['python']} stdlib, {sum(card['documents'].values())} documents "
      f"({card['documents']['eval']} held out), {sum(card['tokens'].values()):,} tokens, "
      f"longest {card['longest']['name']} "
      f"({card['longest']['tokens']:,}), prepared in {card['seconds']['total']:.0f} s")
if train:
    steady = [m["seconds"] for m in train[len(train) // 4:]] or [train[-1]["seconds"]]
    print(f"train: {len(train)} steps, loss {train[0]['loss']:.3f} -> {train[-1]['loss']:.3f}, "
          f"{sorted(steady)[len(steady) // 2]:.3f} s/step (median after the first quarter), "
          f"peak GPU {max(m['peak_gpu_bytes'] for m in train) / 2**30:.1f} GiB, "
          f"skipped rows {train[-1]['skipped_rows']}")
print(f"{'step':>5} {'eval loss':>9} {'first bucket':>12} {'last bucket':>11} {'near half':>9} {'far half':>8} "
      f"{'far - near':>10}")
for c in curve:
    loss = [x for x in c["loss"] if x is not None]
    half = len(loss) // 2
    near, far = sum(loss[:half]) / half, sum(loss[half:]) / (len(loss) - half)
    print(f"{c['step']:>5} {c['eval_loss']:>9.3f} {loss[0]:>12.3f} {loss[-1]:>11.3f} {near:>9.3f} {far:>8.3f} "
          f"{far - near:>+10.3f}")
EOF
exit "$rc"
