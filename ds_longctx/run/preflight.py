"""Every check of a run that reads no dataset and starts nothing: called by each rank before the process group.

    hf_config, resume_meta = preflight(cfg, world_size)   # raises ValueError naming the value and the fix

Order: the engine's own checks (sp_size vs world and heads, attention backend, model class), the RoPE
coverage at seq_len, the data source (path, file sniffing, tokenizer vs vocabulary, packing support), then
output_dir and resume (checkpoint.check_run_dir). Nothing is written: a refused run leaves no output.
"""

from __future__ import annotations

import copy
import logging

from ds_longctx.run import checkpoint

from ds_longctx import data
from ds_longctx.run.engine import validate

log = logging.getLogger("ds_longctx")


def rope_coverage(cfg, hf_config) -> None:
    """Refuse a seq_len beyond the positions YaRN is set for (an explicit rope_parameters dict, or a checkpoint
    that already carries YaRN with rope_scaling='none'). Works on a copy: the engine applies it itself."""
    from ds_longctx.levers.rope import apply_rope_scaling
    hf = copy.deepcopy(hf_config)
    quiet = log.disabled
    log.disabled = True
    try:
        apply_rope_scaling(hf, cfg.seq_len, cfg.rope_scaling,
                           original_max_position_embeddings=32768 if hf.model_type == "qwen3" and
                           hf.max_position_embeddings == 40960 else None)
    finally:
        log.disabled = quiet
    rp = getattr(hf, "rope_parameters", None) or {}
    if rp.get("rope_type") == "yarn":
        covered = float(rp["factor"]) * int(rp["original_max_position_embeddings"])
        if covered < cfg.seq_len:
            need = cfg.seq_len / int(rp["original_max_position_embeddings"])
            raise ValueError(f"seq_len={cfg.seq_len} is beyond what YaRN is set for: factor {rp['factor']} x "
                             f"original_max_position_embeddings {rp['original_max_position_embeddings']} = "
                             f"{int(covered)} positions; use factor >= {need:g} in rope_scaling, "
                             f"rope_scaling: auto (sets it from seq_len), or seq_len <= {int(covered)}")


def preflight(cfg, world_size: int):
    """(HF config, checkpoint meta to resume from or None). Raises ValueError on bad input."""
    hf_cfg = validate(cfg, world_size)
    rope_coverage(cfg, hf_cfg)
    data.check_data_source(cfg, hf_cfg.get_text_config().vocab_size)
    meta = checkpoint.check_run_dir(cfg, world_size)
    return hf_cfg, meta
