"""Checkpoints: save, load, verify and resume, and conversion to and from Hugging Face weights."""
