"""Algorithm 1 on arrays: exact by enumeration, checked by sampling, no NaN in edge cases.

For context-free distributions (p_i and q_i not depending on earlier tokens), the emitted block
x_1..x_n, t followed by fresh samples from p_{n+2}, ..., p_{gamma+1} must be distributed exactly as
independent samples y_j ~ p_j. The enumeration below uses the module's own acceptance probability
and adjusted distribution, and the sampling tests check that `accept` follows them. The
`Verifier` strategy the loop calls: `TokenVerifier` is `accept` / `accept_greedy`.

Block verification is checked the same way on distributions that depend on the whole prefix
(`_prefix_tables`), against a deliberately wrong variant, and on the paper's worked example. Broken
drafts (out of the vocabulary, q not a distribution) must be rejected.

Tree verification (recursive rejection sampling over each node's children) is checked against a
float64 reference walk written from its definition (`_tree_walks`): the reference's law is the
target's, and `accept_tree` takes the reference's decisions (uniforms just below or above each
threshold) and draws from its residuals; then by sampling, at temperature 0 against a brute-force
search for the matching path, and on a chain against Algorithm 1.
"""

import collections
import functools
import itertools
import types

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import chisquare_pvalue
from speculative_t5x import draft_length
from speculative_t5x import drafters
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import theory
from speculative_t5x import trees

SIGNIFICANCE = 1e-3  # goodness-of-fit tests reject at this level; seeds are fixed.

# The functions under test, jitted as the decoding loop runs them. Called op by op, each of their
# primitives compiles on its own, which cost this file more than its tests.
jitted = types.SimpleNamespace(
    accept=jax.jit(speculative.accept, static_argnums=4),
    accept_greedy=jax.jit(speculative.accept_greedy),
    accept_block=jax.jit(speculative.accept_block, static_argnums=4),
    accept_tree=jax.jit(speculative.accept_tree, static_argnums=(4, 5, 6)),
    accept_tree_greedy=jax.jit(speculative.accept_tree_greedy, static_argnums=2),
    acceptance_probability=jax.jit(speculative.acceptance_probability),
    adjusted_distribution=jax.jit(speculative.adjusted_distribution),
    prefix_weights=jax.jit(speculative.prefix_weights),
    block_thresholds=jax.jit(speculative.block_thresholds),
    valid_drafts=jax.jit(speculative.valid_drafts),
)


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
  return {
      "random": (p, q),
      "q_zero_where_p_positive": (p, q_zero),
      "one_hot_q": (p, one_hot_q),
      "p_equals_q": (p, p[:gamma].copy()),
      "greedy": (p_one_hot, np.eye(vocab)[[0] * gamma]),
  }


def _exact_output_law(p, q):
  """P(y_1..y_{gamma+1}) of the speculative block continued by sampling p, by enumeration."""
  gamma, vocab = q.shape
  pj, qj = jnp.asarray(p[None], jnp.float32), jnp.asarray(q[None], jnp.float32)
  tokens = np.arange(vocab)
  # a[i, x] = acceptance probability of draft x at position i.
  accept = np.stack(
      [
          np.asarray(jitted.acceptance_probability(pj, qj, jnp.full((1, gamma), x, jnp.int32)))[0]
          for x in tokens
      ],
      axis=1,
  )
  adjusted = [
      np.asarray(jitted.adjusted_distribution(pj, qj, jnp.array([n])))[0] for n in range(gamma + 1)
  ]
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
@pytest.mark.parametrize(
    "case", ["random", "q_zero_where_p_positive", "one_hot_q", "p_equals_q", "greedy"]
)
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
  a = [float(jitted.acceptance_probability(pj, qj, jnp.array([[x]]))[0, 0]) for x in range(3)]
  np.testing.assert_allclose(a, [1.0, 0.5, 1.0], rtol=1e-6)
  np.testing.assert_allclose(
      jitted.adjusted_distribution(pj, qj, jnp.array([0]))[0], [1.0, 0.0, 0.0], atol=1e-6
  )  # norm(max(0, p - q)) = [0.3, 0, 0] / 0.3
  np.testing.assert_allclose(
      jitted.adjusted_distribution(pj, qj, jnp.array([1]))[0], p[1], rtol=1e-6
  )  # all accepted: the bonus token comes from p_2
  _, _, beta = jitted.accept(pj, qj, jnp.array([[1]]), jnp.array([[0.3, 0.5]]))
  np.testing.assert_allclose(beta, [[0.2 + 0.3 + 0.2]], rtol=1e-6)


def test_accept_needs_one_uniform_per_test_and_one_for_the_token():
  p, q = jnp.full((1, 3, 4), 0.25), jnp.full((1, 2, 4), 0.25)
  with pytest.raises(ValueError, match=r"uniforms of shape \(1, 3\)"):
    jitted.accept(p, q, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2)))


def _sample_blocks(p, q, rows, seed, verify=speculative.accept):
  """Draws drafts from q and runs `verify` (default `accept`) on `rows` copies -> (n [rows],
  token [rows], drafts [rows, gamma], beta [rows, gamma])."""
  gamma, vocab = q.shape
  key_drafts, key_accept = jax.random.split(jax.random.PRNGKey(seed))
  q_rows = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, gamma, vocab))
  drafts = jax.random.categorical(key_drafts, jnp.log(q_rows), axis=-1).astype(jnp.int32)
  p_rows = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (rows, gamma + 1, vocab))
  u = sampling.uniforms(key_accept, (rows, gamma + 1))
  n, token, beta = jax.jit(verify)(p_rows, q_rows, drafts, u)
  assert not np.any(np.isnan(np.asarray(beta)))
  return np.asarray(n), np.asarray(token), np.asarray(drafts), np.asarray(beta)


def _continued_blocks(p, q, rows, seed, verify=speculative.accept):
  """`_sample_blocks`, each block continued with fresh samples from p -> (codes [rows] of the
  sequences y_1..y_{gamma+1} in base V, n [rows], beta [rows, gamma])."""
  gamma, vocab = q.shape
  n, token, drafts, beta = _sample_blocks(p, q, rows, seed, verify)
  rng = np.random.default_rng(3)
  sequences = np.zeros((rows, gamma + 1), np.int64)
  for j in range(gamma + 1):
    fresh = rng.choice(vocab, size=rows, p=p[j])
    sequences[:, j] = np.where(j < n, drafts[:, min(j, gamma - 1)], np.where(j == n, token, fresh))
  return sequences @ (vocab ** np.arange(gamma, -1, -1)), n, beta


@pytest.mark.parametrize("case", ["random", "q_zero_where_p_positive", "one_hot_q"])
def test_accept_samples_follow_the_target(case):
  gamma, vocab, rows = 2, 3, 60000
  p, q = _cases(gamma, vocab, seed=7)[case]
  # Each block continued with fresh samples from p: the whole sequence's law must be p's.
  codes, _, _ = _continued_blocks(p, q, rows, seed=11)
  observed = np.bincount(codes, minlength=vocab ** (gamma + 1))
  expected = np.array(
      [
          np.prod([p[j, y[j]] for j in range(gamma + 1)])
          for y in itertools.product(range(vocab), repeat=gamma + 1)
      ]
  )
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE


def test_accept_count_follows_acceptance_probability():
  gamma, vocab, rows = 3, 4, 40000
  p, q = _cases(gamma, vocab, seed=5)["random"]
  n, *_ = _sample_blocks(p, q, rows, seed=2)
  beta = np.minimum(p[:gamma], q).sum(-1)  # P(accept at i) for context-free p, q
  expected = [np.prod(beta[:k]) * (1 - beta[k] if k < gamma else 1) for k in range(gamma + 1)]
  observed = np.bincount(n, minlength=gamma + 1)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE


