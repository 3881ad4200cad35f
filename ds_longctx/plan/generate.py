"""The config writer's old name: `ds_longctx.plan.write` is its home (`from ds_longctx.plan.generate
import main` keeps working)."""

from ds_longctx.plan.write import main  # noqa: F401
