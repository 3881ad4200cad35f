"""The data entry points (the package doc shows them) and the checks that span the row pipeline."""

from __future__ import annotations

# torch's varlen_attn is probed inside a try: some torch builds lack it.
import logging
from typing import Optional

import torch

from ds_longctx.data.formats import row_format
from ds_longctx.data.preference import PairRows, pair_files, read_pairs
from ds_longctx.data.rl_rows import RolloutRows, read_rollouts
from ds_longctx.data.rows import Batch, TokenRows  # noqa: F401 (Batch: the package exports it)
from ds_longctx.data.sources import DataError, check_source, load_documents, prepared_split
from ds_longctx.data.synthetic import SyntheticRetrieval
from ds_longctx.data.tokenize import cut_rule, default_train_on, eos_id, load_tokenizer, tokenize
from ds_longctx.data.tokenize_check import check_tokenized
from ds_longctx.parallel import attention

log = logging.getLogger("ds_longctx")


def check_packing(cfg, on_cuda: Optional[bool] = None) -> None:
    """data_layout='pack' needs an attention kernel that keeps documents apart at this seq_len."""
    if cfg.data.layout != "pack":
        return
    on_cuda = torch.cuda.is_available() if on_cuda is None else on_cuda
    choice = attention.resolve_backend(cfg.kernels.attn_backend)
    if choice.backend == "flash_attn":
        return
    if on_cuda:
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401

            return
        except ImportError:
            raise DataError(
                f"data_layout='pack' on CUDA with attn_backend={cfg.kernels.attn_backend!r} needs "
                f"torch.nn.attention.varlen (torch >= 2.9, this is {torch.__version__}) or "
                "flash-attn; upgrade torch, install flash-attn, or use data_layout: concat"
            ) from None
    if cfg.train.seq_len > attention.MAX_MASKED_TOKENS:
        raise DataError(
            f"data_layout='pack' at seq_len={cfg.train.seq_len} needs a varlen attention kernel "
            "(CUDA); the CPU fallback masks a full seq_len^2 matrix and stops at "
            f"{attention.MAX_MASKED_TOKENS} tokens; use seq_len <= {attention.MAX_MASKED_TOKENS}, "
            "data_layout: concat, or a GPU"
        )


def resolve_layout(cfg, fmt: str) -> str:
    """data_layout auto, decided once from the rows' format `fmt` (cfg.data.layout set, rank 0 logs
    it): pack for formats whose record (data/formats.py) says so (attention stays inside each
    session), concat for text and where pack cannot run here."""
    if cfg.data.layout != "auto":
        return cfg.data.layout
    cfg.data.layout, why = "concat", f"the default for {fmt} rows: documents joined end to end"
    if row_format(fmt).layout == "pack":
        why = f"the default for {fmt} rows: each one its own document, attention kept inside it"
        cfg.data.layout = "pack"
        try:
            if cfg.train.micro_batch != 1:
                raise DataError(f"pack takes micro_batch=1, this run has {cfg.train.micro_batch}")
            check_packing(cfg)
        except DataError as e:
            cfg.data.layout, why = "concat", f"not pack, the default for {fmt} rows: {e}"
    log.info("data layout: %s (%s; data_layout sets it)", cfg.data.layout, why)
    return cfg.data.layout


def check_data_source(cfg, vocab_size: int) -> None:
    """Checks before any process group exists: the source resolves, every local file reads through
    (data/scan.py: every bad row refused, or counted with skip_bad_rows), train_on and truncate fit
    the rows and layout, the tokenizer fits. What only the tokenizer shows (a template that fails or
    rewrites turns, a row with no trained token) is refused when the rows are tokenized
    (data/tokenize_check.py `check_tokenized`), by file and line too."""
    if cfg.data.source == "synthetic":
        return
    if cfg.train.objective in ("dpo", "grpo"):
        # every row read and tokenized: a bad one refused by file and line (the build logs them)
        build_pairs(cfg, vocab_size, say=False)
        return
    scan = check_source(cfg)
    if scan is not None:
        resolve_layout(cfg, scan.mode)
    cut_rule(cfg)
    if scan is not None:
        default_train_on(cfg, scan.mode)
    load_tokenizer(cfg, vocab_size)
    check_packing(cfg)


