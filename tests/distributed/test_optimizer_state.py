"""`optimizer.state_at_build` (run/optimizer_state.py) on CPU (gloo, 2 processes, SP=2, qwen3-tiny,
fp32, AdamW with weight decay): the Adam moments exist right after the build, zero and at step 0,
the master weights are the ones the lazy default builds, and two steps later weights, moments and
step counters equal the lazy default's, for the optimizer on the device (torch AdamW), fully
offloaded (DeepSpeedCPUAdam, JIT-built on first use) and half offloaded (CPU Adam plus DeepSpeed's
AdamW for the other half)."""

import pytest
import torch

from tests.helpers import torchrun

pytestmark = pytest.mark.slow

CASES = {
    "device": [],
    "offload": ["optimizer_offload=true"],
    "half": ["optimizer_offload=true", "optimizer_offload_ratio=0.5"],
}


def run(tmp_path, case: str, at_build: bool, nproc: int = 2, env: dict | None = None) -> list[dict]:
    """The worker's per-rank files for `case` with the state made at build or not (SP = nproc)."""
    out = tmp_path / f"{case}_{at_build}"
    out.mkdir()
    sets = [x for kv in [*CASES[case], f"sp_size={nproc}"] for x in ("--set", kv)]
    torchrun(
        nproc,
        [
            "tests/distributed/optimizer_state_worker.py",
            "--at_build",
            str(at_build).lower(),
            "--out",
            str(out),
            *sets,
        ],
        env=env,
        timeout=900,
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-8)


def assert_steps_as_the_lazy_default(
    made: list[dict], lazy: list[dict], case: str, exact: bool = True
) -> None:
    """Per rank: state at build (zero moments, step 0, weights untouched) and, two steps later, the
    lazy default's losses, weights, moments and step counters: bit for bit (`exact`; CPU), or to
    fp32 rounding (a GPU's attention backward may add in another order from run to run). A first
    real step at another step count (bias correction) or with the warm-up's update left in would be
    far outside both."""
    for rank, (m, lz) in enumerate(zip(made, lazy)):
        assert m["built"]["optimizers"] == lz["built"]["optimizers"]
        if case == "half":
            assert m["built"]["optimizers"] == ["AdamW", "DeepSpeedCPUAdam"]
        # at build: the lazy default has no state; ours has every sub-group's, zero moments at step
        # 0
        assert all(st == {} for st in lz["built"]["state"]), (rank, lz["built"]["state"])
        assert len(m["built"]["state"]) == len(lz["built"]["state"]) >= 1
        for p, st in zip(m["built"]["master"], m["built"]["state"]):
            assert {"step", "exp_avg", "exp_avg_sq"} <= set(st), st.keys()
            assert st["step"] == 0
            assert st["exp_avg"].shape == st["exp_avg_sq"].shape == p.shape
            assert not st["exp_avg"].any() and not st["exp_avg_sq"].any()
        # the warm-up step changed no weight (lr and weight decay 0 for it): the same master as the
        # lazy build
        for a, b in zip(m["built"]["master"], lz["built"]["master"]):
            assert torch.equal(a, b)
        # two real steps later: the same losses, weights, moments and step counters as the lazy
        # default
        assert (
            m["losses"] == lz["losses"]
            if exact
            else m["losses"] == pytest.approx(lz["losses"], rel=1e-6)
        )
        for a, b in zip(m["stepped"]["master"], lz["stepped"]["master"]):
            assert same(a, b, exact)
        assert any(
            not torch.equal(a, b) for a, b in zip(m["stepped"]["master"], m["built"]["master"])
        )
        for sa, sb in zip(m["stepped"]["state"], lz["stepped"]["state"]):
            assert sa.keys() == sb.keys() and sa["step"] == sb["step"] == 2
            for k in ("exp_avg", "exp_avg_sq"):
                assert same(sa[k], sb[k], exact), k
            assert sa["exp_avg_sq"].any()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c, marks=[pytest.mark.cpu_adam] if "optimizer_offload=true" in CASES[c] else []
        )
        for c in CASES
    ],
)
def test_state_made_at_build_steps_as_the_lazy_default(tmp_path, case):
    assert_steps_as_the_lazy_default(run(tmp_path, case, True), run(tmp_path, case, False), case)


class Zero3Like:
    """The three things `materialize` uses of DeepSpeed's ZeRO-3 optimizer, as stage3.py has them:
    the fp32
    sub-groups, the inner optimizer with empty param groups between steps, and `_optimizer_step(i)`,
    which puts sub-group i in its group, steps and takes it out again."""

    def __init__(self, opt_cls, sizes=(5, 3), **kw):
        self.fp32_partitioned_groups_flat = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
        self.optimizer = opt_cls(self.fp32_partitioned_groups_flat, lr=0.1, **kw)
        self.optimizer.param_groups[0]["params"] = []

    def _optimizer_step(self, i):
        self.optimizer.param_groups[0]["params"] = [self.fp32_partitioned_groups_flat[i]]
        self.optimizer.step()
        self.optimizer.param_groups[0]["params"] = []


def test_other_optimizers_and_other_engines_are_left_to_their_first_step():
    from ds_longctx.run.optimizer_state import materialize, skip_reason

    zo = Zero3Like(torch.optim.SGD, momentum=0.9)
    made, line = materialize(zo)
    assert made == 0 and "optimizer SGD is not one of" in line and "left to the first step" in line
    assert len(zo.optimizer.state) == 0
    assert "no per-sub-group step" in skip_reason(object())
    for attr, value, why in (
        ("swap_optimizer", True, "NVMe"),
        ("torch_autocast_gradscaler", object(), "GradScaler"),
        ("zenflow", True, "ZenFlow"),
    ):
        zo = Zero3Like(torch.optim.AdamW)
        setattr(zo, attr, value)
        assert why in skip_reason(zo) and materialize(zo)[0] == 0 and len(zo.optimizer.state) == 0


def test_a_sub_group_with_state_keeps_it_and_the_others_get_theirs():
    from ds_longctx.run.optimizer_state import materialize

    zo = Zero3Like(torch.optim.AdamW, weight_decay=0.1)
    first, second = zo.fp32_partitioned_groups_flat
    first.grad = torch.ones_like(first)
    for _ in range(3):
        zo._optimizer_step(0)
    first.grad = None
    before = {k: v.clone() for k, v in zo.optimizer.state[first].items()}
    weights = [p.detach().clone() for p in zo.fp32_partitioned_groups_flat]
    made, line = materialize(zo)
    assert made == 1 and "made at build for 1 sub-groups (AdamW" in line
    assert all(
        torch.equal(zo.optimizer.state[first][k], v) for k, v in before.items()
    )  # step 3 stays 3
    st = zo.optimizer.state[second]
    assert st["step"] == 0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any()
    assert all(torch.equal(p, w) for p, w in zip(zo.fp32_partitioned_groups_flat, weights))
    assert (
        zo.optimizer.param_groups[0]["lr"] == 0.1
        and zo.optimizer.param_groups[0]["weight_decay"] == 0.1
    )
    assert second.grad is None
