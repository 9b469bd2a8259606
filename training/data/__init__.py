"""Data: tokenizers, moe-data prepare, and the dataset and loader the trainer reads."""
