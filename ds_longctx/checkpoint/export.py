"""DeepSpeed ZeRO-3 checkpoint -> a Hugging Face directory that `from_pretrained` loads.

    ds-longctx export --checkpoint runs/x [--tag step300] --out runs/x-hf \\
        [--dtype auto|fp32|bf16] [--merged]

`--checkpoint` is a run's output_dir (or its `checkpoints/` directory); the tag defaults to
`latest`. The fp32 master weights are gathered from every rank's partition with DeepSpeed's
`zero_to_fp32`, put into the model class of the config the engine built (saved in the checkpoint as
config.json: YaRN rope parameters of the training seq_len included), and written with
`save_pretrained` as safetensors, with the run's tokenizer when it had one (`--tokenizer`, else the
model directory's). dtype auto: the training dtype (bf16 on GPU, fp32 on CPU). The output appears
atomically: everything is written to `<out>.tmp-*` and renamed to `<out>` at the end. Before
anything is loaded every file of the checkpoint is checked (size, sha256, the globals its pickle
names: checkpoint/files.py), and every load is weights-only, zero_to_fp32's too: a checkpoint runs
no code. An --out that cannot be written (permissions, a read-only filesystem, a full disk: its free
space is checked first) is refused in one line naming it, the bytes needed and free, with nothing
left behind (parallel/disk.describe_os_error).

A LoRA run (lora_rank > 0) exports its adapter in PEFT's format instead (PEFT's own
`save_pretrained`):
    <out>/adapter_config.json, adapter_model.safetensors   `PeftModel.from_pretrained(base, <out>)`
    <out>/base/     the frozen base, only for a shipped geometry (its random init exists nowhere
                    else; its weights are the checkpoint's, i.e. the run's initial draw); the
                    adapter's base_model_name_or_path names this directory (absolute), else the
                    run's model directory
    <out>/merged/   with --merged: base + (alpha / r)·B·A folded into each Linear, a plain HF model
The adapter targets are the full module names the run adapted (levers/lora.target_names), so PEFT
wraps exactly those Linears again.
"""

from __future__ import annotations

# deepspeed, transformers, peft and safetensors are imported when an export runs, after its
# arguments are checked.
import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from ds_longctx.checkpoint import files, nvme_state
from ds_longctx.checkpoint.layout import CKPT_SUBDIR, LATEST, CheckpointError
from ds_longctx.checkpoint.paths import read_latest, tag_names
from ds_longctx.checkpoint.resume import find_checkpoint
from ds_longctx.config import FLAT
from ds_longctx.config.lora import LoraConfig
from ds_longctx.config.model import random_init
from ds_longctx.data.scan import DataError
from ds_longctx.data.tokenize import open_tokenizer, tokenizer_of
from ds_longctx.levers.lora import ADAPTER, is_adapter, model_linears, peft_config, target_names
from ds_longctx.parallel import fake_world
from ds_longctx.parallel.disk import (
    describe_os_error,
    existing_ancestor,
    free_bytes,
    size_text,
    unwritable,
    user_path,
)


def find_run_checkpoint(
    checkpoint: str, tag: str | None, what: str = "export"
) -> tuple[Path, dict]:
    """(tag directory, meta) of a complete checkpoint under a run's output_dir or its checkpoints/
    directory (`what`: the command named in refusals; `ds-longctx eval` asks too)."""
    p = Path(checkpoint)
    if not p.is_dir():
        raise CheckpointError(
            f"{what}: --checkpoint {checkpoint!r} is not a directory; pass a run's output_dir"
        )
    root = p / CKPT_SUBDIR if (p / CKPT_SUBDIR).is_dir() else p
    if (
        tag is None
        and not (root / LATEST).is_file()
        and not (root / CKPT_SUBDIR).exists()
        and root == p
    ):
        raise CheckpointError(
            f"{what}: no checkpoint in {checkpoint!r} (neither checkpoints/latest nor latest); "
            f"pass the output_dir of a run that saved one (save_every > 0, or stopped by SIGTERM)"
        )
    return find_checkpoint(root, tag, what=what)


def check_out(out: str) -> Path:
    p = Path(out)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise CheckpointError(
            f"export: --out {out!r} already exists and is not an empty directory; choose a new "
            f"path (or an empty directory)"
        )
    parent = p.parent if p.parent != Path("") else Path(".")
    if not parent.is_dir():
        raise CheckpointError(
            f"export: the parent of --out {out!r} ({str(parent)!r}) is not a directory; create "
            f"it first or choose another path"
        )
    if why := unwritable(p):
        raise CheckpointError(
            f"export: --out {out!r} cannot be written ({why}); choose a writable --out"
        )
    return p


def run_lora(meta: dict) -> LoraConfig:
    """The `lora` section of the run that wrote a checkpoint (its meta's flat keys; rank 0 before
    LoRA existed)."""
    return LoraConfig(
        **{
            name: meta["run"][flat]
            for flat, (sec, name) in FLAT.items()
            if sec == "lora" and flat in meta["run"]
        }
    )


