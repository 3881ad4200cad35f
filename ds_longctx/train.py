"""`python -m ds_longctx.train`: the per-process training entry (the loop is `ds_longctx.run.train`)."""

from ds_longctx.run.train import main

if __name__ == "__main__":
    main()
