"""`ds-longctx rehearse`: one GPU plays ranks of a config's world, built and stepped through run/'s
own code (rehearse.py: the command; rank.py: one rank; world.py: what both read; layer_clock.py:
per-layer figures;
layer_pick.py: which layers run)."""
