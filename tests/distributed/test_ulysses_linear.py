"""Ulysses around a hybrid model's gated DeltaNet layers, CPU/gloo, through the engine (ZeRO-3, the
loss head): loss and every gradient against a plain single-process HF Qwen3_5ForCausalLM on the full
sequence (fp32, rel <= 1e-5).

qwen3.5-tiny: 3 gated DeltaNet layers (2 key / 4 value heads) and 1 full-attention layer (4 query /
2 KV heads of 32, output gate, partial rotary). sp=4 goes past the linear key heads (each replicated
twice inside the exchange) and the KV heads. A packed row's reference is its documents run one by
one (transformers' torch path cannot keep packed documents apart: it refuses cu_seqlens without
FLA)."""

import pytest

from tests.distributed.test_ulysses import check, run, sample
from tests.helpers import tiny_model

pytestmark = pytest.mark.slow
MODEL = "qwen3.5-tiny"
LENS = [
    20,
    29,
    15,
]  # the 29-token document straddles the slice borders at 32 (sp 2) and 32, 48 (sp 4)


def reference(ids, doc_lens=None):
    """HF's own token-mean loss of one row (each document alone, token-weighted, when packed) and
    its gradients."""
    model = tiny_model(seed=0, attn="eager", model=MODEL)
    if doc_lens is None:
        loss = model(input_ids=ids[None], labels=ids[None]).loss
    else:
        parts, start = [], 0
        for n in doc_lens:
            doc = ids[start : start + n][None]
            parts.append(model(input_ids=doc, labels=doc).loss * (n - 1))
            start += n
        loss = sum(parts) / sum(n - 1 for n in doc_lens)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


# sp2 also pulls the levers that touch every layer type: the chunked loss (chunks smaller than a
# slice), the tiled MLP (tiles that divide no slice), two linear layers' checkpoints through
# DeepSpeed's offloading checkpoint and the full-attention layer's output kept by the attention
# cache
LEVERS = dict(
    chunked_loss=True,
    loss_chunk_rows=5,
    tiled_mlp=True,
    tile_tokens=7,
    placement="offload:2,keep:1,cache:1",
)


@pytest.mark.parametrize(
    "sp,packed,levers",
    [(1, True, {}), (2, False, LEVERS), (4, True, {})],
    ids=["sp1_packed", "sp2_levers", "sp4_past_key_heads_packed"],
)
def test_hybrid_sp_matches_plain_hf(tmp_path, sp, packed, levers):
    got = run(
        tmp_path,
        sp,
        sp,
        length=64,
        packed=LENS if packed else None,
        model=MODEL,
        read_placement=bool(levers),
        **levers,
    )
    if levers:  # what the layers really run, read off them
        assert got["applied"] == ["offload", "offload", "keep", "cache"]
    assert got["tokens"] == (sum(n - 1 for n in LENS) if packed else 63)
    check(got, *reference(sample(0), LENS if packed else None))
