"""YaRN RoPE scaling: choose the factor for a target length and set it on the HF config before the
model is built.

Design notes: docs/design/levers.md, section `rope.py`.
"""

from __future__ import annotations

# torch and transformers are imported lazily: `ds-longctx plan` imports this module without them.
import copy
import logging
import math
from typing import Optional, Union

from ds_longctx import families

log = logging.getLogger("ds_longctx")

FACTOR_STEP = 8  # F is rounded up to a multiple of 1 / FACTOR_STEP
MODES = ("auto", "none", "yarn")
_YARN_REQUIRED = ("rope_type", "factor", "original_max_position_embeddings")
# Kept from a config's existing rope parameters when we recompute YaRN for it (the factor is ours).
_CARRIED_KEYS = (
    "partial_rotary_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "mrope_section",
    "mrope_interleaved",
)  # the last two: Qwen3.5's (its rotary embedding reads them)


def _rope_params(hf_config) -> dict:
    rp = getattr(hf_config, "rope_parameters", None) or {}
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError(
            f"rope_parameters of {type(hf_config).__name__} are per layer type "
            f"({sorted(rp)}); YaRN scaling here supports one global RoPE only"
        )
    return rp


def _rope_theta(hf_config) -> float:
    theta = _rope_params(hf_config).get("rope_theta") or getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise ValueError(
            f"{type(hf_config).__name__} has no rope_theta (neither in rope_parameters nor as an "
            "attribute); set config.rope_parameters['rope_theta'] to the model's RoPE base"
        )
    return float(theta)


def trained_context(hf_config) -> int:
    """YaRN's O for this model (the rule in the module doc): an existing YaRN's original length, a
    publisher's documented one (families.py), else max_position_embeddings."""
    return trained_context_of(
        getattr(hf_config, "model_type", None),
        int(hf_config.max_position_embeddings),
        _rope_params(hf_config),
    )


def trained_context_of(model_type: Optional[str], max_position_embeddings: int, rope: dict) -> int:
    """`trained_context` from a model's fields (pure: the planner asks it of a config.json)."""
    if rope.get("rope_type") == "yarn" and rope.get("original_max_position_embeddings"):
        return int(rope["original_max_position_embeddings"])
    return original_context(model_type, max_position_embeddings)


def yarn_problem(rope_type: Optional[str]) -> Optional[str]:
    """Why YaRN cannot be set from seq_len over this RoPE (rope_scaling auto / yarn), or None. More:
    docs/design/levers.md."""
    if (rope_type or "default") in ("default", "yarn"):
        return None
    return (
        f"already uses rope_type={rope_type!r}; YaRN on top of it is not defined here: pass an "
        "explicit rope_parameters dict, or rope_scaling='none'"
    )


def rope_problem(
    name: str, rope_type: Optional[str], trained: int, seq_len: int, mode: Union[str, dict] = "auto"
) -> Optional[str]:
    """Why rope_scaling `mode` cannot train model `name` at seq_len, or None. More:
    docs/design/levers.md."""
    if isinstance(mode, dict) or mode == "none" or (mode == "auto" and seq_len <= trained):
        return None
    if yarn_problem(rope_type) is None:
        return None
    own = f"its config's own RoPE scaling (rope_type={rope_type!r}), which YaRN does not stack on"
    if mode == "yarn":
        return (
            f"model {name}: rope_scaling='yarn' sets YaRN over {own}; use rope_scaling 'auto' "
            f"(seq_len <= {trained:,}), 'none', or an explicit rope_parameters dict"
        )
    return (
        f"model {name}: seq_len={seq_len:,} is past its trained context {trained:,}, where "
        "rope_scaling 'auto' "
        f"sets YaRN over {own}; use seq_len <= {trained:,}, or set model.rope_scaling to 'none' "
        f"(positions past {trained:,} untrained) or an explicit rope_parameters dict"
    )


