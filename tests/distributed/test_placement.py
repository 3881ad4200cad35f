"""Mixed placement plans (a layer offloaded through DeepSpeed's checkpoint, a layer with its
attention output cached, a layer with both its checkpoint and its kept output on the host) under
ZeRO-3 SP=2 on 2 gloo processes: the engine applies exactly the plan the run config makes, layer by
layer (read off each layer's checkpoint function), and the loss and every gradient equal a plain
single-process HF model's (fp32, rel <= 1e-5)."""

import pytest

from tests.distributed.test_ulysses import TOL, check, reference, run, sample

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "overrides,want",
    [
        (dict(offload_layers=1, attention_cache_layers=1), ["offload", "cache"]),
        (dict(placement="cache,offload"), ["cache", "offload"]),
        (dict(placement="cache+offload,cache"), ["cache+offload", "cache"]),
        (dict(placement="offload,cache+offload", pinned_pool=True), ["offload", "cache+offload"]),
    ],
)
def test_mixed_plan_is_what_the_engine_applies_and_keeps_the_grads(tmp_path, overrides, want):
    got = run(tmp_path, 2, 2, length=64, read_placement=True, **overrides)
    assert got["planned"] == got["engine_plan"] == got["applied"] == want
    check(got, *reference([sample(0)]), tol=TOL)
    if overrides.get(
        "pinned_pool"
    ):  # both host layers' inputs in slices of the engine's one reservation, made at
        # build, and layer 1's kept attention output + LSE in its region of the same block: the step
        # allocated no slot or buffer of its own
        from ds_longctx.plan.geometry import ModelGeometry

        g = ModelGeometry.from_name_or_path("qwen3-tiny")
        shape = (1, 64 // 2, g.hidden)  # [b, s/sp, H], fp32
        per = shape[0] * shape[1] * shape[2] * 4
        region = (
            64 * (g.heads // 2) * g.head_dim * 4 + (g.heads // 2) * (64 + 128) * 4 + 65536
        )  # output, LSE, room
        at = -(-2 * per // 512) * 512
        pool = got["pool"]
        assert {k: v for k, v in pool.items() if k != "cache_kept_at"} == {
            "block_bytes": at + region,
            "own": [],
            "slots": {0: (shape, 0), 1: (shape, per)},
            "regions": {("attention", 1): (at, region)},
        }
        kept = pool["cache_kept_at"][1]
        assert len(kept) >= 2 and kept[0] == at and all(at <= k < at + region for k in kept)


def test_disk_layers_through_the_engine_give_the_plain_hf_grads_and_leave_nvme_path_empty(tmp_path):
    """A layer's checkpoint on disk (levers/disk_tier.py) beside one in the pinned pool, SP=2: the
    plan the engine applies, the plain model's loss and gradients, and each rank's scratch directory
    gone after its step."""
    nvme = tmp_path / "nvme"
    got = run(
        tmp_path,
        2,
        2,
        length=64,
        read_placement=True,
        placement="disk,offload",
        pinned_pool=True,
        nvme_path=str(nvme),
    )
    assert got["planned"] == got["engine_plan"] == got["applied"] == ["disk", "offload"]
    check(got, *reference([sample(0)]), tol=TOL)
    assert nvme.is_dir() and list(nvme.iterdir()) == []
