"""The fields of an HF config.json read as transformers' config classes read them (no torch): a
missing key takes its family's default, a null is derived or refused as transformers does, a flag is
a JSON boolean.

    # absent: 32, Qwen3Config's default
    kv = field(cfg, "qwen3", "num_key_value_heads", heads, where)
    # 4096 where the key is absent; None: no window
    window = sliding_window(cfg, "mistral", layers, where)

tests/plan/test_hf_fields.py holds every default here to the installed transformers' config classes.
"""

from __future__ import annotations

from typing import Optional

from ds_longctx import families
from ds_longctx.parallel import kernel_rules

FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")


def field(cfg: dict, family: str, key: str, fallback, where: str):
    """`cfg[key]` as transformers reads it for `family`; the value is not checked."""
    fam = families.of(family)
    if key not in cfg:
        return fam.defaults.get(key, fallback) if fam else fallback
    if cfg[key] is None:
        if fam and key in fam.null_is_fallback:
            return fallback
        raise ValueError(
            f"{where}: {key} is null, which transformers' {family} config cannot build; give it as "
            f"a whole number >= 1, or leave the key out for its default (fix the config)"
        )
    return cfg[key]


def with_old_names(cfg: dict, family: str) -> dict:
    """`cfg` with each renamed key of `family` (families.py) under the planner's name too."""
    fam = families.of(family)
    renamed = {
        old: cfg[new]
        for old, new in (fam.renamed if fam else {}).items()
        if old not in cfg and new in cfg
    }
    return {**cfg, **renamed} if renamed else cfg


def flag(cfg: dict, key: str, where: str) -> bool:
    """A boolean key (absent or null: false); anything else is refused."""
    v = cfg.get(key)
    if v is not None and not isinstance(v, bool):
        raise ValueError(
            f"{where}: {key} = {v!r} is not a JSON boolean; write true or false, unquoted (fix the "
            f"config)"
        )
    return bool(v)


MAX_LAYERS = 10_000  # the plan holds one entry per layer


def check_layer_count(layers: int, where: str) -> int:
    """`layers`, refused past MAX_LAYERS."""
    if layers > MAX_LAYERS:
        raise ValueError(
            f"{where}: num_hidden_layers = {layers:,} is past {MAX_LAYERS:,}, more layers than any "
            f"model the planner lays out (published ones have about 100); fix the config"
        )
    return layers


def check_layer_types(cfg: dict, layers: int, where: str) -> None:
    """Refuse a `layer_types` that is not a list of one name per layer."""
    kinds = cfg.get("layer_types")
    if kinds is not None and not (
        isinstance(kinds, list) and len(kinds) == layers and all(isinstance(k, str) for k in kinds)
    ):
        raise ValueError(
            f"{where}: layer_types = {kinds!r:.80} is not a list of num_hidden_layers={layers} "
            "names, "
            f'one per layer (e.g. "full_attention"); fix the config'
        )


def sliding_window(cfg: dict, family: str, layers: int, where: str) -> Optional[int]:
    """The window (tokens) transformers' attention applies to some or all layers of this dense
    config, or None. Layer kinds other than full and sliding attention are refused."""
    use = flag(cfg, "use_sliding_window", where)
    kinds = set(kernel_rules.layer_types(cfg)) if cfg.get("layer_types") else set()
    rule = families.FAMILIES[family].window_rule
    if rule == families.WINDOW_FROM_LAYER and use and not kinds:
        start = cfg.get("max_window_layers", families.FAMILIES[family].max_window_layers)
        if isinstance(start, bool) or not isinstance(start, int):
            raise ValueError(
                f"{where}: max_window_layers = {start!r} is not a whole number (fix the config)"
            )
        kinds = {kernel_rules.SLIDING_ATTENTION} if layers > start else set()
    if not kinds <= {*kernel_rules.LAYER_KINDS, kernel_rules.SLIDING_ATTENTION}:
        raise ValueError(
            f"{where}: layer types {sorted(kinds | {kernel_rules.FULL_ATTENTION})}: ds_longctx "
            "runs full causal attention (and gated DeltaNet) layers; give full_attention for every "
            f"layer in layer_types"
        )
    sliding = kernel_rules.SLIDING_ATTENTION in kinds
    if not (sliding or rule == families.WINDOW_ALWAYS or (rule == families.WINDOW_FLAG and use)):
        return None
    defaults = families.FAMILIES[family].defaults
    window = cfg.get("sliding_window", defaults.get("sliding_window", 4096))
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(
            f"{where}: sliding_window = {window!r} is not a positive integer or null (fix the "
            "config)"
        )
    return window


def window_problem(name: str, window: Optional[int], seq_len: Optional[int]) -> Optional[str]:
    """Why `seq_len` tokens (None: any length) cannot train a model with a `window`, or None."""
    if window is None or (seq_len is not None and seq_len <= window):
        return None
    at = f"past {window:,} tokens" if seq_len is None else f"at seq_len={seq_len:,} > {window:,}"
    return (
        f"model {name} attends within a sliding window of {window:,} tokens in some or all layers "
        "(its config's "
        "sliding_window, 4096 where the key is absent: Mistral's every layer, Qwen's with "
        "use_sliding_window), "
        f"and ds_longctx's attention is full causal, the same only within the window: {at} it "
        "would train unlike "
        f'its config. Set "sliding_window": null in its config.json to train it with full attention'
        + ("" if seq_len is None else f", or use seq_len <= {window:,}")
    )


SCALED_ROPES = ("linear", "dynamic", "yarn", "llama3")  # scaled by `factor`


def rope_parameters(cfg: dict, where: str) -> dict:
    """The config's RoPE (rope_scaling, else rope_parameters) with its rope_type, checked."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(
            f"{where}: rope_parameters / rope_scaling = {rope!r} is not a JSON object; an HF "
            f'config.json gives it as {{"rope_type": ..., ...}} or null (fix the config)'
        )
    rope = dict(rope, rope_type=rope.get("rope_type") or rope.get("type") or "default")
    factor, orig = rope.get("factor"), rope.get("original_max_position_embeddings", 1)
    if rope["rope_type"] in SCALED_ROPES and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1
    ):
        raise ValueError(
            f"{where}: rope_type {rope['rope_type']!r} with factor = {factor!r}: give its scaling "
            'factor as a number >= 1 (e.g. "factor": 4.0), or drop the rope scaling (fix the '
            "config)"
        )
    if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
        raise ValueError(
            f"{where}: rope original_max_position_embeddings = {orig!r} is not a positive integer "
            f"(fix the config)"
        )
    return rope
