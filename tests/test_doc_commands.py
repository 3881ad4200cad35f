"""Every command in a ```bash block of README.md and docs/*.md runs, or RULES says why not here.

A command is one line of a block (a trailing backslash joins the next, a `# comment` is cut). RULES
holds, for each, the first rule whose pattern matches the start of the line:
- run: run on this CPU in a scratch directory of its page, the page's commands in order (a later one
  reads what an earlier one wrote, as a reader following the page would); exit 0. `Mini` makes a
  GPU-sized or long example its CPU miniature, naming what it changes; `env` adds variables
  (DRY_RUN=1: the launchers print their command).
- refused: run; exit 2 with the given words (a GPU-only command refuses early on a CPU).
- gpu / manual: not run; the reason says what it needs (GPUs, several nodes, the network, minutes of
  a benchmark).
- covered: not run here (too long for the suite); the named test runs it or its miniature (the test
  must exist).
A command no rule matches fails: add a rule. `ds-longctx ...` and `torchrun --nproc_per_node N
SCRIPT` are forked from the tests' pre-imported server (tests/forkrun.py); the rest runs under bash,
with `ds-longctx` on PATH.

The scratch directory holds what the pages assume: `Qwen3-8B/` (a tiny Qwen3 and its tokenizer,
saved by transformers: the stand-in for a downloaded checkpoint), `my.jsonl`, `launch/` and
`notebooks/` (links to the repository's), and the metrics of runs the pages train elsewhere
(`runs/basics`, `runs/demo/sp2`), for `ds-longctx plot`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.corpus import documents, make_tokenizer, write_jsonl
from tests.helpers import ROOT, cpu_env, run_cli, tiny_config, torchrun
from tests.test_docs import DOCS

pytestmark = pytest.mark.slow
STDLIB_FEW = (
    "--only bisect,colorsys,heapq,json,shlex,textwrap --eval_every 2 --eval_min_chars 10000"
)
SESSIONS_FEW = (
    "--only "
    "abc,bisect,colorsys,copy,dbm,fnmatch,getopt,glob,heapq,hmac,json,keyword,reprlib,sched,shlex,"
    "sqlite3,stat,textwrap --min_tokens 4096"
)


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def commands_of(text: str, doc: str) -> list:
    """The command lines of `text`'s ```bash blocks, each with the line it starts on."""
    out, block, start, pending = [], False, 0, ""
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash" if not block else False
            continue
        if not block:
            continue
        start = start if pending else i
        pending += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        command = re.sub(r"(^|\s)#.*$", "", pending).strip()
        pending = ""
        if command:
            out.append(Command(doc, start, " ".join(command.split())))
    return out


@dataclass(frozen=True)
class Mini:
    """A CPU miniature: each `old` replaced by its `new` (an `old` missing from the command is an
    error: the rule is stale), `append` added; `tail`: only the part after the last ` && `."""

    why: str
    replace: tuple = ()
    append: str = ""
    tail: bool = False

    def __call__(self, text: str) -> str:
        if self.tail:
            text = text.split(" && ")[-1]
        for old, new in self.replace:
            if old not in text:
                raise AssertionError(
                    f"the miniature's {old!r} is not in `{text}`: update its rule in RULES"
                )
            text = text.replace(old, new)
        return f"{text} {self.append}".strip()


@dataclass(frozen=True)
class Rule:
    pattern: str
    kind: str  # run | refused | gpu | manual | covered
    why: str = (
        ""  # gpu / manual: the reason; covered: tests/FILE.py::TEST; refused: the words expected
    )
    mini: Mini | None = None
    env: tuple = ()


def covered(test: str, pattern: str) -> Rule:
    return Rule(pattern, "covered", test)