def test_greedy_accepts_matches_and_corrects_with_target_argmax():
  vocab = 5
  target = jnp.array([[2, 4, 1, 3]])  # argmax of p_1..p_4
  p = jax.nn.one_hot(target, vocab)
  for drafts, n_expected, token_expected in (
      ([2, 4, 1], 3, 3),
      ([2, 0, 1], 1, 4),
      ([0, 4, 1], 0, 2),
  ):
    d = jnp.array([drafts])
    n, token, beta = jitted.accept(p, jax.nn.one_hot(d, vocab), d, jnp.full((1, 4), 0.5))
    assert int(n[0]) == n_expected and int(token[0]) == token_expected
    np.testing.assert_array_equal(beta[0], (np.array(drafts) == np.array(target[0, :3])))


def test_accept_greedy_is_accept_on_one_hot_distributions():
  rng = np.random.default_rng(4)
  vocab, gamma, rows = 4, 3, 200
  target = rng.integers(0, vocab, (rows, gamma + 1)).astype(np.int32)
  # Drafts agreeing with the target often, so every n in 0..gamma occurs.
  drafts = np.where(
      rng.random((rows, gamma)) < 0.7, target[:, :gamma], rng.integers(0, vocab, (rows, gamma))
  ).astype(np.int32)
  u = sampling.uniforms(jax.random.PRNGKey(2), (rows, gamma + 1))
  general = jitted.accept(
      jax.nn.one_hot(target, vocab), jax.nn.one_hot(drafts, vocab), jnp.asarray(drafts), u
  )
  greedy = jitted.accept_greedy(jnp.asarray(target), jnp.asarray(drafts))
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
    n, token, beta = jitted.accept(
        jnp.asarray(p),
        jnp.asarray(q_case),
        drafts,
        sampling.uniforms(jax.random.PRNGKey(1), (64, 4)),
    )
    assert np.all((np.asarray(token) >= 0) & (np.asarray(token) < vocab))
    assert np.all(np.isfinite(np.asarray(beta)))
    for k in range(4):
      adjusted = jitted.adjusted_distribution(
          jnp.asarray(p), jnp.asarray(q_case), jnp.full((64,), k, jnp.int32)
      )
      assert np.all(np.isfinite(np.asarray(adjusted)))
      np.testing.assert_allclose(np.asarray(adjusted).sum(-1), 1.0, rtol=1e-5)


# --- the Verifier strategy -----------------------------------------------------------------------
def _random_block(seed, rows=64, gamma=3, vocab=6):
  rng = np.random.default_rng(seed)
  p = jnp.asarray(_random_dists(rng, (rows, gamma + 1, vocab)), jnp.float32)
  q = jnp.asarray(_random_dists(rng, (rows, gamma, vocab)), jnp.float32)
  drafts = jnp.asarray(rng.integers(0, vocab, (rows, gamma)), jnp.int32)
  u = sampling.uniforms(jax.random.PRNGKey(seed), (rows, gamma + 1))
  return p, q, drafts, u


def test_token_verifier_is_algorithm_1():
  p, q, drafts, u = _random_block(0)
  verifier = speculative.TokenVerifier()

  def mode(u, probs):  # a draw other than the default: the most likely token of p'
    del u
    return jnp.argmax(probs, axis=-1).astype(jnp.int32)

  @jax.jit
  def both(p, q, drafts, u):
    return (
        verifier.verify(p, q, drafts, u),
        speculative.accept(p, q, drafts, u),
        verifier.verify(p, q, drafts, u, mode),
        speculative.accept(p, q, drafts, u, mode),
    )

  got, expected, got_mode, expected_mode = both(p, q, drafts, u)
  assert len(set(np.asarray(expected[0]))) > 1  # several acceptance counts occur
  for g, want in zip(got + got_mode, expected + expected_mode):
    np.testing.assert_array_equal(g, want)
  assert not np.array_equal(got_mode[1], got[1])  # the draw it is given is the one it uses


def test_token_verifier_greedy_is_accept_greedy():
  rng = np.random.default_rng(1)
  target = jnp.asarray(rng.integers(0, 4, (100, 4)), jnp.int32)
  drafts = jnp.where(
      jnp.asarray(rng.random((100, 3)) < 0.7),
      target[:, :3],
      jnp.asarray(rng.integers(0, 4, (100, 3)), jnp.int32),
  )
  got = speculative.TokenVerifier().verify_greedy(target, drafts)
  want = jitted.accept_greedy(target, drafts)
  assert set(np.asarray(want[0])) == {0, 1, 2, 3}
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_a_verifier_missing_a_method_cannot_be_made():
  class GreedyOnly(speculative.Verifier):

    def verify_greedy(self, target_tokens, drafts):
      return jitted.accept_greedy(target_tokens, drafts)

  with pytest.raises(TypeError, match="verify"):
    GreedyOnly()
  with pytest.raises(TypeError):
    speculative.Verifier()  # pylint: disable=abstract-class-instantiated


@gin.configurable(module="test_speculative")
def _configured_verifier(verifier=gin.REQUIRED):
  return verifier


def test_gin_binds_the_token_verifier():
  gin.clear_config()
  try:
    gin.parse_config(
        "VERIFIER = @speculative.TokenVerifier()\n"
        "test_speculative._configured_verifier.verifier = %VERIFIER"
    )
    verifier = _configured_verifier()
  finally:
    gin.clear_config()
  assert isinstance(verifier, speculative.TokenVerifier)
  assert verifier == speculative.TokenVerifier()  # a frozen dataclass: hashable, one trace
  assert hash(verifier) == hash(speculative.TokenVerifier())


# --- block verification --------------------------------------------------------------------------
def _prefix_tables(rng, gamma, vocab, kind):
  """Distributions that depend on the whole prefix: p[prefix] for prefixes of length 0..gamma,
  q[prefix] for 0..gamma-1 (kind: 'random', 'q_zero_where_p_positive', 'one_hot_q',
  'p_equals_q')."""
  p, q = {}, {}
  for i in range(gamma + 1):
    for prefix in itertools.product(range(vocab), repeat=i):
      p[prefix] = _random_dists(rng, (vocab,))
      if i == gamma:
        continue
      if kind == "random":
        q[prefix] = _random_dists(rng, (vocab,))
      elif kind == "q_zero_where_p_positive":
        x = _random_dists(rng, (vocab,))
        x[0] = 0
        q[prefix] = x / x.sum()
      elif kind == "one_hot_q":
        q[prefix] = np.eye(vocab)[rng.integers(vocab)]
      else:
        q[prefix] = p[prefix].copy()
  return p, q


def _block_arrays(p, q, gamma, vocab, stop=None, drop=False):
  """Every draft block x [V^gamma, gamma], its p and q rows [V^gamma, gamma(+1), V], and its
  probability under the drafter [V^gamma].

  stop: None, or (prefix, x_i) -> bool, a draft-length rule: the drafter stops after x_i, and
  the slots after it are EMPTY with zero q rows, as the drafting loop leaves them (the target
  reads token 0 there, as the decoding loop feeds it). A block's probability is that of its
  drafted prefix (summed over the undrafted continuations). drop: the wrong variant, the slot of
  the flagged draft x_i is emptied too."""
  drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)), np.int32)
  q_drafts = np.array([np.prod([q[tuple(x[:i])][x[i]] for i in range(gamma)]) for x in drafts])
  if stop is not None:
    for x in drafts:
      stops = [i for i in range(gamma) if stop(tuple(int(t) for t in x[:i]), int(x[i]))]
      if stops:
        x[stops[0] + (0 if drop else 1) :] = drafters.EMPTY
  fed = np.maximum(drafts, 0)
  p_rows = np.stack([np.stack([p[tuple(x[:i])] for i in range(gamma + 1)]) for x in fed])
  q_rows = np.stack(
      [np.stack([q[tuple(x[:i])] * (d[i] >= 0) for i in range(gamma)]) for x, d in zip(fed, drafts)]
  )
  return (drafts, jnp.asarray(p_rows, jnp.float32), jnp.asarray(q_rows, jnp.float32), q_drafts)


