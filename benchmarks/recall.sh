#!/bin/bash
# Issue 56's GPU run: does fine-tuning a real model (SmolLM2-135M-Instruct) on long agent sessions make it recall
# facts read far back? Recall exact match and the answer loss with and without the evidence, per answer-to-evidence
# distance bucket, for the base model and while it trains. Run from the repo root on one GPU.
#
#   1. the sessions, in the model's own tokenizer (`data prepare --sessions --tokenizer MODEL`), each fitting one row
#      of SEQ_LEN (MAX_TOKENS = SEQ_LEN - 64: room for the EOS training appends), answer-to-evidence distances from
#      ~1k to ~64k tokens at the defaults; or SESSIONS=DIR prepared earlier with the same options (deterministic from
#      its seed: prepare it off the device and carry it). The first EVAL_ROWS sessions are held out, the rest trained.
#      MIN_TOKENS above SEQ_LEN / 2 keeps two sessions out of one packed row (each eval row is one session).
#      Size: 4 sessions of 34,556 to 57,281 tokens (30 answers: 3 at 0-1k, 4 at 1k-4k, 9 at 4k-16k, 14 at 16k-64k)
#      took 12 s on 2 shared cores and 660 KB (3.8 bytes a token); the default 128 are ~6M tokens, ~23 MB, ~7 min:
#        python3 -m ds_longctx.cli data prepare --sessions 128 --out sessions --tokenizer MODEL --max_tokens 65472
#   2. the base model as it is (MODEL: a `ds-longctx models get smollm2-135m-instruct --out DIR` directory), scored
#      by `ds-longctx eval --model MODEL --recall true` at SEQ_LEN (YaRN from its 8,192 trained positions, as
#      training sets it): stage base, step 0
#   3. training: STEPS steps at SEQ_LEN (`pack` layout: one session a row), with recall rows of the held-out
#      sessions before step 1, every EVAL_EVERY steps and at the end (--eval_recall true): stage trained
# Every recall row goes to $RES/recall.jsonl (notebooks/recall.ipynb plots it: RECALL_FILE=$RES/recall.jsonl), each
# answer to $RES/recall_answers.jsonl; also log.txt, data_card.md, run.yaml, metrics.jsonl, eval_curve.jsonl,
# answer_loss.jsonl, answer_loss_answers.jsonl. Each phase prints its seconds.
#
# Knobs (env): MODEL (required), SEQ_LEN (65536), STEPS (300), EVAL_EVERY (STEPS/2: start, middle, end), EVAL_ROWS (8),
# LR (1e-4), WARMUP (10), DTYPE (bf16), SESSIONS, N_SESSIONS (128), MIN_TOKENS (32768), MAX_TOKENS (SEQ_LEN - 64),
# SEED (0), WORK (/tmp/recall), DS_LONGCTX_COMMIT (the rows' commit; default `git describe --dirty`: set it where the
# copy has no .git, as on the device).
#
# On CPU, the check that it runs: 23 min on 2 shared cores (sessions 25 s, base 310 s, 2 steps with 3 recall
# evaluations 1,047 s; benchmarks/results/sessions/2026-12-06/recall_cpu has what it wrote):
#   MODEL=/work/cache/smollm2-135m-instruct SEQ_LEN=4096 STEPS=2 EVAL_ROWS=2 N_SESSIONS=4 MIN_TOKENS=2048 \
#   MAX_TOKENS=4000 SEED=2 DTYPE=fp32 RES=/tmp/recall_cpu bash benchmarks/recall.sh
set -euo pipefail
RES=${RES:-${OUT:?set OUT or RES}}
MODEL=${MODEL:?set MODEL to a model directory, e.g. from ds-longctx models get smollm2-135m-instruct --out DIR}
WORK=${WORK:-/tmp/recall}
SEQ_LEN=${SEQ_LEN:-65536} STEPS=${STEPS:-300} EVAL_ROWS=${EVAL_ROWS:-8} LR=${LR:-1e-4} WARMUP=${WARMUP:-10}
EVAL_EVERY=${EVAL_EVERY:-$((STEPS / 2))} DTYPE=${DTYPE:-bf16}
mkdir -p "$RES" "$WORK"
LOG="$RES/log.txt"
# the rows' commit: the checkout's, -dirty with uncommitted changes (DS_LONGCTX_COMMIT names it where .git is absent)
export PYTHONUNBUFFERED=1 DS_LONGCTX_COMMIT=${DS_LONGCTX_COMMIT:-$(git describe --always --dirty --abbrev=7 2>/dev/null || echo '?')}
echo "recall: $(date -u +%FT%TZ) commit $DS_LONGCTX_COMMIT model $MODEL seq_len $SEQ_LEN steps $STEPS lr $LR" \
     "eval every $EVAL_EVERY ($EVAL_ROWS sessions)" | tee -a "$LOG"
