"""What a benchmark runs on: random models (for the mechanics, never for alpha) and random
tokens drawn on the host (`text.input_data` reads the inputs)."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x.text import input_data

# Random drafters exercise the mechanics only: their alpha says nothing about real drafters.
RANDOM_DRAFTER_KINDS = ("independent", "copy")


def random_params(config: network.T5Config, seed: int) -> dict:
  """float32 parameters, initialised eagerly: compiling the initialiser costs more."""
  return network.init_params(config, jax.random.PRNGKey(seed))


def random_drafter(
    kind: str,
    target_config: network.T5Config,
    target_params: dict,
    drafter: drafters_lib.Drafter,
    drafter_params: dict,
) -> tuple[drafters_lib.Drafter, dict]:
  """-> (drafter, params): 'independent', `drafter` with its own random parameters; 'copy', a
  T5 drafter with the target's very parameters (alpha ~ 1)."""
  if kind == "independent":
    return drafter, drafter_params
  if kind == "copy":
    return drafters_lib.T5Drafter(target_config), target_params
  raise ValueError(f"unknown random drafter kind {kind!r}: use one of {RANDOM_DRAFTER_KINDS}.")


def host_tokens(draws: np.random.Generator, vocab_size: int, shape: Sequence[int]) -> jax.Array:
  """`input_data.random_tokens` drawn on the host by numpy's `draws` (no program compiled)."""
  return jnp.asarray(
      draws.integers(input_data.FIRST_NON_SPECIAL_ID, vocab_size, tuple(shape), np.int32)
  )
