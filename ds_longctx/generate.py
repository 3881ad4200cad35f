"""`python -m ds_longctx.generate`: the config generator (`ds_longctx.plan.generate`)."""

import sys

from ds_longctx.plan.generate import main

if __name__ == "__main__":
    sys.exit(main())
