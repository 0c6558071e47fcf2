"""Data: text and image datasets, tokenizers, batching."""