def _accepted_length_law(p_rows, q_rows, drafts, rule):
  """P(n = i | drafts) [V^gamma, gamma+1] of block verification ('block'), or of Algorithm 1's
  token-by-token test ('token'), from their per-position probabilities (independent uniforms)."""
  gamma = drafts.shape[1]
  if rule == "block":
    h = np.asarray(
        jitted.block_thresholds(
            p_rows, q_rows, jitted.prefix_weights(p_rows, q_rows, jnp.asarray(drafts))
        ),
        np.float64,
    )
    # n = max{i : eta_i < h_i}: P(n = i) = h_i prod_{j > i} (1 - h_j), P(n = 0) = prod_j (1 - h_j).
    return np.stack(
        [
            np.prod(1 - h[:, i:], axis=1) * (1.0 if i == 0 else h[:, i - 1])
            for i in range(gamma + 1)
        ],
        axis=1,
    )
  a = np.asarray(jitted.acceptance_probability(p_rows, q_rows, jnp.asarray(drafts)), np.float64)
  return np.stack(
      [np.prod(a[:, :i], axis=1) * (1 - a[:, i] if i < gamma else 1.0) for i in range(gamma + 1)],
      axis=1,
  )


def _block_output_law(p, q, gamma, vocab, rule="block", stop=None, drop=False):
  """Exact law of y_1..y_{gamma+1}: the block verifier's n accepted drafts and its token from the
  weighted residual, continued by sampling p. rule='token' keeps that residual but accepts token
  by token: the mistake one port of block verification shipped; rule='algorithm_1' is Algorithm
  1 (token acceptance, residual weight 1). stop, drop: a draft-length rule (`_block_arrays`)."""
  drafts, p_rows, q_rows, q_drafts = _block_arrays(p, q, gamma, vocab, stop, drop)
  length_law = _accepted_length_law(
      p_rows, q_rows, drafts, "token" if rule == "algorithm_1" else rule
  )
  weights = np.pad(
      np.asarray(jitted.prefix_weights(p_rows, q_rows, jnp.asarray(drafts))),
      ((0, 0), (1, 0)),
      constant_values=1.0,
  )
  if rule == "algorithm_1":
    weights = np.ones_like(weights)
  law = collections.defaultdict(float)
  for d, x in enumerate(drafts):
    for n in range(gamma + 1):
      if q_drafts[d] * length_law[d, n] == 0:
        continue
      residual = np.asarray(
          jitted.adjusted_distribution(
              p_rows[d : d + 1],
              q_rows[d : d + 1],
              jnp.array([n]),
              jnp.asarray(weights[d : d + 1, n], jnp.float32),
          )
      )[0]
      for token, rest in itertools.product(
          range(vocab), itertools.product(range(vocab), repeat=gamma - n)
      ):
        y = tuple(int(t) for t in x[:n]) + (token,) + rest
        law[y] += (
            q_drafts[d]
            * length_law[d, n]
            * residual[token]
            * np.prod([p[y[:j]][y[j]] for j in range(n + 1, gamma + 1)])
        )
  return law


def _target_law(p, gamma, vocab):
  return {
      y: np.prod([p[y[:j]][y[j]] for j in range(gamma + 1)])
      for y in itertools.product(range(vocab), repeat=gamma + 1)
  }


BLOCK_CASES = ["random", "q_zero_where_p_positive", "one_hot_q", "p_equals_q"]


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_block_output_law_is_exactly_the_target(gamma, case):
  p, q = _prefix_tables(np.random.default_rng(gamma), gamma, 3, case)
  target = _target_law(p, gamma, 3)
  law = _block_output_law(p, q, gamma, 3)
  assert max(abs(law[y] - target[y]) for y in target) < 2e-6


@pytest.mark.parametrize("case", ["random", "q_zero_where_p_positive"])
def test_token_acceptance_with_the_block_residual_is_not_exact(case):
  p, q = _prefix_tables(np.random.default_rng(2), 2, 3, case)
  target = _target_law(p, 2, 3)
  law = _block_output_law(p, q, 2, 3, rule="token")
  assert max(abs(law[y] - target[y]) for y in target) > 1e-2


@pytest.mark.parametrize("gamma", [2, 3, 4])
def test_block_accepts_at_least_as_many_as_token_verification(gamma):
  for seed in range(4):
    p, q = _prefix_tables(np.random.default_rng(10 * gamma + seed), gamma, 3, "random")
    drafts, p_rows, q_rows, q_drafts = _block_arrays(p, q, gamma, 3)
    lengths = np.arange(gamma + 1)
    expected = {
        rule: float(
            np.sum(q_drafts[:, None] * lengths * _accepted_length_law(p_rows, q_rows, drafts, rule))
        )
        for rule in ("block", "token")
    }
    assert expected["block"] >= expected["token"] - 1e-6, (seed, expected)


def test_block_verification_on_the_papers_example():
  """Sun et al.'s motivating example: context-independent p = (1/3, 2/3), q = (2/3, 1/3) on
  {a, b}, gamma = 2: token verification accepts 10/9 drafts per block on average, block
  verification 11/9."""
  p = {
      prefix: np.array([1 / 3, 2 / 3])
      for i in range(3)
      for prefix in itertools.product(range(2), repeat=i)
  }
  q = {prefix: np.array([2 / 3, 1 / 3]) for prefix in p if len(prefix) < 2}
  drafts, p_rows, q_rows, q_drafts = _block_arrays(p, q, 2, 2)
  for rule, expected in (("token", 10 / 9), ("block", 11 / 9)):
    law = _accepted_length_law(p_rows, q_rows, drafts, rule)
    np.testing.assert_allclose(np.sum(q_drafts[:, None] * np.arange(3) * law), expected, rtol=1e-6)


def test_block_is_token_verification_on_one_hot_distributions():
  rng = np.random.default_rng(0)
  gamma, vocab, rows = 4, 5, 64
  target = rng.integers(0, vocab, (rows, gamma + 1))
  drafts = np.where(
      rng.random((rows, gamma)) < 0.7, target[:, :gamma], rng.integers(0, vocab, (rows, gamma))
  ).astype(np.int32)
  p = jnp.asarray(np.eye(vocab)[target], jnp.float32)
  q = jnp.asarray(np.eye(vocab)[drafts], jnp.float32)
  u = jax.random.uniform(jax.random.PRNGKey(0), (rows, gamma + 1))
  for got, want in zip(
      jitted.accept_block(p, q, jnp.asarray(drafts), u),
      jitted.accept(p, q, jnp.asarray(drafts), u),
  ):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["random", "q_zero_where_p_positive"])