def ships_base(model_name: str) -> bool:
    """Whether a LoRA export writes its frozen base: a model without weights (`random_init`) has its
    random init nowhere else, so there is no base to point at."""
    return random_init(model_name)


def export_bytes(model, adapters: dict, lora: LoraConfig, model_name: str, merged: bool) -> int:
    """Bytes an export writes, near enough: the model's weights once (LoRA: the base where it is
    shipped and the merged model with --merged), plus the adapters."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    copies = 1 if not lora.rank else int(ships_base(model_name)) + int(merged)
    return copies * weights + sum(t.numel() * t.element_size() for t in adapters.values())


def _save_lora(
    model, adapters: dict, lora: LoraConfig, tmp: Path, dest: Path, model_name: str, merged: bool
) -> list:
    """The adapter in PEFT's format into `tmp` (module docstring), the base for a shipped geometry,
    the merged model if asked; returns the model directories written (for the tokenizer)."""
    try:
        from peft import get_peft_model
    except ImportError:
        raise CheckpointError(
            "export: this is a LoRA run and peft is not installed; pip install 'ds-longctx[lora]' "
            "(or pip install peft)"
        ) from None
    dirs = [tmp]
    shipped = ships_base(model_name)
    if shipped:  # before PEFT wraps the model
        model.save_pretrained(str(tmp / "base"), safe_serialization=True)
        dirs.append(tmp / "base")
    linears, output = model_linears(model)
    base = str((dest / "base").resolve()) if shipped else model_name
    peft_model = get_peft_model(
        model,
        peft_config(lora, target_names(linears, lora.target_modules, output)),
        adapter_name=ADAPTER,
        autocast_adapter_dtype=False,
    )
    peft_model.peft_config[
        ADAPTER
    ].base_model_name_or_path = base  # get_peft_model wrote the checkpoint dir there
    missing, unexpected = peft_model.get_base_model().load_state_dict(adapters, strict=False)
    missing = [k for k in missing if is_adapter(k)]
    if missing or unexpected:
        raise CheckpointError(
            f"export: the checkpoint's adapters do not match lora_target_modules="
            f"{lora.target_modules!r}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    peft_model.save_pretrained(str(tmp), safe_serialization=True)
    if merged:
        peft_model.merge_and_unload().save_pretrained(str(tmp / "merged"), safe_serialization=True)
        dirs.append(tmp / "merged")
    return dirs


def export(
    checkpoint: str, out: str, tag: str | None = None, dtype: str = "auto", merged: bool = False
) -> Path:
    """Write the HF directory; returns its path. Raises CheckpointError on bad input (nothing
    written then)."""
    fake_world.refuse_in_rehearsal("an export", CheckpointError)
    tag_dir, meta = find_run_checkpoint(checkpoint, tag)
    if nvme_state.swapped(tag_dir):
        raise CheckpointError(
            f"export: checkpoint {str(tag_dir)!r} keeps master weights in NVMe swap files "
            f"({nvme_state.SWAP_DIR}/, memory.nvme_optimizer), which zero_to_fp32 does not read; "
            f"export a checkpoint saved without the NVMe optimizer"
        )
    lora = run_lora(meta)
    if merged and not lora.rank:
        raise CheckpointError(
            f"export: --merged folds LoRA adapters into the base, and {str(tag_dir)!r} is from a "
            f"full fine-tuning run (lora_rank 0): drop --merged, the export is the full model"
        )
    dest = check_out(out)
    try:
        model, adapters = _load_model(tag_dir, meta, dtype)
    except Exception:
        if line := pruned_line(tag_dir, meta):
            raise CheckpointError(line) from None
        raise
    _write(model, adapters, lora, tag_dir, meta, dest, merged)
    return dest


def pruned_line(tag_dir: Path, meta: dict) -> str | None:
    """The refusal of a tag whose files went while export read them (a running train pruned it past
    keep_checkpoints), naming the tags still there; None while every file of its meta is in
    place."""

    names = ["meta.json", *(meta.get("files") or {})]
    gone = [n for n in names if not (tag_dir / n).is_file()]
    if not gone:
        return None
    root = tag_dir.parent
    try:
        latest = read_latest(root, "export")
    except (CheckpointError, OSError):
        latest = None
    kept = [t for t in tag_names(root) if (root / t / "meta.json").is_file()]
    return (
        f"export: checkpoint {tag_dir.name!r} in {str(root)!r} was removed while export read it "
        f"({len(gone)} of its {len(names)} files gone: a run writing there keeps only its newest "
        f"keep_checkpoints tags); export the latest (now {latest!r}, --tag left out) or a kept tag "
        f"({', '.join(kept) or 'none'}), or export once that run has ended"
    )


def _load_model(tag_dir: Path, meta: dict, dtype: str) -> tuple:
    """(the HF model in `dtype` with the checkpoint's fp32 master weights, LoRA adapter tensors by
    name): every file checked first, every load weights-only (module doc)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(tag_dir), trust_remote_code=False)
    train_dtype = "bf16" if str(getattr(config, "dtype", "")).endswith("bfloat16") else "fp32"
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[
        train_dtype if dtype == "auto" else dtype
    ]
    bad = files.problem(tag_dir, meta, None, show=True)
    if bad:
        raise CheckpointError(
            f"export: checkpoint {str(tag_dir)!r} could not be loaded ({bad}); export an earlier "
            f"tag (--tag)"
        )
    try:
        with files.weights_only_loads():
            state = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    except Exception as e:
        reason = files.refusal(e, "a file zero_to_fp32 loaded")
        if reason is None:
            raise
        raise CheckpointError(f"export: checkpoint {str(tag_dir)!r} is refused: {reason}") from None
    # the DeepSpeed module is engine.LossHead: the HF model sits under `model.`
    state = {k.removeprefix("model."): v for k, v in state.items()}
    # LoRA: the adapters apart; the base weights under the names of the unwrapped Linears
    adapters = {k: state.pop(k) for k in [k for k in state if is_adapter(k)]}
    state = {k.replace(".base_layer.", "."): v for k, v in state.items()}
    config.use_cache = True
    config.dtype = torch_dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    text = config.get_text_config()
    tied = (
        set(getattr(model, "_tied_weights_keys", None) or []) if text.tie_word_embeddings else set()
    )
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise CheckpointError(
            f"export: checkpoint {str(tag_dir)!r} does not match {type(model).__name__}: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}; export with the ds_longctx version "
            f"that trained it"
        )
    if tied:
        model.tie_weights()
    return model.to(torch_dtype), adapters


