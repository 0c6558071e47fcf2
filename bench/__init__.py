"""Speed of zoo side by side with timm, HF transformers and torch.nn (see bench/run.py)."""
