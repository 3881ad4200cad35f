"""`python -m ds_longctx.eval`: the per-process entry of `ds-longctx eval`
(`ds_longctx.run.eval_checkpoint`)."""

from ds_longctx.run.eval_checkpoint import main

if __name__ == "__main__":
    main()
