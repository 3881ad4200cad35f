"""Corpora written to disk for training and evaluation: `ds-longctx data prepare` (prepare.py)
writes the Python standard library as documents (stdlib_corpus.py) or long agent sessions over it
(agent_sessions.py), each with its tokenizer and data card. It reads and writes through data/ (rows,
checks, tokenizers); data/ never imports it. Design notes: docs/design/corpora.md."""
