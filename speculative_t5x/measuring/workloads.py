"""What a benchmark runs on: random models (for the mechanics, never for alpha), and random or
text inputs, EOS-ended and padded."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network

# Random drafters exercise the mechanics only: their alpha says nothing about real drafters.
RANDOM_DRAFTER_KINDS = ("independent", "copy")
FIRST_NON_SPECIAL_ID = 3  # T5 vocabularies: 0 = PAD, 1 = EOS, 2 = UNK.


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


def random_tokens(rng: jax.Array, vocab_size: int, shape: Sequence[int]) -> jax.Array:
  """Random non-special token ids (none is PAD, EOS or UNK) -> int32 array of `shape`."""
  if vocab_size <= FIRST_NON_SPECIAL_ID:
    raise ValueError(f"vocab_size {vocab_size} leaves no ordinary tokens after PAD, EOS and UNK.")
  return jax.random.randint(rng, tuple(shape), FIRST_NON_SPECIAL_ID, vocab_size, jnp.int32)


def host_tokens(draws: np.random.Generator, vocab_size: int, shape: Sequence[int]) -> jax.Array:
  """`random_tokens` drawn on the host by numpy's `draws` (no program compiled)."""
  return jnp.asarray(draws.integers(FIRST_NON_SPECIAL_ID, vocab_size, tuple(shape), np.int32))


def random_inputs(
    vocab_size: int, num_examples: int, length: int, seed: int = 0, eos_id: int = 1
) -> np.ndarray:
  """[num_examples, length] int32: n_i - 1 random tokens, EOS, 0-padding; n_i drawn from
  [max(1, length // 2), length]."""
  if num_examples < 1 or length < 1:
    raise ValueError(
        f"random inputs need num_examples >= 1 and length >= 1, got {num_examples} "
        f"and {length}."
    )
  tokens = np.asarray(random_tokens(jax.random.PRNGKey(seed), vocab_size, (num_examples, length)))
  lengths = np.random.default_rng(seed).integers(max(1, length // 2), length + 1, num_examples)
  return pad_sequences([list(row[: n - 1]) + [eos_id] for row, n in zip(tokens, lengths)], length)


def pad_sequences(sequences: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """Token sequences, each at most `length` long -> [len(sequences), length] int32, 0-padded."""
  inputs = np.zeros((len(sequences), length), np.int32)
  for i, sequence in enumerate(sequences):
    inputs[i, : len(sequence)] = sequence
  return inputs


def read_lines(path: str, limit: int | None = None) -> list[str]:
  """The non-empty lines of a text file, stripped; the first `limit` of them when it is set."""
  with open(path, encoding="utf-8") as f:
    lines = [line for line in (line.strip() for line in f) if line]
  if not lines:
    raise ValueError(f"{path} has no non-empty lines: give a file with one input per line.")
  return lines[:limit] if limit else lines


def check_vocabulary(vocabulary: Any, vocab_size: int, source: str) -> None:
  """Raises ValueError if `vocabulary` (from `source`) has ids the models' vocab_size lacks."""
  if vocabulary.vocab_size > vocab_size:
    raise ValueError(
        f"{source} has {vocabulary.vocab_size} pieces but the models' vocab_size is "
        f"{vocab_size}: use the models' vocabulary."
    )


def encode_texts(
    texts: Sequence[str], vocabulary: Any, length: int | None = None, multiple: int = 8
) -> np.ndarray:
  """Texts tokenized, EOS-ended, 0-padded -> [len(texts), length] int32 (None: the longest,
  rounded up to a `multiple`). Raises ValueError, naming the first, if a text does not fit."""
  if not texts:
    raise ValueError("no texts to encode.")
  sequences = [list(vocabulary.encode(text)) + [vocabulary.eos_id] for text in texts]
  longest = max(len(sequence) for sequence in sequences)
  if length is None:
    length = -(-longest // multiple) * multiple
  too_long = [i for i, sequence in enumerate(sequences) if len(sequence) > length]
  if too_long:
    first = too_long[0]
    raise ValueError(
        f"{len(too_long)} of the {len(texts)} inputs (first: input {first + 1}, "
        f"{len(sequences[first])} tokens with EOS: {texts[first][:60]!r}) exceed the "
        f"'inputs' length {length}: raise the 'inputs' feature length "
        "(TASK_FEATURE_LENGTHS) or shorten them."
    )
  return pad_sequences(sequences, length)
