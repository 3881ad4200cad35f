"""Checkpoints and the run directory: layout and load rule (layout.py), saves, loads, digests, RNG,
the writer's lock, and the commands that read a checkpoint outside a run. It imports no module of
run/."""
