"""Every bad input is refused before anything expensive starts, with a message that names the value and the
fix, and leaves output_dir exactly as it was (absent stays absent).

In-process: each case goes through what `train.main` runs before it builds the engine (RunConfig,
`preflight.preflight`, `data.build_data`), or through `export.export`. Two cases also run the real
`python -m ds_longctx.train` entry point. Cases that need a real multi-process checkpoint (resume with a
different world size) and the NaN stop are in tests/distributed/test_resume.py.
"""

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from ds_longctx.checkpoint import files as checkpoint_files
from ds_longctx.checkpoint import resume
from ds_longctx.checkpoint.layout import FORMAT, CheckpointError, ckpt_root
from ds_longctx.config import RunConfig, format_validation_error, resume_keys
from ds_longctx.data import build_data, build_eval_data
from ds_longctx.run.preflight import preflight
from tests.helpers import (
    ROOT,
    documents,
    free_port,
    make_tokenizer,
    run_cli,
    run_module,
    token_ids,
    write_jsonl,
    write_parquet,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    docs = documents(30)
    f = {"dir": d, "tok": str(make_tokenizer(d / "tok")), "jsonl": str(write_jsonl(d / "ok.jsonl", docs)),
         "cache": str(d / "cache"), "big_tok": str(make_tokenizer(d / "big_tok", n_words=600))}
    (d / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 10)
    (d / "data.bin").write_bytes(b"0123")
    (d / "fake.parquet").write_text("not parquet")
    (d / "broken.jsonl").write_text('{"text": "w1 w2"\n')
    (d / "list.jsonl").write_text('["w1", "w2"]\n')
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    (d / "body.jsonl").write_text('{"body": "w1 w2"}\n')
    (d / "ids_high.jsonl").write_text(json.dumps({"input_ids": [5, 6, 700]}) + "\n")
    (d / "ids_negative.jsonl").write_text(json.dumps({"input_ids": [5, -1, 6]}) + "\n")
    (d / "tiny.jsonl").write_text('{"text": "w1 w2 w3"}\n')
    write_jsonl(d / "short_docs.jsonl", documents(5, min_words=3, max_words=8))
    mixed = d / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "a.jsonl", docs[:3])
    write_parquet(mixed / "b.parquet", docs[3:6])
    (d / "empty_dir").mkdir()
    (d / "a_file").write_text("x")
    return f


def snapshot(path: Path):
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*")) if path.exists() else None