# each line as it comes (carriage returns end lines too), tqdm's progress bars left out
quiet() { awk -v RS='[\r\n]+' '!/^[[:space:]]*$|\/s[],]/ {print; fflush()}' | tee -a "$LOG"; }

# ---------------------------------------------------------------- 1. the sessions, in the model's tokenizer
t0=$SECONDS
if [[ -z ${SESSIONS:-} ]]; then
  SESSIONS=$WORK/sessions
  rm -rf "$SESSIONS"
  python3 -m ds_longctx.cli data prepare --sessions "${N_SESSIONS:-128}" --out "$SESSIONS" --tokenizer "$MODEL" \
     --min_tokens "${MIN_TOKENS:-32768}" --max_tokens "${MAX_TOKENS:-$((SEQ_LEN - 64))}" --seed "${SEED:-0}" 2>&1 | quiet
fi
head -n "$EVAL_ROWS" "$SESSIONS/train.jsonl" > "$WORK/held_out.jsonl"
tail -n +"$((EVAL_ROWS + 1))" "$SESSIONS/train.jsonl" > "$WORK/train.jsonl"
cp "$SESSIONS/data_card.md" "$RES/"
echo "phase sessions: $SESSIONS, $(wc -l < "$WORK/train.jsonl") trained on, $EVAL_ROWS held out, $((SECONDS - t0)) s" \
  | tee -a "$LOG"
COMMON=(--dtype "$DTYPE" --seq_len "$SEQ_LEN" --tokenizer "$SESSIONS/tokenizer" --data_layout pack)

# ---------------------------------------------------------------- 2. the base model, as it is
t0=$SECONDS
rm -rf "$WORK/base"
python3 -m ds_longctx.cli eval --model "$MODEL" --data "$WORK/held_out.jsonl" --rows "$EVAL_ROWS" --recall true \
   --out "$WORK/base" "${COMMON[@]}" 2>&1 | quiet
cat "$WORK/base/recall.jsonl" >> "$RES/recall.jsonl"
cat "$WORK/base/recall_answers.jsonl" >> "$RES/recall_answers.jsonl"
echo "phase base: $((SECONDS - t0)) s" | tee -a "$LOG"

# ---------------------------------------------------------------- 3. train, with recall of the held-out sessions
t0=$SECONDS
rm -rf "$WORK/run"
set +e
python3 -m ds_longctx.cli train --nproc 1 --model "$MODEL" "${COMMON[@]}" --steps "$STEPS" --lr "$LR" \
   --warmup_steps "$WARMUP" --data "$WORK/train.jsonl" --data_cache_dir "$WORK/cache" \
   --eval_data "$WORK/held_out.jsonl" --eval_rows "$EVAL_ROWS" --eval_every "$EVAL_EVERY" --eval_answer_loss true \
   --eval_recall true --log_every 5 --report_to none --output_dir "$WORK/run" \
   2>&1 | awk -v RS='[\r\n]+' '!/step\/s|s\/step/ || /\| *[0-9]*5\/|100%/ {print; fflush()}' | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "phase train: exit $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
for f in run.yaml metrics.jsonl eval_curve.jsonl answer_loss.jsonl answer_loss_answers.jsonl; do
  [[ -f "$WORK/run/$f" ]] && cp "$WORK/run/$f" "$RES/"
done
[[ -f "$WORK/run/recall.jsonl" ]] && cat "$WORK/run/recall.jsonl" >> "$RES/recall.jsonl"
[[ -f "$WORK/run/recall_answers.jsonl" ]] && cat "$WORK/run/recall_answers.jsonl" >> "$RES/recall_answers.jsonl"
exit "$rc"
