"""`python -m ds_longctx.train`: the per-process training entry (ds_longctx.run.train; the loop:
run/train_loop.py)."""

from ds_longctx.run.train import main

if __name__ == "__main__":
    main()