CUDA = "needs a CUDA GPU"
EIGHT = "8 GPUs of a node (the plan's world)"
RULES = [
    # README.md
    Rule(
        "ds-longctx train --nproc 8 --model /path/to/Qwen3-8B",
        "run",
        mini=Mini(
            "2 processes, SP=2, 64 tokens, 2 steps of the tiny checkpoint",
            (
                ("--nproc 8", "--nproc 2"),
                ("/path/to/Qwen3-8B", "Qwen3-8B"),
                ("--seq_len 131072", "--seq_len 64"),
                ("--sp_size 8", "--sp_size 2"),
            ),
            "--steps 2 --dtype fp32 --data_cache_dir cache",
        ),
    ),
    Rule(
        'python3 -m venv .venv && . .venv/bin/activate && pip install -q "torch==2.13.0" -e . && '
        "ds-longctx demo",
        "run",
        mini=Mini("the demo itself (the install is the one .ci/run does)", tail=True),
    ),
    Rule(
        'python3 -m venv .venv && . .venv/bin/activate && pip install -q "torch==2.13.0" -e '
        '".[test]"',
        "manual",
        "the test suite itself: .ci/run runs this line verbatim (tests/test_docs.py checks that)",
    ),
    Rule(
        "python3 -m venv .venv",
        "manual",
        "a fresh virtual environment and pip install from the network (.ci/run)",
    ),
    Rule(
        'pip install -e ".[gpu]"', "gpu", "CUDA wheels (FlashAttention 4, the CUTLASS DSL, Liger)"
    ),
    covered(
        "tests/checkpoint/test_real_models.py::test_models_get_writes_the_directory_and_a_greedy_answer",
        "ds-longctx models get smollm2-135m-instruct --out smollm2",
    ),
    covered(
        "tests/distributed/test_real_model_sp.py::test_smollm2_packed_sessions_at_sp3_give_hf_loss_on_delta_rule_"
        "tokens",
        "ds-longctx train --nproc 3 --sp_size 3 --model smollm2",
    ),
    Rule(
        "ds-longctx train --nproc 2 --sp_size 2 --model qwen3-tiny --seq_len 512 --steps 5$", "run"
    ),
    Rule("ds-longctx train --help", "run"),
    Rule(
        "ds-longctx plan ", "run"
    ),  # the planner is arithmetic: every plan runs as written, 8B and 1M included
    Rule("ds-longctx rehearse --config my_run/run.yaml", "refused", CUDA),
    Rule("NGPU=8 CONFIG=my_run/run.yaml bash launch/", "run", env=(("DRY_RUN", "1"),)),
    Rule(
        "RUN_DIR=/tmp/run1m ",
        "run",
        mini=Mini("RUN_DIR in the scratch directory", (("/tmp/run1m", "run1m"),)),
        env=(("DRY_RUN", "1"),),
    ),
    # docs/data.md
    covered(
        "tests/corpora/test_stdlib_corpus.py::test_a_tiny_model_trains_on_it_packed_with_the_long_range_eval",
        "ds-longctx train --nproc 2 --sp_size 2 --model qwen3-tiny --seq_len 4096 --data corpus/ "
        "--tokenizer tok/",
    ),
    Rule(
        "ds-longctx data prepare --stdlib --out corpus/ --vocab_size 512",
        "run",
        mini=Mini("six modules of the standard library, not all of it", append=STDLIB_FEW),
    ),
    covered(
        "tests/corpora/test_stdlib_corpus.py::test_a_tiny_model_trains_on_it_packed_with_the_long_range_eval",
        "ds-longctx train --nproc 1 --model qwen3-tiny --data corpus/ --tokenizer corpus/tokenizer",
    ),
    Rule(
        "bash benchmarks/stdlib_corpus.sh",
        "gpu",
        "one H200 for minutes (its header; STDLIB_TINY=1 is its CPU run)",
    ),
    Rule(
        "bash benchmarks/answer_loss.sh",
        "gpu",
        "one H200 for ~21 min (its header gives the CPU check)",
    ),
    Rule(
        "ds-longctx data prepare --sessions --out sessions/",
        "run",
        mini=Mini(
            "3 sessions of 4k to 12k tokens over 18 small modules, a 512-id BPE (the defaults: a "
            "minute of the stdlib)",
            (("--sessions --out", "--sessions 3 --out"),),
            f"--vocab_size 512 --max_tokens 12000 {SESSIONS_FEW}",
        ),
    ),
    Rule(
        "ds-longctx data prepare --sessions 8 --out tiny_sessions/ --vocab_size 512",
        "run",
        mini=Mini(
            "2 sessions of 4k to 12k tokens over 18 small modules",
            (("--sessions 8", "--sessions 2"), ("--max_tokens 65536", "--max_tokens 12000")),
            SESSIONS_FEW,
        ),
    ),
    covered(
        "tests/corpora/test_agent_sessions.py::test_sessions_in_a_given_tokenizer_are_the_sessions_of_its_ids",
        "ds-longctx data prepare --sessions 64 --out smol_sessions/ --tokenizer MODEL_DIR",
    ),
    covered(
        "tests/corpora/test_agent_sessions.py::test_a_tiny_model_trains_on_the_sessions",
        "ds-longctx train --nproc 2 --sp_size 2 --model qwen3-tiny --data tiny_sessions/",
    ),
    covered(
        "tests/corpora/test_agent_sessions.py::test_ds_longctx_eval_of_the_checkpoint_gives_the_trainings_answer_loss",
        "ds-longctx eval --checkpoint runs/answers --data tiny_sessions/",
    ),
    covered(
        "tests/test_notebooks.py::test_notebook_runs_and_prints_what_is_committed",
        "jupyter nbconvert --to notebook --execute --inplace notebooks/answer_loss.ipynb",
    ),
    # docs/planner.md
    # docs/reliability.md
    covered(
        "tests/distributed/test_reshard.py::test_resume_at_another_layout_continues_the_run",
        "ds-longctx checkpoint reshard runs/a --tag step300",
    ),
    covered(
        "tests/distributed/test_reshard.py::test_resume_at_another_layout_continues_the_run",
        "ds-longctx train --nproc 4 --sp_size 4 --resume true --output_dir runs/a",
    ),
    covered(
        "tests/test_bench_planner.py::test_held_out_plan_specs_carry_their_model_and_budgets",
        "python benchmarks/bench_planner.py --plans",
    ),
    covered(
        "tests/test_bench_planner.py::test_check_says_which_committed_predictions_are_still_held_out",
        "python benchmarks/bench_planner.py --check",
    ),
    # docs/workflows.md
    covered(
        "tests/run/test_recall.py::test_eval_of_a_model_directory_recalls_what_it_was_taught",
        "ds-longctx eval --model MODEL_DIR --data smol_sessions/",
    ),
    covered(
        "tests/corpora/test_agent_sessions.py::test_a_tiny_model_trains_on_the_sessions",
        "ds-longctx train ... --eval_data smol_sessions/ "
        "--eval_answer_loss true --eval_recall true",
    ),
    covered(
        "tests/run/test_preference_step.py::test_dpo_train_stores_the_reference_and_logs_rewards",
        "ds-longctx train --nproc 2 --sp_size 2 --model /path/to/Qwen3-8B --objective dpo",
    ),
    covered(
        "tests/levers/test_preference.py::test_dpo_and_grpo_sp2_packed_match_trl_and_the_hand_reference",
        "ds-longctx train ... --objective dpo --ref_model",
    ),
    covered(
        "tests/levers/test_preference.py::test_dpo_and_grpo_sp2_packed_match_trl_and_the_hand_reference",
        "ds-longctx train --nproc 2 --sp_size 2 --model policy-0 --objective grpo",
    ),
    covered(
        "tests/run/test_real_weights.py::test_a_checkpoint_directory_fine_tunes_from_its_weights_then_evals_and_"
        "exports",
        "ds-longctx export --checkpoint runs/grpo-",
    ),
    Rule("vllm serve ", "manual", "an inference engine serving the export (vLLM, on a GPU)"),
    Rule(
        "ds-longctx train --nproc 2 --config my_run/run.yaml",
        "gpu",
        "my_run is the Qwen3-8B plan for 8 GPUs",
    ),
    Rule("torchrun --nproc_per_node 8 -m ds_longctx.train", "gpu", EIGHT),
    Rule("deepspeed --num_gpus 8 ", "gpu", EIGHT),
    Rule("accelerate launch --config_file accelerate.yaml -m", "gpu", EIGHT),
    Rule("hf download ", "manual", "the Hugging Face Hub (network)"),
    Rule("ds-longctx train --nproc 8 --config my_run/run.yaml --data my.jsonl", "gpu", EIGHT),
    covered(
        "tests/run/test_real_weights.py::test_a_checkpoint_directory_fine_tunes_from_its_weights_then_evals_and_"
        "exports",
        "ds-longctx export --checkpoint runs/long",
    ),
    covered(
        "tests/data/test_chat.py::test_last_assistant_and_per_message_train_flags",
        "ds-longctx train ... --train_on last_assistant",
    ),
    covered(
        "tests/data/test_chat.py::test_bad_rows_are_refused_naming_file_and_line",
        "ds-longctx train ... --truncate refuse",
    ),
    covered(
        "tests/distributed/test_training_basics.py::test_grad_accum_of_4_equals_one_step_over_the_4_micro_batches",
        "ds-longctx train --nproc 2 --sp_size 2 --model qwen3-tiny --seq_len 256 --grad_accum 4",
    ),
    Rule("ds-longctx plot ", "run"),
    Rule(
        "RUN_DIR=$PWD/runs/basics jupyter nbconvert",
        "run",
        mini=Mini(
            "the copy written here, not into notebooks/",
            (("--output basics.ipynb", "--output basics.ipynb --output-dir ."),),
        ),
    ),
    Rule("cd my_run", "manual", "a shell step of the several-node recipe"),
    Rule("deepspeed --hostfile hostfile", "manual", "several nodes (pdsh over ssh)"),
    covered(
        "tests/distributed/test_nodes.py::test_two_nodes_of_2_write_the_losses_of_one_node_of_4",
        "torchrun --nnodes 2 ",
    ),
    Rule(
        "accelerate launch --config_file accelerate.yaml --machine_rank", "manual", "several nodes"
    ),
    Rule('pip install -e ".[', "manual", "pip install from the network"),
    covered(
        "tests/distributed/test_hf_trainer.py::test_trl_sft_example_under_accelerate_launch_with_the_plans_config",
        "accelerate launch --config_file my_run/accelerate.yaml launch/trl_sft.py",
    ),
    Rule("torchrun --nproc_per_node 2 launch/trl_sft.py --model qwen3-tiny", "run"),
    covered(
        "tests/distributed/test_lora.py::test_train_keeps_the_base_and_moves_the_adapters",
        "ds-longctx train --nproc 2 --sp_size 2 --model qwen3-tiny --seq_len 512 --steps 5 "
        "--save_every 5",
    ),
    covered(
        "tests/distributed/test_lora.py::test_export_adapter_loads_with_peft_and_gives_the_engines_logits",
        "ds-longctx export --checkpoint runs/lora",
    ),
    covered(
        "tests/distributed/test_lora.py::test_export_adapter_loads_with_peft_and_gives_the_engines_logits",
        'python -c "from peft import AutoPeftModelForCausalLM',
    ),
    covered(
        "tests/distributed/test_eval.py::test_train_writes_eval_lines_curve_and_progress_bar",
        "ds-longctx train --nproc 2 --sp_size 2 --seq_len 512 --steps 100",
    ),
    covered(
        "tests/distributed/test_eval.py::test_ds_longctx_eval_of_the_checkpoint_gives_the_in_training_eval",
        "ds-longctx eval --checkpoint runs/latest",
    ),
    covered(
        "tests/run/test_real_weights.py::test_a_checkpoint_directory_fine_tunes_from_its_weights_then_evals_and_"
        "exports",
        "ds-longctx eval --checkpoint RUN_DIR --data held_out.jsonl",
    ),
    Rule(
        "python benchmarks/bench_long_range.py",
        "manual",
        "a benchmark: over a thousand steps on CPU, minutes",
    ),
    covered(
        "tests/data/test_chat.py::test_sessions_train_end_to_end_on_their_trained_targets_only",
        "ds-longctx train --nproc 2 --sp_size 2 --data sessions.jsonl --tokenizer tok/ "
        "--data_layout pack",
    ),
]


