"""The small local corpus of the tests (no network): word-level and BPE tokenizers, ChatML chat
templates with and without generation markers, random documents and the files that hold them (JSONL,
a folder of .txt, Parquet).

Heavy imports (tokenizers, transformers, pyarrow) stay inside the functions, so importing this
module is cheap.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def make_tokenizer(path: Path, n_words: int = 60, extra: tuple = ()) -> Path:
    """A WordLevel tokenizer over `n_words` words + 4 specials, saved as a PreTrainedTokenizerFast
    directory (ids: [PAD]=0 [BOS]=1 [EOS]=2 [UNK]=3, then w0, w1, ..., then the `extra` words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + words(n_words) + list(extra))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
    )
    fast.save_pretrained(str(path))
    return path


CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
CHAT_WORDS = ["system", "user", "assistant", "tool", "tools"]
# ChatML, its tool calls as `<tool_call> NAME ARG_VALUES </tool_call>`; GENERATION marks what an
# assistant turn trains
CHATML = (
    "{%- if tools %}<|im_start|>system\ntools {% for t in tools %}{{ t.function.name }} {% endfor "
    "%}<|im_end|>\n{% endif %}{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\nGEN_START{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %} <tool_call> {{ tc.function.name }} "
    "{%- for k, v in tc.function.arguments.items() %} {{ v }}{% endfor %} </tool_call>{% endfor %}"
    "<|im_end|>GEN_END{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(generation: bool) -> str:
    """CHATML with `{% generation %}` markers around each assistant turn's content and end, or
    without."""
    start, end = ("{% generation %}", "{% endgeneration %}") if generation else ("", "")
    return CHATML.replace("GEN_START", start).replace("GEN_END", end)


def make_chat_tokenizer(path: Path, template: str, n_words: int = 60) -> Path:
    """`make_tokenizer` with ChatML's special tokens (after the words: CHAT_WORDS, then
    CHAT_SPECIALS as added tokens) and `template` as its chat template."""
    from transformers import AutoTokenizer

    make_tokenizer(path, n_words, extra=tuple(CHAT_WORDS))
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIALS})
    tok.chat_template = template
    tok.save_pretrained(str(path))
    return path


BPE_TEXT = [
    "Hello there, how are you? I am fine. The weather is nice today, ok.",
    "You are a helpful assistant.",
    '{"name": "search", "arguments": {"q": "pack"}}',
    "Cutting Knowledge Date: December 2023\n\nToday Date",
]


def bpe_tokenizer(specials: list, eos: str, bos: str | None = None, vocab_size: int = 300):
    """A byte-level BPE trained here on BPE_TEXT (ms), with `specials` as special tokens: a real
    tokenizer's offsets and merges for the chat-template tests, held in memory (`save_pretrained` to
    use it as a directory)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        BPE_TEXT * 4,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos)


def documents(
    n_docs: int, min_words: int = 5, max_words: int = 40, n_words: int = 60, seed: int = 0
) -> list[str]:
    import random

    rng = random.Random(seed)
    vocab = words(n_words)
    return [
        " ".join(rng.choice(vocab) for _ in range(rng.randint(min_words, max_words)))
        for _ in range(n_docs)
    ]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d}) + "\n" for d in docs))
    return path


def write_txt_dir(path: Path, docs: list[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (path / f"doc{i:04d}.txt").write_text(d + "\n")
    return path


def write_parquet(path: Path, docs: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs}), str(path))
    return path


def token_ids(docs: list[str]) -> list[list[int]]:
    """What make_tokenizer gives for each document (word wK -> id K + 4), without EOS."""
    return [[int(w[1:]) + len(SPECIALS) for w in d.split()] for d in docs]