def yarn_factor(seq_len: int, original: int) -> float:
    """F = seq_len / O rounded up to a multiple of 1 / FACTOR_STEP (the module doc), in exact
    integers."""
    return -(-seq_len * FACTOR_STEP // original) / FACTOR_STEP


def original_context(model_type: Optional[str], max_position_embeddings: int) -> int:
    """O for a model not yet scaled: its publisher's documented YaRN context, else
    max_position_embeddings (pure: the planner asks it without torch or transformers)."""
    fam = families.of(model_type)
    published = fam.published_original if fam else {}
    return published.get(max_position_embeddings, max_position_embeddings)


def _check_seq_len(seq_len) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(
            f"seq_len={seq_len!r} must be a positive int (the training sequence length in tokens)"
        )


def yarn_rope_parameters(
    hf_config, seq_len: int, original_max_position_embeddings: Optional[int] = None
) -> Optional[dict]:
    """The `rope_parameters` dict for YaRN at `seq_len`, or None when seq_len <= the trained context
    O.

    O = `original_max_position_embeddings` if given, else `trained_context(hf_config)`;
    factor = seq_len / O rounded up to a multiple of 1/8; rope_theta is the model's own.
    """
    _check_seq_len(seq_len)
    orig = original_max_position_embeddings or trained_context(hf_config)
    if not isinstance(orig, int) or orig < 1:
        raise ValueError(
            f"original_max_position_embeddings={orig!r} must be a positive int "
            "(the context the model was trained at, e.g. 32768 for Qwen3)"
        )
    if seq_len <= orig:
        return None
    rp = _rope_params(hf_config)
    if problem := yarn_problem(rp.get("rope_type")):
        raise ValueError(f"{type(hf_config).__name__} {problem}")
    factor = yarn_factor(seq_len, orig)
    carried = {k: rp[k] for k in _CARRIED_KEYS if k in rp}
    return {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": orig,
        "rope_theta": _rope_theta(hf_config),
        **carried,
    }


def _validated(params: dict, hf_config, seq_len: int) -> dict:
    """An explicit rope_parameters dict, checked, with the model's rope_theta filled in if
    missing."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if not isinstance(params.get("rope_type"), str):
        raise ValueError(
            f"rope_parameters={params!r} has no 'rope_type'; e.g. {{'rope_type': 'yarn', 'factor': "
            "4.0, 'original_max_position_embeddings': 32768}}"
        )
    rope_type = params["rope_type"]
    known = ("default", *ROPE_INIT_FUNCTIONS)
    if rope_type not in known:
        raise ValueError(
            f"rope_parameters rope_type={rope_type!r} is not one transformers knows; use one of "
            f"{known}"
        )
    if rope_type == "yarn":
        missing = [k for k in _YARN_REQUIRED if k not in params]
        if missing:
            raise ValueError(
                f"YaRN rope_parameters={params!r} is missing {missing}; give all of "
                f"{list(_YARN_REQUIRED)}, e.g. factor={seq_len / trained_context(hf_config):.3f} "
                f"and original_max_position_embeddings={trained_context(hf_config)} for "
                f"seq_len={seq_len}"
            )
        orig = params["original_max_position_embeddings"]
        if not isinstance(orig, int) or orig < 1:
            raise ValueError(
                f"rope_parameters original_max_position_embeddings={orig!r} must be a positive int"
            )
    factor = params.get("factor")
    if factor is not None and (not isinstance(factor, (int, float)) or factor < 1):
        raise ValueError(
            f"rope_parameters factor={factor!r} must be a number >= 1 (a factor < 1 compresses the "
            f"trained context); for seq_len={seq_len} use factor = seq_len / "
            f"original_max_position_embeddings, or mode='none' to leave RoPE unscaled"
        )
    out = copy.deepcopy(params)
    if rope_type == "yarn":
        out["factor"] = float(factor)
        if factor * out["original_max_position_embeddings"] < seq_len:
            log.warning(
                "rope: YaRN factor %s x original_max_position_embeddings %d = %d covers less than "
                "seq_len=%d; positions past it are out of distribution",
                factor,
                out["original_max_position_embeddings"],
                factor * out["original_max_position_embeddings"],
                seq_len,
            )
    out.setdefault("rope_theta", _rope_theta(hf_config))
    return out


def apply_rope_scaling(
    hf_config,
    seq_len: int,
    mode: Union[str, dict] = "auto",
    original_max_position_embeddings: Optional[int] = None,
) -> Optional[dict]:
    """Set `hf_config.rope_parameters` (and max_position_embeddings >= seq_len) for training at
    `seq_len`.

    Notes: docs/design/levers.md, `rope.py`.
    """
    _check_seq_len(seq_len)
    trained = original_max_position_embeddings or trained_context(hf_config)
    if isinstance(mode, dict):
        params, why = _validated(mode, hf_config, seq_len), "explicit rope_parameters"
    elif mode == "none":
        if seq_len > trained:
            log.warning(
                "rope: rope_scaling='none' but seq_len=%d exceeds the trained context %d: "
                "positions past "
                "%d are out of distribution and quality will suffer; use rope_scaling='auto' "
                "(YaRN) unless this is deliberate",
                seq_len,
                trained,
                trained,
            )
        return None
    elif mode in ("auto", "yarn"):
        params = yarn_rope_parameters(hf_config, seq_len, original_max_position_embeddings)
        if params is None and mode == "auto":
            log.info("rope: unchanged (seq_len=%d fits the trained context %d)", seq_len, trained)
            return None
        if params is None:
            params = {
                "rope_type": "yarn",
                "factor": 1.0,
                "original_max_position_embeddings": trained,
                "rope_theta": _rope_theta(hf_config),
            }
            why = (
                f"rope_scaling='yarn' asked for; seq_len={seq_len} fits the trained context "
                f"{trained}"
            )
        else:
            why = f"seq_len={seq_len} exceeds the trained context {trained}"
    else:
        raise ValueError(
            f"rope_scaling mode={mode!r} is not one of {MODES} or a rope_parameters dict"
        )

    old_max = int(hf_config.max_position_embeddings)
    covered = (
        math.ceil(params["factor"] * params["original_max_position_embeddings"])
        if params["rope_type"] == "yarn"
        else 0
    )
    hf_config.rope_parameters = params
    hf_config.max_position_embeddings = max(old_max, seq_len, covered)
    if getattr(hf_config, "head_dim", 0) is None:  # transformers 5.17 YaRN reads it undefaulted
        hf_config.head_dim = hf_config.hidden_size // hf_config.num_attention_heads
    log.info(
        "rope: %s factor %s (original_max_position_embeddings=%s, rope_theta=%g): %s; "
        "max_position_embeddings %d -> %d",
        params["rope_type"],
        params.get("factor"),
        params.get("original_max_position_embeddings"),
        params["rope_theta"],
        why,
        old_max,
        hf_config.max_position_embeddings,
    )
    return params


def yarn_inv_freq(
    head_dim: int,
    rope_theta: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
) -> tuple:
    """YaRN inverse frequencies [d/2] (fp32) and the attention factor sqrt(1/t), from the paper (see
    module doc)."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(
            f"head_dim={head_dim} must be even and >= 2 (RoPE rotates pairs of dimensions)"
        )
    if factor < 1:
        raise ValueError(
            f"factor={factor} must be >= 1; YaRN stretches the trained context, it does not shrink "
            "it"
        )
    import torch  # here, not at the top: the planner imports this module's rule without torch

    orig, base = original_max_position_embeddings, float(rope_theta)
    i = torch.arange(head_dim // 2, dtype=torch.float64)  # frequency index, [d/2]
    theta = base ** (-2.0 * i / head_dim)  # theta_i, [d/2]

    def dim_at(
        rotations: float,
    ) -> float:  # the (fractional) index i where r_i = O theta_i / 2pi == rotations
        return head_dim * math.log(orig / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(dim_at(beta_fast)), 0)  # below: r > beta_fast, keep theta_i
    high = min(math.ceil(dim_at(beta_slow)), head_dim - 1)  # above: r < beta_slow, theta_i / F
    if high == low:
        high += 0.001
    blend = ((i - low) / (high - low)).clamp(0.0, 1.0)  # 0 keeps theta_i, 1 interpolates, [d/2]
    inv_freq = theta * (1 - blend) + (theta / factor) * blend
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq.to(torch.float32), attention_factor
