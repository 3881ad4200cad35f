"""`python -m ds_longctx.plan`: `ds-longctx plan` (ds_longctx.plan.write), `--regen-all DIR`
rewrites the committed configs."""

import sys

from ds_longctx.plan.write import main

if __name__ == "__main__":
    sys.exit(main())