def rule_of(cmd: Command) -> Rule | None:
    """The first rule whose pattern starts the command (a pattern ending in `$`: the whole
    command)."""
    return next(
        (
            r
            for r in RULES
            if (
                cmd.text == r.pattern[:-1]
                if r.pattern.endswith("$")
                else cmd.text.startswith(r.pattern)
            )
        ),
        None,
    )


# ----------------------------------------------------------------------------- the scratch
# directories
def scratch(root: Path) -> Path:
    """A page's working directory: what the pages assume is there (module docstring)."""
    import torch
    from transformers import Qwen3ForCausalLM

    root.mkdir(parents=True)
    for name in ("launch", "notebooks"):
        (root / name).symlink_to(ROOT / name)
    torch.manual_seed(0)
    Qwen3ForCausalLM(tiny_config()).save_pretrained(str(root / "Qwen3-8B"))
    make_tokenizer(root / "Qwen3-8B")
    write_jsonl(root / "my.jsonl", documents(40, seed=2))
    for run, steps in (("runs/basics", 6), ("runs/demo/sp2", 4)):
        (root / run).mkdir(parents=True)
        (root / run / "metrics.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": s,
                        "loss": 6.3 - 0.1 * s,
                        "lr": 1e-3,
                        "grad_norm": 1.0,
                        "tokens_per_s": 500.0,
                        "peak_gpu_bytes": 0,
                        "host_rss_bytes": int(1e9),
                    }
                )
                + "\n"
                for s in range(1, steps + 1)
            )
        )
    (root / "bin").mkdir()
    shim = root / "bin" / "ds-longctx"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ds_longctx.cli "$@"\n')
    shim.chmod(0o755)
    return root


