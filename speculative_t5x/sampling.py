"""Standardized sampling (paper section 2.2): logits -> the distribution actually sampled from.

Temperature, top-k and top-p all become ordinary sampling from an adjusted distribution. The same
function turns the drafter's and the target's logits into q and p, so the q in the acceptance ratio
is exactly the distribution the draft was sampled from (docs/design.md, contract 3).

Temperature may be a traced scalar or a `[batch]` array (no recompilation when it changes);
`topk` and `topp` are static Python numbers because they change the computation. A temperature
known at trace time to be greedy (`is_greedy`) selects a greedy specialization: every distribution
is then a one-hot argmax, so the loops take argmaxes of the logits and never build distributions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import validation

# T5X's decoding.MIN_TEMPERATURE: at or below it, sampling is greedy (a one-hot argmax).
MIN_TEMPERATURE = 1e-4
# `sample` finds the block of this many tokens first, then the token inside it.
SAMPLE_BLOCK = 128


def validate(temperature=None, topk: int = 0, topp: float = 0.0) -> None:
  """Raises ValueError for settings that have no meaning, before anything is traced: a
  temperature (None: not checked) finite and >= 0, topk an integer >= 0, topp in [0, 1], not both
  (`validation.check_sampling`)."""
  validation.check_sampling(temperature, topk, topp)


def is_greedy(temperature) -> bool:
  """True when `temperature` is known at trace time (a Python or NumPy number, or a concrete
  array, not a tracer) and every value of it is at or below MIN_TEMPERATURE."""
  if isinstance(temperature, jax.core.Tracer):
    return False
  return bool(np.all(np.asarray(temperature) <= MIN_TEMPERATURE))


def distribution(logits: jax.Array, temperature, topk: int = 0, topp: float = 0.0) -> jax.Array:
  """Standardized distribution, in float32.

  Args:
    logits: [..., vocab].
    temperature: scalar, or an array broadcastable against logits[..., 0] (e.g. `[batch, 1]` for
      logits `[batch, k, vocab]`). At or below MIN_TEMPERATURE the result is the one-hot argmax
      (first index on ties, as `jnp.argmax`).
    topk: keep the tokens whose scaled logit is at least the k-th largest (ties at the threshold
      are kept); 0 keeps all.
    topp: keep the smallest set of most likely tokens whose mass reaches topp (ties at the
      threshold are kept); 0 keeps all.

  Returns:
    probabilities [..., vocab] float32, summing to 1 along the last axis.
  """
  logits = logits.astype(jnp.float32)
  temperature = jnp.asarray(temperature, jnp.float32)[..., None]
  scaled = logits / jnp.maximum(temperature, MIN_TEMPERATURE)
  if topk:
    kth = jax.lax.top_k(scaled, int(topk))[0][..., -1:]
    scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
  if topp:
    probs = jax.nn.softmax(scaled)
    sorted_probs = -jnp.sort(-probs, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    kept = mass_before < topp
    threshold = jnp.min(jnp.where(kept, sorted_probs, jnp.inf), axis=-1, keepdims=True)
    scaled = jnp.where(probs >= threshold, scaled, -jnp.inf)
  sampled = jax.nn.softmax(scaled)
  greedy = jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
  return jnp.where(temperature <= MIN_TEMPERATURE, greedy, sampled)


def argmax(x: jax.Array) -> jax.Array:
  """jnp.argmax over the last axis (first index on ties) as two plain reductions, which XLA:CPU
  runs several times faster than its variadic argmax reduction. [..., vocab] -> [...] int32."""
  top = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def uniforms(rng: jax.Array, shape) -> jax.Array:
  """U[0, 1) float32 draws of `shape` [L, rows, ...], for `sample`.

  rng: one PRNG key for every row, or one key per example ([B, 2] raw or [B] typed, B dividing
  rows = B * N): example b's N rows (num_decodes) then take uniforms(key_b, [L, N, ...]), the
  draws a batch of that example alone would take, so its tokens do not depend on the examples
  beside it.

  The decoding loops draw all the uniforms a decode can use in one call, before their
  `lax.while_loop`, and read them by step inside it: on XLA:CPU every threefry call lowers to a
  rolled loop of its own, dozens of tiny kernels, which per-step `split` / `uniform` calls would pay
  at every step.
  """
  shape = tuple(shape)
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  if rng.ndim == (0 if typed else 1):
    return jax.random.uniform(rng, shape, jnp.float32)
  examples = rng.shape[0]
  per_example = (shape[0], shape[1] // examples) + shape[2:]
  draws = jax.vmap(lambda key: jax.random.uniform(key, per_example, jnp.float32))(rng)
  return jnp.moveaxis(draws, 0, 1).reshape(shape)  # [L, B, N, ...] -> [L, B * N, ...]


def sample(u: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token id per row from (possibly unnormalized) probabilities [..., vocab] -> [...],
  given one uniform per row, u [...] in [0, 1) (see `uniforms`).

  Inverse-CDF sampling (one uniform per row instead of a Gumbel draw per vocabulary entry): token
  i is drawn when cdf[i-1] <= u * total < cdf[i]. The cumulative sum is taken in two levels, as a
  cumulative sum over a vocabulary-long axis is slow on XLA:CPU: over the masses of blocks of
  SAMPLE_BLOCK tokens to find the block, then inside that block. A probability-0 token (or block)
  is never drawn, even where rounding puts the threshold on a boundary or at the total.
  """
  probs = probs.astype(jnp.float32)
  vocab = probs.shape[-1]
  # A vocabulary smaller than a block is one block of its own size: padding it would only add
  # zeros to both cumulative sums.
  width = min(SAMPLE_BLOCK, vocab)
  num_blocks = -(-vocab // width)
  padding = [(0, 0)] * (probs.ndim - 1) + [(0, num_blocks * width - vocab)]
  blocks = jnp.pad(probs, padding).reshape(probs.shape[:-1] + (num_blocks, width))
  mass = jnp.sum(blocks, axis=-1)  # [..., num_blocks]
  block_cdf = jnp.cumsum(mass, axis=-1)
  total = block_cdf[..., -1:]
  threshold = jnp.asarray(u, jnp.float32)[..., None] * total
  block = _first_above(block_cdf, threshold)
  inside = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
  before = jnp.take_along_axis(block_cdf - mass, block[..., None], axis=-1)
  token = block * width + _first_above(jnp.cumsum(inside, axis=-1), threshold - before)
  return token.astype(jnp.int32)


def _first_above(cdf: jax.Array, threshold: jax.Array) -> jax.Array:
  """The first index whose cdf [..., n] exceeds threshold [..., 1], kept among the entries of
  positive mass: between the first one (threshold below 0) and the last one (threshold at or
  past the total) -> [...] int32. The cdf is a cumulative sum of non-negative numbers with a
  positive total."""
  index = jnp.sum(cdf <= threshold, axis=-1)
  first_positive = jnp.sum(cdf <= 0, axis=-1)
  last_positive = jnp.sum(cdf < cdf[..., -1:], axis=-1)  # the cdf is flat after it
  return jnp.clip(index, first_positive, last_positive).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Standardizer:
  """The standardization of one decode call, applied alike to drafter and target logits.

  `temperature` is a scalar or an array broadcastable against logits[..., 0] (e.g. [rows, 1] for
  [rows, k, vocab]); it may be traced.
  """

  temperature: Any
  topk: int = 0
  topp: float = 0.0

  @property
  def greedy(self) -> bool:
    """Static: the temperature is known to be greedy (see `is_greedy`)."""
    return is_greedy(self.temperature)

  def __call__(self, logits: jax.Array) -> jax.Array:
    """logits [..., vocab] -> probabilities [..., vocab] (see `distribution`)."""
    return distribution(logits, self.temperature, self.topk, self.topp)

  def draw(self, u: jax.Array, probs: jax.Array) -> jax.Array:
    """A token from probabilities [..., vocab] and uniforms u [...] -> [...] (see `sample`); with
    one scalar temperature at or below MIN_TEMPERATURE the distributions are one-hot, and the
    argmax is taken without sampling."""
    if jnp.ndim(self.temperature) == 0:
      return jax.lax.cond(
          jnp.asarray(self.temperature) <= MIN_TEMPERATURE,
          lambda: argmax(probs),
          lambda: sample(u, probs),
      )
    return sample(u, probs)

  def draw_from_logits(self, u: jax.Array, logits: jax.Array) -> tuple[jax.Array, Any]:
    """Standardizes logits [..., vocab] and draws with uniforms u [...] -> (tokens [...],
    probabilities [..., vocab]); when `greedy`, (argmax of the logits, None): the one-hot
    distributions are implied and never built."""
    if self.greedy:
      return argmax(logits), None
    probs = self(logits)
    return self.draw(u, probs), probs
