"""`python -m ds_longctx.generate`: the old spelling of `python -m ds_longctx.plan` (the config
writer, `ds_longctx.plan.write`)."""

import sys

from ds_longctx.plan.write import main

if __name__ == "__main__":
    sys.exit(main())