def execute(text: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """Run one command line in `cwd`: forked for a plain `ds-longctx` or single-node torchrun line,
    else bash."""
    words = shlex.split(text)
    if not env and words[0] == "ds-longctx" and not {"&&", "|", ";"} & set(words):
        return run_cli(words[1:], cwd=cwd, timeout=600)
    if not env and words[:2] == ["torchrun", "--nproc_per_node"] and words[3].endswith(".py"):
        try:
            return torchrun(int(words[2]), [str(cwd / words[3]), *words[4:]], cwd=cwd, timeout=600)
        except AssertionError as e:  # torchrun raises with every rank's tail
            return subprocess.CompletedProcess(words, 1, "", str(e))
    bash_env = cpu_env() | env
    bash_env["PATH"] = (
        f"{cwd / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{bash_env['PATH']}"
    )
    return subprocess.run(
        ["bash", "-c", text], cwd=cwd, env=bash_env, capture_output=True, text=True, timeout=600
    )


def check(cmd: Command, cwd: Path) -> str | None:
    """What is wrong with `cmd` (None: it ran as its rule says, or its rule says why it does not run
    here)."""
    rule = rule_of(cmd)
    if rule is None:
        return (
            f"{cmd}\n  matches no rule: add one to RULES in tests/test_doc_commands.py (run, "
            f"refused, gpu, manual or covered, with its reason)"
        )
    if rule.kind == "covered":
        path, name = rule.why.split("::")
        found = (ROOT / path).is_file() and re.search(
            rf"^def {name}\(", (ROOT / path).read_text(), re.M
        )
        return (
            None if found else f"{cmd}\n  is said to be covered by {rule.why}, which does not exist"
        )
    if rule.kind in ("gpu", "manual"):
        return None if rule.why else f"{cmd}\n  its {rule.kind} rule gives no reason"
    text = rule.mini(cmd.text) if rule.mini else cmd.text
    res = execute(text, cwd, dict(rule.env))
    last = ([line for line in (res.stdout + res.stderr).splitlines() if line.strip()] or [""])[-1]
    if rule.kind == "refused":
        ok = res.returncode == 2 and rule.why in last
        return (
            None
            if ok
            else f"{cmd}\n  should be refused (exit 2, {rule.why!r}): exit {res.returncode}: {last}"
        )
    if res.returncode:
        tail = "\n    ".join((res.stdout + res.stderr).strip().splitlines()[-12:])
        return f"{cmd}\n  ran as `{text}` and exited {res.returncode}:\n    {tail}"
    return None


PAGES = {doc: commands_of((ROOT / doc).read_text(), doc) for doc in DOCS}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory) -> dict:
    """One scratch directory per page, made on first use."""
    made: dict = {}

    def of(doc: str) -> Path:
        if doc not in made:
            made[doc] = scratch(tmp_path_factory.mktemp("docs") / doc.replace("/", "_"))
        return made[doc]

    return of


