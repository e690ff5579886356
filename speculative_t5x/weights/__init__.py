"""Weights: T5X, Hugging Face and orbax checkpoints, and target-drafter pairs."""
