"""`parallel_state.init_distributed` for a plain-python world of one: its rendezvous port (CPU,
gloo)."""

import json
import socket
import subprocess
import sys

import pytest

from tests.helpers import ROOT, cpu_env, free_port

WORLD_OF_ONE = """
import json, os
import torch.distributed as dist
from ds_longctx.parallel.parallel_state import init_distributed
init_distributed()
print(json.dumps({"world": dist.get_world_size(), "port": os.environ["MASTER_PORT"]}))
"""


def _world_of_one(env: dict) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", WORLD_OF_ONE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_world_of_one_takes_a_free_port_so_two_jobs_on_a_machine_do_not_collide():
    """Plain `python` (no RANK): the rendezvous binds a port nothing holds. With the fixed 29517 of
    before, a second single-process job on the machine (here: a socket listening there) failed with
    EADDRINUSE. A MASTER_PORT given is kept."""
    env = {
        k: v
        for k, v in cpu_env().items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")
    }
    with socket.socket() as held:
        try:
            held.bind(
                ("127.0.0.1", 29517)
            )  # the old default, as another job on this machine would hold it
            held.listen()
        except OSError:  # another process holds it already (two test runs at once): the same case
            pass
        got = _world_of_one(env)
        assert got["world"] == 1 and got["port"] != "29517"
        port = str(free_port())
        assert _world_of_one(dict(env, MASTER_PORT=port)) == {"world": 1, "port": port}


def test_a_config_planned_for_one_world_refuses_a_launch_of_another():
    from ds_longctx.parallel.parallel_state import check_planned_world

    check_planned_world(None, None, 3, 3)  # no world written: any launch
    check_planned_world(1, 8, 8, 8)
    check_planned_world(2, 8, 16, 8)
    with pytest.raises(
        ValueError, match=r"planned for 8 processes \(1 node\(s\) x 8\); this launch has 2 \(1 node"
    ):
        check_planned_world(1, 8, 2, 2)
    with pytest.raises(
        ValueError,
        match=r"planned for 16 processes \(2 node\(s\) x 8\); this launch has 16 \(4 node",
    ):
        check_planned_world(2, 8, 16, 4)  # the same count, spread otherwise: another plan
    with pytest.raises(ValueError, match="parallel.nodes: null"):
        check_planned_world(1, 8, 4, 4)


def test_train_refuses_a_generated_config_on_another_world_before_any_worker():
    from tests.helpers import run_cli

    res = run_cli(
        ["train", "--nproc", "2", "--config", "ds_configs/qwen3-8b_1m_8x141gb/run.yaml"],
        timeout=120,
    )
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert "planned for 8 processes" in last and "this launch has 2" in last, last
