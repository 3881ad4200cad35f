"""`ds-longctx plan` where it cannot plan: exit 2 before any work, naming the value, the longest
length that fits and the fixes that would."""

from __future__ import annotations

import json
import re

import pytest

from ds_longctx.plan import write
from ds_longctx.plan.search import find_max_len
from tests.helpers import ROOT


def test_1m_on_1x24_exits_2_with_the_longest_length(tmp_path, capsys):
    out = tmp_path / "never"
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1048576",
                "--gpus",
                "1",
                "--gpu_mem_gb",
                "24",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "Longest length that fits: 0 tokens" in err and "Fix:" in err
    )  # 16 GB of bf16 weights alone
    assert not out.exists()


def test_no_fit_names_a_positive_longest_length(capsys):
    n = find_max_len("qwen3-8b", 1, 80, 256)
    assert (
        write.main(
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1048576",
                "--gpus",
                "1",
                "--gpu_mem_gb",
                "80",
                "--host_mem_gb",
                "256",
            ]
        )
        == 2
    )
    assert n > 0 and f"Longest length that fits: {n:,} tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,says",
    [
        (["--model", "no-such-model", "--seq_len", "1024", "--gpus", "1"], "qwen3-8b"),
        (["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "0"], "--gpus 0"),
        (["--model", "qwen3-8b", "--seq_len", "0", "--gpus", "1"], "--seq_len 0"),
        (["--model", "qwen3-8b", "--seq_len", "-5", "--gpus", "1"], "--seq_len -5"),
        (["--model", "qwen3-8b", "--gpus", "1"], "--find_max_len"),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "8", "--sp_size", "3"],
            "try one of [1, 2, 4, 8]",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--gpu_mem_gb", "0"],
            "--gpu_mem_gb 0",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--host_mem_gb", "-1"],
            "--host_mem_gb -1",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--headroom", "0.97"],
            "--headroom 0.97 must be in",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--headroom", "nan"],
            "--headroom nan must be in",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--gpu_mem_gb", "nan"],
            "--gpu_mem_gb nan",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--gpu_mem_gb", "inf"],
            "--gpu_mem_gb inf",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "1", "--host_mem_gb", "nan"],
            "--host_mem_gb nan",
        ),
        (
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1024",
                "--gpus",
                "1",
                "--optimizer_offload_ratio",
                "nan",
            ],
            "--optimizer_offload_ratio nan",
        ),
        (
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1024",
                "--gpus",
                "1",
                "--attn_bwd_head_groups",
                "0",
            ],
            "--attn_bwd_head_groups 0",
        ),
        (
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1024",
                "--gpus",
                "1",
                "--attn_bwd_head_groups",
                "3",
            ],
            "attn_bwd_head_groups=3: each rank attends 8 KV head(s) (8 over sp_size=1), which 3 "
            "groups do not split evenly; use one of [1, 2, 4, 8]",
        ),
        (
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1024",
                "--gpus",
                "2",
                "--sp_size",
                "2",
                "--attn_bwd_head_groups",
                "8",
            ],
            "use one of [1, 2, 4]",
        ),
        (
            [
                "--model",
                "qwen3-8b",
                "--seq_len",
                "1024",
                "--gpus",
                "1",
                "--offload_params",
                "--lora_rank",
                "16",
            ],
            "--offload_params with --lora_rank 16",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "8", "--sp_size", "0"],
            "--sp_size 0: give a",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "1024", "--gpus", "8", "--lora_rank", "100000"],
            "--lora_rank 100000 is more than qwen3-8b's hidden size 4096",
        ),
        (
            ["--model", "qwen3-8b", "--seq_len", "65536", "--gpus", "8", "--headroom", "0.01"],
            "Fix: --headroom 0.9 (now 0.01",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_value(args, says, capsys):
    assert write.main(args) == 2
    assert says in capsys.readouterr().err


def test_a_multinode_plan_refuses_an_sp_group_across_nodes(capsys):
    two_nodes = [
        "--model",
        "qwen3-8b",
        "--seq_len",
        "1048576",
        "--nodes",
        "2",
        "--gpus",
        "8",
        "--gpu_mem_gb",
        "80",
        "--host_mem_gb",
        "560",
    ]
    assert write.main(two_nodes + ["--sp_size", "16"]) == 2
    assert "sp_size=16 does not divide the 8 processes per node" in capsys.readouterr().err
    assert write.main(two_nodes[:4] + ["--nodes", "0", "--gpus", "8"]) == 2
    assert "--nodes 0: need at least 1 node" in capsys.readouterr().err


def test_out_that_cannot_hold_the_files_and_conflicting_flags_exit_2_before_planning(
    tmp_path, capsys
):
    """--out a file, under a file or empty; --seq_len beside --find_max_len: exit 2 naming the
    value, nothing written, before any search."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    base = ["--model", "qwen3-8b", "--seq_len", "4096", "--gpus", "8", "--gpu_mem_gb", "80"]
    for out, says in (
        (str(afile), "is a file, not a directory"),
        (str(afile / "sub"), "is a file, so no directory"),
        ("", "--out ''"),
    ):
        assert write.main(base + ["--out", out]) == 2
        assert says in capsys.readouterr().err
    assert afile.read_text() == "keep me"
    assert write.main(base + ["--find_max_len"]) == 2
    assert "--seq_len 4096 with --find_max_len" in capsys.readouterr().err


def test_the_fix_for_the_gpu_size_is_rounded_up_to_a_size_that_fits(capsys):
    """NoFit's "GPUs of >= N GB": N rounded up, so the size it names plans (rounded to the nearest,
    11.5 printed as 11, which does not); the "every lever on" figure counts the parameter offload
    and the grouped attention backward the search may pull (at most what the smallest fitting GPU
    plans)."""
    base = ["--model", "qwen3-8b", "--seq_len", "65536", "--gpus", "2"]
    assert write.main(base + ["--gpu_mem_gb", "11"]) == 2
    err = capsys.readouterr().err
    need = int(re.search(r"Fix: GPUs of >= (\d+) GB", err).group(1))
    every = float(re.search(r"needs ([\d.]+) GB/GPU", err).group(1))
    assert write.main(base + ["--gpu_mem_gb", str(need)]) == 0
    planned = float(re.search(r"planned: ([\d.]+) GB per GPU", capsys.readouterr().out).group(1))
    assert write.main(base + ["--gpu_mem_gb", str(need - 1)]) == 2
    assert every <= planned and "the parameters offloaded" in err


def test_head_groups_that_hold_sp_down_are_said_so(capsys):
    """--attn_bwd_head_groups 8 on 8 GPUs: only sp 1 leaves each rank 8 KV heads to split, so the
    plan is at sp 1, and plan.txt says why (not "the largest"); where that does not fit, the fixes
    name dropping the flag."""
    base = ["--model", "qwen3-8b", "--gpus", "8", "--gpu_mem_gb", "80"]
    assert write.main(base + ["--seq_len", "131072", "--attn_bwd_head_groups", "8"]) == 0
    out = capsys.readouterr().out
    assert (
        "sp_size=1: the largest of [1, 2, 4, 8] whose ranks' KV heads split into "
        "--attn_bwd_head_groups 8" in out
    )
    assert write.main(base + ["--seq_len", "1048576", "--attn_bwd_head_groups", "8"]) == 2
    assert "Fix: drop --attn_bwd_head_groups 8" in capsys.readouterr().err
    assert write.main(base + ["--seq_len", "1048576"]) == 0  # without it the same length plans


def test_a_longest_length_at_the_searchs_end_is_said_to_be_at_least(capsys, monkeypatch):
    """find_max_len stops at MAX_SEARCH_TOKENS: reached, the answer is a lower bound and the line
    says so."""
    from ds_longctx.plan import plan_args

    monkeypatch.setattr(plan_args, "MAX_SEARCH_TOKENS", 16384)
    assert (
        write.main(
            ["--model", "qwen3-0.6b", "--find_max_len", "--gpus", "8", "--gpu_mem_gb", "141"]
        )
        == 0
    )
    assert (
        "longest seq_len that fits >= 16,384 tokens (the search stops there"
        in capsys.readouterr().out
    )


def test_model_and_out_paths_that_cannot_be_used_exit_2_naming_them(tmp_path, capsys):
    """A name too long for the file system (--model, --out) was an OSError traceback; a directory
    without a config.json was said to be neither a directory nor a file."""
    base = ["--seq_len", "1024", "--gpus", "1"]
    (tmp_path / "empty").mkdir()
    for args, says in (
        (["--model", str(tmp_path / ("a" * 300))], "File name too long; pass an HF config.json"),
        (
            ["--model", "qwen3-8b", "--out", str(tmp_path / ("a" * 300))],
            "File name too long; give a directory you can write to",
        ),
        (
            ["--model", str(tmp_path / "empty")],
            "is a directory without a config.json; pass an HF "
            "checkpoint directory (config.json beside its weights)",
        ),
        (["--model", "/dev/null"], "(/dev/null is not a regular file)"),
    ):
        assert write.main(args + base) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err


def test_a_length_written_128k_or_1m_is_refused_naming_the_numbers_it_may_mean(capsys):
    """`--seq_len 1M` said only `invalid int value: '1M'`; 1M is 1048576 or 1000000, and the plan
    does not guess."""
    for text, says in (
        ("1M", "give the whole number, e.g. 1048576 or 1000000"),
        ("lots", "give a whole number"),
        ("128k", "give the whole number, e.g. 131072 or 128000"),
        ("1e6", "give the whole number, e.g. 1000000"),
    ):
        with pytest.raises(SystemExit) as e:
            write.main(["--model", "qwen3-8b", "--gpus", "8", "--seq_len", text])
        assert (
            e.value.code == 2
            and f"argument --seq_len: '{text}' is not a whole number of tokens; {says}"
            in capsys.readouterr().err
        )


def test_a_pinned_sp_size_that_no_fix_can_keep_is_left_out_of_the_fixes(capsys):
    """Nothing fits with --sp_size 2 on 2 GPUs: the fixes tried 1 GPU per node, where sp_size 2
    cannot be, and the refusal ended in check_sp_size's ValueError traceback. A pinned --tiled_layer
    on a mixture of experts too."""
    args = [
        "--model",
        "qwen3.5-4b",
        "--seq_len",
        "1048576",
        "--gpus",
        "2",
        "--sp_size",
        "2",
        "--optimizer_offload_ratio",
        "0.5",
    ]
    assert write.main(args) == 2
    err = capsys.readouterr().err
    assert "Longest length that fits" in err and "--gpus 1" not in err
    assert (
        write.main(
            ["--model", "qwen3-moe-tiny", "--seq_len", "4096", "--gpus", "1", "--tiled_layer"]
        )
        == 2
    )
    assert (
        "is a mixture of experts; the tiled layer tiles gated MLPs only" in capsys.readouterr().err
    )


def test_absurd_gpu_node_and_head_counts_are_answered_at_once(tmp_path, capsys):
    """--gpus 1000000000 searched its fixes over every divisor candidate below it (minutes); a
    config of 2^40 heads listed the KV-head counts that split them the same way; a config of 10^12
    layers ran the planner out of memory."""
    for args, says in (
        (["--gpus", "1000000000"], "--gpus 1000000000 --nodes 1: give at most 1024 GPUs per node"),
        (["--gpus", "8", "--nodes", "10000000"], "and 1,000,000 nodes"),
    ):
        assert (
            write.main(["--model", "qwen3-8b", "--seq_len", "4096", *args]) == 2
            and says in capsys.readouterr().err
        )
    tiny = json.loads((ROOT / "ds_longctx" / "models" / "qwen3-tiny.json").read_text())
    for change, says in (
        (
            {"num_attention_heads": 2**40, "num_key_value_heads": 3, "head_dim": 8},
            "num_key_value_heads one of [1, 2, 4, 8, 16,",
        ),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers = 1,000,000,000,000 is past 10,000"),
    ):
        (tmp_path / "config.json").write_text(json.dumps(tiny | change))
        assert write.main(["--model", str(tmp_path), "--seq_len", "4096", "--gpus", "8"]) == 2
        assert says in capsys.readouterr().err


def test_plan_out_into_a_directory_holding_a_users_files_is_refused_writing_nothing(
    tmp_path, capsys
):
    """--out holding files no plan wrote (a user's run.yaml), or a plan's file changed since, is
    refused before the search, every byte kept; a directory holding only an earlier plan's unchanged
    files is planned into again; `--out /` is refused (it holds other files)."""
    plan = [
        "--model",
        "qwen3-8b",
        "--seq_len",
        "131072",
        "--gpus",
        "8",
        "--gpu_mem_gb",
        "80",
        "--out",
    ]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "run.yaml").write_text("model: qwen3-8b  # my own\n")
    (mine / "notes.txt").write_text("mine\n")
    assert write.main(plan + [str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"ds-longctx plan: --out {mine} holds notes.txt, run.yaml, which no plan wrote there (or "
        "changed "
        "since), so nothing is written; give a new or empty directory (an earlier plan's own "
        f"unchanged files are replaced)"
    )
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "run.yaml"]
    assert (mine / "run.yaml").read_text() == "model: qwen3-8b  # my own\n"
    again = tmp_path / "again"
    assert (
        write.main(plan + [str(again)]) == 0 and write.main(plan + [str(again)]) == 0
    )  # its own files replaced
    (again / "launch.txt").write_text(
        "my own launch lines\n"
    )  # a plan's file the user changed is theirs now
    assert (
        write.main(plan + [str(again)]) == 2
        and "holds launch.txt, which no plan" in capsys.readouterr().err
    )
    assert (again / "launch.txt").read_text() == "my own launch lines\n"
    assert write.main(plan + ["/"]) == 2 and "--out / holds " in capsys.readouterr().err
    linked, victim = tmp_path / "linked", tmp_path / "victim.txt"
    linked.mkdir()
    victim.write_text("mine\n")
    (linked / write.PLAN_MARKER).symlink_to(
        victim
    )  # a marker that is a link is no plan's, never written through
    assert write.main(plan + [str(linked)]) == 2
    assert (
        f"holds {write.PLAN_MARKER}, which no plan" in capsys.readouterr().err
        and victim.read_text() == "mine\n"
    )
