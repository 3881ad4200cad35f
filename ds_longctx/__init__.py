"""ds_longctx: million-token full fine-tuning of HF causal LMs with DeepSpeed ZeRO-3 and Ulysses
SP."""

__version__ = "0.1.0"