def build_pairs(cfg, vocab_size: int, hf_config=None, say: bool = True):
    """objective dpo: the preference pairs of data (data/preference.py) packed in rows of seq_len;
    grpo: its scored rollouts (data/rl_rows.py), summed up in one line where `say`."""
    check_packing(cfg.model_copy(update={"data": cfg.data.model_copy(update={"layout": "pack"})}))
    tok = load_tokenizer(cfg, vocab_size)
    if tok is None:
        raise DataError(
            f"data={cfg.data.source!r} holds preference pairs as text and needs a tokenizer; set "
            f"tokenizer to the model's tokenizer directory"
        )
    eos = eos_id(tok, hf_config) if cfg.data.add_eos else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos or 0
    if cfg.train.objective == "grpo":
        t = cfg.train
        seqs = read_rollouts(pair_files(cfg.data.source), tok, eos, t.seq_len, t.scale_rewards)
        rows = RolloutRows(seqs, t.seq_len, t.seed, cfg.data.shuffle, int(pad))
        (log.info if say else log.debug)(
            "grpo: %d rollouts in %d row(s); dr_grpo's max_completion_length %d (%s)",
            len(seqs),
            rows.n_rows,
            t.max_completion_length or rows.max_len,
            "set"
            if t.max_completion_length
            else "the longest completion; max_completion_length sets it",
        )
        return rows
    pairs = read_pairs(pair_files(cfg.data.source), tok, eos, cfg.train.seq_len)
    return PairRows(
        pairs,
        cfg.train.seq_len,
        cfg.train.seed,
        cfg.data.shuffle,
        int(pad),
        cfg.data.source,
        cfg.train.shared_prompt,
    )


def build_data(cfg, hf_config, dp_size: int):
    """The run's data: `SyntheticRetrieval` for data='synthetic', else `TokenRows` (validated; see
    module doc)."""
    vocab = hf_config.get_text_config().vocab_size
    if cfg.data.source == "synthetic":
        return SyntheticRetrieval(cfg.train.seq_len, vocab, cfg.train.seed)
    if cfg.train.objective in ("dpo", "grpo"):
        return build_pairs(cfg, vocab, hf_config)
    tok = load_tokenizer(cfg, vocab)
    docs = load_documents(cfg)
    resolve_layout(cfg, docs.format)
    check_packing(cfg)
    tokenized = tokenize(
        docs.ds, tok, cfg, eos_id(tok, hf_config), docs.format, docs.mask_keys, vocab
    )
    skipped = check_tokenized(tokenized, cfg, docs.skipped_rows)
    pad = (
        tok.pad_token_id
        if tok is not None and tok.pad_token_id is not None
        else eos_id(tok, hf_config) or 0
    )
    rows = TokenRows(
        tokenized,
        cfg.train.seq_len,
        cfg.data.layout,
        cfg.train.seed,
        cfg.data.shuffle,
        int(pad),
        source=cfg.data.source,
        vocab_size=vocab,
        skipped_rows=skipped,
        cut=cut_rule(cfg),
    )
    need = dp_size * cfg.train.micro_batch
    if rows.n_rows < need:
        raise DataError(
            f"data={cfg.data.source!r} gives {rows.n_rows} rows of seq_len={cfg.train.seq_len} "
            f"({cfg.data.layout}) but one step needs {need} different rows (dp={dp_size} x "
            f"micro_batch={cfg.train.micro_batch}); add data, lower seq_len, or lower micro_batch"
        )
    return rows


# ----------------------------------------------------------------- held-out data (the eval section)
def eval_view(cfg):
    """`cfg` with eval_data as its data source (a prepared corpus directory: its eval.jsonl):
    held-out files are read like the training data (tokenizer, layout, fields, seed order)."""
    source = prepared_split(cfg.eval.data, "eval") if cfg.eval.data else cfg.eval.data
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": source})})


def check_eval_source(cfg, vocab_size: int) -> None:
    """`check_data_source` for eval_data (nothing to check without it)."""
    if cfg.eval.data is not None:
        check_data_source(eval_view(cfg), vocab_size)


def build_eval_data(cfg, hf_config):
    """The held-out rows of eval_data, or None without it: eval_data='synthetic' is the training
    task's `held_out()` stream; a path gives `TokenRows` whose first eval_rows samples are the eval
    set (refused when it has fewer rows)."""
    if cfg.eval.data is None:
        return None
    rows = build_data(eval_view(cfg), hf_config, dp_size=1)
    if cfg.eval.data == "synthetic":
        return rows.held_out()
    if rows.n_rows < cfg.eval.rows:
        raise DataError(
            f"eval_data={cfg.eval.data!r} gives {rows.n_rows} rows of seq_len={cfg.train.seq_len} "
            f"({cfg.data.layout}), fewer than eval_rows={cfg.eval.rows}; lower eval_rows to "
            f"{rows.n_rows} or add held-out data"
        )
    return rows
