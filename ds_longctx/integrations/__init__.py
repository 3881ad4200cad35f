"""ds_longctx inside other training loops: `hf_trainer.py` (the HF Trainer and TRL's SFTTrainer) and `hf_data.py`
(their data under SP). Importing this package imports no torch."""