def refused(out: Path, fragments, world: int = 1, **kw) -> str:
    """Run the pre-engine checks of train.main for RunConfig(**kw); assert a refusal naming every fragment and
    that `out` (the run's output_dir) is unchanged."""
    kw.setdefault("output_dir", str(out))
    before = snapshot(out)
    try:
        cfg = RunConfig(**kw)
        hf_cfg, _ = preflight(cfg, world)
        build_data(cfg, hf_cfg, world // cfg.parallel.sp_size)
        build_eval_data(cfg, hf_cfg)
    except ValidationError as e:
        msg = format_validation_error(e)
    except ValueError as e:
        msg = str(e)
    else:
        raise AssertionError(f"not refused: {kw}")
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in: {msg}"
    assert snapshot(out) == before, "a refused run changed output_dir"
    return msg


def data_kw(files, name, **kw):
    return {"data": str(files["dir"] / name) if not name.startswith("/") else name, "tokenizer": files["tok"],
            "seq_len": 32, "data_cache_dir": files["cache"], **kw}


# ----------------------------------------------------------------------------- data
@pytest.mark.parametrize("name, fragments", [
    ("missing.jsonl", ["missing.jsonl", "does not exist", "pass an existing"]),
    ("binary.txt", ["binary.txt", "is not text", "NUL byte", "UTF-8 text"]),
    ("latin1.txt", ["latin1.txt", "not UTF-8", "0xe9", "convert it to UTF-8"]),
    ("data.bin", ["data.bin", "'.bin'", "supported"]),
    ("fake.parquet", ["fake.parquet", "not a Parquet file", "to_parquet"]),
    ("broken.jsonl", ["broken.jsonl", "line 1 (byte 16): not JSON", "cut short?", "fix that line in the file"]),
    ("list.jsonl", ["list.jsonl", "JSON list, not an object", "one"]),
    ("mixed", ["mixed", "mixes formats", "['json', 'parquet']", "split the"]),
    ("empty_dir", ["empty_dir", "empty directory", "put .txt"]),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_data_files(files, tmp_path, name, fragments):
    refused(tmp_path / "out", fragments, **data_kw(files, name))


def test_empty_dataset(files, tmp_path):
    refused(tmp_path / "out", ["empty.jsonl", "is empty (0 documents", "give it documents"],
            **data_kw(files, "empty.jsonl"))


def test_dataset_of_empty_documents(files, tmp_path):
    refused(tmp_path / "out", ["blank.jsonl", "tokenized to 0 tokens", "2 documents, all empty"],
            **data_kw(files, "blank.jsonl"))


def test_text_field_missing(files, tmp_path):
    refused(tmp_path / "out", ["text_field='text'", "['body']", "set text_field"], **data_kw(files, "body.jsonl"))


def test_text_without_tokenizer(files, tmp_path):
    refused(tmp_path / "out", ["ok.jsonl", "needs a tokenizer", "set tokenizer"],
            **data_kw(files, "ok.jsonl", tokenizer=None))


def test_tokenizer_missing(files, tmp_path):
    refused(tmp_path / "out", ["tokenizer=", "nope", "is not a directory", "local tokenizer directory"],
            **data_kw(files, "ok.jsonl", tokenizer=str(tmp_path / "nope")))


def test_tokenizer_larger_than_model_vocab(files, tmp_path):
    refused(tmp_path / "out", ["big_tok", "has 604 tokens", "vocab_size=512", "use the model's own tokenizer"],
            **data_kw(files, "ok.jsonl", tokenizer=files["big_tok"]))


def test_token_ids_out_of_range(files, tmp_path):
    refused(tmp_path / "out", ["ids_high.jsonl", "token id 700", "vocab_size=512", "re-tokenize"],
            **data_kw(files, "ids_high.jsonl", tokenizer=None))


def test_negative_token_ids(files, tmp_path):
    refused(tmp_path / "out", ["ids_negative.jsonl", "token id -1", "re-tokenize"],
            **data_kw(files, "ids_negative.jsonl", tokenizer=None))


def test_documents_shorter_than_seq_len_without_concatenation(files, tmp_path):
    shortest = min(len(ids) for ids in token_ids(documents(5, min_words=3, max_words=8))) + 1  # + EOS
    refused(tmp_path / "out", ["5 of 5 documents", "shorter than seq_len=32", f"shortest {shortest} tokens",
                               "data_layout: concat", f"seq_len <= {shortest}"],
            **data_kw(files, "short_docs.jsonl", data_layout="document"))


def test_fewer_tokens_than_one_row(files, tmp_path):
    refused(tmp_path / "out", ["tiny.jsonl", "has 4 tokens", "seq_len=32", "lower seq_len to at most 4"],
            **data_kw(files, "tiny.jsonl"))


def test_fewer_rows_than_one_step_needs(files, tmp_path):
    refused(tmp_path / "out", ["rows of seq_len=512", "one step needs 4", "micro_batch=4", "add data"],
            **data_kw(files, "ok.jsonl", seq_len=512, micro_batch=4))


def test_hub_name_without_a_hub(files, tmp_path, monkeypatch):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refused(tmp_path / "out", ["no_such_org_xyz/corpus", "could not be loaded from the hub", "pass a local"],
            **{**data_kw(files, "ok.jsonl"), "data": "no_such_org_xyz/corpus"})


# ----------------------------------------------------------------------------- layout, attention, RoPE
def test_packing_beyond_the_cpu_masked_fallback(files, tmp_path):
    refused(tmp_path / "out", ["data_layout='pack'", "seq_len=32768", "16384", "data_layout: concat"],
            **data_kw(files, "ok.jsonl", seq_len=32768, data_layout="pack"))


def test_packing_with_micro_batch_above_one(files, tmp_path):
    refused(tmp_path / "out", ["data_layout='pack'", "micro_batch=2", "set micro_batch: 1"],
            **data_kw(files, "ok.jsonl", data_layout="pack", micro_batch=2))


def test_seq_len_beyond_yarn(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048}
    refused(tmp_path / "out", ["seq_len=8192", "beyond what YaRN is set for", "factor 2.0", "4096 positions",
                               "factor >= 4", "rope_scaling: auto"], seq_len=8192, rope_scaling=yarn)


# ----------------------------------------------------------------------------- output_dir
def test_output_dir_is_a_file(files):
    refused(files["dir"] / "a_file", ["a_file", "is a file", "choose a directory"])


def test_output_dir_under_a_file(files):
    refused(files["dir"] / "a_file" / "run", ["a_file", "cannot be created", "is a file", "another output_dir"])


def test_output_dir_not_writable(tmp_path):
    out = Path("/proc/ds_longctx_run")  # read-only for every user, root included
    refused(out, ["/proc/ds_longctx_run", "is not writable", "choose a writable output_dir"])


def test_eval_data_missing(files, tmp_path):
    refused(tmp_path / "out", ["missing.jsonl", "does not exist"], **data_kw(files, "ok.jsonl"),
            eval_data=str(files["dir"] / "missing.jsonl"))


def test_eval_data_with_fewer_rows_than_eval_rows(files, tmp_path):
    refused(tmp_path / "out", ["short_docs.jsonl", "fewer than eval_rows=50", "lower eval_rows to"],
            **data_kw(files, "ok.jsonl"), eval_data=str(files["dir"] / "short_docs.jsonl"), eval_rows=50)


# ----------------------------------------------------------------------------- resume
def fake_checkpoint(out: Path, step: int = 3, world: int = 2, sp: int = 2, **run_overrides) -> Path:
    """A complete-looking checkpoint (meta.json + one sized file) as checkpoint/save.save writes it."""
    cfg = RunConfig(output_dir=str(out))
    run = resume_keys.stored_values(cfg) | run_overrides
    run.update(world_size=world, sp_size=sp, dp_size=world // sp)
    root = ckpt_root(out)
    tag = root / f"step{step}"
    tag.mkdir(parents=True)
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").write_bytes(b"x" * 100)
    meta = {"format": FORMAT, "step": step, "tag": tag.name, "run": run, "data": {},
            "files": checkpoint_files.entries(tag, ["zero_pp_rank_0_mp_rank_00_optim_states.json"])}
    (tag / "meta.json").write_text(json.dumps(meta))
    (root / "latest").write_text(tag.name)
    return tag


def test_resume_without_a_checkpoint(tmp_path):
    refused(tmp_path / "out", ["resume", "no checkpoint in", "save_every > 0"], resume=True, steps=6)


def test_resume_with_latest_missing(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag.parent / "latest").unlink()
    refused(tmp_path / "out", ["latest' is missing", "['step3']", "resume_tag"], resume=True, steps=6,
            sp_size=2, world=2)


def test_resume_from_a_tag_that_does_not_exist(tmp_path):
    fake_checkpoint(tmp_path / "out")
    refused(tmp_path / "out", ["tag 'step9' does not exist", "available: ['step3']"], resume=True,
            resume_tag="step9", steps=12, sp_size=2, world=2)


def test_resume_from_an_interrupted_save(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "meta.json").unlink()
    refused(tmp_path / "out", ["step3", "is incomplete", "no meta.json", "use an earlier tag"], resume=True,
            steps=6, sp_size=2, world=2)


def test_resume_from_a_truncated_checkpoint(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").write_bytes(b"x" * 40)
    refused(tmp_path / "out", ["corrupt", "zero_pp_rank_0_mp_rank_00_optim_states.json has 40 bytes, 100 were written",
                               "use an earlier tag"], resume=True, steps=6, sp_size=2, world=2)


def test_resume_from_a_checkpoint_with_a_missing_file(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.json").unlink()
    refused(tmp_path / "out", ["corrupt", "optim_states.json is missing"], resume=True, steps=6, sp_size=2, world=2)


def test_resume_with_another_world_size_and_global_batch(tmp_path):
    fake_checkpoint(tmp_path / "out", world=2, sp=2)
    refused(tmp_path / "out", ["trained 1 sequences a step (dp 1 x micro_batch 1 x grad_accum 1)",
                               "this run trains 2 (dp 2 x micro_batch 1 x grad_accum 1)", "--allow_batch_change true"],
            resume=True, steps=6, sp_size=2, world=4)


def test_resume_with_another_sp_size_keeping_the_batch_is_a_reshard(tmp_path):
    fake_checkpoint(tmp_path / "out", world=2, sp=2)
    cfg = RunConfig(output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=1, grad_accum=1)
    meta = resume.check_run_dir(cfg, 1)
    assert meta["layout_change"].startswith("resume: layout world 2 = sp 2 x dp 1 -> world 1 = sp 1 x dp 1")


def test_resume_with_changed_settings(tmp_path):
    """Keys that make the model, its numerics or the data order are refused, each named with both values; the lr,
    the step count and the levers may change (run/resume_changes.py applies them)."""
    fake_checkpoint(tmp_path / "out")
    msg = refused(tmp_path / "out", ["resume: this run changes model.dtype 'auto' -> 'bf16', train.seq_len 256 -> 512 "
                                     "from checkpoint", "resume with the checkpoint's values (its run.yaml) or start "
                                     "a new output_dir"], resume=True, steps=6, sp_size=2, world=2, seq_len=512,
                  dtype="bf16", lr=1e-3)
    assert "lr" not in msg
    cfg = RunConfig(output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=2, lr=1e-3, offload_layers=1)
    meta = resume.check_run_dir(cfg, 2)
    changed = resume_keys.compare(meta["run"], cfg)[1]
    assert resume_keys.changed_line(changed, meta["step"]) == ("resume: changed since step 3: steps 3 -> 6, lr 0.0001 "
                                                               "-> 0.001, offload_layers 0 -> 1")


@pytest.mark.parametrize("kw, says", [
    ({"optimizer_offload": True, "optimizer_offload_ratio": 0.5}, "optimizer.offload_ratio 1 -> 0.5 (the optimizer "
                                                                 "state is saved in the old split's sub-groups"),
    ({"torch_adam": False}, "optimizer.torch_adam True -> False (the saved Adam state is carried into another "
                            "implementation only for optimizer_offload)"),
    ({"attn_backend": "sdpa_math"}, "kernels.attn_backend 'auto' -> 'sdpa_math'"),
    ({"rope_scaling": "none"}, "model.rope_scaling 'auto' -> 'none'"),
])
def test_resume_refuses_a_change_that_cannot_be_honoured_naming_why(tmp_path, kw, says):
    fake_checkpoint(tmp_path / "out")
    msg = refused(tmp_path / "out", [f"resume: this run changes {says}"], resume=True, steps=6, sp_size=2, world=2,
                  **kw)
    assert "optimizer.offload " not in msg  # the offload itself may change (run/resume_changes.py)


def test_resume_with_changed_lora_and_from_a_checkpoint_older_than_lora(tmp_path):
    fake_checkpoint(tmp_path / "out", lora_rank=8)
    refused(tmp_path / "out", ["lora.rank 8 -> 4"], resume=True, steps=6, sp_size=2, world=2, lora_rank=4)
    old = fake_checkpoint(tmp_path / "old")  # written before the lora keys existed: they held their defaults
    meta = json.loads((old / "meta.json").read_text())
    meta["run"] = {k: v for k, v in meta["run"].items() if not k.startswith("lora_") and k != "steps"}
    (old / "meta.json").write_text(json.dumps(meta))
    cfg = RunConfig(output_dir=str(tmp_path / "old"), resume=True, steps=6, sp_size=2)
    assert resume_keys.compare(resume.check_run_dir(cfg, 2)["run"], cfg) == ([], [])  # steps then: not known
    refused(tmp_path / "old", ["lora.rank 0 -> 4"], resume=True, steps=6, sp_size=2, world=2, lora_rank=4)


def test_resume_from_a_checkpoint_that_stored_fewer_keys_compares_its_run_yaml(tmp_path):
    """Keys its meta.json lacks (compared since) are read from the checkpoint's run.yaml, not assumed default."""
    tag = fake_checkpoint(tmp_path / "out")
    RunConfig(rope_scaling="none", steps=3).dump(tag / "run.yaml")
    meta = json.loads((tag / "meta.json").read_text())
    meta["run"] = {k: v for k, v in meta["run"].items() if k not in ("rope_scaling", "steps")}
    meta["files"].update(checkpoint_files.entries(tag, ["run.yaml"]))
    (tag / "meta.json").write_text(json.dumps(meta))
    cfg = RunConfig(output_dir=str(tmp_path / "out"), resume=True, steps=6, sp_size=2, rope_scaling="none")
    saved = resume_keys.saved_values(resume.check_run_dir(cfg, 2)["run"], tag / "run.yaml")
    assert resume_keys.compare(saved, cfg) == ([], [("steps", 3, 6)])
    refused(tmp_path / "out", ["model.rope_scaling 'none' -> 'auto'"], resume=True, steps=6, sp_size=2, world=2)


def test_resume_with_nothing_left_to_train(tmp_path):
    fake_checkpoint(tmp_path / "out", step=6)
    refused(tmp_path / "out", ["at step 6 and steps=6", "set steps above 6"], resume=True, steps=6, sp_size=2,
            world=2)


def test_fresh_run_into_a_directory_with_checkpoints(tmp_path):
    fake_checkpoint(tmp_path / "out")
    refused(tmp_path / "out", ["already holds checkpoints (latest step3)", "--resume", "new output_dir"])


def test_overwrite_deletes_only_checkpoints_this_project_wrote(tmp_path):
    """--overwrite deletes checkpoints/ where every file in it is a save's; a file no save wrote (beside the tags, or
    inside one) is refused by name before anything starts, and stays."""
    tag = fake_checkpoint(tmp_path / "out")
    (tag.parent / "zero_to_fp32.py").write_text("# DeepSpeed's script, copied by its save\n")
    (tag.parent / "notes.txt").write_text("mine")
    (tag / "extra.bin").write_bytes(b"x")
    refused(tmp_path / "out", ["overwrite deletes", "checkpoints' only where every file in it is a checkpoint's",
                               "checkpoints/notes.txt, checkpoints/step3/extra.bin, which no save wrote",
                               "move those out of it, or choose a new output_dir"], overwrite=True)
    cfg = RunConfig(output_dir=str(tmp_path / "out"), overwrite=True)
    with pytest.raises(CheckpointError, match="checkpoints/notes.txt"):
        resume.clear_previous_run(cfg)
    (tag.parent / "notes.txt").unlink()
    (tag / "extra.bin").unlink()
    assert resume.check_run_dir(cfg, 1) is None
    resume.clear_previous_run(cfg)
    assert not ckpt_root(tmp_path / "out").exists()


def test_checkpoints_that_do_not_fit_the_free_space_are_refused(tmp_path, monkeypatch):
    """save_every > 0: keep_checkpoints + 1 checkpoints at once (plan/planner.disk_checkpoint_bytes each: 12 bytes per
    trained parameter, fp32 on CPU: qwen3-tiny 2.0 MB) against output_dir's free space, with the keep that fits."""
    from ds_longctx.run import preflight as pre
    monkeypatch.setattr(pre, "free_bytes", lambda path: 5_000_000)
    refused(tmp_path / "out", [f"output_dir={str(tmp_path / 'out')!r}: its checkpoints need ~6.1 MB more and its "
                               f"filesystem has 5.0 MB free (one checkpoint of qwen3-tiny is ~2.0 MB; save_every=2, "
                               f"keep_checkpoints=2: 3 at once); set keep_checkpoints 1 (2 at once while a save is "
                               f"written), or choose an output_dir with more free space"], save_every=2, steps=6,
            dtype="fp32")
    monkeypatch.setattr(pre, "free_bytes", lambda path: 3_000_000)
    refused(tmp_path / "out", ["no two checkpoints fit there"], save_every=2, steps=6, dtype="fp32", lora_rank=0)


def test_resume_tag_without_resume(tmp_path):
    refused(tmp_path / "out", ["resume_tag='step3'", "--resume true"], resume_tag="step3")


def test_resume_with_changed_data(tmp_path):
    tag = fake_checkpoint(tmp_path / "out")
    meta = json.loads((tag / "meta.json").read_text()) | {"data": {"kind": "files", "n_rows": 10}}
    with pytest.raises(CheckpointError, match=r"data changed since checkpoint .*resume with the same data"):
        resume.load(None, tag, meta, {"kind": "files", "n_rows": 11})


# ----------------------------------------------------------------------------- export
def test_export_refusals(tmp_path):
    from ds_longctx.checkpoint.export import export
    with pytest.raises(CheckpointError, match="no checkpoint in .*save_every > 0"):
        export(str(tmp_path), str(tmp_path / "hf"))
    fake_checkpoint(tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"tag 'step5' does not exist.*available: \['step3'\]"):
        export(str(tmp_path / "run"), str(tmp_path / "hf"), tag="step5")
    with pytest.raises(CheckpointError, match=r"--merged folds LoRA adapters .*lora_rank 0.*drop --merged"):
        export(str(tmp_path / "run"), str(tmp_path / "hf"), merged=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(CheckpointError, match="'.*busy' already exists and is not an empty directory; "
                                                         "choose a new path"):
        export(str(tmp_path / "run"), str(tmp_path / "busy"))
    assert not (tmp_path / "hf").exists() and os.listdir(tmp_path / "busy") == ["x"]


# ----------------------------------------------------------------------------- the real entry point
@pytest.mark.parametrize("case", ["empty_dataset", "tokenizer_mismatch"])
def test_train_entry_point_refuses_and_writes_nothing(files, tmp_path, case):
    out = tmp_path / "out"
    data = files["dir"] / "empty.jsonl" if case == "empty_dataset" else files["jsonl"]
    tok = files["tok"] if case == "empty_dataset" else files["big_tok"]
    res = run_module(["ds_longctx.train", "--data", str(data), "--tokenizer", tok, "--seq_len", "32",
                      "--data_cache_dir", files["cache"], "--output_dir", str(out)], {"MASTER_PORT": str(free_port())})
    assert res.returncode != 0
    assert ("is empty (0 documents" if case == "empty_dataset" else "has 604 tokens") in res.stderr, res.stderr[-2000:]
    assert not out.exists()


def test_a_refusal_inside_the_workers_ends_ds_longctx_train_with_exit_2_and_the_line_last(files, tmp_path):
    """Out-of-vocabulary token ids are found by the workers (rank 0 reads the data): `ds-longctx train` still exits
    2 with the one refusal line as the last thing printed, no traceback, nothing written."""
    out = tmp_path / "out"
    res = run_cli(["train", "--nproc", "2", "--sp_size", "2", "--data", str(files["dir"] / "ids_high.jsonl"),
                   "--seq_len", "32", "--data_cache_dir", files["cache"], "--output_dir", str(out)], timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    path = str(files["dir"] / "ids_high.jsonl")  # named by file and line, as a bad row is
    assert last.startswith(f"refused before start: data file {path!r} line 1: ") and "token id 700" in last and \
        "re-tokenize" in last
    assert "Traceback" not in res.stderr + res.stdout and "ChildFailedError" not in res.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- logging
def test_memory_snapshot_without_cuda(tmp_path):
    refused(tmp_path / "out", ["memory_snapshot_steps=2", "needs a CUDA GPU", "memory_snapshot_steps: 0"],
            memory_snapshot_steps=2)


def test_kv_heads_that_do_not_split_the_query_heads_are_refused_before_the_engine(tmp_path):
    """8 query heads over 3 KV heads: HF's attention cannot group them (the run went on to a NaN loss and advice
    about the learning rate); preflight refuses it at any sp_size, with the planner's rule
    (kernel_rules.check_attention_heads)."""
    cfg = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text())
    cfg.update(num_attention_heads=8, num_key_value_heads=3)
    path = tmp_path / "bad_heads.json"
    path.write_text(json.dumps(cfg))
    refused(tmp_path / "out", ["num_attention_heads=8 with num_key_value_heads=3", "num_key_value_heads one of"],
            model=str(path), seq_len=64, sp_size=1)


@pytest.mark.parametrize("nproc,says", [(0, "--nproc 0: need at least 1 process"),
                                        (10_000, "--nproc 10000: no GPU here")])
def test_a_process_count_past_the_machine_is_refused_before_any_worker_starts(nproc, says):
    """`ds-longctx train --nproc N` past what the machine runs (on CPU: CPU_PROCESSES_PER_CORE per core; on GPUs: one
    per GPU) exits 2 at once: torchrun forked hundreds of workers for --nproc 1000 and did not stop on SIGTERM."""
    import time
    t0 = time.perf_counter()
    res = run_cli(["train", "--nproc", str(nproc), "--steps", "1"], timeout=120)
    assert res.returncode == 2 and says in res.stderr, res.stderr[-2000:]
    assert time.perf_counter() - t0 < 60
