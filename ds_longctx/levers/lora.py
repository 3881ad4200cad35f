"""LoRA adapters on a frozen, ZeRO-3-partitioned base: the one home of the rule "which parameters
train".

    # adapters injected in place (PEFT), base frozen, adapters drawn:
    n = apply_lora(model, cfg.lora, seed)
    # what deepspeed.initialize gets: the adapters (every param without LoRA):
    params = trainable_parameters(module)
    # which Linears get adapters (the engine and the planner ask it):
    names = target_names(linears, targets, output)

Design notes: docs/design/levers.md, section `lora.py`.
"""

from __future__ import annotations

# torch and peft are imported lazily: `ds-longctx plan` imports this module without them.
import copy
import logging
import zlib

from ds_longctx import families

log = logging.getLogger("ds_longctx")

DEFAULT_TARGETS = families.LORA_TARGETS
ALL_LINEAR = "all-linear"
ADAPTER = "default"  # PEFT's adapter name: parameter names hold `.lora_A.default.`
_ADAPTER_PARTS = (".lora_A.", ".lora_B.")


# ----------------------------------------------------------------------------- the rule (no torch)
def check_targets(targets: list) -> None:
    """The target list on its own (no model): non-empty names, all-linear alone. Raises ValueError
    naming the fix."""
    if not targets:
        raise ValueError(
            "lora_target_modules is empty; name module suffixes (e.g. "
            f"{','.join(DEFAULT_TARGETS)}) or all-linear"
        )
    for t in targets:
        if (
            not isinstance(t, str)
            or not t
            or t != t.strip()
            or t.startswith(".")
            or t.endswith(".")
        ):
            raise ValueError(
                f"lora_target_modules entry {t!r} is not a module-name suffix; use names such as "
                f"q_proj or mlp.down_proj, comma-separated on the command line"
            )
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(
            f"lora_target_modules={targets}: {ALL_LINEAR} already means every Linear but the "
            f"output layer; give it alone or list suffixes without it"
        )


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)  # PEFT's rule for a list of names


def target_names(linears: dict, targets, output: str) -> list:
    """The full names of the Linears that get adapters, in module order. More:
    docs/design/levers.md."""
    if targets == ALL_LINEAR or list(targets) == [ALL_LINEAR]:
        return [n for n in linears if n != output]
    check_targets(list(targets))
    for t in targets:
        hit = [n for n in linears if _matches(n, t)]
        if not hit:
            suffixes = sorted({n.rpartition(".")[2] for n in linears if n != output})
            raise ValueError(
                f"lora_target_modules entry {t!r} matches no Linear of the model; its Linears end "
                f"in {', '.join(suffixes)} (or use all-linear)"
            )
        if output in hit:
            raise ValueError(
                f"lora_target_modules entry {t!r} matches the output layer {output!r}: the chunked "
                "loss computes it from its weight, so an adapter there would never run; drop it "
                f"(all-linear leaves it out)"
            )
    return [n for n in linears if any(_matches(n, t) for t in targets)]


def is_adapter(name: str) -> bool:
    """A parameter name of a LoRA adapter (`...lora_A.default.weight`): what trains when LoRA is
    on."""
    return any(part in name for part in _ADAPTER_PARTS)


# ----------------------------------------------------------------------------- on a model (torch,
# PEFT)
def model_linears(model) -> tuple:
    """({full name: (in_features, out_features)} of every nn.Linear of `model`, the output layer's
    name)."""
    import torch.nn as nn

    head = model.get_output_embeddings()
    linears, output = {}, None
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            linears[name] = (m.in_features, m.out_features)
        if m is head:
            output = name
    return linears, output


def check_model_targets(model_cls, hf_config, targets) -> list:
    """`target_names` for a model class and config, on a meta-device instance (nothing allocated),
    and PEFT importable: what the engine's checks (run/preflight.validate) run before any work.
    Raises ValueError."""
    import torch

    try:
        import peft  # noqa: F401
    except ImportError:
        raise ValueError(
            "lora_rank > 0 needs peft, which is not installed: pip install 'ds-longctx[lora]' (or "
            "pip install peft), or set lora_rank: 0"
        ) from None
    with torch.device("meta"):
        model = model_cls(copy.deepcopy(hf_config))
    linears, output = model_linears(model)
    return target_names(linears, targets, output)


def peft_config(lora, target_modules: list, base_model_name_or_path=None):
    """PEFT's LoraConfig for run-config section `lora` on exactly `target_modules` (full names:
    `target_names`
    decides, PEFT only executes)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        bias="none",
        target_modules=list(target_modules),
        base_model_name_or_path=base_model_name_or_path,
    )


def inject(model, lora) -> list:
    """Wrap the targeted Linears of `model` in place with PEFT adapters and freeze everything else;
    returns the targeted names. The adapters are PEFT's initial draw (`init_adapters` replaces
    it)."""
    from peft import inject_adapter_in_model

    linears, output = model_linears(model)
    names = target_names(linears, lora.target_modules, output)
    inject_adapter_in_model(peft_config(lora, names), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return names


def init_adapters(model, seed: int, init: str = "zero_b") -> None:
    """Draw every adapter from a generator seeded by (seed, parameter name), on the parameter's
    device: the same adapters for any world size or sp_size. More: docs/design/levers.md."""
    import torch

    for name, p in model.named_parameters():
        if not is_adapter(name):
            continue
        if hasattr(p, "ds_id"):
            raise RuntimeError(
                f"init_adapters: {name} is already partitioned by ZeRO-3; draw the adapters before "
                f"deepspeed.initialize"
            )
        with torch.no_grad():
            if ".lora_B." in name and init == "zero_b":
                p.zero_()
                continue
            g = torch.Generator(device=p.device).manual_seed(
                seed * 7919 + zlib.crc32(name.encode())
            )
            bound = p.shape[1] ** -0.5  # [r, in] or [out, r]: 1/sqrt(fan_in)
            p.copy_(
                torch.rand(p.shape, generator=g, device=p.device, dtype=torch.float32)
                .mul_(2 * bound)
                .sub_(bound)
            )


def apply_lora(model, lora, seed: int) -> int:
    """Inject adapters into `model` (in place), freeze the base, draw the adapters, let the
    embedding output require grad (module docstring); returns the number of adapter parameters. A
    no-op (0) when lora.rank is 0."""
    if lora.rank == 0:
        return 0
    names = inject(model, lora)
    init_adapters(model, seed, lora.init)
    model.enable_input_require_grads()
    n = sum(p.numel() for p in trainable_parameters(model))
    log.info(
        "LoRA: rank %d, alpha %g on %d Linears (%s): %d adapter parameters train, the base is "
        "frozen",
        lora.rank,
        lora.alpha,
        len(names),
        ",".join(sorted({x.rpartition(".")[2] for x in names})),
        n,
    )
    return n


def trainable_parameters(module) -> list:
    """The parameters the optimizer steps: the adapters under LoRA, every parameter otherwise."""
    return [p for p in module.parameters() if p.requires_grad]
