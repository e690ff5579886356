"""Standardized sampling (paper section 2.2): logits -> the distribution actually sampled from.

Temperature, top-k and top-p all become ordinary sampling from an adjusted distribution. The same
function turns the drafter's and the target's logits into q and p, so the q in the acceptance ratio
is exactly the distribution the draft was sampled from (DESIGN.md contract 3).

Temperature may be a traced scalar or a `[batch]` array (no recompilation when it changes);
`topk` and `topp` are static Python numbers because they change the computation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# T5X's decoding.MIN_TEMPERATURE: at or below it, sampling is greedy (a one-hot argmax).
MIN_TEMPERATURE = 1e-4


def validate(temperature=None, topk: int = 0, topp: float = 0.0) -> None:
  """Raises ValueError for settings that have no meaning, before anything is traced."""
  if topk and topp:
    raise ValueError(f"topk={topk} and topp={topp} were both set: at most one of top-k and top-p "
                     "may be non-zero (set the other to 0).")
  if int(topk) != topk or topk < 0:
    raise ValueError(f"topk must be a non-negative integer (0 = no cutoff), got {topk}.")
  if not 0.0 <= topp <= 1.0:
    raise ValueError(f"topp must be in [0, 1] (0 = no cutoff), got {topp}.")
  if temperature is not None and not isinstance(temperature, jax.core.Tracer):
    if np.any(np.asarray(temperature) < 0) or np.any(np.isnan(np.asarray(temperature))):
      raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}.")


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
  greedy = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  return jnp.where(temperature <= MIN_TEMPERATURE, greedy, sampled)


def sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token id per row from (possibly unnormalized) probabilities [..., vocab] -> [...]."""
  return jax.random.categorical(rng, jnp.log(probs), axis=-1).astype(jnp.int32)
