"""disk_tier.py on CPU: `disk` layers give the pinned pool's (host offload's) losses and gradients
bit for bit over two optimizer steps; a full disk mid-step stops with one line naming the path while
an earlier checkpoint still loads; a filesystem without O_DIRECT is a fallback said in one line; the
run's scratch directory goes at close and nothing else under nvme_path is touched. The planner's
side: tests/plan/test_disk_plan.py."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import torch

from ds_longctx.levers import disk_tier
from ds_longctx.levers.placement import PlacementPlan
from ds_longctx.levers.placement_apply import applied_placement, apply_placement
from ds_longctx.parallel import direct_io
from tests.helpers import tiny_config, tiny_model


@pytest.fixture(autouse=True)
def _closed():
    yield
    disk_tier.close_all()


def train(spec: str, steps: int = 2, model=None, **where):
    """Losses and the last step's gradients of a tiny model (`model`, else the fp32 CPU one) whose
    layers are placed as `spec`, SGD in between."""
    model = tiny_model(seed=0) if model is None else model
    assert apply_placement(model, PlacementPlan.parse(spec), **where).spec() == spec
    assert applied_placement(model).spec() == spec
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        ids = torch.randint(0, 512, (1, 48), generator=torch.Generator().manual_seed(step))
        ids = ids.to(model.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, losses, grads


def test_disk_layers_equal_host_offload_bit_for_bit_and_leave_nvme_path_as_found(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    (nvme / "theirs.txt").write_text("not the run's")
    _, want_losses, want_grads = train("offload:2", pinned_pool=True)
    _, losses, grads = train("disk:1,offload:1", pinned_pool=True, nvme_path=str(nvme))
    _, all_disk, all_grads = train("disk:2", nvme_path=str(nvme))
    for got_l, got_g in ((losses, grads), (all_disk, all_grads)):
        assert all(torch.equal(a, b) for a, b in zip(got_l, want_losses))
        assert all(torch.equal(a, b) for a, b in zip(got_g, want_grads))
    tier = disk_tier.disk_tier(str(nvme))
    # 1 then 2 disk layers' inputs [1, 48, 64] fp32, written in each of two steps; each file is gone
    # once read back
    assert tier.bytes_written == (1 + 2) * 2 * 48 * 64 * 4 and tier.direct is not None
    assert tier.dir is None and sorted(os.listdir(nvme)) == ["theirs.txt"]
    # a metrics line's disk figures: the bytes since the last line, then none
    stats = disk_tier.step_stats()
    assert stats["disk_written_bytes"] == tier.bytes_written and stats["disk_wait_s"] >= 0
    assert stats["disk_gpu_stall_s"] == 0  # off CUDA: no GPU to stall
    assert disk_tier.step_stats() == {
        "disk_written_bytes": 0,
        "disk_wait_s": 0.0,
        "disk_gpu_stall_s": 0.0,
    }
    disk_tier.close_all()
    assert sorted(os.listdir(nvme)) == ["theirs.txt"] and disk_tier.step_stats() == {}


def test_full_disk_mid_step_stops_with_one_line_and_the_earlier_checkpoint_loads(
    tmp_path, monkeypatch
):
    model, _, _ = train("disk:2", steps=1, nvme_path=str(tmp_path))
    saved = tmp_path / "step1.pt"
    torch.save(model.state_dict(), saved)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(direct_io.os, "pwrite", full)
    ids = torch.randint(0, 512, (1, 48), generator=torch.Generator().manual_seed(5))
    with pytest.raises(disk_tier.DiskTierError) as e:
        model(input_ids=ids, labels=ids).loss.backward()
    msg = str(e.value)
    assert "\n" not in msg and "no space left" in msg and str(tmp_path) in msg
    assert "nvme_gb" in msg  # the fix
    monkeypatch.undo()
    disk_tier.close_all()  # what the run's exit does: the scratch directory goes, nvme_path stays
    assert os.listdir(tmp_path) == ["step1.pt"]
    back = tiny_model(seed=1)
    back.load_state_dict(torch.load(saved, weights_only=True))
    assert all(
        torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values())
    )


def test_no_o_direct_is_a_fallback_said_once_with_the_same_numbers(tmp_path, monkeypatch, caplog):
    _, want, want_grads = train("offload:2", pinned_pool=True)
    real_open = os.open

    def no_direct(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(direct_io.os, "open", no_direct)
    with caplog.at_level(logging.WARNING, logger="ds_longctx"):
        _, got, grads = train("disk:2", nvme_path=str(tmp_path))
    said = [r.getMessage() for r in caplog.records if "O_DIRECT" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path) in said[0], said
    assert disk_tier.disk_tier(str(tmp_path)).direct is False
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))


def test_disk_layers_need_an_nvme_path():
    with pytest.raises(ValueError, match="nvme_path"):
        apply_placement(tiny_model(), PlacementPlan.parse("disk:2"))


def test_a_forward_without_grad_writes_nothing(tmp_path):
    model = tiny_model(seed=0)
    apply_placement(model, PlacementPlan.parse("disk:2"), nvme_path=str(tmp_path))
    ids = torch.randint(0, 512, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, labels=ids)
    assert disk_tier.disk_tier(str(tmp_path)).bytes_written == 0 and os.listdir(tmp_path) == []


def test_zero_infinity_swaps_in_a_directory_of_the_runs_own(tmp_path):
    from ds_longctx.parallel import parallel_state

    theirs = (
        tmp_path / "zero_stage_3" / "optimizer" / "rank0"
    )  # what DeepSpeed empties at its start
    theirs.mkdir(parents=True)
    (theirs / "f").write_text("another run's")
    zero = {"offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}}
    zero["offload_param"] = {"device": "cpu"}
    ds = disk_tier.private_swap_dirs({"zero_optimization": zero})
    made = ds["zero_optimization"]["offload_optimizer"]["nvme_path"]
    assert os.path.dirname(made) == str(tmp_path) and os.path.isdir(made) and made != str(tmp_path)
    assert ds["zero_optimization"]["offload_param"] == {"device": "cpu"}
    parallel_state.AT_LEAVE[-1]()  # what leave() runs before os._exit
    assert not os.path.exists(made) and (theirs / "f").read_text() == "another run's"
    plain = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert disk_tier.private_swap_dirs(plain) == {
        "zero_optimization": {"offload_optimizer": {"device": "cpu"}}
    }


def test_a_disk_with_less_free_space_than_the_tier_needs_is_refused_at_start_and_plan(
    tmp_path, monkeypatch, capsys
):
    from ds_longctx.config import RunConfig
    from ds_longctx.plan import disk_args, write
    from ds_longctx.run.preflight import preflight

    where = {"placement": "disk:2", "nvme_path": str(tmp_path)}
    cfg = RunConfig(model="qwen3-tiny", seq_len=1024, dtype="fp32", **where)
    need = 2 * 1024 * 64 * 4 * 2  # 2 disk layers x 1,024 tokens x hidden 64 x fp32, 2 ranks
    monkeypatch.setattr(disk_tier.disk, "free_bytes", lambda p: need)
    args = (cfg, tiny_config(), 2, 2, 10**6)
    assert disk_tier.nvme_space_problem(*args, PlacementPlan.parse("disk:2")) is None
    # the placement given is the one counted: a third disk layer no longer fits
    assert disk_tier.nvme_space_problem(*args, PlacementPlan.parse("disk:3")) is not None
    monkeypatch.setattr(disk_tier.disk, "free_bytes", lambda p: need - 1)
    with pytest.raises(ValueError) as e:
        preflight(cfg, 2, 2)
    assert str(e.value) == (
        f"nvme_path={str(tmp_path)!r}: the disk tier needs ~1.0 MB on "
        f"{disk_tier.disk.mount_point(tmp_path)} and it has 1.0 MB free; free space there, give an "
        f"nvme_path on a larger disk, or plan again within it (ds-longctx plan --nvme_gb 0)"
    )
    monkeypatch.setattr(disk_args, "free_bytes", lambda p: 40 * 10**9)
    plan = ["--model", "qwen3-8b", "--gpus", "1", "--seq_len", "1024", "--nvme_path", str(tmp_path)]
    assert write.main([*plan, "--nvme_gb", "50"]) == 2
    assert "--nvme_gb 50: " in (err := capsys.readouterr().err) and "40.0 GB free" in err, err
    assert "give --nvme_gb 40 or less" in err