def test_block_verifier_samples_follow_the_target(case):
  """BlockVerifier.verify's blocks, continued by sampling p, against the target's exact law."""
  gamma, vocab, samples = 2, 3, 20000
  p, q = _prefix_tables(np.random.default_rng(5), gamma, vocab, case)
  drafts, p_rows, q_rows, q_drafts = _block_arrays(p, q, gamma, vocab)
  rng = np.random.default_rng(6)
  picked = rng.choice(len(drafts), size=samples, p=q_drafts / q_drafts.sum())
  u = jax.random.uniform(jax.random.PRNGKey(7), (samples, gamma + 1))
  n, token, _ = jax.jit(speculative.BlockVerifier().verify)(
      p_rows[picked], q_rows[picked], jnp.asarray(drafts[picked]), u
  )
  outcomes = list(itertools.product(range(vocab), repeat=gamma + 1))
  counts = np.zeros(len(outcomes))
  for x, accepted, t in zip(drafts[picked], np.asarray(n), np.asarray(token)):
    y = tuple(int(v) for v in x[:accepted]) + (int(t),)
    while len(y) < gamma + 1:
      y += (int(rng.choice(vocab, p=p[y])),)
    counts[outcomes.index(y)] += 1
  target = _target_law(p, gamma, vocab)
  assert chisquare_pvalue(counts, [target[y] for y in outcomes]) > SIGNIFICANCE


def test_invalid_drafts_are_rejected_and_their_position_drawn_from_p():
  """Out-of-vocabulary drafts, NaN rows of q and q(x) = 0 are treated as not drafted."""
  vocab, gamma = 4, 3
  p = jnp.asarray(np.full((4, gamma + 1, vocab), 0.25), jnp.float32)
  q = np.full((4, gamma, vocab), 0.25)
  drafts = np.array([[1, 2, vocab], [1, -1, 2], [1, 2, 3], [1, 2, 3]], np.int32)
  q[2, 1] = np.nan  # a NaN row at the second draft of row 2
  q[3, 1] = [1.0, 0.0, 0.0, 0.0]  # q(x_2) = 0 at row 3: a sampler never drew it
  q = jnp.asarray(q, jnp.float32)
  q_valid, valid = jitted.valid_drafts(q, jnp.asarray(drafts))
  np.testing.assert_array_equal(valid, [[1, 1, 0], [1, 0, 1], [1, 0, 1], [1, 0, 1]])
  assert np.all(np.asarray(q_valid)[~np.asarray(valid)] == 0)
  np.testing.assert_allclose(
      jitted.acceptance_probability(p, q, jnp.asarray(drafts)),
      np.where(np.asarray(valid), 1.0, 0.0),
  )
  u = jnp.zeros((4, gamma + 1))  # every valid draft passes its test
  for verifier in (speculative.TokenVerifier(), speculative.BlockVerifier()):
    n, token, beta = verifier.verify(p, q, jnp.asarray(drafts), u)
    np.testing.assert_array_equal(n, [2, 1, 1, 1])
    assert np.all((np.asarray(token) >= 0) & (np.asarray(token) < vocab))
    assert np.all(np.isfinite(np.asarray(beta)))
  # The position of the first invalid draft draws from p itself: u = 0.9 picks token 3 of p.
  _, token, _ = jitted.accept(p, q, jnp.asarray(drafts), jnp.full((4, gamma + 1), 0.9))
  assert int(token[1]) == 3


def test_block_verifier_realizes_the_theorys_expected_tokens():
  """The mean accepted length of `BlockVerifier.verify` on context-independent p and q matches
  `theory.block_expected_tokens` (a measurement of the formula; 4 standard errors)."""
  gamma, vocab, samples = 3, 4, 40000
  rng = np.random.default_rng(11)
  p1, q1 = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
  drafts = rng.choice(vocab, size=(samples, gamma), p=q1).astype(np.int32)
  p = jnp.broadcast_to(jnp.asarray(p1, jnp.float32), (samples, gamma + 1, vocab))
  q = jnp.broadcast_to(jnp.asarray(q1, jnp.float32), (samples, gamma, vocab))
  u = jax.random.uniform(jax.random.PRNGKey(3), (samples, gamma + 1))
  n = np.asarray(jax.jit(speculative.accept_block)(p, q, jnp.asarray(drafts), u)[0])
  expected = theory.block_expected_tokens(p1, q1, gamma) - 1
  assert abs(n.mean() - expected) < 4 * n.std() / np.sqrt(samples), (n.mean(), expected)
  assert expected > theory.expected_tokens(np.minimum(p1, q1).sum(), gamma) - 1


# --- adaptive draft length: blocks with empty slots ---------------------------------------------
def _confidence_rule(q, threshold, measure):
  """The shipped `draft_length.ConfidenceStop` on the drafter's q (as logits log q)."""
  rule = draft_length.ConfidenceStop(threshold, measure)

  def stop(prefix, x):
    logits = jnp.log(jnp.asarray(q[prefix], jnp.float32))[None]
    return bool(rule(logits, jnp.array([x]))[0])

  return stop


@pytest.mark.parametrize("rule", ["algorithm_1", "block"])
@pytest.mark.parametrize(
    "case, measure", [("random", "max"), ("random", "draft"), ("q_zero_where_p_positive", "draft")]
)
def test_a_stopped_block_is_emitted_exactly_as_the_target(rule, case, measure):
  """A rule reading only the drafter's q decides how many of gamma = 3 slots are drafted; the
  verifier rejects the empty ones, and the emitted law is still exactly the target's. The
  threshold is the root's top probability ('max': the first draft never stops, later ones do
  where q is flatter) or the median of q over the table ('draft')."""
  gamma = 3
  p, q = _prefix_tables(np.random.default_rng(30), gamma, 3, case)
  confidences = [row[x] for row in q.values() for x in range(3)]
  threshold = q[()].max() if measure == "max" else np.median(confidences)
  stop = _confidence_rule(q, float(threshold), measure)
  drafts, *_ = _block_arrays(p, q, gamma, 3, stop)
  drafted = np.sum(np.cumprod(drafts != drafters.EMPTY, axis=1), axis=1)
  assert len(set(drafted)) >= 2 and min(drafted) < 3  # blocks of several lengths
  law = _block_output_law(p, q, gamma, 3, rule, stop)
  target = _target_law(p, gamma, 3)
  assert max(abs(law[y] - target[y]) for y in target) < 2e-6


@pytest.mark.parametrize("rule", ["algorithm_1", "block"])
def test_dropping_the_unsure_draft_itself_is_not_exact(rule):
  """The deliberately wrong variant: emptying the slot of the draft the rule flags (instead of
  keeping it and stopping after it) decides that slot from its own draw, so the kept drafts no
  longer follow the q the verifier is given."""
  gamma = 3
  p, q = _prefix_tables(np.random.default_rng(30), gamma, 3, "random")
  confidences = [row[x] for row in q.values() for x in range(3)]
  unsure = _confidence_rule(q, float(np.median(confidences)), "draft")
  law = _block_output_law(p, q, gamma, 3, rule, unsure, drop=True)
  target = _target_law(p, gamma, 3)
  assert max(abs(law[y] - target[y]) for y in target) > 1e-3  # exact ones are within 2e-6


# --- tree verification ---------------------------------------------------------------------------
TREES = [(2,), (2, 1), (3,), (2, 2), (3, 2), (2, 2, 1)]
SCHEMES = ["iid", "without_replacement", "candidates"]
# How a broken node looks to the verifier: (draft, its row of q) for vocabulary size V.
_JUNK = {
    "empty": lambda vocab: (drafters.EMPTY, np.zeros(vocab)),
    "out_of_vocabulary": lambda vocab: (vocab, np.full(vocab, 1 / vocab)),
    "nan": lambda vocab: (0, np.full(vocab, np.nan)),
    "q_zero": lambda vocab: (0, np.eye(vocab)[1]),
}

_Leaf = collections.namedtuple("_Leaf", "prob slot prefix residual nodes")