@pytest.mark.parametrize("cmd", [c for cmds in PAGES.values() for c in cmds], ids=str)
def test_documented_command(cmd, workdirs):
    problem = check(
        cmd, workdirs(cmd.doc) if rule_of(cmd) and rule_of(cmd).kind in ("run", "refused") else ROOT
    )
    assert problem is None, problem


def test_the_pages_have_their_commands():
    """The extractor finds the pages' commands (a block it could not read would pass as no commands
    at all)."""
    assert all(
        PAGES[d] for d in ("README.md", "docs/workflows.md", "docs/planner.md", "docs/data.md")
    )
    assert sum(map(len, PAGES.values())) >= 40


def test_a_planted_typo_is_reported(tmp_path):
    """A page whose example misspells an option, and one whose command no rule knows: both reported,
    naming them."""
    page = (
        "Plan it:\n\n```bash\nds-longctx plan --model qwen3-8b --seq_len 1048576 --gpus 8 "
        "--gpu_mem_gb 80 \\\n"
        "  --ouf my_run      # the typo\n```\n\n```bash\nds-longctx lint --all\n```\n"
    )
    typo, unknown = commands_of(page, "planted.md")
    assert (typo.line, typo.text) == (
        4,
        "ds-longctx plan --model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --ouf my_run",
    )
    problem = check(typo, tmp_path)
    assert (
        problem is not None
        and "planted.md:4" in problem
        and "--ouf" in problem
        and "exited 2" in problem
    ), problem
    assert "matches no rule" in check(unknown, tmp_path)
