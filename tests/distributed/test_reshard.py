"""A checkpoint resumed at another layout (CPU, gloo, fp32, qwen3-tiny): saved by 4 ranks at sp=4
(grad_accum 2), resumed at 2 ranks sp=2, at 4 ranks sp=2 x dp=2 (grad_accum 1: the global batch
kept) and at 1 rank. Each continues with the same step, lr and samples, and its losses equal a plain
HF model + torch AdamW stepped in this process from the checkpoint's weights and moments. A
universal file carrying a pickle is refused unloaded; another global batch is refused unless asked;
a machine the planner says is too small is refused before anything is loaded."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ds_longctx.checkpoint import universal
from ds_longctx.config import RunConfig
from ds_longctx.data import build_data
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.plan.search import find_max_len
from ds_longctx.run.model import load_hf_config
from tests.helpers import (
    read_metrics,
    rel_err,
    run_cli,
    run_module,
    text_run_args,
    tiny_model,
    torchrun,
)

pytestmark = pytest.mark.slow
TOL = 1e-5


def options(base: list, sp: int, accum: int) -> list:
    out = list(base)
    out[out.index("--sp_size") + 1] = str(sp)
    return [*out, "--grad_accum", str(accum)]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """4 ranks, sp=4, grad_accum 2: steps 1-4, saved at 2 and 4; the universal form of step 2
    written by `ds-longctx checkpoint reshard` ahead of the resumes."""
    d = tmp_path_factory.mktemp("reshard")
    base = text_run_args(d / "data")
    src = d / "src"
    torchrun(
        4,
        [
            "ds_longctx.train",
            *options(base, 4, 2),
            "--steps",
            "4",
            "--save_every",
            "2",
            "--output_dir",
            str(src),
        ],
        module=True,
    )
    res = run_cli(["checkpoint", "reshard", str(src), "--tag", "step2"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "universal: 25 parameters" in res.stdout and "peak host RSS" in res.stdout, res.stdout
    return {"dir": d, "base": base, "src": src}


def copy_at_step2(source, name: str, universal_too: bool = True) -> Path:
    out = source["dir"] / name
    shutil.copytree(source["src"], out)
    shutil.rmtree(out / "checkpoints" / "step4")
    (out / "checkpoints" / "latest").write_text("step2")
    if not universal_too:
        shutil.rmtree(out / "checkpoints" / "step2" / "universal")
    return out


@pytest.fixture(scope="module")
def reference(source):
    """Losses of steps 3 and 4: HF's Qwen3 with step 2's fp32 weights, torch AdamW with its moments
    and step, the run's gradient clipping (1.0), on samples 4-5 then 6-7 (global batch 2), the
    token-mean next-token CE."""
    tag = source["src"] / "checkpoints" / "step2"
    manifest = universal.read_manifest(tag)
    model = tiny_model(attn="eager")
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0
    )
    for p in manifest["params"]:
        whole = {
            k: t.view(p["shape"])
            for k, t in universal.read_slices(tag, p["name"], 0, p["numel"]).items()
        }
        param = params[p["name"].removeprefix("model.")]
        param.data.copy_(whole["fp32"])
        opt.state[param] = {
            "step": torch.tensor(manifest["optimizer_step"]),
            "exp_avg": whole["exp_avg"],
            "exp_avg_sq": whole["exp_avg_sq"],
        }
    assert len(manifest["params"]) == len(params)
    cfg = RunConfig.from_cli(options(source["base"], 1, 2), world_size=1)
    data = build_data(cfg, load_hf_config("qwen3-tiny"), 1)
    losses = []
    for step in (2, 3):
        batch = data.rows(range(2 * step, 2 * step + 2))
        logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids).logits
        labels = batch.labels[:, 1:]
        loss = (
            F.cross_entropy(
                logits[:, :-1].flatten(0, 1),
                labels.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            / (labels != IGNORE_INDEX).sum()
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize(
    "nproc,sp,accum,ahead",
    [(2, 2, 2, True), (4, 2, 1, True), (1, 1, 2, False)],
    ids=["2ranks_sp2", "4ranks_sp2xdp2", "1rank_converted_at_resume"],
)
def test_resume_at_another_layout_continues_the_run(source, reference, nproc, sp, accum, ahead):
    out = copy_at_step2(source, f"r{nproc}_{sp}", universal_too=ahead)
    res = torchrun(
        nproc,
        [
            "ds_longctx.train",
            *options(source["base"], sp, accum),
            "--steps",
            "4",
            "--save_every",
            "2",
            "--resume",
            "true",
            "--output_dir",
            str(out),
        ],
        module=True,
    )
    log = res.stdout + res.stderr
    assert (
        f"resume: layout world 4 = sp 4 x dp 1 -> world {nproc} = sp {sp} x dp {nproc // sp}" in log
    )
    assert ("writing the universal form" in log) != ahead
    straight, got = read_metrics(source["src"]), read_metrics(out)
    assert [r["step"] for r in got] == [1, 2, 3, 4] and got[:2] == straight[:2]
    assert [r["lr"] for r in got] == [r["lr"] for r in straight]
    for r, ref, old in zip(got[2:], reference, straight[2:]):
        assert rel_err(r["loss"], ref) <= TOL, (
            r["loss"],
            ref,
        )  # the plain model from the same weights and moments
        assert rel_err(r["loss"], old["loss"]) <= TOL, (
            r["loss"],
            old["loss"],
        )  # the straight run, old layout
        assert r["tokens"] == old["tokens"]
    meta = json.loads((out / "checkpoints" / "step4" / "meta.json").read_text())
    assert (meta["run"]["world_size"], meta["run"]["sp_size"], meta["samples"]) == (nproc, sp, 8)


def test_a_universal_file_carrying_a_pickle_is_refused_unloaded(source):
    out = copy_at_step2(source, "payload")
    base = out / "checkpoints" / "step2" / "universal"
    manifest = json.loads((base / universal.MANIFEST).read_text())
    name = sorted(manifest["files"])[0]
    marker = out / "PWNED"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"fp32": Payload()}, base / name)
    blob = (base / name).read_bytes()
    manifest["files"][name] = {
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }  # digests match
    (base / universal.MANIFEST).write_text(json.dumps(manifest))
    res = run_module(
        [
            "ds_longctx.train",
            *options(source["base"], 1, 2),
            "--steps",
            "4",
            "--resume",
            "true",
            "--output_dir",
            str(out),
        ]
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"{name}' is not a safetensors file" in res.stderr and "refused unloaded" in res.stderr
    assert not marker.exists()


def test_another_global_batch_is_refused_unless_asked(source):
    out = copy_at_step2(source, "batch")
    args = [
        "ds_longctx.train",
        *options(source["base"], 1, 1),
        "--steps",
        "4",
        "--resume",
        "true",
        "--output_dir",
        str(out),
        "--save_every",
        "2",
    ]
    res = run_module(args)
    assert res.returncode == 2
    assert (
        "trained 2 sequences a step" in res.stderr and "set grad_accum 2 to keep it" in res.stderr
    )
    assert not (out / "checkpoints" / "step4").exists()
    res = run_module([*args, "--allow_batch_change", "true"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "global batch 2 -> 1 sequences a step (allow_batch_change): the sample stream continues at "
        "sample 4" in res.stderr
    )
    meta = json.loads((out / "checkpoints" / "step4" / "meta.json").read_text())
    assert meta["samples"] == 4 + 2 * 1


def test_a_machine_the_planner_says_is_too_small_is_refused_before_loading(source):
    """Qwen3-8B at 1M tokens saved on 8 ranks (its meta), resumed on 2 x 141 GB: refused with the
    longest length that fits there, before any worker starts or any file is read."""
    out = copy_at_step2(source, "too_small", universal_too=False)
    tag = out / "checkpoints" / "step2"
    meta = json.loads((tag / "meta.json").read_text())
    meta["run"].update(
        model="qwen3-8b", seq_len=1048576, world_size=8, sp_size=8, dp_size=1, grad_accum=1
    )
    (tag / "meta.json").write_text(json.dumps(meta))
    (tag / "run.yaml").unlink()
    meta["files"].pop("run.yaml")
    (tag / "meta.json").write_text(json.dumps(meta))
    args = [a if a != "qwen3-tiny" else "qwen3-8b" for a in source["base"]]
    args[args.index("--seq_len") + 1] = "1048576"
    res = run_cli(
        [
            "train",
            *args,
            "--nproc",
            "2",
            "--gpu_budget_gb",
            "141",
            "--resume",
            "true",
            "--output_dir",
            str(out),
        ]
    )
    assert res.returncode == 2, res.stderr[-2000:]
    import psutil

    longest = find_max_len("qwen3-8b", 2, 141, psutil.virtual_memory().total / 1e9)
    assert (
        "does not fit 2 x 141 GB GPUs" in res.stderr
        and f"longest that fits is {longest:,} tokens" in res.stderr
    )
    assert not (tag / "universal").exists() and "resharded" not in res.stderr
