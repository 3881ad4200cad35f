"""Checkpoints and the run directory that holds them: its layout and which run may load a checkpoint (layout.py,
the one statement of both), saves, finding and loading one, the files' digests and weights-only loads, the paths kept
inside the run, each rank's RNG, the one writer's lock, and the commands that read a checkpoint outside a run
(`ds-longctx checkpoint convert`, `ds-longctx export`). It imports no module of run/: a run calls into it."""
