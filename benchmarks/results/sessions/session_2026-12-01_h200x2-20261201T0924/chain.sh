# The device calls of this session, in order (nvidia-h200-x2; 30 device minutes).
# call 1, carry [".fa4a"]:
bash .fa4a/stage.sh; nvidia-smi -L; free -g | head -2
# call 2, carry [".whl", ".sdist", ".fa4b"]:
bash .whl/install.sh >/dev/null 2>&1 && bash .fa4b/install.sh >/dev/null 2>&1 && mkdir -p /tmp/snap && tar cf - --exclude=./.whl --exclude=./.sdist --exclude=./.fa4a --exclude=./.fa4b --exclude=./.git . | tar xf - -C /tmp/snap && cd /tmp/snap && export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/snap PYTHONUNBUFFERED=1; python3 -c "import flash_attn.cute, deepspeed; print('fa4 ok', deepspeed.__version__)"; GPUS=2 VALIDATE_PLANS=262144:64,262144:80 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01f.jsonl RES=/tmp/res RUN_DIR=/tmp/session launch/detach.sh bash benchmarks/gpu_session.sh b11b708 longest validate; sleep 540; ...; tar czf $OUT/res.tgz --exclude=books --exclude=cache --exclude='*.pickle' -C /tmp res session
# call 3: a loop until 'stage validate' appeared in /tmp/res/session.txt (the longest done), then the same tar
# call 4: the same loop for 'stage validate done' -- but the machine had gone back between calls 3 and 4 (more
#   than the 30 s idle release), so call 4 ran on a fresh machine with no /tmp/res: its 560 s found nothing and
#   the validate runs (262144:64 was in its build) were lost. Use launch/wait.sh, which exits 2 at once when its
#   RUN_DIR holds no job, and make the next call at once.
