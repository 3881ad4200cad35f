"""`offload_params` (DeepSpeed ZeRO-3 offload_param, written by plan/ds_config.py) through the whole
engine on CPU: ZeRO-3 + SP=2 over 2 gloo processes, with the bf16... here fp32 parameter partitions
in the offload buffer, gives the plain HF model's loss and gradients (the same check as SP alone,
tests/distributed/test_ulysses.py). The optimizer stays where it is (DeepSpeed allows offload_param
alone), so no CPU Adam is built."""

from __future__ import annotations

from tests.distributed.test_ulysses import check, reference, run, sample


def test_offloaded_parameters_give_the_plain_hf_grads(tmp_path):
    got = run(tmp_path, 2, 2, offload_params=True)
    check(got, *reference([sample(0)]))
    # DeepSpeed took it: its stage-3 optimizer offloads the parameters into one flat buffer of the
    # rank's partition
    from tests.helpers import tiny_model

    n = sum(p.numel() for p in tiny_model(seed=0, attn="eager").parameters())
    assert got["offload_param"] and n // 2 <= got["param_host_buffer"] <= n // 2 + 1024
    plain = run(tmp_path, 2, 2)
    assert not plain["offload_param"] and plain["param_host_buffer"] == 0


def test_grouped_attention_backward_through_the_engine_gives_the_plain_hf_grads(tmp_path):
    """The tiny Qwen3's 2 KV heads at SP=1, the backward one KV head at a time
    (memory.attn_bwd_head_groups 2)."""
    got = run(tmp_path, 1, 1, attn_bwd_head_groups=2)
    check(got, *reference([sample(0)]))
