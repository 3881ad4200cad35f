"""A shipped geometry with a tokenizer's vocabulary: `python benchmarks/model_for_tokenizer.py BASE
TOKENIZER_DIR OUT` writes OUT, the model config BASE (ds_longctx/models/BASE.json) with vocab_size
the tokenizer's rounded up to a multiple of 128 and its bos / eos ids, and prints one line saying so
(benchmarks/stdlib_corpus.sh, benchmarks/answer_loss.sh)."""

import json
import sys

from transformers import AutoTokenizer

from ds_longctx.config.model import SHIPPED_MODELS_DIR

base, tok_dir, out = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
cfg = json.loads((SHIPPED_MODELS_DIR / f"{base}.json").read_text())
cfg.update(
    vocab_size=-(-len(tok) // 128) * 128,
    bos_token_id=tok.bos_token_id,
    eos_token_id=tok.eos_token_id,
)
open(out, "w").write(json.dumps(cfg, indent=1) + "\n")
print(
    f"model: {base} geometry, vocab_size {cfg['vocab_size']} (tokenizer {len(tok)}), eos "
    f"{tok.eos_token_id}"
)
