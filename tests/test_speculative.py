"""Algorithm 1 on arrays: exact by enumeration, checked by sampling, no NaN in edge cases.

For context-free distributions (p_i and q_i not depending on earlier tokens), the emitted block
x_1..x_n, t followed by fresh samples from p_{n+2}, ..., p_{gamma+1} must be distributed exactly as
independent samples y_j ~ p_j. The enumeration below uses the module's own acceptance probability
and adjusted distribution, and the sampling tests check that `accept` follows them.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import chisquare_pvalue
from speculative_t5x import sampling
from speculative_t5x import speculative

SIGNIFICANCE = 1e-3  # goodness-of-fit tests reject at this level; seeds are fixed.


def _random_dists(rng, shape):
  x = rng.gamma(0.5, size=shape)
  return x / x.sum(-1, keepdims=True)


def _cases(gamma, vocab=3, seed=0):
  rng = np.random.default_rng(seed)
  p = _random_dists(rng, (gamma + 1, vocab))
  q = _random_dists(rng, (gamma, vocab))
  q_zero = q.copy()
  q_zero[:, 0] = 0  # q = 0 where p > 0: only the residual can produce token 0.
  q_zero /= q_zero.sum(-1, keepdims=True)
  one_hot_q = np.eye(vocab)[rng.integers(0, vocab, gamma)]
  p_one_hot = np.eye(vocab)[rng.integers(0, vocab, gamma + 1)]
  return {"random": (p, q), "q_zero_where_p_positive": (p, q_zero), "one_hot_q": (p, one_hot_q),
          "p_equals_q": (p, p[:gamma].copy()), "greedy": (p_one_hot, np.eye(vocab)[[0] * gamma])}


def _exact_output_law(p, q):
  """P(y_1..y_{gamma+1}) of the speculative block continued by sampling p, by enumeration."""
  gamma, vocab = q.shape
  pj, qj = jnp.asarray(p[None], jnp.float32), jnp.asarray(q[None], jnp.float32)
  tokens = np.arange(vocab)
  # a[i, x] = acceptance probability of draft x at position i.
  accept = np.stack([np.asarray(speculative.acceptance_probability(
      pj, qj, jnp.full((1, gamma), x, jnp.int32)))[0] for x in tokens], axis=1)
  adjusted = [np.asarray(speculative.adjusted_distribution(pj, qj, jnp.array([n])))[0]
              for n in range(gamma + 1)]
  reject = 1 - np.sum(q * accept, axis=1)  # P(reject at i) = sum_x q_i(x) (1 - a_i(x))
  law = {}
  for y in itertools.product(tokens, repeat=gamma + 1):
    total = 0.0
    for n in range(gamma + 1):
      prob = np.prod([q[i, y[i]] * accept[i, y[i]] for i in range(n)])
      if n < gamma:
        prob *= reject[n]
      prob *= adjusted[n][y[n]]
      prob *= np.prod([p[j, y[j]] for j in range(n + 1, gamma + 1)])
      total += prob
    law[y] = total
  return law


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("case", ["random", "q_zero_where_p_positive", "one_hot_q", "p_equals_q",
                                  "greedy"])
def test_output_law_is_exactly_the_target(gamma, case):
  p, q = _cases(gamma, seed=gamma)[case]
  law = _exact_output_law(p, q)
  for y, prob in law.items():
    target = np.prod([p[j, y[j]] for j in range(gamma + 1)])
    assert abs(prob - target) < 2e-6, (y, prob, target)


def test_closed_form_pieces():
  p = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
  q = np.array([[0.2, 0.6, 0.2]])
  pj, qj = jnp.asarray(p[None], jnp.float32), jnp.asarray(q[None], jnp.float32)
  a = [float(speculative.acceptance_probability(pj, qj, jnp.array([[x]]))[0, 0]) for x in range(3)]
  np.testing.assert_allclose(a, [1.0, 0.5, 1.0], rtol=1e-6)
  np.testing.assert_allclose(speculative.adjusted_distribution(pj, qj, jnp.array([0]))[0],
                             [1.0, 0.0, 0.0], atol=1e-6)  # norm(max(0, p - q)) = [0.3, 0, 0] / 0.3
  np.testing.assert_allclose(speculative.adjusted_distribution(pj, qj, jnp.array([1]))[0],
                             p[1], rtol=1e-6)  # all accepted: the bonus token comes from p_2
  _, _, beta = speculative.accept(pj, qj, jnp.array([[1]]), jnp.array([[0.3, 0.5]]))
  np.testing.assert_allclose(beta, [[0.2 + 0.3 + 0.2]], rtol=1e-6)


def test_accept_needs_one_uniform_per_test_and_one_for_the_token():
  p, q = jnp.full((1, 3, 4), 0.25), jnp.full((1, 2, 4), 0.25)
  with pytest.raises(ValueError, match=r"uniforms of shape \(1, 3\)"):
    speculative.accept(p, q, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2)))


def _sample_blocks(p, q, rows, seed):
  """Draws drafts from q and runs `accept` on `rows` copies -> (n [rows], token [rows], drafts)."""
  gamma, vocab = q.shape
  key_drafts, key_accept = jax.random.split(jax.random.PRNGKey(seed))
  q_rows = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, gamma, vocab))
  drafts = jax.random.categorical(key_drafts, jnp.log(q_rows), axis=-1).astype(jnp.int32)
  p_rows = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (rows, gamma + 1, vocab))
  u = sampling.uniforms(key_accept, (rows, gamma + 1))
  n, token, beta = jax.jit(speculative.accept)(p_rows, q_rows, drafts, u)
  assert not np.any(np.isnan(np.asarray(beta)))
  return np.asarray(n), np.asarray(token), np.asarray(drafts)


@pytest.mark.parametrize("case", ["random", "q_zero_where_p_positive", "one_hot_q"])
def test_accept_samples_follow_the_target(case):
  gamma, vocab, rows = 2, 3, 60000
  p, q = _cases(gamma, vocab, seed=7)[case]
  n, token, drafts = _sample_blocks(p, q, rows, seed=11)
  # Continue each block with fresh samples from p, then compare the whole sequence's law to p.
  rng = np.random.default_rng(3)
  sequences = np.zeros((rows, gamma + 1), np.int64)
  for j in range(gamma + 1):
    fresh = rng.choice(vocab, size=rows, p=p[j])
    sequences[:, j] = np.where(j < n, drafts[:, min(j, gamma - 1)],
                               np.where(j == n, token, fresh))
  codes = sequences @ (vocab ** np.arange(gamma, -1, -1))
  observed = np.bincount(codes, minlength=vocab ** (gamma + 1))
  expected = np.array([np.prod([p[j, y[j]] for j in range(gamma + 1)])
                       for y in itertools.product(range(vocab), repeat=gamma + 1)])
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE


def test_accept_count_follows_acceptance_probability():
  gamma, vocab, rows = 3, 4, 40000
  p, q = _cases(gamma, vocab, seed=5)["random"]
  n, _, _ = _sample_blocks(p, q, rows, seed=2)
  beta = np.minimum(p[:gamma], q).sum(-1)  # P(accept at i) for context-free p, q
  expected = [np.prod(beta[:k]) * (1 - beta[k] if k < gamma else 1) for k in range(gamma + 1)]
  observed = np.bincount(n, minlength=gamma + 1)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE


def test_greedy_accepts_matches_and_corrects_with_target_argmax():
  vocab = 5
  target = jnp.array([[2, 4, 1, 3]])  # argmax of p_1..p_4
  p = jax.nn.one_hot(target, vocab)
  for drafts, n_expected, token_expected in (([2, 4, 1], 3, 3), ([2, 0, 1], 1, 4),
                                             ([0, 4, 1], 0, 2)):
    d = jnp.array([drafts])
    n, token, beta = speculative.accept(p, jax.nn.one_hot(d, vocab), d, jnp.full((1, 4), 0.5))
    assert int(n[0]) == n_expected and int(token[0]) == token_expected
    np.testing.assert_array_equal(beta[0], (np.array(drafts) == np.array(target[0, :3])))


def test_accept_greedy_is_accept_on_one_hot_distributions():
  rng = np.random.default_rng(4)
  vocab, gamma, rows = 4, 3, 200
  target = rng.integers(0, vocab, (rows, gamma + 1)).astype(np.int32)
  # Drafts agreeing with the target often, so every n in 0..gamma occurs.
  drafts = np.where(rng.random((rows, gamma)) < 0.7, target[:, :gamma],
                    rng.integers(0, vocab, (rows, gamma))).astype(np.int32)
  u = sampling.uniforms(jax.random.PRNGKey(2), (rows, gamma + 1))
  general = speculative.accept(jax.nn.one_hot(target, vocab), jax.nn.one_hot(drafts, vocab),
                               jnp.asarray(drafts), u)
  greedy = speculative.accept_greedy(jnp.asarray(target), jnp.asarray(drafts))
  assert set(np.asarray(greedy[0])) == set(range(gamma + 1))
  for g, a in zip(greedy, general):
    np.testing.assert_array_equal(g, a)


def test_no_nan_when_p_equals_q_or_the_residual_underflows():
  vocab = 50
  rng = np.random.default_rng(0)
  p = _random_dists(rng, (64, 4, vocab)).astype(np.float32)
  q = p[:, :3].copy()
  q_close = np.nextafter(q, 1.0)  # q slightly above p everywhere: residual mass 0 or ~1e-8
  for q_case in (q, q_close):
    drafts = jnp.asarray(rng.integers(0, vocab, (64, 3)), jnp.int32)
    n, token, beta = speculative.accept(jnp.asarray(p), jnp.asarray(q_case), drafts,
                                        sampling.uniforms(jax.random.PRNGKey(1), (64, 4)))
    assert np.all((np.asarray(token) >= 0) & (np.asarray(token) < vocab))
    assert np.all(np.isfinite(np.asarray(beta)))
    for k in range(4):
      adjusted = speculative.adjusted_distribution(jnp.asarray(p), jnp.asarray(q_case),
                                                   jnp.full((64,), k, jnp.int32))
      assert np.all(np.isfinite(np.asarray(adjusted)))
      np.testing.assert_allclose(np.asarray(adjusted).sum(-1), 1.0, rtol=1e-5)
