"""Exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) for T5 1.1 in JAX/Flax.

Importing the package, or any module of the method, has no side effects and loads JAX, flax,
numpy and gin alone. Scripts set up the process with `speculative_t5x.running.bootstrap.start()`.
"""

__version__ = "0.1.0"
