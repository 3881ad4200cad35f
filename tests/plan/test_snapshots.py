"""The plan against the CUDA allocator's own record: each committed GPU run that recorded its
allocations (`run/memory/rank0_peak.txt`, logging.memory_snapshot_steps) is planned again with its
own levers, and the plan's live tensors (its terms in every phase plus its peak phase, before
fragmentation and the CUDA context) must be the bytes the allocator held at its highest point."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from ds_longctx.config import RunConfig
from ds_longctx.rehearsal.world import planned
from ds_longctx.run.preflight import validate
from tests.helpers import ROOT

SESSIONS = ROOT / "benchmarks/results/sessions"
# (run directory, layers of the model file the run trained: reduced depth writes its own, None: the
# shipped one)
RECORDED = [
    ("session_2026-12-04_h200x1-20261204T1000/moe_longest", 1),
    ("session_2026-12-04_h200x1-20261204T1235/moe_longest", 1),
    ("session_2026-12-04_h200x1-20261204T1235/qwen35_longest", None),
    ("session_2026-12-04_h200x1-20261204T1845/qwen35_longest", None),
    ("session_2026-12-04_h200x1-20261204T1845/plan_run_qwen3.5-4b_131072", None),
]


def allocated_peak(run_dir) -> int:
    """The first line of rank0_peak.txt: `... (event N of M recorded): X GiB`, in bytes."""
    first = (run_dir / "run/memory/rank0_peak.txt").read_text().splitlines()[0]
    return round(float(re.search(r": ([\d.]+) GiB$", first).group(1)) * 2**30)


@pytest.mark.parametrize(
    "where,layers", RECORDED, ids=[r[0].split("/")[-1] + "@" + r[0][-5:] for r in RECORDED]
)
def test_the_plan_holds_what_the_allocator_held(where, layers, tmp_path):
    run_dir = SESSIONS / where
    overrides = {}
    if layers is not None:  # benchmarks/device_job.sh's reduced model file, written again here
        name = yaml.safe_load((run_dir / "plan/run.yaml").read_text())["model"]["name"]
        shipped = name.split("/")[-1].split("-reduced")[0]  # /tmp/qwen3-30b-a3b-reduced.json
        geometry = json.loads((ROOT / "ds_longctx/models" / f"{shipped}.json").read_text())
        geometry["num_hidden_layers"] = layers
        (tmp_path / "model.json").write_text(json.dumps(geometry))
        overrides["model"] = str(tmp_path / "model.json")
    cfg = RunConfig.load(run_dir / "plan/run.yaml", **overrides)
    p = planned(cfg, validate(cfg, 1, 1))
    live = p.reserved_bytes - p.term("allocator_slack").gpu_bytes  # all + the peak phase
    measured = allocated_peak(run_dir)
    assert abs(live / measured - 1) < 0.02, (p.peak_phase, live, measured)