def _write(
    model, adapters: dict, lora: LoraConfig, tag_dir: Path, meta: dict, dest: Path, merged: bool
) -> None:
    """The export into a fresh `<dest>.tmp-*` directory, renamed to `dest` at the end; on any error
    the temporary directory goes and nothing is left at `dest`."""
    from safetensors import SafetensorError

    needed, free = (
        export_bytes(model, adapters, lora, meta["run"]["model"], merged),
        free_bytes(dest.parent),
    )
    if free is not None and free < needed:
        raise CheckpointError(
            f"export: --out {str(dest)!r} needs ~{size_text(needed)} and "
            f"{existing_ancestor(dest)} has {size_text(free)} free; choose an --out on a "
            f"filesystem with more space"
        )
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    except OSError as e:
        raise CheckpointError(
            f"export: --out {str(dest)!r} cannot be written ({describe_os_error(e, dest)}); choose "
            f"a writable --out"
        ) from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        if lora.rank:
            dirs = _save_lora(model, adapters, lora, tmp, dest, meta["run"]["model"], merged)
        else:
            model.save_pretrained(str(tmp), safe_serialization=True)
            dirs = [tmp]
        tok = tokenizer_of(
            meta["run"].get("tokenizer"), meta["run"]["model"]
        )  # the model directory's by default
        if tok:
            tokenizer = open_tokenizer(tok)
            for d in dirs:
                tokenizer.save_pretrained(str(d))
        (tmp / "ds_longctx_export.json").write_text(
            json.dumps(
                {
                    "checkpoint": str(tag_dir),
                    "step": meta["step"],
                    "dtype": str(model.dtype).removeprefix("torch."),
                    "lora": lora.model_dump() if lora.rank else None,
                    "run": meta["run"],
                },
                indent=1,
            )
            + "\n"
        )
        if dest.exists():
            dest.rmdir()  # an empty directory (checked above)
        tmp.rename(dest)
    except (OSError, SafetensorError) as e:  # safetensors reports an I/O error as its own type
        shutil.rmtree(tmp, ignore_errors=True)
        why = (
            describe_os_error(e, dest, needed) if isinstance(e, OSError) and e.strerror else str(e)
        )
        raise CheckpointError(
            f"export: writing {str(dest)!r} failed: {why}; nothing was left there; free space or "
            f"choose another --out"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="ds-longctx export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        type=user_path,
        help="a run's output_dir (or its checkpoints/ directory)",
    )
    p.add_argument("--tag", default=None, help="checkpoint tag, e.g. step300 (default: latest)")
    p.add_argument(
        "--out",
        required=True,
        type=user_path,
        help="new directory for the HF model (must not exist or be empty)",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="weights dtype (auto: the training dtype)",
    )
    p.add_argument(
        "--merged",
        action="store_true",
        help="LoRA runs: also write the base with the adapters folded in, under <out>/merged",
    )
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        dest = export(a.checkpoint, a.out, a.tag, a.dtype, a.merged)
    except (CheckpointError, DataError) as e:
        print(f"export refused: {e}", file=sys.stderr)
        return 2
    print(f"exported {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
