"""The run config in sections, one module per section beside this one (its owner named in its
docstring).

    from ds_longctx.config import RunConfig
    cfg = RunConfig.load("run.yaml")  # or RunConfig.from_cli(argv), RunConfig(seq_len=4096, ...)

Sections: model, train, data, parallel, kernels, memory, lora, optimizer, checkpoint, logging, eval
(`run.SECTIONS`). Keys are flat (`seq_len`), dotted (`train.seq_len`) or nested;
`RunConfig.help_text()` documents every field.
"""

from ds_longctx.config.errors import format_validation_error
from ds_longctx.config.keys import DOTTED, FLAT, SECTIONS
from ds_longctx.config.model import SHIPPED_MODELS_DIR, shipped_models
from ds_longctx.config.run import RunConfig

__all__ = [
    "DOTTED",
    "FLAT",
    "SECTIONS",
    "SHIPPED_MODELS_DIR",
    "RunConfig",
    "format_validation_error",
    "shipped_models",
]
