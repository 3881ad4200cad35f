"""What one Qwen3 decoder layer saves for backward with fused_ops none vs compile (CPU, bf16): the
planner's hidden / q-k-norm / MLP units are counted for HF's eager ops; this lists the saved
storages (size, shape, dtype) of each.

    python benchmarks/probe_fused_ops_saved.py none 1024
    python benchmarks/probe_fused_ops_saved.py compile 1024

Seen 2026-12-01 (hidden 512, I 1536, 8 q / 4 kv heads of 64, T 1024; E = T·H·2): none keeps 2 fp32
[T, H] (the norms' upcasts), 2 bf16 normed copies, 4 [T, I] (gate, up, act, act·up) and fp32 + bf16
q/k norm copies; compile keeps the norms' bf16 inputs only, 3 [T, I] (gate, up, the product) and the
q/k norms' bf16 inputs (benchmarks/results/sessions/2026-12-01/planner_runs_2026-12-01.md says what
this would change in the planner and why it is not in yet).
"""

import sys
from pathlib import Path

import torch
from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ds_longctx.levers import fused_ops  # noqa: E402


class OneLayer(torch.nn.Module):
    __module__ = (
        modeling_qwen3.__name__
    )  # fused_ops patches the rotary function of the model's modeling module

    def __init__(self, cfg):
        super().__init__()
        self.layer, self.rot, self.config = (
            Qwen3DecoderLayer(cfg, 0),
            Qwen3RotaryEmbedding(cfg),
            cfg,
        )


def main():
    kind, T = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    cfg = Qwen3Config(
        hidden_size=512,
        intermediate_size=1536,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_hidden_layers=1,
        vocab_size=128,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = OneLayer(cfg).to(torch.bfloat16)
    if kind != "none":
        fused_ops.apply_fused_ops(m, kind)
    x = torch.randn(1, T, 512, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = (t.detach() for t in m.rot(x, torch.arange(T)[None]))
    params = {p.untyped_storage().data_ptr() for p in m.parameters()} | {
        x.untyped_storage().data_ptr()
    }
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = (st.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""))
        return t

    for _ in range(2):  # the first call compiles
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.layer(x, position_embeddings=(cos, sin), attention_mask=None)
    E = T * 512 * 2
    for nbytes, shape, dtype in sorted(seen.values(), reverse=True):
        print(f"{nbytes / E:6.2f} E  {dtype:9s} {shape}")
    print(
        f"{kind}: {sum(v[0] for v in seen.values()) / E:.2f} E saved in {len(seen)} storages (E = "
        "T·H·2)"
    )


if __name__ == "__main__":
    main()
