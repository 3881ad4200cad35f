"""A rehearsal of an objective-dpo config (rehearsal/dpo_rows.py): the synthetic row it steps on has
the shared-prompt shape the planner counts (prompt once, chosen, rejected: branch ids 0/1/2), its
plan carries the dpo terms, its pairs file is not read, and a completion length leaving no prompt is
refused before any rank starts. In-process, CPU."""

from __future__ import annotations

import torch

from ds_longctx.parallel.shared_prefix import shared_layout
from ds_longctx.parallel.units import IGNORE_INDEX
from ds_longctx.rehearsal import rehearse
from ds_longctx.rehearsal.dpo_rows import synthetic_pair_rows
from ds_longctx.rehearsal.world import check, planned
from tests.rehearsal.test_rehearse import SEQ, write_config


def dpo_config(d):
    path = write_config(d, extra="data:\n  source: pairs.jsonl\n")
    text = path.read_text().replace(f"  seq_len: {SEQ}\n", f"  seq_len: {SEQ}\n  objective: dpo\n")
    path.write_text(text)
    return path


def test_the_synthetic_row_is_one_shared_prompt_then_chosen_and_rejected():
    """512 tokens, completions of 64: the prompt's 383 tokens once (its last heads each branch), 65
    + 65 branch tokens with 64 trained each; the attention's query documents [447, 65] over key
      documents [447, 447]."""
    rows = synthetic_pair_rows(SEQ, 512, 64, seed=0)
    b = rows.row(0)
    branch = b.branch[0].tolist()
    assert branch == [0] * 382 + [1] * 65 + [2] * 65
    trained = (b.labels[0] != IGNORE_INDEX).tolist()
    assert sum(trained[:382]) == 0 and sum(trained[382:447]) == sum(trained[447:]) == 64
    lay = shared_layout(b.position_ids[0], b.branch[0])
    assert lay.cu_seqlens_q.tolist() == [0, 447, 512] and lay.cu_seqlens.tolist() == [0, 447, 894]
    assert torch.equal(b.ref, torch.zeros(1, 2))


def test_a_dpo_configs_rehearsal_reads_no_pairs_and_is_planned_with_its_terms(tmp_path):
    cfg, off = rehearse.rehearsal_config(["--config", str(dpo_config(tmp_path))])
    assert cfg.data.source == "synthetic" and any("pairs.jsonl" in o for o in off)
    plan = planned(cfg, check(cfg, 8, 8), completion_len=64)
    assert plan.term("shared_prompt_kv").formula.startswith("2·P·kv'·d·2 (P=384:")


def test_a_completion_len_leaving_no_prompt_is_refused_before_any_rank(tmp_path, capsys):
    argv = ["--cpu", "--config", str(dpo_config(tmp_path)), "--completion_len", "255"]
    assert rehearse.main(argv) == 2
    assert "--completion_len 255" in capsys.readouterr().err
