"""Drafters whose drafts cost no model call: token-frequency tables and prompt lookup.

The loop's notation is the `drafters` protocol's: `sequences` [B, S] holds the tokens decoded so
far, y_0 y_1 ... (zero beyond), `length` [B] how many are decoded, and the decoder input at
position t is x_t = 0 (BOS) for t = 0 and y_{t-1} after, so a proposal continues from x_length.

The n-gram tables (`UnigramDrafter`: q(x); `BigramDrafter`: q(x | x_length), backed off to the
unigram) are fitted on target sequences (`fit_params`); their logits are standardized with the same
`standardize` function the target uses (docs/design.md, contract 3) and sampled. Prompt lookup
(`PromptLookupDrafter`) copies what followed an earlier occurrence of the last n decoder inputs; it
proposes deterministically, so its q is one-hot, which keeps speculative sampling exact. None of
them keeps a cache, so rolling back (the loop setting `length` back) asks nothing of them.

Their gin names are the `drafters` module's (`@drafters.BigramDrafter()`); gin knows them once
this module is imported: the gin files that bind them import it, and so does `pairs` (a DRAFTER
given on the command line).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Iterable, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters
from speculative_t5x import layers
from speculative_t5x import validation


def _check_token_ids(tokens: np.ndarray, vocab_size: int, owner: str) -> np.ndarray:
  """The non-padding ids of one fitting sequence, refused where outside [0, vocab_size)."""
  tokens = np.asarray(validation.scalar(tokens, f"{owner}.fit's sequence"))
  if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"{owner}.fit needs integer token ids, got dtype {tokens.dtype}.")
  bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
  if bad.size:
    raise ValueError(
        f"{owner}.fit got token id {int(bad.flat[0])} outside [0, {vocab_size}): fit on "
        "sequences of the target's vocabulary, with the target's vocab_size."
    )
  return tokens.ravel()


def _sequences(token_arrays, owner: str, ordered: bool = True):
  """The sequences `fit` counts, refused with the fix where `token_arrays` is not an iterable of
  them (dataset features, a string, a number) and, where the order of the tokens counts
  (`ordered`: bigrams), where one is not a 1-D array (one sequence alone, whose items are
  numbers; a [N, L] array in a list, whose rows would be joined)."""
  what = (
      f"{owner}.fit takes an iterable of target sequences, 1-D token id arrays (e.g. the rows of "
      "a [N, L] array, or [ex['targets'] for ex in dataset.as_numpy_iterator()])"
  )
  if isinstance(token_arrays, (str, bytes, Mapping)) or not isinstance(token_arrays, Iterable):
    raise ValueError(f"{what}, got {type(token_arrays).__name__}.")
  for index, tokens in enumerate(token_arrays):
    if isinstance(tokens, Mapping):
      raise ValueError(
          f"{what}; item {index} is a mapping of features ({sorted(tokens)[:4]}): give its "
          "'targets'."
      )
    if isinstance(tokens, (str, bytes)) or (ordered and np.ndim(tokens) != 1):
      fix = (
          "wrap one sequence in a list ([tokens])"
          if np.ndim(tokens) == 0
          else "give the rows of the array (list(array))"
      )
      raise ValueError(f"{what}; item {index} has shape {np.shape(tokens)}: {fix}.")
    yield tokens


def _ngram_logits(counts: np.ndarray, smoothing: float) -> np.ndarray:
  return np.log(np.asarray(counts, np.float64) + smoothing).astype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class _TableDrafter(drafters.Drafter):
  """Shared proposal loop of the n-gram drafters: logits from a table, standardized, sampled.
  A subclass gives `fit` (a static method: token arrays and vocab_size -> params) and
  `next_logits`; untrained params are the table fitted on nothing (uniform)."""

  vocab_size: int = 0
  eos_id: int | None = None

  def __post_init__(self):
    drafters.set_checked_fields(self, {"vocab_size": 0}, ("smoothing",))
    if self.smoothing < 0:
      raise ValueError(
          f"{type(self).__name__}.smoothing must be a finite number >= 0 (added to every count), "
          f"got {self.smoothing!r}."
      )

  @property
  def steps_per_draft(self) -> int:
    return 0  # a table lookup, not a model call.

  def init_params(self, rng, input_shapes):
    del rng, input_shapes
    return self.fit_params([])

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    return ()

  @abc.abstractmethod
  def next_logits(self, params, previous: jax.Array) -> jax.Array:
    """previous tokens [B] -> logits [B, V]."""

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    previous = drafters.decoder_inputs(sequences, length[:, None])[:, 0]
    drafts, q, _, _ = drafters.draft_chain(
        self.next_logits(params, previous)[:, None],
        lambda carry, token, i: (self.next_logits(params, token)[:, None], carry),
        (),
        gamma,
        u,
        standardize,
        stop,
    )
    return drafts, q, state

  def propose_tree(self, params, state, sequences, length, tree, u, standardize):
    previous = drafters.decoder_inputs(sequences, length[:, None])[:, 0]
    vocab = self.vocab_size

    def level_logits(carry, tokens, slots):
      del slots
      logits = self.next_logits(params, tokens.reshape(-1))
      return logits.reshape(tokens.shape + (vocab,)), carry

    drafts, q, _ = drafters.draft_tree(
        self.next_logits(params, previous)[:, None], level_logits, (), tree, u, standardize
    )
    return drafts, q, state

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    del encoder_input_tokens, target_encoded  # a table reads only the previous token.
    return jax.vmap(lambda previous: self.next_logits(params, previous), in_axes=1, out_axes=1)(
        decoder_input_tokens
    )


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class UnigramDrafter(_TableDrafter):
  """q(x) from token frequencies; params = {'logits': [V]} (see `fit`)."""

  smoothing: float = 1.0

  @staticmethod
  def fit(token_arrays, vocab_size: int, smoothing: float = 1.0) -> dict:
    """Counts token ids (0 = padding, ignored) in an iterable of int arrays -> params."""
    counts = np.zeros(vocab_size, np.int64)
    for tokens in _sequences(token_arrays, "UnigramDrafter", ordered=False):
      tokens = _check_token_ids(tokens, vocab_size, "UnigramDrafter")
      counts += np.bincount(tokens[tokens > 0], minlength=vocab_size)
    return {"logits": _ngram_logits(counts, smoothing)}

  def fit_params(self, targets):
    return self.fit(targets, self.vocab_size, self.smoothing)

  def next_logits(self, params, previous):
    return jnp.broadcast_to(params["logits"], (previous.shape[0], self.vocab_size))


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class BigramDrafter(_TableDrafter):
  """q(x | previous token) from bigram counts, kept sparse: the `top` most frequent successors of
  each token, backed off to the unigram distribution.

  params = {'unigram': [V] log-probabilities, 'next_ids': [V, top] int32, 'next_logp': [V, top]
  log-probabilities replacing the unigram's at those ids}. Counting starts from BOS (0).
  """

  top: int = 32
  smoothing: float = 1.0
  backoff: float = 0.1

  def __post_init__(self):
    super().__post_init__()
    drafters.set_checked_fields(self, {"top": 1}, ("backoff",))
    if not 0 < self.backoff < 1:
      raise ValueError(
          f"BigramDrafter.backoff must be in (0, 1) (the unigram's weight), got {self.backoff!r}."
      )

  @staticmethod
  def fit(
      token_arrays, vocab_size: int, top: int = 32, smoothing: float = 1.0, backoff: float = 0.1
  ) -> dict:
    """Fits on target sequences (an iterable of 1-D int arrays, 0 = padding)."""
    if not 0 < backoff < 1:
      raise ValueError(f"backoff must be in (0, 1), got {backoff}.")
    unigram = np.zeros(vocab_size, np.int64)
    pairs: dict[tuple[int, int], int] = {}
    for tokens in _sequences(token_arrays, "BigramDrafter"):
      tokens = _check_token_ids(tokens, vocab_size, "BigramDrafter")
      tokens = tokens[tokens > 0]
      unigram += np.bincount(tokens, minlength=vocab_size)
      for prev, nxt in zip(np.concatenate([[0], tokens[:-1]]), tokens):
        pairs[(int(prev), int(nxt))] = pairs.get((int(prev), int(nxt)), 0) + 1
    uni_p = (unigram + smoothing) / (unigram + smoothing).sum()
    next_ids = np.zeros((vocab_size, top), np.int32)
    next_p = np.zeros((vocab_size, top), np.float64)
    by_prev: dict[int, list[tuple[int, int]]] = {}
    for (prev, nxt), count in pairs.items():
      by_prev.setdefault(prev, []).append((count, nxt))
    for prev, successors in by_prev.items():
      successors.sort(key=lambda cn: (-cn[0], cn[1]))
      successors = successors[:top]
      total = sum(c for c, _ in successors)
      for j, (count, nxt) in enumerate(successors):
        next_ids[prev, j] = nxt
        next_p[prev, j] = count / total
    # Rows with successors mix (1 - backoff) * bigram + backoff * unigram; others are unigram.
    has_next = next_p.sum(1, keepdims=True) > 0
    mixed = np.where(has_next, (1 - backoff) * next_p + backoff * uni_p[next_ids], uni_p[next_ids])
    return {
        "unigram": np.log(uni_p).astype(np.float32),
        "next_ids": next_ids,
        "next_logp": np.log(mixed).astype(np.float32),
        "backoff": np.where(has_next[:, 0], np.log(backoff), 0.0).astype(np.float32),
    }

  def fit_params(self, targets):
    return self.fit(targets, self.vocab_size, self.top, self.smoothing, self.backoff)

  def param_shapes(self):
    """`fit`'s tables, whatever number of successors per token they keep: `top` is what
    `fit_params` keeps, and the proposals read the tables as they are."""
    vocab = self.vocab_size
    return {
        "unigram": (vocab,),
        "next_ids": (vocab, None),
        "next_logp": (vocab, None),
        "backoff": (vocab,),
    }

  def next_logits(self, params, previous):
    params = jax.tree.map(jnp.asarray, params)  # `fit` returns numpy arrays.
    base = params["unigram"][None, :] + params["backoff"][previous][:, None]
    rows = jnp.arange(previous.shape[0])[:, None]
    return base.at[rows, params["next_ids"][previous]].set(params["next_logp"][previous])


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class PromptLookupDrafter(drafters.Drafter):
  """Copies what followed the latest earlier occurrence of the key x_{length-n+1..length} (the last
  `ngram` decoder inputs, BOS included while fewer than n tokens are decoded), searched in the
  encoder input and in the decoded prefix (prefix matches win). The copy stops at the end of what
  is known (x_length) and at the first padding; `fallback_token` fills the drafts where nothing
  matches or the copy ran out. Deterministic: q is one-hot, so sampling stays exact. An encoder
  match may copy the input's own EOS.
  """

  vocab_size: int = 0
  ngram: int = 2
  eos_id: int | None = None
  fallback_token: int = 0

  def __post_init__(self):
    drafters.set_checked_fields(self, {"vocab_size": 0, "ngram": 1, "fallback_token": 0})
    if self.vocab_size and self.fallback_token >= self.vocab_size:
      raise ValueError(
          f"PromptLookupDrafter.fallback_token {self.fallback_token} is outside the vocabulary "
          f"[0, {self.vocab_size}): give an id of the target's vocabulary (0 by default)."
      )

  @property
  def steps_per_draft(self) -> int:
    return 0

  def check_lengths(self, encoder_length, decode_length):
    """Its key is the last `ngram` decoder inputs (BOS and the decoded tokens), and it searches
    for a key only once that many are known (`propose`): a decode of decode_length tokens never
    has a key longer than decode_length."""
    del encoder_length  # an encoder match needs a key too.
    if self.ngram > decode_length:
      raise validation.InvalidInputError(
          f"PromptLookupDrafter.ngram {self.ngram} is longer than the decode "
          f"({decode_length} tokens): its key, the last ngram decoder inputs, never exists, so "
          f"every draft would be fallback_token. Use ngram <= {decode_length} (2 or 3 is usual), "
          "or decode longer sequences."
      )

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    return jnp.asarray(encoder_input_tokens, jnp.int32)

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    """The one-hot of its first draft at every position, as logits (0 there, MASK_VALUE else)."""
    del target_encoded  # it copies tokens.
    batch, length = decoder_input_tokens.shape
    self.check_lengths(np.shape(encoder_input_tokens)[1], length)
    state = self.init_state(params, encoder_input_tokens, length)
    sequences = jnp.pad(decoder_input_tokens[:, 1:], ((0, 0), (0, 1)))  # y_t = x_{t+1}
    first = jax.vmap(
        lambda t: self.propose(
            params, state, sequences, jnp.full((batch,), t, jnp.int32), 1, None, None
        )[0][:, 0],
        out_axes=1,
    )(jnp.arange(length))
    return jnp.where(jax.nn.one_hot(first, self.vocab_size, dtype=bool), 0.0, layers.MASK_VALUE)

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    del stop  # its drafts cost no drafter step, so stopping early saves nothing.
    n = self.ngram
    # Search space per row: the input tokens, then x_0..x_length (BOS and the decoded tokens).
    positions = jnp.arange(sequences.shape[1] + 1)[None]
    decoded = drafters.decoder_inputs(sequences, positions)
    decoded = jnp.where(positions <= length[:, None], decoded, -1)
    source = jnp.concatenate([state, decoded], axis=1)  # [B, Le + S + 1]
    offset = state.shape[1]
    end = offset + length  # index of x_length in `source`
    key = jnp.stack(
        [jnp.take_along_axis(source, (end - n + 1 + j)[:, None], axis=1)[:, 0] for j in range(n)],
        axis=1,
    )  # [B, n], the last n tokens x_{length-n+1..length}
    width = source.shape[1]
    starts = jnp.arange(width - n + 1)
    windows = jnp.stack([source[:, starts + j] for j in range(n)], axis=-1)  # [B, W, n]
    match = jnp.all(windows == key[:, None, :], axis=-1)
    # A match must end before x_length, and the n-gram must lie inside the decoded part.
    match &= (starts + n - 1)[None] < end[:, None]
    match &= length[:, None] + 1 >= n
    best = jnp.max(jnp.where(match, starts[None], -1), axis=1)  # the latest match wins.
    copy_from = best + n
    idx = jnp.clip(copy_from[:, None] + jnp.arange(gamma)[None], 0, width - 1)
    drafts = jnp.take_along_axis(source, idx, axis=1)
    valid = (best[:, None] >= 0) & (copy_from[:, None] + jnp.arange(gamma)[None] <= end[:, None])
    # The copy stops at the first padding (0): a continuation never runs past the end of the
    # input, through BOS, into the decoded prefix.
    valid = jnp.cumprod(valid & (drafts > 0), axis=1).astype(bool)
    drafts = jnp.where(valid, drafts, self.fallback_token).astype(jnp.int32)
    return drafts, jax.nn.one_hot(drafts, self.vocab_size, dtype=jnp.float32), state