def _sibling_law(q_parent, taken, scheme):
  """q_j, the law of a slot's next drafted child given the tokens `taken` by its earlier drafted
  siblings: 'iid' the drafter's q at the slot; 'without_replacement' q with the taken tokens
  removed, renormalized (0 when nothing is left); 'candidates' the one-hot of the next most likely
  token (deterministic distinct candidates)."""
  if scheme == "iid":
    return q_parent
  if scheme == "candidates":
    return np.eye(len(q_parent))[np.argsort(-q_parent, kind="stable")[len(taken)]]
  rest = q_parent.copy()
  rest[list(taken)] = 0.0
  return rest / rest.sum() if rest.sum() > 0 else rest


def _tree_walks(tree, p, q, scheme, broken=(), adjust=True):
  """Every outcome of recursive rejection sampling on `tree`, with its probability: a float64
  reference written from the definition, independent of `speculative`.

  p[prefix], q[prefix]: the target's and the drafter's distributions after a token prefix (the
  p of a slot is p at its path's tokens). Node slots in `broken` hold junk drafts (`_JUNK`,
  cycled), as does a child with nothing left to draw: they are not drafted. adjust=False tests
  every child against the parent's p instead of the residual (the wrong variant).

  Returns leaves: (prob, the last accepted slot, its path's tokens, the residual the token is
  drawn from, nodes {slot: (draft, q row, test)} of the children the walk reached: test None for
  a node not drafted, else (accepted, a) with the threshold a = min(1, r(x) / q(x))).
  """
  vocab = len(p[()])
  kinds = list(_JUNK)
  children = [[int(c) for c in row if c > 0] for row in tree.children]
  leaves = []

  def walk(slot, prefix, j, r, taken, prob, nodes):
    if j == len(children[slot]):
      leaves.append(_Leaf(prob, slot, prefix, r, nodes))
      return
    c = children[slot][j]
    law = _sibling_law(q[prefix], taken, scheme)
    if c in broken or not law.any():
      draft, row = _JUNK[kinds[c % len(kinds)] if c in broken else "empty"](vocab)
      walk(slot, prefix, j + 1, r, taken, prob, {**nodes, c: (draft, row, None)})
      return
    base = r if adjust else p[prefix]
    for x in map(int, np.flatnonzero(law)):
      a = min(1.0, base[x] / law[x])
      if a > 0:
        accepted = {**nodes, c: (x, law, (True, a))}
        walk(c, prefix + (x,), 0, p[prefix + (x,)], (), prob * law[x] * a, accepted)
      if a < 1:
        rest = np.maximum(r - law, 0.0)
        rest = rest / rest.sum() if rest.sum() > 0 else r
        rejected = {**nodes, c: (x, law, (False, a))}
        walk(slot, prefix, j + 1, rest, taken + (x,), prob * law[x] * (1 - a), rejected)

  walk(0, (), 0, p[()], (), 1.0, {})
  return leaves


def _continuations(p, depth, vocab):
  """prefix -> the target's law of the tokens after it up to length D+1 [V^(D+1-len)]."""

  @functools.cache
  def rest(prefix):
    if len(prefix) == depth + 1:
      return np.ones(1)
    return np.concatenate([p[prefix][t] * rest(prefix + (t,)) for t in range(vocab)])

  return rest


def _emitted_law(leaves, residuals, rest, depth, vocab):
  """The law [V^(D+1)] of the accepted path's tokens and the token drawn from each leaf's
  residual (`residuals` [leaves, V]), continued by sampling the target."""
  law = np.zeros(vocab ** (depth + 1))
  for leaf, residual in zip(leaves, residuals):
    for t in range(vocab):
      y = leaf.prefix + (t,)
      size = vocab ** (depth + 1 - len(y))
      start = int(np.dot(y, vocab ** np.arange(len(y) - 1, -1, -1))) * size
      law[start : start + size] += leaf.prob * residual[t] * rest(y)
  return law


@functools.partial(jax.jit, static_argnames=("tree", "adjust_siblings"))
def _accept_tree_and_residual(p, q, drafts, u, tree, adjust_siblings=True):
  """`accept_tree`, and the residual its token was drawn from [B, V] (captured from `draw`)."""
  residuals = []

  def draw(u, r):
    residuals.append(r)
    return sampling.sample(u, r)

  return speculative.accept_tree(p, q, drafts, u, draw, tree, adjust_siblings), residuals[0]


