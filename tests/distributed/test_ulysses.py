"""Ulysses SP on CPU over gloo, real processes: loss and every parameter gradient against a plain
single-process HF forward/backward on the full sequence (fp32, rel <= 1e-5)."""

import pytest
import torch

from ds_longctx.data.synthetic import SyntheticRetrieval
from tests.helpers import rel_err, tiny_model, torchrun

pytestmark = pytest.mark.slow
TOL = 1e-5


def reference(samples: list[torch.Tensor], doc_lens=None, mask_from=None):
    """Mean over samples of HF's own token-mean loss, and the mean gradients (the dp-replica
    average); labels ignored from `mask_from` on (a document left without a trained target weighs
    0)."""
    model = tiny_model(seed=0, attn="eager")
    total = 0.0
    for ids in samples:
        labels = ids.clone()
        if mask_from is not None:
            labels[mask_from:] = -100
        if doc_lens is None:
            loss = model(input_ids=ids[None], labels=labels[None]).loss
        else:  # packed: each document on its own, token-weighted
            parts, start, n = [], 0, 0
            for L in doc_lens:
                doc, lab = ids[start : start + L][None], labels[start : start + L][None]
                k = int((lab[:, 1:] != -100).sum())
                if k:
                    parts.append(model(input_ids=doc, labels=lab).loss * k)
                n += k
                start += L
            loss = sum(parts) / n
        (loss / len(samples)).backward()
        total += float(loss) / len(samples)
    return total, {n: p.grad for n, p in model.named_parameters()}


def run(
    tmp_path,
    nproc,
    sp,
    length=64,
    packed=None,
    env=None,
    read_placement=False,
    mask_from=None,
    micro=1,
    **overrides,
):
    """Launch grad_worker on nproc processes; overrides go to the run config (key=value);
    `read_placement`: also return each layer's applied checkpoint kind."""
    out = tmp_path / f"grads_{nproc}_{sp}_{len(overrides)}_{micro}.pt"
    args = [
        "tests/distributed/grad_worker.py",
        "--sp",
        str(sp),
        "--length",
        str(length),
        "--out",
        str(out),
        *(["--placement"] if read_placement else []),
    ]
    if packed:
        args += ["--packed", ",".join(map(str, packed))]
    if mask_from is not None:
        args += ["--mask_from", str(mask_from)]
    if micro > 1:
        args += ["--micro", str(micro)]
    for k, v in overrides.items():
        args += ["--set", f"{k}={v}"]
    torchrun(nproc, args, env=env)
    return torch.load(out)


def check(got, ref_loss, ref_grads, tol=TOL):
    assert rel_err(got["loss"], ref_loss) <= tol, (got["loss"], ref_loss)
    assert set(got["grads"]) == set(ref_grads), set(got["grads"]) ^ set(ref_grads)
    worst = max((rel_err(got["grads"][n], g.float().cpu()), n) for n, g in ref_grads.items())
    assert worst[0] <= tol, f"grad of {worst[1]} off by rel {worst[0]:.2e}"


def sample(i, length=64):
    return SyntheticRetrieval(length, 512, seed=0).sample(i)[0]


@pytest.mark.parametrize("sp", [2, 4], ids=["sp2", "sp4_kv_replicated"])
def test_sp_matches_plain_hf(tmp_path, sp):
    # tiny Qwen3: 8 query / 2 KV heads, so sp=4 replicates each KV head twice
    got = run(tmp_path, sp, sp)
    check(got, *reference([sample(0)]))


def test_sp2_dp2_matches_two_replica_reference(tmp_path):
    got = run(tmp_path, 4, 2)
    check(got, *reference([sample(0), sample(1)]))


def test_odd_length_is_padded(tmp_path):
    got = run(tmp_path, 2, 2, length=63)
    assert got["tokens"] == 62  # every real label kept, padding supervised nothing
    check(got, *reference([sample(0, 63)]))


def test_every_lever_on_matches_plain(tmp_path):
    # chunked loss with chunks smaller than a slice, tiled MLP with a tile that does not divide the
    # slice, checkpointing routed through DeepSpeed's checkpoint (offload itself needs a GPU:
    # tests/gpu),
    # YaRN
    got = run(
        tmp_path,
        2,
        2,
        length=64,
        chunked_loss=True,
        loss_chunk_rows=5,
        tiled_mlp=True,
        tile_tokens=7,
        activation_checkpointing=True,
        activation_offload=True,
        rope_scaling="none",
    )
    check(got, *reference([sample(0)]))


