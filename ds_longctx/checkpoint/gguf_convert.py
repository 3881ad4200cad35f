"""A llama-family GGUF to an HF directory: config.json from its metadata, its tensors dequantized
(gguf's numpy kernels) into bf16 model.safetensors, the tokenizer and chat template through
transformers' GGUF reader.

    convert(gguf_path, dest, facts)   # facts: config values the result must hold (else refused)
    greedy_answer(dest, prompt)       # the model's greedy reply through its chat template

llama.cpp stores q_proj and k_proj with each head's rotary halves interleaved; `unpermute` gives
HF's order back (the inverse of llama.cpp's convert_hf_to_gguf.py permute, as transformers' own
GGUF loader does).
"""

from __future__ import annotations

# gguf (optional), safetensors and transformers are imported where a file is converted.
from pathlib import Path

import numpy as np
import torch

LAYER_NAMES = {  # GGUF blk.N.<key> -> HF model.layers.N.<value>
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
GEN_TOKENS = 12


def field_value(reader, key: str):
    """A scalar or string metadata value of the GGUF (None where absent)."""
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def hf_config(reader):
    """The LlamaConfig that the GGUF's metadata describes (bf16)."""
    from transformers import LlamaConfig

    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: only llama is converted")

    def meta(key):
        return field_value(reader, f"llama.{key}")

    hidden, heads = meta("embedding_length"), meta("attention.head_count")
    return LlamaConfig(
        vocab_size=meta("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=meta("attention.head_count_kv"),
        head_dim=meta("rope.dimension_count") or hidden // heads,
        max_position_embeddings=meta("context_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": float(meta("rope.freq_base"))},
        tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors),
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field_value(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=field_value(reader, "tokenizer.ggml.padding_token_id"),
        architectures=["LlamaForCausalLM"],
        dtype="bfloat16",
    )


def check_facts(config, facts: dict) -> None:
    """ValueError naming every config value that differs from `facts`."""
    got = config.to_dict() | {"rope_theta": config.rope_parameters["rope_theta"]}
    wrong = [f"{k}={got.get(k)} (expected {v})" for k, v in facts.items() if got.get(k) != v]
    if wrong:
        raise ValueError(f"the GGUF gives {', '.join(wrong)}")


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """[heads * d, in] from llama.cpp's rotary order to HF's: per head, [d/2, 2] -> [2, d/2]."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    stem, _, kind = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, key = stem.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[key]}.{kind}"
    return f"{GLOBAL_NAMES[stem]}.{kind}"


def state_dict(reader, config) -> dict:
    """Every GGUF tensor dequantized, named as HF's Llama names it, in bf16; the names checked."""
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if ".attn_q." in t.name:
            w = unpermute(w, config.num_attention_heads)
        elif ".attn_k." in t.name:
            w = unpermute(w, config.num_key_value_heads)
        out[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16)
    layers = range(config.num_hidden_layers)
    want = {f"model.layers.{i}.{v}.weight" for i in layers for v in LAYER_NAMES.values()}
    want |= {"model.embed_tokens.weight", "model.norm.weight"}
    want |= set() if config.tie_word_embeddings else {"lm_head.weight"}
    if set(out) != want:
        raise ValueError(
            f"the GGUF's tensors do not make a Llama: missing "
            f"{sorted(want - set(out))[:3]}, extra {sorted(set(out) - want)[:3]}"
        )
    return out


def convert(gguf_path: Path, dest: Path, facts: dict) -> None:
    """Write the HF directory of `gguf_path` into the existing directory `dest`."""
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    reader = GGUFReader(str(gguf_path))
    config = hf_config(reader)
    check_facts(config, facts)
    save_file(
        state_dict(reader, config), str(Path(dest) / "model.safetensors"), metadata={"format": "pt"}
    )
    config.save_pretrained(str(dest))
    GenerationConfig.from_model_config(config).save_pretrained(str(dest))
    gguf_path = Path(gguf_path)
    tok = AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, trust_remote_code=False
    )
    template = field_value(reader, "tokenizer.chat_template")
    if template and tok.chat_template != template:
        raise ValueError("transformers' tokenizer of the GGUF lost its chat template")
    tok.save_pretrained(str(dest))


def greedy_answer(model_dir: Path, prompt: str, tokens: int = GEN_TOKENS) -> str:
    """The greedy reply to one user message through the chat template, `tokens` at most."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, trust_remote_code=False
    ).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=tokens,
            pad_token_id=tok.pad_token_id,
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
