"""ds_longctx inside other training loops (the HF Trainer, TRL); importing it imports no torch."""