def _run_leaves(tree, runs, vocab, adjust=True, seed=0):
  """Feeds every leaf of `runs` [(p, leaf)] to `accept_tree`, each tested child's uniform just
  below (accepted) or above (rejected) its threshold, u = 0 for a node not drafted (it must be
  rejected whatever its uniform); nodes the walk never reached get random drafts, q, p rows and
  uniforms -> (the last accepted slot [leaves], the residual the token was drawn from [leaves, V],
  checked [leaves] bool: the leaves whose thresholds and residual masses are far enough from 0
  and 1 for float32 to decide as float64 does)."""
  rng = np.random.default_rng(seed)
  rows = -(-len(runs) // 1024) * 1024  # a few batch shapes: few traces
  m = tree.num_nodes
  drafts = rng.integers(0, vocab, (rows, m)).astype(np.int32)
  q_rows = _random_dists(rng, (rows, m, vocab))
  p_rows = _random_dists(rng, (rows, m + 1, vocab))
  u = rng.random((rows, m + 1))
  checked = np.zeros(len(runs), bool)
  for i, (p, leaf) in enumerate(runs):
    margins = [1.0]
    for slot, (draft, row, test) in leaf.nodes.items():
      drafts[i, slot - 1], q_rows[i, slot - 1], u[i, slot] = draft, row, 0.0
      if test is not None:
        accepted, a = test
        u[i, slot] = a * (1 - 1e-3) if accepted else a + (1 - a) * 1e-3
        # a, and for a rejection its probability (a lower bound of the residual's mass)
        margins.append(a if accepted else row[draft] * (1 - a))
    path = [0] + [int(s) for s in tree.paths[leaf.slot][: len(leaf.prefix)]]
    p_rows[i, path] = [p[leaf.prefix[:d]] for d in range(len(path))]
    checked[i] = min(margins) > 1e-3
  (path, n, _, beta), residual = _accept_tree_and_residual(
      jnp.asarray(p_rows, jnp.float32),
      jnp.asarray(q_rows, jnp.float32),
      jnp.asarray(drafts),
      jnp.asarray(u, jnp.float32),
      tree,
      adjust,
  )
  assert np.all(np.isfinite(np.asarray(beta)))
  n = np.asarray(n)[: len(runs)]
  last = np.asarray(path)[np.arange(len(runs)), np.maximum(n - 1, 0)]
  return np.where(n > 0, last, 0), np.asarray(residual, np.float64)[: len(runs)], checked


def _tree_cases(branching):
  """(label, p, q, scheme, broken) for every kind of tables and way of drawing the children,
  without and with broken nodes (every third slot from slot 1)."""
  tree = trees.DraftTree.from_branching(branching)
  for kind, scheme, broken in itertools.product(
      BLOCK_CASES, SCHEMES, [(), tuple(range(1, tree.width, 3))]
  ):
    p, q = _prefix_tables(np.random.default_rng(len(tree.parents)), tree.depth, 3, kind)
    yield f"{kind}, {scheme}, broken slots {broken}", p, q, scheme, broken


def _tree_law_errors(branching, adjust=True):
  """For every `_tree_cases` case: the reference walk's and `accept_tree`'s (on the checked
  leaves, the reference's on the others) largest deviation from the target's law, after checking
  that `accept_tree` takes the reference's decisions and draws from its residual on the checked
  leaves -> {label: (reference error, accept_tree error, probability of the checked leaves)}."""
  tree, vocab = trees.DraftTree.from_branching(branching), 3
  cases = [
      (label, p, _tree_walks(tree, p, q, scheme, broken, adjust))
      for label, p, q, scheme, broken in _tree_cases(branching)
  ]
  slots, residuals, checked = _run_leaves(
      tree, [(p, leaf) for _, p, walks in cases for leaf in walks], vocab, adjust
  )
  errors, start = {}, 0
  for label, p, walks in cases:
    part = slice(start, start + len(walks))
    start += len(walks)
    ok = checked[part]
    reference = np.stack([leaf.residual for leaf in walks])
    np.testing.assert_array_equal(
        slots[part][ok], np.array([leaf.slot for leaf in walks])[ok], err_msg=label
    )
    np.testing.assert_allclose(residuals[part][ok], reference[ok], atol=1e-5, err_msg=label)
    rest = _continuations(p, tree.depth, vocab)
    laws = [
        _emitted_law(walks, r, rest, tree.depth, vocab)
        for r in (reference, np.where(ok[:, None], residuals[part], reference))
    ]
    checked_mass = sum(leaf.prob for leaf, k in zip(walks, ok) if k)
    errors[label] = tuple(float(np.max(np.abs(law - rest(())))) for law in laws) + (checked_mass,)
  return errors


@pytest.mark.parametrize("branching", TREES)
def test_tree_output_law_is_exactly_the_target(branching):
  """Every tree, kind of tables (`BLOCK_CASES`) and way of drawing the children (`SCHEMES`),
  with and without broken nodes: the reference walk's emitted law is the target's, and
  `accept_tree` takes the reference's decisions and draws from its residuals, so its own law is
  the target's up to float32 rounding."""
  errors = np.array(list(_tree_law_errors(branching).values()))
  reference, accept_tree = errors[:, :2].max(axis=0)
  checked = errors[:, 2].min()
  print(
      f"tree {branching}: largest deviation, reference {reference:.1e}, accept_tree "
      f"{accept_tree:.1e}; its decisions left unchecked on <= {1 - checked:.1e} of a case's mass"
  )
  assert reference < 1e-9 and accept_tree < 1e-6 and checked > 0.5


def test_unadjusted_sibling_acceptance_is_not_exact():
  """The deliberately wrong variant: later siblings tested with min(1, p(x) / q(x)) at the
  parent's p instead of the residual r the rejected ones left. `accept_tree(adjust_siblings=
  False)` is that variant (it takes the reference's decisions), and its law is not the target's."""
  errors = _tree_law_errors((3, 2), adjust=False)
  for scheme in SCHEMES:
    worst = max(errors[label][0] for label in errors if f"random, {scheme}," in label)
    print(f"unadjusted siblings, {scheme}: largest deviation {worst:.3f}")
    assert worst > 1e-2, (scheme, errors)


def _table_arrays(tables, depth, vocab):
  """Tables {prefix: row} -> for d = 0..depth an array [V^d, V] indexed by the prefix's base-V
  code."""
  return [
      np.stack([tables[x] for x in itertools.product(range(vocab), repeat=d)])
      for d in range(depth + 1)
  ]


def _inverse_cdf(rng, probs):
  """One token per row of probs [rows, V] with positive total, by inverse CDF -> [rows]."""
  cdf = np.cumsum(probs, axis=-1)
  return np.argmax(rng.random((len(probs), 1)) * cdf[:, -1:] < cdf, axis=-1)


def _draw_tree(tree, p, q, scheme, broken, rows, rng, vocab=3):
  """`rows` draft trees drawn as `_tree_walks` describes them (vectorized) -> drafts [rows, M],
  q [rows, M, V] (each node's law given its parent's path and earlier siblings) and the target's
  p at every slot [rows, M+1, V]."""
  ps, qs = _table_arrays(p, tree.depth, vocab), _table_arrays(q, tree.depth - 1, vocab)
  codes = np.zeros((rows, tree.width), np.int64)  # base-V code of every slot's path
  drafts = np.zeros((rows, tree.num_nodes), np.int32)
  q_rows = np.zeros((rows, tree.num_nodes, vocab))
  p_rows = np.zeros((rows, tree.width, vocab))
  p_rows[:, 0] = ps[0][0]
  taken = np.zeros((tree.width, rows, vocab), bool)  # tokens drafted by each slot's children
  kinds = list(_JUNK)
  for i, parent in enumerate(tree.parents):
    base = qs[tree.depths[parent]][codes[:, parent]]
    if scheme == "iid":
      law = base
    elif scheme == "candidates":
      order = np.argsort(-base, axis=-1, kind="stable")
      law = np.eye(vocab)[order[np.arange(rows), taken[parent].sum(-1)]]
    else:
      law = np.where(taken[parent], 0.0, base)
      total = law.sum(-1, keepdims=True)
      law = np.where(total > 0, law / np.where(total > 0, total, 1.0), 0.0)
    drafted = law.sum(-1) > 0
    x = _inverse_cdf(rng, np.where(drafted[:, None], law, 1.0))
    drafts[:, i], q_rows[:, i] = np.where(drafted, x, drafters.EMPTY), law
    if i + 1 in broken:
      drafted[:] = False
      drafts[:, i], q_rows[:, i] = _JUNK[kinds[(i + 1) % len(kinds)]](vocab)
    taken[parent, np.arange(rows), x] |= drafted
    codes[:, i + 1] = codes[:, parent] * vocab + np.where(drafted, x, 0)
    p_rows[:, i + 1] = ps[tree.depths[i + 1]][codes[:, i + 1]]
  return drafts, q_rows, p_rows


_verify_tree = jax.jit(speculative.TreeVerifier().verify_tree, static_argnames=("draw", "tree"))


@pytest.mark.parametrize(
    "scheme, broken", [("iid", ()), ("without_replacement", (1, 4)), ("candidates", (2,))]
)
def test_tree_verifier_samples_follow_the_target(scheme, broken):
  """`TreeVerifier.verify_tree` on sampled trees (2, 2): the accepted path's drafts and the token,
  continued by sampling the target, against the target's exact law (chi-square)."""
  tree, vocab, rows = trees.DraftTree.from_branching((2, 2)), 3, 40000
  p, q = _prefix_tables(np.random.default_rng(8), tree.depth, vocab, "random")
  rng = np.random.default_rng(9)
  drafts, q_rows, p_rows = _draw_tree(tree, p, q, scheme, broken, rows, rng)
  path, n, token, _ = map(
      np.asarray,
      _verify_tree(
          jnp.asarray(p_rows, jnp.float32),
          jnp.asarray(q_rows, jnp.float32),
          jnp.asarray(drafts),
          rng.random((rows, tree.width), np.float32),
          draw=sampling.sample,
          tree=tree,
      ),
  )
  ps = _table_arrays(p, tree.depth, vocab)
  code = np.zeros(rows, np.int64)
  for j in range(tree.depth + 1):
    accepted = drafts[np.arange(rows), path[:, min(j, tree.depth - 1)] - 1]
    fresh = _inverse_cdf(rng, ps[j][code])
    code = code * vocab + np.where(j < n, accepted, np.where(j == n, token, fresh))
  observed = np.bincount(code, minlength=vocab ** (tree.depth + 1))
  target = _continuations(p, tree.depth, vocab)(())
  deviation = np.max(np.abs(observed / rows - target))
  print(f"{scheme}: largest frequency deviation {deviation:.4f}, n = {np.bincount(n)}")
  assert len(set(n)) == tree.depth + 1
  assert chisquare_pvalue(observed, target) > SIGNIFICANCE


@pytest.mark.parametrize("kind", ["random", "q_zero_where_p_positive"])
def test_a_tree_accepts_at_least_as_many_as_its_first_chain(kind):
  """Exact expected accepted depth of the tree (2, 1), children without replacement, against
  Algorithm 1 on its first chain (1, 1) with the same drafter: a second child can only add."""
  gains = []
  for seed in range(6):
    p, q = _prefix_tables(np.random.default_rng(40 + seed), 2, 3, kind)
    expected = {}
    for branching in ((2, 1), (1, 1)):
      tree = trees.DraftTree.from_branching(branching)
      leaves = _tree_walks(tree, p, q, "without_replacement")
      expected[branching] = sum(leaf.prob * tree.depths[leaf.slot] for leaf in leaves)
    gains.append(expected[(2, 1)] - expected[(1, 1)])
  print(f"{kind}: gain in expected accepted depth {np.round(gains, 4)}")
  assert min(gains) >= -1e-12 and max(gains) > 1e-2


def _greedy_walk(tree, target, drafts):
  """The deepest slot whose path matches the target's argmax at every parent, by brute force over
  the slots, and Algorithm 1's beta along it -> (slot, beta [D])."""
  matching = [0] + [
      s
      for s in range(1, tree.width)
      if all(drafts[a - 1] == target[tree.parents[a - 1]] for a in tree.paths[s][: tree.depths[s]])
  ]
  slot = max(matching, key=lambda s: tree.depths[s])
  path = [0] + list(tree.paths[slot][: tree.depths[slot]])
  beta = np.zeros(tree.depth)
  for d, s in enumerate(path[: tree.depth]):
    first = tree.children[s, 0]
    beta[d] = first > 0 and drafts[first - 1] == target[s]
  return slot, beta


@pytest.mark.parametrize("branching", [(3, 2), (2, 2, 1)])
def test_greedy_tree_accepts_the_longest_matching_path(branching):
  """`verify_tree_greedy` takes the deepest path matching the target's argmaxes (siblings
  distinct, some EMPTY), and equals `accept_tree` on one-hot p and q."""
  tree, vocab, rows = trees.DraftTree.from_branching(branching), 3, 1024
  rng = np.random.default_rng(len(branching))
  target = rng.integers(0, vocab, (rows, tree.width)).astype(np.int32)
  drafts = np.zeros((rows, tree.num_nodes), np.int32)
  for slot in range(tree.width):
    kids = tree.children[slot][tree.children[slot] > 0] - 1
    if not len(kids):
      continue
    drafts[:, kids] = np.argsort(rng.random((rows, vocab)), axis=-1)[:, : len(kids)]
    # Half the slots get the target's token among their children, at a random sibling.
    hit = (rng.random(rows) < 0.5) & ~np.any(drafts[:, kids] == target[:, slot : slot + 1], -1)
    position = kids[rng.integers(0, len(kids), rows)]
    drafts[hit, position[hit]] = target[hit, slot]
  drafts[rng.random(drafts.shape) < 0.1] = drafters.EMPTY
  greedy = jax.jit(speculative.TreeVerifier().verify_tree_greedy, static_argnums=2)
  got = tuple(map(np.asarray, greedy(jnp.asarray(target), jnp.asarray(drafts), tree)))
  slots, betas = zip(*(_greedy_walk(tree, t, d) for t, d in zip(target, drafts)))
  slots = np.array(slots)
  expected = (
      tree.paths[slots],
      tree.depths[slots],
      target[np.arange(rows), slots],
      np.array(betas),
  )
  for g, want in zip(got, expected):
    np.testing.assert_array_equal(g, want)
  assert set(got[1]) == set(range(tree.depth + 1))
  one_hot = lambda x: (x[..., None] == np.arange(vocab)).astype(np.float32)  # EMPTY: a zero row
  sampled, _ = _accept_tree_and_residual(
      one_hot(target),
      one_hot(drafts),
      drafts,
      rng.random((rows, tree.width), np.float32),
      tree,
      True,
  )
  for g, want in zip(sampled, expected):
    np.testing.assert_array_equal(g, want)


def test_tree_verifier_on_a_chain_is_algorithm_1():
  """On the chain (1, 1, 1) recursive rejection sampling is Algorithm 1: `verify_tree` with the
  uniforms moved (u[:, 0] the token's, u[:, i] the test of draft i) equals `accept` (beta on the
  verified depths 1..n+1, the ones alpha averages), also with EMPTY drafts, and so does its greedy
  walk; the chain methods are `accept` and `accept_greedy`."""
  p, q, drafts, u = _random_block(3)
  drafts = drafts.at[::5, 1].set(drafters.EMPTY)
  target = jnp.argmax(p, axis=-1).astype(jnp.int32)
  matching = jnp.where(
      jnp.asarray(np.random.default_rng(0).random((64, 3)) < 0.7), target[:, :3], 0
  )
  tree, verifier = trees.DraftTree.chain(3), speculative.TreeVerifier()

  @jax.jit
  def run(p, q, drafts, u, target, matching):
    return (
        (speculative.accept(p, q, drafts, u), speculative.accept_greedy(target, matching)),
        (verifier.verify(p, q, drafts, u), verifier.verify_greedy(target, matching)),
        (
            verifier.verify_tree(p, q, drafts, jnp.roll(u, 1, axis=1), sampling.sample, tree),
            verifier.verify_tree_greedy(target, matching, tree),
        ),
    )

  algorithm_1, chain, on_tree = jax.tree.map(np.asarray, run(p, q, drafts, u, target, matching))
  for (n, token, beta), chain_out, tree_out in zip(algorithm_1, chain, on_tree):
    assert len(set(n)) == 4
    for got, want in zip(chain_out, (n, token, beta)):
      np.testing.assert_array_equal(got, want)
    verified = np.arange(3) <= n[:, None]
    for got, want in zip(tree_out, (tree.paths[n], n, token, np.where(verified, beta, 0))):
      np.testing.assert_array_equal(got, want)


def test_gin_binds_the_tree_verifier():
  gin.clear_config()
  try:
    gin.parse_config("test_speculative._configured_verifier.verifier = @speculative.TreeVerifier()")
    verifier = _configured_verifier()
  finally:
    gin.clear_config()
  assert verifier == speculative.TreeVerifier() and hash(verifier) == hash(
      speculative.TreeVerifier()
  )


@pytest.mark.parametrize("verifier", [speculative.TokenVerifier(), speculative.BlockVerifier()])
def test_chain_verifiers_refuse_a_tree(verifier):
  tree = trees.DraftTree.from_branching((2,))
  message = rf"{type(verifier).__name__} verifies chains .* use speculative.TreeVerifier\(\) with a draft tree"
  p, q = jnp.full((1, 3, 4), 0.25), jnp.full((1, 2, 4), 0.25)
  drafts = jnp.zeros((1, 2), jnp.int32)
  with pytest.raises(ValueError, match=message):
    verifier.verify_tree(p, q, drafts, jnp.zeros((1, 3)), sampling.sample, tree)
  with pytest.raises(ValueError, match=message):
    verifier.verify_tree_greedy(jnp.zeros((1, 3), jnp.int32), drafts, tree)


def test_accept_tree_checks_its_shapes():
  tree = trees.DraftTree.from_branching((2, 1))
  p, q = jnp.full((1, 5, 4), 0.25), jnp.full((1, 4, 4), 0.25)
  drafts = jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(ValueError, match=r"uniforms of shape \(1, 5\)"):
    jitted.accept_tree(p, q, drafts, jnp.zeros((1, 4)), sampling.sample, tree)
  with pytest.raises(ValueError, match="a draft tree of 4 nodes needs p"):
    jitted.accept_tree(p[:, :4], q, drafts, jnp.zeros((1, 5)), sampling.sample, tree)


# --- lenience (the paper's Appendix A.5: lossy, opt-in) -----------------------------------------
def _lenient_law(p, q, lenience):
  """The documented law of a lenient block continued by sampling p, enumerated in float64 from
  the definition: x_i is accepted with min(1, p_i(x_i) / (l q_i(x_i))), the first rejection is
  corrected from norm(max(0, p_{n+1} - l q_{n+1})), p_{gamma+1} after gamma acceptances
  -> {(y_1..y_{gamma+1}): probability}."""
  gamma, vocab = q.shape
  scaled = lenience * q
  accept = np.where(scaled > p[:gamma], p[:gamma] / np.where(scaled > 0, scaled, 1.0), 1.0)
  residual = np.maximum(p[:gamma] - scaled, 0.0)
  residual /= residual.sum(-1, keepdims=True)
  reject = 1.0 - np.sum(q * accept, axis=1)
  law = {}
  for y in itertools.product(range(vocab), repeat=gamma + 1):
    total = 0.0
    for n in range(gamma + 1):
      prob = np.prod([q[i, y[i]] * accept[i, y[i]] for i in range(n)])
      prob *= reject[n] * residual[n, y[n]] if n < gamma else p[gamma, y[gamma]]
      prob *= np.prod([p[j, y[j]] for j in range(n + 1, gamma + 1)])
      total += prob
    law[y] = total
  return law


def _law_vector(law):
  return np.array([law[y] for y in sorted(law)])


def test_lenience_one_is_algorithm_1_token_for_token():
  p, q, drafts, u = _random_block(3)
  got = jax.jit(speculative.LenientVerifier(1.0).verify)(p, q, drafts, u)
  want = jax.jit(speculative.accept)(p, q, drafts, u)
  assert len(set(np.asarray(want[0]))) > 1
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("lenience", [0.5, 0.1])
def test_lenient_blocks_follow_the_documented_law_and_not_the_target(lenience):
  gamma, vocab, rows = 2, 3, 60000
  p, q = _cases(gamma, vocab, seed=7)["random"]
  law = _law_vector(_lenient_law(p, q, lenience))
  target = _law_vector(_lenient_law(p, q, 1.0))  # l = 1: Algorithm 1, whose law is the target's
  np.testing.assert_allclose(
      target,
      [np.prod([p[j, y[j]] for j in range(gamma + 1)]) for y in sorted(_lenient_law(p, q, 1.0))],
      atol=1e-12,
  )
  codes, _, _ = _continued_blocks(p, q, rows, 11, speculative.LenientVerifier(lenience).verify)
  observed = np.bincount(codes, minlength=vocab ** (gamma + 1))
  assert chisquare_pvalue(observed, law) > SIGNIFICANCE
  # The test has power: Algorithm 1's blocks fail it, and the lenient ones fail the target's law.
  exact, _, _ = _continued_blocks(p, q, rows, 11, speculative.TokenVerifier().verify)
  assert chisquare_pvalue(np.bincount(exact, minlength=vocab ** (gamma + 1)), law) < SIGNIFICANCE
  assert chisquare_pvalue(observed, target) < SIGNIFICANCE
  # What it costs: the total variation distance from the target's law, and the paper's bound.
  distance = 0.5 * np.abs(law - target).sum()
  assert {0.5: 0.05, 0.1: 0.15}[lenience] < distance < 1.0, distance
  first = law.reshape(vocab, -1).sum(1)  # the first emitted token's law
  assert np.all(first <= p[0] / lenience + 1e-12) and not np.allclose(first, p[0])


@pytest.mark.parametrize("lenience", [1.0, 0.5, 0.2, 0.1])
def test_lenient_acceptance_follows_the_papers_alpha(lenience):
  gamma, vocab, rows = 3, 4, 40000
  p, q = _cases(gamma, vocab, seed=5)["random"]
  alpha = theory.lenient_alpha(p[:gamma], q, lenience)  # Appendix A.5: sum_x min(p(x) / l, q(x))
  _, n, beta = _continued_blocks(p, q, rows, 2, speculative.LenientVerifier(lenience).verify)
  np.testing.assert_allclose(beta, np.broadcast_to(alpha, beta.shape), rtol=1e-5)
  expected = [np.prod(alpha[:k]) * (1 - alpha[k] if k < gamma else 1) for k in range(gamma + 1)]
  assert chisquare_pvalue(np.bincount(n, minlength=gamma + 1), expected) > SIGNIFICANCE
  # Tokens per call n + 1: Eq. (1) with alpha per position, 1 + sum_k prod_{i<=k} alpha_i, which
  # is theory.expected_tokens where the positions share one alpha.
  predicted = 1 + sum(np.prod(alpha[:k]) for k in range(1, gamma + 1))
  assert abs(np.mean(n + 1) - predicted) < 4 * np.std(n) / np.sqrt(rows)
  shared = np.full(gamma, alpha.mean())
  np.testing.assert_allclose(
      1 + sum(np.prod(shared[:k]) for k in range(1, gamma + 1)),
      theory.expected_tokens(alpha.mean(), gamma),
  )


def test_lenience_raises_tokens_per_call_and_keeps_greedy_exact():
  p, q = _cases(3, 4, seed=5)["random"]
  means = [
      np.mean(_continued_blocks(p, q, 20000, 4, speculative.LenientVerifier(lenience).verify)[1])
      for lenience in (1.0, 0.5, 0.2, 0.1)
  ]
  assert all(a < b for a, b in zip(means, means[1:])), means
  rng = np.random.default_rng(1)
  target = jnp.asarray(rng.integers(0, 4, (100, 4)), jnp.int32)
  drafts = jnp.asarray(rng.integers(0, 4, (100, 3)), jnp.int32)
  got = speculative.LenientVerifier(0.1).verify_greedy(target, drafts)
  for g, w in zip(got, jitted.accept_greedy(target, drafts)):
    np.testing.assert_array_equal(g, w)
  tree = trees.as_tree((2, 1))
  with pytest.raises(ValueError, match="LenientVerifier verifies chains of drafts only"):
    speculative.LenientVerifier(0.5).verify_tree_greedy(target[:, :4], drafts, tree)


@pytest.mark.parametrize(
    "lenience, message",
    [
        (0.0, r"must be in \(0, 1\], got 0\.0"),
        (1.5, r"must be in \(0, 1\], got 1\.5"),
        (float("nan"), r"must be in \(0, 1\], got nan"),
        (True, r"must be a number in \(0, 1\], got True \(bool\)"),
        ("0.5", r"must be a number in \(0, 1\], got '0\.5' \(str\)"),
    ],
)
def test_a_bad_lenience_is_refused(lenience, message):
  with pytest.raises(ValueError, match=message):
    speculative.LenientVerifier(lenience)


def test_gin_binds_the_lenient_verifier():
  gin.clear_config()
  try:
    gin.parse_config(
        "speculative.LenientVerifier.lenience = 0.2\n"
        "test_speculative._configured_verifier.verifier = @speculative.LenientVerifier()"
    )
    verifier = _configured_verifier()
  finally:
    gin.clear_config()
  assert verifier == speculative.LenientVerifier(0.2) and hash(verifier) == hash(verifier)


def test_beta_is_one_minus_the_total_variation_distance():
  """Theorem 3.5: sum_x min(p, q) = 1 - TV(p, q), TV = |p - q|_1 / 2, checked on random laws."""
  rng = np.random.default_rng(0)
  p, q = rng.dirichlet(np.ones(7), (3, 4)), rng.dirichlet(np.ones(7), (3, 4))
  got = np.asarray(speculative.beta(jnp.asarray(p), jnp.asarray(q)))
  assert got.shape == (3, 4)
  np.testing.assert_allclose(got, 1 - 0.5 * np.abs(p - q).sum(-1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(speculative.beta(jnp.asarray(p), jnp.asarray(p))), 1, 1e-6)
