"""Several nodes on one machine (CPU, gloo, ZeRO-3): two torchrun agents of 2 processes each
(`--nnodes 2 --node_rank 0/1`, launch.txt's c10d rendezvous on a localhost port) are one world of 4
whose SP groups (sp=2) stay inside a "node" and whose data parallelism runs across the two. They
write the losses of one node of 4 processes, and a checkpoint they save resumes on them with the
straight run's losses.

What one machine cannot show: another network between the nodes, and a filesystem that is not
shared. checkpoint/resume.py assumes output_dir is one filesystem for every rank (rank 0 renames
what all ranks wrote); here it is, as on a cluster's shared filesystem.
"""

import pytest

from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import ckpt_root
from tests.helpers import free_port, read_metrics, rel_err, run_module, torchrun, torchrun_nodes

pytestmark = pytest.mark.slow
TOL = 1e-4
RUN = [
    "ds_longctx.train",
    "--model",
    "qwen3-tiny",
    "--seq_len",
    "64",
    "--dtype",
    "fp32",
    "--lr",
    "1e-3",
    "--sp_size",
    "2",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One node of 4 processes, 4 steps straight; two nodes of 2: 2 steps saved, then resumed to
    4."""
    d = tmp_path_factory.mktemp("nodes")
    one, two = d / "one_node", d / "two_nodes"
    torchrun(4, [*RUN, "--steps", "4", "--output_dir", str(one)], module=True)
    torchrun_nodes(
        2,
        2,
        [*RUN, "--steps", "2", "--save_every", "2", "--output_dir", str(two)],
        module=True,
        output_dir=two,
    )
    first = read_metrics(two)
    torchrun_nodes(
        2,
        2,
        [*RUN, "--steps", "4", "--save_every", "2", "--resume", "--output_dir", str(two)],
        module=True,
        output_dir=two,
    )
    return {"one": read_metrics(one), "first": first, "two": two}


def test_two_nodes_of_2_write_the_losses_of_one_node_of_4(runs):
    one, two = runs["one"], runs["first"]
    assert [r["step"] for r in two] == [1, 2]
    assert all(
        r["tokens"] == 2 * 64 for r in two
    )  # dp = 4 / sp 2 = 2 sequences per step: one per node
    assert max(rel_err(a["loss"], b["loss"]) for a, b in zip(two, one)) <= TOL, (two, one[:2])


def test_a_checkpoint_saved_across_nodes_resumes_with_the_straight_losses(runs):
    two = read_metrics(runs["two"])
    assert [r["step"] for r in two] == [1, 2, 3, 4] and two[:2] == runs["first"]
    assert max(rel_err(a["loss"], b["loss"]) for a, b in zip(two, runs["one"])) <= TOL, (
        two,
        runs["one"],
    )
    root = ckpt_root(runs["two"])
    tag_dir, meta = resume.find_checkpoint(root)  # complete: every listed file at its size
    assert (
        tag_dir.name == "step4" and meta["run"]["world_size"] == 4 and meta["run"]["sp_size"] == 2
    )
    # every rank of both nodes wrote its ZeRO-3 partition and RNG into the one directory
    assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)} <= set(meta["files"])
    assert {f"rng_rank{r:05d}.pt" for r in range(4)} <= set(meta["files"])


def test_an_sp_group_across_nodes_is_refused_before_start(tmp_path):
    """sp=4 on nodes of 2 processes: the rank sees LOCAL_WORLD_SIZE=2 of WORLD_SIZE=4 (what torchrun
    gives it) and refuses with exit 2 and one line, before any process group or file exists."""
    out = tmp_path / "run"
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    res = run_module(
        [
            "ds_longctx.train",
            "--model",
            "qwen3-tiny",
            "--seq_len",
            "64",
            "--sp_size",
            "4",
            "--output_dir",
            str(out),
        ],
        env,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        "refused before start: sp_size=4 does not divide the 2 processes per node, so an SP group "
        "would "
        "straddle nodes (its all-to-all over the inter-node network); try one of [1, 2] per node, "
        "or set sp_across_nodes: true to let SP groups span nodes"
    ), last
    assert not out.exists()
