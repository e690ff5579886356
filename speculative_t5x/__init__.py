"""Exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) for T5 1.1 in JAX/Flax."""

__version__ = "0.1.0"
