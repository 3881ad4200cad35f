"""`data` section: what the run reads and how documents become rows of seq_len tokens (owner:
ds_longctx/data/)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ds_longctx.config.base import Section
from ds_longctx.data.formats import ROW_FORMATS, TRAIN_ON


class DataConfig(Section):
    """What the run reads and how documents become rows of seq_len tokens."""

    USER_PATHS = ("source", "tokenizer", "cache_dir")

    source: str = Field("synthetic", json_schema_extra={"flat": "data"})
    """`synthetic` (key-value retrieval with long-range structure), a local .txt / .jsonl / .json /
    .parquet file or a directory of them (one format), a corpus directory of `ds-longctx data
    prepare` (its train.jsonl), or a `datasets` hub name (needs a reachable hub)."""
    tokenizer: Optional[str] = None
    """Local tokenizer directory for text data (default: the model directory when it holds a
    tokenizer). Its size must not exceed the model's vocab_size. Not needed when the data has an
    `input_ids` column."""
    layout: Literal["auto", "concat", "pack", "document"] = Field(
        "auto", json_schema_extra={"flat": "data_layout"}
    )
    """concat: documents joined end to end (EOS between) and cut into rows of exactly seq_len (PG-19
    style); pack: whole documents packed into rows, position ids restart per document and attention
    stays inside each (needs a varlen attention kernel); document: one document per row, its first
    seq_len tokens (every document must be that long). auto: pack for messages, prompt_completion
    and tokens rows (concat where pack cannot run here, said in one line), concat for text; the log
    names the layout taken."""
    text_field: str = "text"
    """Column holding the text in JSONL / Parquet / hub data."""
    format: Literal[("auto", *ROW_FORMATS)] = Field(  # data/formats.py FORMAT_TABLE
        "auto", json_schema_extra={"flat": "data_format"}
    )
    """What a row holds: text (`text_field`); messages (a chat session: a `messages` list of {role,
    content, tool_calls}, an optional `tools` list, rendered with the tokenizer's chat template);
    prompt_completion (`prompt` and `completion` strings); tokens (`input_ids`, optionally `labels`
    and 0/1 `completion_mask` / `assistant_masks`, all honoured together, and `attention_mask`,
    whose 0s are padding left out). auto: the first row's keys decide (logged)."""
    train_on: Optional[Literal[TRAIN_ON]] = None
    """Which tokens train: assistant (every assistant turn with its tool calls; the default of
    messages rows), last_assistant, completion (the default of prompt_completion rows), all (every
    token; the only choice for text). A message's own `"train": true|false` overrides it; tool
    output trains only under all. tokens rows train where their labels say (all: every token)."""
    truncate: Optional[Literal["split", "head", "refuse"]] = None
    """A document (session) longer than seq_len in layout pack or document: split into windows of
    seq_len, each its own document (pack's default); head: its first seq_len tokens (document's
    default); refuse: the run stops naming its file and line. concat always cuts the joined stream
    at row borders. A document (after head) left with no trained token is refused (or skipped with
    skip_bad_rows); a split window without one trains nothing."""
    skip_bad_rows: bool = False
    """Leave out bad rows of local files instead of refusing the run: a JSON line without
    text_field, whose value is not a string, or that is not UTF-8 / JSON / an object; a chat row the
    template cannot render or with no trained token; a null text in Parquet or hub data. They are
    counted (`skipped_rows` on every metrics.jsonl train line) and the first 5 named (file:line,
    why) in the log. False: the first one is refused naming its file, line and byte offset."""
    text_unit: Literal["document", "line", "paragraph"] = "document"
    """.txt files: one document per file, per line, or per blank-line paragraph."""
    split: str = Field("train", json_schema_extra={"flat": "data_split"})
    """Split to read (hub datasets; local files are one 'train' split)."""
    cache_dir: Optional[str] = Field(None, json_schema_extra={"flat": "data_cache_dir"})
    """Cache for the converted and tokenized data (datasets' cache_dir); default:
    HF_DATASETS_CACHE."""
    add_eos: bool = True
    """Append the EOS token (the tokenizer's, else the model config's) to every document that does
    not end with it."""
    shuffle: bool = True
    """Visit rows in a new order each epoch, drawn from (seed, epoch); false: file order."""
    tokenize_num_proc: int = Field(1, ge=1)
    """Processes for tokenization (datasets.map num_proc)."""
