"""Tests of standardized sampling: temperature, greedy, top-k, top-p, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import chisquare_pvalue

from speculative_t5x import sampling

LOGITS = jnp.array([[1.0, 3.0, 2.0, 3.0, -1.0]])


def test_temperature_one_is_softmax_and_scales():
  np.testing.assert_allclose(sampling.distribution(LOGITS, 1.0), jax.nn.softmax(LOGITS), rtol=1e-6)
  np.testing.assert_allclose(
      sampling.distribution(LOGITS, 0.5), jax.nn.softmax(LOGITS / 0.5), rtol=1e-6
  )


def test_greedy_is_one_hot_first_index_on_ties():
  for t in (0.0, 1e-5):
    np.testing.assert_array_equal(sampling.distribution(LOGITS, t), [[0, 1, 0, 0, 0]])
  # Greedy ignores top-k / top-p, as T5X's greedy branch does.
  np.testing.assert_array_equal(sampling.distribution(LOGITS, 0.0, topk=3), [[0, 1, 0, 0, 0]])


def test_top_k_keeps_k_largest_and_renormalizes():
  probs = np.asarray(sampling.distribution(jnp.array([[0.0, 2.0, 1.0, 3.0]]), 1.0, topk=2))
  expected = np.array([0, np.exp(2.0), 0, np.exp(3.0)]) / (np.exp(2.0) + np.exp(3.0))
  np.testing.assert_allclose(probs[0], expected, rtol=1e-6)


def test_top_p_keeps_smallest_set_reaching_mass():
  base = np.array([0.5, 0.3, 0.15, 0.05])
  logits = jnp.log(jnp.array([base]))
  np.testing.assert_allclose(
      sampling.distribution(logits, 1.0, topp=0.7)[0], [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-5
  )
  np.testing.assert_allclose(
      sampling.distribution(logits, 1.0, topp=0.5)[0], [1, 0, 0, 0], atol=1e-6
  )
  np.testing.assert_allclose(
      sampling.distribution(logits, 1.0, topp=0.81)[0],
      [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
      rtol=1e-5,
  )


def test_per_row_temperature():
  logits = jnp.stack([LOGITS[0], LOGITS[0]])
  probs = sampling.distribution(logits, jnp.array([0.0, 1.0]))
  np.testing.assert_array_equal(probs[0], [0, 1, 0, 0, 0])
  np.testing.assert_allclose(probs[1], jax.nn.softmax(LOGITS[0]), rtol=1e-6)


def test_argmax_is_jnp_argmax_with_first_index_on_ties():
  x = jnp.array([[1.0, 3.0, 3.0], [-2.0, -2.0, -5.0], [0.5, 0.25, 0.75]])
  np.testing.assert_array_equal(sampling.argmax(x), jnp.argmax(x, axis=-1))


def test_sample_never_draws_probability_zero_tokens():
  probs = jnp.broadcast_to(jnp.array([0.0, 0.5, 0.0, 0.5, 0.0, 0.0]), (50000, 6))
  draws = np.asarray(sampling.sample(sampling.uniforms(jax.random.PRNGKey(3), (50000,)), probs))
  assert set(np.unique(draws)) == {1, 3}
  one_hot = jnp.broadcast_to(jnp.array([0.0, 0.0, 1.0, 0.0]), (1000, 4))
  u = sampling.uniforms(jax.random.PRNGKey(4), (1000,))
  assert np.all(np.asarray(sampling.sample(u, one_hot)) == 2)
  # The extremes of [0, 1) and past it (rounding) still land on positive-probability tokens.
  edges = jnp.array([0.0, np.nextafter(np.float32(1), np.float32(0)), 1.0], jnp.float32)
  np.testing.assert_array_equal(sampling.sample(edges, probs[:3]), [1, 3, 3])


def test_is_greedy_only_for_known_temperatures_at_or_below_the_minimum():
  assert sampling.is_greedy(0.0) and sampling.is_greedy(np.float32(1e-5))
  assert sampling.is_greedy(np.zeros(3)) and sampling.is_greedy(jnp.float32(0))
  assert not sampling.is_greedy(0.5) and not sampling.is_greedy(np.array([0.0, 1.0]))
  seen = []
  jax.jit(lambda t: seen.append(sampling.is_greedy(t)) or t)(0.0)  # traced: unknown
  assert seen == [False]


def test_draw_from_logits_greedy_takes_the_argmax_and_builds_no_distribution():
  logits = jnp.array([[0.5, 2.0, -1.0, 2.0], [3.0, 0.0, 0.0, 1.0]])
  tokens, probs = sampling.Standardizer(0.0).draw_from_logits(jnp.array([0.3, 0.9]), logits)
  assert probs is None
  np.testing.assert_array_equal(tokens, [1, 0])
  standardize = sampling.Standardizer(jnp.float32(0.8))
  u = jnp.array([0.3, 0.9])
  tokens, probs = standardize.draw_from_logits(u, logits)
  np.testing.assert_allclose(probs, standardize(logits))
  np.testing.assert_array_equal(tokens, sampling.sample(u, probs))


def test_sample_is_the_inverse_cdf_of_its_uniform():
  probs = jnp.array([0.1, 0.6, 0.0, 0.3])  # cdf 0.1, 0.7, 0.7, 1.0
  u = jnp.array([0.0, 0.05, 0.1, 0.4, 0.69, 0.71, 0.95])
  np.testing.assert_array_equal(
      sampling.sample(u, jnp.broadcast_to(probs, (7, 4))), [0, 0, 1, 1, 1, 3, 3]
  )
  # Unnormalized probabilities are scaled by their total.
  np.testing.assert_array_equal(
      sampling.sample(u, jnp.broadcast_to(probs * 5, (7, 4))), [0, 0, 1, 1, 1, 3, 3]
  )


def _spread_distribution(vocab=1000, seed=0):
  """Probabilities over several SAMPLE_BLOCK blocks: whole blocks of zeros, zeros at block edges,
  a few large and many small masses."""
  rng = np.random.default_rng(seed)
  probs = np.zeros(vocab)
  positive = rng.choice(vocab, 60, replace=False)
  probs[positive] = rng.gamma(0.5, size=60)
  probs[sampling.SAMPLE_BLOCK * 2 : sampling.SAMPLE_BLOCK * 3] = 0.0  # an empty block
  probs[sampling.SAMPLE_BLOCK - 1] = probs[sampling.SAMPLE_BLOCK] = 0.0
  probs[[5, 700]] = 3.0
  return probs / probs.sum()


def test_two_level_sample_is_the_flat_inverse_cdf_away_from_rounding():
  probs = _spread_distribution()
  cdf = np.cumsum(probs)
  u = np.asarray(sampling.uniforms(jax.random.PRNGKey(7), (5000,)), np.float64)
  clear = np.min(np.abs(u[:, None] - cdf[None]), axis=1) > 1e-5  # not within rounding of an edge
  expected = np.sum(cdf[None] <= u[:, None], axis=1)
  drawn = np.asarray(
      sampling.sample(
          jnp.asarray(u, jnp.float32),
          jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (5000, len(probs))),
      )
  )
  assert clear.mean() > 0.95
  np.testing.assert_array_equal(drawn[clear], expected[clear])


def test_two_level_sample_follows_a_spread_distribution():
  probs = _spread_distribution(seed=1)
  draws = np.asarray(
      sampling.sample(
          sampling.uniforms(jax.random.PRNGKey(8), (100000,)),
          jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (100000, len(probs))),
      )
  )
  assert np.all(probs[draws] > 0)
  support = probs > 0
  observed = np.bincount(draws, minlength=len(probs))[support]
  assert chisquare_pvalue(observed, probs[support]) > 1e-3


def test_sample_follows_distribution():
  probs = jnp.array([0.1, 0.6, 0.0, 0.3])
  draws = sampling.sample(
      sampling.uniforms(jax.random.PRNGKey(0), (20000,)), jnp.broadcast_to(probs, (20000, 4))
  )
  counts = np.bincount(np.asarray(draws), minlength=4) / 20000
  assert counts[2] == 0
  np.testing.assert_allclose(counts, probs, atol=0.015)  # > 4 standard errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(topk=5, topp=0.9), "at most one of top-k and top-p"),
        (dict(topk=-1), "topk must be a non-negative integer"),
        (dict(topp=1.5), r"topp must be in \[0, 1\]"),
    ],
)
def test_validate(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.validate(**kwargs)


def test_uniforms_with_one_key_per_example_are_each_examples_own():
  """[L, B * N, M] from B keys: example b's N rows are uniforms(key_b, [L, N, M])."""
  keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(0), jnp.arange(3))
  draws = np.asarray(sampling.uniforms(keys, (5, 6, 4)))
  for b in range(3):
    np.testing.assert_array_equal(
        draws[:, 2 * b : 2 * b + 2], np.asarray(sampling.uniforms(keys[b], (5, 2, 4)))
    )
  typed = jax.vmap(jax.random.wrap_key_data)(keys)
  np.testing.assert_array_equal(np.asarray(sampling.uniforms(typed, (5, 6, 4))), draws)