def test_packed_documents_keep_boundaries(tmp_path):
    lens = [20, 29, 15]  # the 29-token document straddles the slice border at 32
    got = run(tmp_path, 2, 2, length=64, packed=lens)
    assert got["tokens"] == sum(L - 1 for L in lens)
    check(got, *reference([sample(0)], doc_lens=lens))


def test_packed_masked_rows_where_one_rank_trains_nothing_match_sp1_and_plain_hf(tmp_path):
    """Labels ignored from position 32 on: SP rank 1 of 2 (positions 32-63) holds no trained target
    and the third document none at all; the loss and every gradient equal SP=1's (1e-6) and plain
    HF's per document (1e-5), token-weighted, finite."""
    lens = [20, 29, 15]
    sp2 = run(tmp_path, 2, 2, length=64, packed=lens, mask_from=32)
    sp1 = run(tmp_path, 1, 1, length=64, packed=lens, mask_from=32)
    assert (
        sp2["tokens"] == sp1["tokens"] == 19 + 11
    )  # document 1's 19 targets, document 2's up to position 31
    assert torch.isfinite(torch.tensor(sp2["loss"])) and all(
        torch.isfinite(g).all() for g in sp2["grads"].values()
    )
    check(sp2, sp1["loss"], sp1["grads"], tol=1e-6)
    check(sp2, *reference([sample(0)], doc_lens=lens, mask_from=32))


@pytest.mark.parametrize(
    "placement,pool", [("offload:1,keep:1", False), ("cache:2", False), ("offload:1,cache:1", True)]
)
def test_tiled_layer_matches_plain(tmp_path, placement, pool):
    """The whole layer's token-wise work tiled (levers/tiled_layer.py; tiles of 7 divide no slice)
    under ZeRO-3 and SP=2, with a checkpoint through DeepSpeed's offload path, the attention output
    cached, or (the longest plan's levers: offload:35,cache:1 with the pool) the checkpoint in our
    pinned pool under a cached top layer; chunked loss."""
    got = run(
        tmp_path,
        2,
        2,
        length=64,
        chunked_loss=True,
        loss_chunk_rows=5,
        tiled_layer=True,
        tile_tokens=7,
        placement=placement,
        pinned_pool=pool,
    )
    check(got, *reference([sample(0)]))


def test_tiled_layer_keeps_packed_documents_apart(tmp_path):
    lens = [20, 29, 15]
    got = run(tmp_path, 2, 2, length=64, packed=lens, tiled_layer=True, tile_tokens=9)
    check(got, *reference([sample(0)], doc_lens=lens))


def family_checkpoint(tmp_path, family: str):
    """A tiny local HF checkpoint of another family (random weights; the engine loads them from the
    directory)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    cfg_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }[family]
    cfg = cfg_cls(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        use_cache=False,
    )
    torch.manual_seed(0)
    path = tmp_path / family
    model_cls(cfg).save_pretrained(path)
    return path, model_cls


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_other_families_with_the_tiled_layer_match_plain_hf(tmp_path, family):
    """Llama and Mistral checkpoints through the whole engine (SP=2, ZeRO-3, tiled layer with uneven
    tiles, chunked loss): the plain HF model's loss and every gradient on the full sequence."""
    path, model_cls = family_checkpoint(tmp_path, family)
    got = run(
        tmp_path,
        2,
        2,
        length=64,
        model=str(path),
        tiled_layer=True,
        tile_tokens=7,
        loss_chunk_rows=5,
    )
    ref = model_cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).train()
    ids = sample(0)[None]
    loss = ref(input_ids=ids, labels=ids).loss
    loss.backward()
    check(got, float(loss), {n: p.grad for n, p in ref.named_parameters()})


def test_tiled_layer_with_kv_replication_and_data_parallelism(tmp_path):
    """sp=4 over 2 KV heads (each replicated twice inside the exchange) and sp=2 x dp=2, with the
    tiled layer (tiles of 5): the plain model's loss and grads (the dp case against the two-replica
    mean)."""
    check(run(tmp_path, 4, 4, length=64, tiled_layer=True, tile_tokens=5), *reference([sample(0)]))
    check(
        run(tmp_path, 4, 2, length=64, tiled_layer=True, tile_tokens=5),
        *reference([sample(0), sample(1)]),
    )
