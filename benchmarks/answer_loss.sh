#!/bin/bash
# Issue 40's GPU run: the loss on answer tokens by answer-to-evidence distance while the Qwen3-0.6B geometry (random
# init, the sessions' own tokenizer) trains on long agent sessions. Run from the repo root on one GPU.
#
#   1. the sessions: `data prepare --sessions` (tool results are stdlib files, answers quote facts read far back),
#      or SESSIONS=DIR of one already prepared (deterministic from its seed: prepare it off the device and carry it);
#      the first EVAL_ROWS sessions are held out, the rest trained on
#   2. the model: Qwen3-0.6B's geometry with the tokenizer's vocabulary (as benchmarks/stdlib_corpus.sh)
#   3. train at SEQ_LEN (sessions longer than it cut into windows, shorter ones packed, `pack` layout) for STEPS
#      steps; the held-out sessions forwarded whole before step 1 and every EVAL_EVERY steps: answer_loss.jsonl
#
# One H200 with the wheels installed (bash .whl/install.sh). At 131,072 tokens a step of one whole-row document takes
# ~12.4 s with every layer's attention output kept (CACHE=all; attention-bound: FlashAttention 4's forward and backward
# of 28 layers are ~10.7 s of it); packed session windows 10.2 s on average, so 100 steps, tokenizing and 3
# evaluations take ~21 min (sessions/session_2026-12-04_h200x1-20261204T2115/answer_loss_h200): start it detached and
# collect every call:
#   RES=/tmp/res/answer_loss RUN_DIR=/tmp/al launch/detach.sh bash benchmarks/answer_loss.sh
#   RUN_DIR=/tmp/al launch/wait.sh 540; tar czf $OUT/res.tgz -C /tmp/res answer_loss
# Knobs (env): STEPS (100), SEQ_LEN (131072), EVAL_EVERY (STEPS/2: start, middle, end), EVAL_ROWS (4), LR (5e-4),
# CACHE (all: memory.attention_cache_layers, so the checkpoints' recompute skips attention; 0 recomputes it),
# WARMUP (10), DTYPE (bf16), SESSIONS, N_SESSIONS (40), MIN_TOKENS (131072), MAX_TOKENS (262144),
# BASE_MODEL (qwen3-0.6b), WORK.
#
# On CPU, the check that it runs: BASE_MODEL=qwen3-tiny DTYPE=fp32 SEQ_LEN=2048 STEPS=4 N_SESSIONS=6 MIN_TOKENS=8192
# MAX_TOKENS=16384 RES=/tmp/al_cpu bash benchmarks/answer_loss.sh
# Writes to $RES: log.txt, data_card.md, model_config.json, run.yaml, metrics.jsonl, eval_curve.jsonl,
# answer_loss.jsonl, answer_loss_answers.jsonl; notebooks/answer_loss.ipynb plots the last (RUN_DIR=$RES).
set -euo pipefail
RES=${RES:-${OUT:?set OUT or RES}}
WORK=${WORK:-/tmp/answer_loss}
STEPS=${STEPS:-100} SEQ_LEN=${SEQ_LEN:-131072} EVAL_ROWS=${EVAL_ROWS:-4} LR=${LR:-5e-4} WARMUP=${WARMUP:-10}
EVAL_EVERY=${EVAL_EVERY:-$((STEPS / 2))} BASE_MODEL=${BASE_MODEL:-qwen3-0.6b} DTYPE=${DTYPE:-bf16}
mkdir -p "$RES" "$WORK"
LOG="$RES/log.txt"
COMMIT=${DS_LONGCTX_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}
echo "answer_loss: $(date -u +%FT%TZ) commit $COMMIT" \
     "base $BASE_MODEL seq_len $SEQ_LEN steps $STEPS lr $LR eval every $EVAL_EVERY ($EVAL_ROWS sessions)" | tee "$LOG"

# ---------------------------------------------------------------- 1. the sessions, held out and trained on
t0=$SECONDS
if [[ -z ${SESSIONS:-} ]]; then
  SESSIONS=$WORK/sessions
  rm -rf "$SESSIONS"
  python3 -m ds_longctx.cli data prepare --sessions "${N_SESSIONS:-40}" --out "$SESSIONS" \
     --min_tokens "${MIN_TOKENS:-131072}" --max_tokens "${MAX_TOKENS:-262144}" 2>&1 | tr '\r' '\n' \
     | grep -v -E '^\s*$|/s[],]' | tee -a "$LOG"
fi
head -n "$EVAL_ROWS" "$SESSIONS/train.jsonl" > "$WORK/held_out.jsonl"
tail -n +"$((EVAL_ROWS + 1))" "$SESSIONS/train.jsonl" > "$WORK/train.jsonl"
cp "$SESSIONS/data_card.md" "$RES/"
echo "sessions: $SESSIONS, $(wc -l < "$WORK/train.jsonl") trained on, $EVAL_ROWS held out, $((SECONDS - t0)) s" \
  | tee -a "$LOG"

# ---------------------------------------------------------------- 2. the model: BASE_MODEL, the tokenizer's vocabulary
python3 benchmarks/model_for_tokenizer.py "$BASE_MODEL" "$SESSIONS/tokenizer" "$WORK/model.json" | tee -a "$LOG"
cp "$WORK/model.json" "$RES/model_config.json"

# ---------------------------------------------------------------- 3. train, with the answer loss of the held-out
t0=$SECONDS
set +e
python3 -m ds_longctx.cli train --nproc 1 --model "$WORK/model.json" --dtype "$DTYPE" --seq_len "$SEQ_LEN" \
   --steps "$STEPS" --lr "$LR" --warmup_steps "$WARMUP" --data "$WORK/train.jsonl" --tokenizer "$SESSIONS/tokenizer" \
   --attention_cache_layers "${CACHE:-all}" \
   --data_layout pack --data_cache_dir "$WORK/cache" --eval_data "$WORK/held_out.jsonl" --eval_rows "$EVAL_ROWS" \
   --eval_every "$EVAL_EVERY" --eval_answer_loss true --log_every 5 --report_to none --output_dir "$WORK/run" \
   2>&1 | tr '\r' '\n' | awk '!/step\/s|s\/step/ || /\| *[0-9]*5\/|100%/' | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "train: exit $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
for f in run.yaml metrics.jsonl eval_curve.jsonl answer_loss.jsonl answer_loss_answers.jsonl; do
  [[ -f "$WORK/run/$f" ]] && cp "$WORK/run/$f" "$RES/"
done
exit "$rc"
