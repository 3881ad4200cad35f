"""The reference model of dpo and grpo (train.ref_model, a HF directory): checked against the policy
before any work (`ref_model_problem`), named with a digest beside the stored reference log-probs
(`ref_signature`), and its weights swapped into the engine's model for the reference pass, the
starting weights put back after (`reference_weights`).

    if why := ref_model_problem(cfg, hf_cfg): refuse(why)
    # ref_model None: the starting weights as they are
    with reference_weights(engine.module.model, cfg.train.ref_model):
        ...the reference pass...

The swap needs the policy's architecture (the same parameter names and shapes); each rank keeps a
CPU copy of its own ZeRO-3 partition of the starting weights meanwhile. Design notes:
docs/design/run.md.
"""

from __future__ import annotations

# transformers, safetensors and deepspeed are imported where weights are read.
import contextlib
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from ds_longctx.levers.lora import is_adapter
from ds_longctx.run.model import load_hf_config, weights_problem

if TYPE_CHECKING:
    from ds_longctx.config import RunConfig

log = logging.getLogger("ds_longctx")

SAMPLE = 64 * 1024  # bytes of each weight file's start and end in the reference's digest
SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def _vocab(tok_dir: str) -> Optional[dict]:
    """The token -> id map of a tokenizer directory (None: it holds none)."""
    d = Path(tok_dir)
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d), trust_remote_code=False).get_vocab()


def ref_model_problem(cfg: RunConfig, policy_cfg) -> Optional[str]:
    """Why train.ref_model cannot be the run's reference (None: it can, or it is unset): not a model
    directory, another architecture (the keys that differ) or another vocabulary than the policy's
    (naming both)."""
    ref = cfg.train.ref_model
    if ref is None:
        return None
    if not (Path(ref) / "config.json").is_file():
        return f"ref_model={ref!r} is not a HF model directory (no config.json); give the directory"
    if why := weights_problem(ref):
        return f"ref_model: {why}"
    ref_cfg = load_hf_config(ref)
    policy = policy_cfg.get_text_config()
    odd = [
        f"{k} {getattr(ref_cfg, k, None)} (the policy's {getattr(policy, k, None)})"
        for k in SHAPE_KEYS
        if getattr(ref_cfg, k, None) != getattr(policy, k, None)
    ]
    if odd:
        return (
            f"ref_model={ref!r} differs from model={cfg.model.name!r}: {', '.join(odd)}; the "
            "reference pass "
            "runs the reference's weights in the policy's engine, so it takes the policy's "
            f"architecture and vocabulary"
        )
    tok = cfg.data.tokenizer
    if tok is not None and (theirs := _vocab(ref)) is not None and theirs != _vocab(tok):
        return (
            f"ref_model={ref!r} holds a tokenizer whose vocabulary differs from tokenizer={tok!r}; "
            f"give a reference trained with the policy's tokenizer"
        )
    return None


def _weight_files(d: Path) -> list:
    return sorted(d.glob("*.safetensors")) or sorted(d.glob("pytorch_model*.bin"))


def ref_signature(ref: Optional[str]) -> dict:
    """What names the reference: its path and a digest of its config.json and, of each weight file,
    its name, size, safetensors header (tensor names, shapes, dtypes) and first and last 64 KiB of
    data (other weights of the same shapes differ there); {"ref_model": None} for the starting
    weights."""
    if ref is None:
        return {"ref_model": None}
    d, h = Path(ref), hashlib.sha256()
    h.update((d / "config.json").read_bytes())
    for f in _weight_files(d):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(SAMPLE))
            fh.seek(max(size - SAMPLE, 0))
            h.update(fh.read(SAMPLE))
    return {"ref_model": str(d), "digest": h.hexdigest()[:16]}


def _ref_tensors(d: Path):
    """(name, tensor) of every weight of a HF directory, one file at a time."""
    for f in _weight_files(d):
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    yield k, fh.get_tensor(k)
        else:
            yield from torch.load(f, map_location="cpu", weights_only=True).items()


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's own data of a parameter: its ZeRO-3 partition, or the whole tensor."""
    return p.ds_tensor if hasattr(p, "ds_tensor") else p.data


def _load(model, ref: Path) -> None:
    """Copy the reference's weights into `model` (names as HF saves them; a tied lm_head may be
    absent)."""
    import deepspeed

    params = {  # under LoRA, PEFT's wrapper holds the base weight as `<linear>.base_layer.weight`
        n.replace(".base_layer.", "."): p for n, p in model.named_parameters() if not is_adapter(n)
    }
    seen = set()
    for name, t in _ref_tensors(ref):
        p = params.get(name)
        if p is None:
            continue
        shape = tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)
        if tuple(t.shape) != shape:
            raise ValueError(
                f"ref_model {ref}: {name} has shape {tuple(t.shape)}, the policy's {shape}"
            )
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0, enabled=hasattr(p, "ds_id")):
            with torch.no_grad():
                p.copy_(t.to(p.dtype))
        seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"ref_model {ref} lacks {len(missing)} weights, e.g. {missing[:3]}")


@contextlib.contextmanager
def reference_weights(model, ref: Optional[str]):
    """Within: `model` holds the reference's weights (`ref` None: unchanged); after, each rank's
    starting partition is copied back exactly. LoRA adapters are not swapped (lora_init zero_b: they
    add nothing at start)."""
    if ref is None:
        yield
        return
    kept = {n: _copies(p) for n, p in model.named_parameters()}
    try:
        _load(model, Path(ref))
        log.info("reference pass: the weights of ref_model=%s", ref)
        yield
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                local, whole = kept[n]
                _local(p).copy_(local)
                if whole is not None:
                    p.data.copy_(whole)


def _copies(p: torch.Tensor) -> tuple:
    """CPU copies of a parameter's partition and, where ZeRO-3 holds it whole too (a persistent
    one), the whole."""
    whole = p.data if hasattr(p, "ds_tensor") and p.data.numel() else None
    return (
        _local(p).detach().to("cpu", copy=True),
        None if whole is None else whole.detach().to("cpu", copy=True),
    )


def signature_json(data_signature: dict, ref: Optional[str]) -> str:
    """The stored signature of reference log-probs: the data's and the reference's."""
    return json.dumps({**data_signature, "reference": ref_signature(ref)}, sort_keys=True)
