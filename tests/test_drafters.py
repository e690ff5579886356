"""What each drafter proposes, pinned down by values worked out by hand.

The exactness tests (test_decoding.py) pass for any q, so a wrong proposal would only lower alpha
silently. Here: the cache of the model drafters (T5, and the shared-encoder decoder reading the
target's encoder output) across proposals and roll-backs, for chains and trees (every q they
return is their distribution given the true prefix and their own earlier drafts, whatever the
loop accepted before); the unigram and bigram tables `fit` builds and the distributions they give; what prompt
lookup copies; the teacher-forced logits of every kind; `for_target`, `as_drafter`, gin, and the
protocol's defaults.
"""

import dataclasses
import functools

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from speculative_t5x import alpha, drafters, network, sampling, trees
from speculative_t5x.validation import InvalidInputError

CONFIG = tiny_config(11)
GAMMA, LENGTH = 3, 24
# Accepted drafts per iteration and row: both rows see rejections and full acceptances, at
# different iterations (so at some iterations only one row needs the catch-up block).
ACCEPTED = [(0, 3), (3, 1), (2, 3), (3, 3), (1, 0)]


E_TARGET = 24  # the target width a shared-encoder drafter reads, != CONFIG.emb_dim
MODEL_KINDS = ["t5", "shared_encoder"]


@functools.lru_cache(maxsize=None)
def _t5_params():
  return jax.jit(network.init_params, static_argnums=0)(CONFIG, jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def _shared_params():
  init = jax.jit(network.shared_encoder_init_params, static_argnums=(0, 1))
  return init(CONFIG, E_TARGET, jax.random.PRNGKey(0))


def _model_drafter(kind, encoder):
  """-> (drafter, params, target_encoded): for the shared-encoder drafter a random stand-in for
  the target's encoder output of `encoder` [B, Le] ([B, Le, E_TARGET]); None for the T5 drafter."""
  if kind == "t5":
    return drafters.T5Drafter(CONFIG), _t5_params(), None
  encoded = np.random.default_rng(0).normal(size=encoder.shape + (E_TARGET,)).astype(np.float32)
  return drafters.SharedEncoderDrafter(CONFIG, E_TARGET), _shared_params(), encoded


def _teacher_forcing(drafter, params):
  """(encoder tokens [b, Le], target sequences [b, L], target_encoded [b, Le, E] or None) ->
  the drafter's teacher-forced logits [b, L, V]; the decoder is causal, so logits at a position
  do not depend on the tokens padded after it."""
  return jax.jit(
      lambda enc, seq, encoded: drafter.teacher_forced_logits(
          params, enc, alpha.shift_right(seq), target_encoded=encoded
      )
  )


def _rows(encoded, row):
  return None if encoded is None else encoded[row : row + 1]


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_drafter_q_equals_teacher_forcing_after_any_acceptance(kind):
  rng = np.random.default_rng(0)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  drafter, params, encoded = _model_drafter(kind, encoder)
  state = drafter.init_state(params, encoder, LENGTH + GAMMA + 1, target_encoded=encoded)
  standardize = sampling.Standardizer(1.0)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose(
          params, state, sequences, length, GAMMA, u, standardize
      )
  )
  forced = _teacher_forcing(drafter, params)
  sequences = np.zeros((2, LENGTH + GAMMA + 1), np.int32)
  length = np.zeros(2, np.int32)
  for iteration, accepted in enumerate(ACCEPTED):
    u = jax.random.uniform(jax.random.PRNGKey(iteration), (2, GAMMA))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      prefix = np.concatenate([sequences[row, : length[row]], drafts[row]])
      logits = forced(
          encoder[row : row + 1],
          np.pad(prefix, (0, LENGTH + GAMMA - len(prefix)))[None],
          _rows(encoded, row),
      )
      expected = jax.nn.softmax(logits[0, length[row] : length[row] + GAMMA], axis=-1)
      np.testing.assert_allclose(
          q[row], expected, atol=2e-5, err_msg=f"iteration {iteration}, row {row}"
      )
      # The loop's update: the accepted drafts, then a correction token of its own.
      n = accepted[row]
      new = np.append(drafts[row, :n], rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + n + 1] = new
      length[row] += n + 1


def _stop_after_multiples_of_three(logits, drafts):
  """A draft-length rule that reads only the drafter's output: stop after a draft 0 mod 3."""
  del logits
  return drafts % 3 == 0


def test_t5_drafter_under_a_stop_rule_drafts_its_chain_and_leaves_the_rest_empty():
  """Rows stop at different slots, and every later proposal (after roll-backs past or into the
  steps the batch took for other rows) still gives q equal to teacher forcing."""
  params = _t5_params()
  drafter = drafters.T5Drafter(CONFIG)
  rng = np.random.default_rng(1)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  gamma = 4
  state = drafter.init_state(params, encoder, LENGTH + gamma + 1)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose(
          params,
          state,
          sequences,
          length,
          gamma,
          u,
          sampling.Standardizer(1.0),
          stop=_stop_after_multiples_of_three,
      )
  )
  forced = jax.jit(
      lambda enc, seq: drafter.teacher_forced_logits(params, enc, alpha.shift_right(seq))
  )
  sequences = np.zeros((2, LENGTH + gamma + 1), np.int32)
  length = np.zeros(2, np.int32)
  lengths_seen = set()
  for iteration in range(6):
    u = jax.random.uniform(jax.random.PRNGKey(10 + iteration), (2, gamma))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      # The rule by hand: drafts up to and including the first multiple of 3, the rest empty.
      stops = np.flatnonzero(drafts[row] % 3 == 0)
      drafted = stops[0] + 1 if len(stops) else gamma
      if drafted < gamma:
        assert np.all(drafts[row, drafted:] == drafters.EMPTY), (iteration, row, drafts[row])
        assert np.all(q[row, drafted:] == 0.0)
      assert np.all(drafts[row, :drafted] >= 0)
      lengths_seen.add(int(drafted))
      prefix = np.concatenate([sequences[row, : length[row]], drafts[row, :drafted]])
      logits = forced(
          encoder[row : row + 1], np.pad(prefix, (0, LENGTH + gamma - len(prefix)))[None]
      )
      expected = jax.nn.softmax(logits[0, length[row] : length[row] + drafted], axis=-1)
      np.testing.assert_allclose(
          q[row, :drafted], expected, atol=2e-5, err_msg=f"iteration {iteration}, row {row}"
      )
      n = min(drafted, (iteration + row) % 3 + 1)  # accept 1..3 of the drafted, in turn
      new = np.append(drafts[row, :n], rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + n + 1] = new
      length[row] += n + 1
  assert len(lengths_seen) >= 2  # the rule stopped rows at different slots


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_drafter_tree_q_equals_teacher_forcing(kind):
  """q of node i is the drafter's distribution after the path to its parent, with its earlier
  siblings removed and renormalized (what `speculative.TreeVerifier` needs), over two proposals
  at ragged lengths, the second after part of the first tree was accepted."""
  tree = trees.DraftTree.from_branching((2, 2, 1))
  rng = np.random.default_rng(2)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  drafter, params, encoded = _model_drafter(kind, encoder)
  state = drafter.init_state(params, encoder, LENGTH + tree.width, target_encoded=encoded)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose_tree(
          params, state, sequences, length, tree, u, sampling.Standardizer(1.0)
      )
  )
  forced = _teacher_forcing(drafter, params)
  sequences = np.zeros((2, LENGTH + tree.width), np.int32)
  sequences[1, :2] = rng.integers(2, CONFIG.vocab_size, 2)
  length = np.array([0, 2], np.int32)
  for iteration, accepted_nodes in enumerate([(8, 0), (1, 5)]):
    u = jax.random.uniform(jax.random.PRNGKey(20 + iteration), (2, tree.num_nodes))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      for node, parent in enumerate(tree.parents):
        depth = tree.depths[parent]
        prefix = np.concatenate(
            [sequences[row, : length[row]], drafts[row, tree.paths[parent, :depth] - 1]]
        )
        logits = forced(
            encoder[row : row + 1],
            np.pad(prefix, (0, sequences.shape[1] - len(prefix)))[None],
            _rows(encoded, row),
        )
        expected = np.asarray(jax.nn.softmax(logits[0, length[row] + depth]), np.float64)
        earlier = [j for j in range(node) if tree.parents[j] == parent]
        expected[drafts[row, earlier]] = 0.0
        np.testing.assert_allclose(
            q[row, node], expected / expected.sum(), atol=2e-5, err_msg=f"{iteration}, {row}"
        )
      # The loop's update: the drafts on the path to the accepted node, and a correction token.
      node = accepted_nodes[row]
      path = drafts[row, tree.paths[node + 1, : tree.depths[node + 1]] - 1]
      new = np.append(path, rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + len(new)] = new
      length[row] += len(new)


def test_draft_chain_runs_only_while_some_row_drafts():
  """Drafter steps: the longest row's drafts; a rule that never stops takes gamma steps."""
  logits = jnp.log(jnp.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]))[:, None]  # [2, 1, 4]

  def step(carry, tokens, i):
    # The next draft is the previous one + 1 (mod 4), with probability 0.7.
    return jnp.log(jax.nn.one_hot((tokens + 1) % 4, 4) * 0.6 + 0.1)[:, None], carry + 1

  u = jnp.zeros((2, 5))
  for stop, expected_drafts, expected_steps in [
      (None, [[0, 1, 2, 3, 0], [3, 0, 1, 2, 3]], 5),
      (lambda lg, d: d == 2, [[0, 1, 2, -1, -1], [3, 0, 1, 2, -1]], 4),
      (lambda lg, d: d >= 0, [[0, -1, -1, -1, -1], [3, -1, -1, -1, -1]], 1),
  ]:
    drafts, q, carry, steps = drafters.draft_chain(
        logits, step, 0, 5, u, sampling.Standardizer(0.0), stop
    )
    np.testing.assert_array_equal(drafts, expected_drafts)
    assert q is None  # greedy
    assert int(steps) == expected_steps and int(carry) == expected_steps - 1


def test_t5_drafter_teacher_forced_logits_are_the_networks():
  """Full-attention teacher forcing equals the network's, and the cached decode of the block."""
  drafter = drafters.T5Drafter(CONFIG)
  module = network.Transformer(CONFIG)

  @jax.jit
  def three_ways(params, encoder, decoder_inputs):
    _, cache = module.apply({"params": params}, encoder, 6, method=module.prefill)
    cached, _ = module.apply(
        {"params": params}, decoder_inputs, cache, jnp.zeros(2, jnp.int32), method=module.decode
    )
    return (
        drafter.teacher_forced_logits(params, encoder, decoder_inputs),
        network.teacher_forced_logits(CONFIG, params, encoder, decoder_inputs),
        cached,
    )

  encoder = np.array([[3, 4, 5, 6, 0], [7, 2, 9, 0, 0]], np.int32)
  decoder_inputs = np.array([[0, 5, 0, 7, 3, 3], [0, 8, 9, 10, 2, 1]], np.int32)  # a 0 token
  logits, network_logits, cached = three_ways(_t5_params(), encoder, decoder_inputs)
  np.testing.assert_array_equal(logits, network_logits)
  np.testing.assert_allclose(logits, cached, atol=2e-5)


# --- unigram and bigram tables -------------------------------------------------------------------
# Two target sequences (0 = padding). By hand: the unigram counts of ids 0..5 are [0, 0, 0, 4, 3, 1]
# (padding ignored); with smoothing 1, p_uni = [1, 1, 1, 5, 4, 2] / 14. Counting from BOS (0) at
# the start of each sequence, the bigrams are (0,3) (3,4) (4,3) (3,5) and (0,4) (4,3) (3,4) (4,3):
# successors of 0: {3: 1, 4: 1}; of 3: {4: 2, 5: 1}; of 4: {3: 3}; none of 1, 2 and 5 (5 ends the
# first sequence: no bigram (5, 4) across sequences).
CORPUS = [np.array([3, 4, 3, 5, 0, 0]), np.array([4, 3, 4, 3])]
TABLE_V = 6
UNIGRAM = np.array([1, 1, 1, 5, 4, 2]) / 14


def _mix(bigram, backoff=0.1):
  """(1 - backoff) * bigram + backoff * unigram, bigram given as {id: probability}."""
  dense = np.zeros(TABLE_V)
  for token, prob in bigram.items():
    dense[token] = prob
  return (1 - backoff) * dense + backoff * UNIGRAM


# The bigram drafter's q(. | previous) for each previous id 0..5, top=2 and top=1 (ties between
# successors broken by the smaller id: 3 before 4 after BOS).
BIGRAM_TOP2 = [
    _mix({3: 0.5, 4: 0.5}),
    UNIGRAM,
    UNIGRAM,
    _mix({4: 2 / 3, 5: 1 / 3}),
    _mix({3: 1.0}),
    UNIGRAM,
]
BIGRAM_TOP1 = [_mix({3: 1.0}), UNIGRAM, UNIGRAM, _mix({4: 1.0}), _mix({3: 1.0}), UNIGRAM]


def _softmax(logits):
  return np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))


def test_unigram_fit_counts_nonzero_tokens_with_smoothing():
  # Counts of ids 0..4: [0 (padding ignored), 1, 3, 1, 0]; a 2-D array counts all its entries.
  corpus = [np.array([2, 2, 3, 0, 0]), np.array([[1, 2], [0, 0]])]
  params = drafters.UnigramDrafter.fit(corpus, 5, smoothing=0.5)
  np.testing.assert_allclose(params["logits"], np.log([0.5, 1.5, 3.5, 1.5, 0.5]), rtol=1e-6)
  drafter = drafters.UnigramDrafter(vocab_size=5, smoothing=0.5)
  np.testing.assert_allclose(drafter.fit_params(corpus)["logits"], params["logits"])
  logits = drafter.next_logits(params, jnp.array([0, 4, 2]))
  np.testing.assert_allclose(
      _softmax(logits), np.tile([[0.5, 1.5, 3.5, 1.5, 0.5]], (3, 1)) / 7.5, rtol=1e-6
  )
  # Untrained: fitted on nothing, uniform.
  untrained = drafter.init_params(jax.random.PRNGKey(0), {})
  np.testing.assert_allclose(
      _softmax(drafter.next_logits(untrained, jnp.array([1]))), np.full((1, 5), 0.2), rtol=1e-6
  )


def test_bigram_fit_keeps_top_successors_mixed_with_the_unigram():
  params = drafters.BigramDrafter.fit(CORPUS, TABLE_V, top=2, smoothing=1.0, backoff=0.1)
  np.testing.assert_allclose(np.exp(params["unigram"]), UNIGRAM, rtol=1e-6)
  np.testing.assert_array_equal(params["next_ids"][0], [3, 4])  # most frequent first, then by id
  np.testing.assert_array_equal(params["next_ids"][3], [4, 5])
  np.testing.assert_array_equal(params["next_ids"][4][:1], [3])
  drafter = drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  logits = drafter.next_logits(params, jnp.arange(TABLE_V))
  np.testing.assert_allclose(_softmax(logits), np.array(BIGRAM_TOP2), rtol=1e-5, atol=1e-7)
  # The logits are the log-probabilities themselves, not just up to a constant.
  np.testing.assert_allclose(np.exp(logits).sum(-1), 1.0, rtol=1e-5)


def test_bigram_fit_params_use_the_drafters_settings():
  """top=1 keeps the smaller id of a tie and renormalizes the kept successors; backoff 0.3."""
  drafter = drafters.BigramDrafter(vocab_size=TABLE_V, top=1, backoff=0.3)
  params = drafter.fit_params(CORPUS)
  expected = [
      _mix({3: 1.0}, 0.3),
      UNIGRAM,
      UNIGRAM,
      _mix({4: 1.0}, 0.3),
      _mix({3: 1.0}, 0.3),
      UNIGRAM,
  ]
  np.testing.assert_allclose(
      _softmax(drafter.next_logits(params, jnp.arange(TABLE_V))),
      np.array(expected),
      rtol=1e-5,
      atol=1e-7,
  )
  top1 = drafters.BigramDrafter(vocab_size=TABLE_V, top=1)
  np.testing.assert_allclose(
      _softmax(top1.next_logits(top1.fit_params(CORPUS), jnp.arange(TABLE_V))),
      np.array(BIGRAM_TOP1),
      rtol=1e-5,
      atol=1e-7,
  )
  untrained = drafter.init_params(jax.random.PRNGKey(0), {})
  np.testing.assert_allclose(
      _softmax(drafter.next_logits(untrained, jnp.arange(TABLE_V))),
      np.full((TABLE_V, TABLE_V), 1 / TABLE_V),
      rtol=1e-6,
  )
  for backoff in (0.0, 1.0):
    with pytest.raises(ValueError, match="backoff must be in"):
      drafters.BigramDrafter.fit(CORPUS, TABLE_V, backoff=backoff)


def test_table_drafters_propose_a_chain_from_the_last_decoded_token():
  drafter = drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  params = drafter.fit_params(CORPUS)
  sequences = jnp.array([[4, 3, 5, 0, 0]] * 3, jnp.int32)
  # x_length: y_1 = 3 for row 0, BOS for row 1, y_2 = 5 (no successors: unigram) for row 2.
  length = jnp.array([2, 0, 3], jnp.int32)
  drafts, q, state = drafter.propose(
      params, (), sequences, length, 3, jnp.zeros((3, 3)), sampling.Standardizer(0.0)
  )
  assert q is None and state == ()
  # Greedy by hand: after 3 the argmax is 4 (0.6 + 0.4/14), after 4 it is 3, after BOS 3
  # (0.45 + 0.5/14 against 0.45 + 0.4/14 for 4), after 5 the unigram's argmax 3.
  np.testing.assert_array_equal(drafts, [[4, 3, 4], [3, 4, 3], [3, 4, 3]])

  # Sampled: inverse-CDF draws, each conditioned on the draft before it.
  u = jnp.array([[0.05, 0.5, 0.97]])
  drafts, q, _ = drafter.propose(
      params, (), sequences[:1], length[:1], 3, u, sampling.Standardizer(1.0)
  )
  # By hand: cdf of q(. | 3) = [.0071, .0143, .0214, .0571, .6857, 1] -> u .05 gives 3, then .5
  # gives 4; cdf of q(. | 4) = [.0071, .0143, .0214, .9571, .9857, 1] -> u .97 gives 4.
  np.testing.assert_array_equal(drafts, [[3, 4, 4]])
  np.testing.assert_allclose(
      q[0], np.array([BIGRAM_TOP2[3], BIGRAM_TOP2[3], BIGRAM_TOP2[4]]), rtol=1e-5, atol=1e-7
  )


def test_table_teacher_forced_logits_are_next_logits_of_the_previous_token():
  decoder_inputs = jnp.array([[0, 3, 4, 5, 0, 2], [0, 4, 4, 3, 1, 1]], jnp.int32)
  bigram = drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  logits = bigram.teacher_forced_logits(bigram.fit_params(CORPUS), None, decoder_inputs)
  assert logits.shape == (2, 6, TABLE_V)
  expected = np.array(BIGRAM_TOP2)[np.asarray(decoder_inputs)]
  np.testing.assert_allclose(_softmax(logits), expected, rtol=1e-5, atol=1e-7)
  unigram = drafters.UnigramDrafter(vocab_size=TABLE_V)
  logits = unigram.teacher_forced_logits(unigram.fit_params(CORPUS), None, decoder_inputs)
  np.testing.assert_allclose(_softmax(logits), np.broadcast_to(UNIGRAM, (2, 6, TABLE_V)), rtol=1e-5)


def test_bigram_drafter_takes_the_params_fit_returns_outside_jit():
  """`fit` returns NumPy tables; indexed by traced tokens (vmap, scan) outside jit."""
  bigram = drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  decoder_inputs = jnp.array([[0, 3, 4]], jnp.int32)
  logits = bigram.teacher_forced_logits(bigram.fit_params(CORPUS), None, decoder_inputs)
  np.testing.assert_allclose(_softmax(logits), np.array(BIGRAM_TOP2)[[[0, 3, 4]]], rtol=1e-5)


# --- prompt lookup -------------------------------------------------------------------------------
LOOKUP_V, FALLBACK = 20, 2


@functools.lru_cache(maxsize=None)
def _jit_propose(ngram, fallback, gamma):
  drafter = drafters.PromptLookupDrafter(vocab_size=LOOKUP_V, ngram=ngram, fallback_token=fallback)
  return jax.jit(
      lambda encoder, decoded, length: drafter.propose(
          {}, drafter.init_state({}, encoder, 32), decoded, length, gamma, None, None
      )
  )


def _lookup(encoder, decoded, length, gamma, ngram=1, fallback=FALLBACK):
  """Drafts [B, gamma] of prompt lookup; checks that q is their one-hot."""
  encoder = np.asarray(encoder, np.int32)
  drafts, q, state = _jit_propose(ngram, fallback, gamma)(
      encoder, np.asarray(decoded, np.int32), np.asarray(length, np.int32)
  )
  assert drafts.dtype == jnp.int32
  np.testing.assert_array_equal(q, jax.nn.one_hot(drafts, LOOKUP_V))
  np.testing.assert_array_equal(state, encoder)
  return np.asarray(drafts)


def test_prompt_lookup_copies_the_continuation_of_the_latest_match():
  fb = FALLBACK
  # Encoder match: y = (8): x_1 = 8 occurs at encoder position 1; 9 10 11 follow, then padding.
  assert _lookup([[7, 8, 9, 10, 11, 0, 0]], [[8, 0, 0, 0]], [1], 4).tolist() == [[9, 10, 11, fb]]
  # The latest of two encoder matches: 7 at positions 0 and 3 -> what follows position 3.
  assert _lookup([[7, 8, 9, 7, 10, 0, 0]], [[7, 0]], [1], 3).tolist() == [[10, fb, fb]]
  # A match in the decoded prefix wins over an (earlier) one in the encoder: y = 8 12 8, the last
  # 8 matches x_1 (and encoder position 1); from x_1 on: x_2 = 12, x_3 = 8, then nothing is known.
  assert _lookup([[7, 8, 9, 10, 11, 0, 0]], [[8, 12, 8, 0]], [3], 3).tolist() == [[12, 8, fb]]
  # The latest match inside the prefix: y = 5 6 5 13 5 -> 5 at x_1 and x_3; x_3 wins.
  assert _lookup([[15, 0]], [[5, 6, 5, 13, 5, 0]], [5], 3).tolist() == [[13, 5, fb]]
  # No match anywhere: the fallback token, repeated (and any fallback_token).
  assert _lookup([[7, 8, 0]], [[17, 0]], [1], 3).tolist() == [[fb, fb, fb]]
  assert _lookup([[7, 8, 0]], [[17, 0]], [1], 2, fallback=5).tolist() == [[5, 5]]
  # Nothing decoded yet: x_0 is BOS, and what follows it (or the padding) is never copied.
  assert _lookup([[7, 8, 0]], [[0, 0]], [0], 2).tolist() == [[fb, fb]]


def test_prompt_lookup_stops_at_what_is_known():
  fb = FALLBACK
  # Tokens beyond `length` in `sequences` are stale: neither matched nor copied (x_4 = 8 there
  # would otherwise be copied after x_3 = 8 as the continuation of the x_1 match).
  assert _lookup([[7, 0]], [[8, 12, 8, 8, 19, 20]], [3], 4).tolist() == [[12, 8, fb, fb]]
  # The whole batch at once, rows at different lengths over the same sequences.
  # At length 4 the key is x_4 = 8: the latest earlier 8 is x_3, continued by x_4 only.
  decoded = [[8, 12, 8, 8, 19, 20]] * 2
  assert _lookup([[7, 0]] * 2, decoded, [3, 4], 2).tolist() == [[12, 8], [8, fb]]
  # Padding in the encoder is never copied (fallback instead).
  assert _lookup([[4, 9, 0, 0]], [[9, 0]], [1], 2).tolist() == [[fb, fb]]


def test_prompt_lookup_continuation_ends_with_the_encoder_input():
  """An encoder match's continuation ends where the input ends: after its padding (or its last
  token) the drafts are the fallback, not the decoded prefix that follows in the search space."""
  fb = FALLBACK
  # source = 7 8 9 0 | BOS x_1=8: the 8 at encoder position 1 is continued by 9, padding, BOS and
  # then x_1 = 8 again, which is not what followed the 8 in the input.
  assert _lookup([[7, 8, 9, 0]], [[8, 0]], [1], 4).tolist() == [[9, fb, fb, fb]]


@pytest.mark.parametrize("ngram, expected", [(1, [13, 4, 5]), (2, [12, 10, 6]), (3, [11, 9, 5])])
def test_prompt_lookup_matches_the_last_ngram_tokens(ngram, expected):
  # y ends in 4 5 6: the latest earlier 6 is followed by 13 4 5, the latest earlier 5 6 by
  # 12 10 6, the latest earlier 4 5 6 (the start) by 11 9 5.
  decoded = [[4, 5, 6, 11, 9, 5, 6, 12, 10, 6, 13, 4, 5, 6, 0, 0]]
  assert _lookup([[15, 16, 0]], decoded, [14], 3, ngram=ngram).tolist() == [expected]


def test_prompt_lookup_matches_ngrams_in_the_encoder():
  fb = FALLBACK
  # y = 3 7 8: the bigram 7 8 occurs at the start of the input, followed by 9 10 and padding.
  assert _lookup([[7, 8, 9, 10, 0]], [[3, 7, 8, 0]], [3], 3, ngram=2).tolist() == [[9, 10, fb]]
  # Only the unigram 8 matches (8 at position 1 of the input is preceded by 7, not 3).
  assert _lookup([[7, 8, 9, 10, 0]], [[3, 3, 8, 0]], [3], 3, ngram=2).tolist() == [[fb, fb, fb]]
  assert _lookup([[7, 8, 9, 10, 0]], [[3, 3, 8, 0]], [3], 3, ngram=1).tolist() == [[9, 10, fb]]


def test_prompt_lookup_teacher_forced_logits_are_its_first_drafts():
  drafter = drafters.PromptLookupDrafter(vocab_size=LOOKUP_V, ngram=1, fallback_token=FALLBACK)
  encoder = jnp.array([[7, 8, 9, 0], [5, 6, 7, 8]], jnp.int32)
  decoder_inputs = jnp.array([[0, 8, 12, 8, 9], [0, 6, 7, 6, 5]], jnp.int32)
  logits = np.asarray(drafter.teacher_forced_logits({}, encoder, decoder_inputs))
  # By hand, the first draft at position t continues the latest earlier occurrence of x_t:
  # row 0: BOS (only padding matches: fallback), 8 -> 9 (input), 12 (none), 8 -> x_2 = 12
  # (prefix), 9 -> padding (fallback); row 1: BOS, 6 -> 7, 7 -> 8, 6 -> x_2 = 7, 5 -> 6.
  first = np.array([[FALLBACK, 9, FALLBACK, 12, FALLBACK], [FALLBACK, 7, 8, 7, 6]])
  assert logits.shape == (2, 5, LOOKUP_V)
  np.testing.assert_array_equal(
      logits, np.where(np.eye(LOOKUP_V, dtype=bool)[first], 0.0, np.float32(network.MASK_VALUE))
  )


# --- for_target, as_drafter, gin, the protocol's defaults ----------------------------------------
def test_for_target_fills_unset_fields_and_rejects_mismatches():
  bigram = drafters.BigramDrafter(top=3, backoff=0.2).for_target(10, 1)
  assert (bigram.vocab_size, bigram.eos_id, bigram.top, bigram.backoff) == (10, 1, 3, 0.2)
  lookup = drafters.PromptLookupDrafter(ngram=3, fallback_token=4).for_target(10, 2)
  assert (lookup.vocab_size, lookup.eos_id, lookup.ngram, lookup.fallback_token) == (10, 2, 3, 4)
  complete = drafters.UnigramDrafter(vocab_size=10, eos_id=1)
  assert complete.for_target(10, 1) is complete
  t5 = drafters.T5Drafter(CONFIG).for_target(11, 1)
  assert (t5.vocab_size, t5.eos_id, t5.config) == (11, 1, CONFIG)
  with pytest.raises(ValueError, match="drafter vocab_size 11 != target vocab_size 12"):
    drafters.T5Drafter(CONFIG).for_target(12, 1)
  with pytest.raises(ValueError, match="drafter vocab_size 9 != target vocab_size 10"):
    drafters.PromptLookupDrafter(vocab_size=9).for_target(10, 1)
  with pytest.raises(ValueError, match="drafter eos_id 2 != the output vocabulary's eos_id 1"):
    drafters.UnigramDrafter(eos_id=2).for_target(10, 1)


def test_as_drafter():
  lookup = drafters.PromptLookupDrafter(vocab_size=10)
  assert drafters.as_drafter(lookup) is lookup
  t5 = drafters.as_drafter(network.Transformer(CONFIG))
  assert isinstance(t5, drafters.T5Drafter) and t5.config == CONFIG and t5.eos_id is None
  assert drafters.as_drafter(CONFIG).config == CONFIG
  with pytest.raises(ValueError, match="network.Transformer, got dict"):
    drafters.as_drafter({"emb_dim": 8})


# The fix every mismatch names.
RESTORE_FIX = (
    r"Restore them with the drafter they were saved with \(pairs\.PairConfig\.from_pair_dir, or "
    r"drafters\.read_drafter on their directory\), or build the drafter with the sizes they have"
)


def test_check_params_takes_the_drafters_own_parameters():
  drafter = drafters.SharedEncoderDrafter(CONFIG, E_TARGET)
  assert drafter.param_shapes() == jax.tree.map(lambda x: tuple(x.shape), _shared_params())
  drafter.check_params(_shared_params())
  drafters.T5Drafter(CONFIG).check_params(_t5_params())
  lookup = drafters.PromptLookupDrafter(vocab_size=CONFIG.vocab_size)
  lookup.check_params({})
  lookup.check_params(None)  # no parameters: any tree without leaves


def test_check_params_refuses_a_shared_encoder_drafter_of_another_width():
  """Parameters of a drafter reading an encoder output of width 16 (another target's), given to
  one reading width 24: the cross-attention kernels differ, and the first is named."""
  narrow = jax.eval_shape(
      lambda: network.shared_encoder_init_params(CONFIG, 16, jax.random.PRNGKey(0))
  )
  with pytest.raises(
      InvalidInputError,
      match=r"^drafter params are not this SharedEncoderDrafter's parameters \(4 problem\(s\); "
      r"the first: decoder/layers_0/encoder_decoder_attention/key/kernel is \(16, 16\), the "
      r"SharedEncoderDrafter needs \(24, 16\)\): .*" + RESTORE_FIX,
  ):
    drafters.SharedEncoderDrafter(CONFIG, E_TARGET).check_params(narrow)


def test_check_params_refuses_the_parameters_of_another_kind():
  """A T5 drafter's parameters given to a shared-encoder drafter of the same sizes: its encoder
  is what the other kind does not have."""
  t5 = jax.eval_shape(lambda: network.init_params(CONFIG, jax.random.PRNGKey(0)))
  with pytest.raises(
      InvalidInputError,
      match=r"^params\['drafter'\] are not this SharedEncoderDrafter's parameters \(\d+ "
      r"problem\(s\); the first: encoder/encoder_norm/scale \(16,\) is not a parameter of the "
      r"SharedEncoderDrafter\): .*" + RESTORE_FIX,
  ):
    drafters.SharedEncoderDrafter(CONFIG, CONFIG.emb_dim).check_params(t5, "params['drafter']")
  with pytest.raises(InvalidInputError, match=r"the first: logits \(11,\) is not a parameter"):
    drafters.PromptLookupDrafter(vocab_size=11).check_params({"logits": np.zeros(11)})
  with pytest.raises(
      InvalidInputError,
      match=r"\(43 problem\(s\); the first: decoder/decoder_norm/scale \(16,\) is missing\)",
  ):
    drafters.T5Drafter(CONFIG).check_params({})


def test_check_params_of_a_bigram_table_takes_any_number_of_successors():
  """`top` is what fitting keeps; the tables of any top serve, those of another vocabulary not."""
  drafter = drafters.BigramDrafter(vocab_size=TABLE_V, top=32)
  drafter.check_params(drafters.BigramDrafter.fit([np.array([3, 4, 1])], TABLE_V, top=2))
  other = drafters.BigramDrafter.fit([], TABLE_V + 1, top=2)
  with pytest.raises(
      InvalidInputError,
      match=rf"the first: backoff is \({TABLE_V + 1},\), the BigramDrafter needs \({TABLE_V},\)",
  ):
    drafter.check_params(other)


def test_shared_encoder_drafter_reads_the_targets_encoder_output_and_nothing_else():
  encoder = np.full((2, 7), 3, np.int32)
  drafter, params, encoded = _model_drafter("shared_encoder", encoder)
  assert (drafter.network_config, drafter.network_encoder_emb_dim) == (CONFIG, E_TARGET)
  assert drafter.needs_checkpoint and drafter.vocab_size == CONFIG.vocab_size
  with pytest.raises(ValueError, match=r"init_state needs target_encoded \[B, Le, 24\]"):
    drafter.init_state(params, encoder, 8)
  with pytest.raises(ValueError, match="teacher_forced_logits needs target_encoded"):
    drafter.teacher_forced_logits(params, encoder, encoder)
  with pytest.raises(
      ValueError,
      match=r"got target_encoded of shape \(2, 7, 16\), but it reads encoder outputs \[B, Le, "
      r"encoder_emb_dim = 24\]",
  ):
    drafter.init_state(params, encoder, 8, target_encoded=encoded[..., :16])
  drafter.check_target(CONFIG.replace(emb_dim=E_TARGET, num_heads=3))
  with pytest.raises(ValueError, match="encoder_emb_dim 24 != the target's emb_dim 16: .*= 16"):
    drafter.check_target(CONFIG)
  with pytest.raises(ValueError, match="vocab_size 11 != the target's vocab_size 12"):
    drafter.check_target(CONFIG.replace(emb_dim=E_TARGET, vocab_size=12))


@gin.configurable(module="test_drafters")
def _configured(drafter=gin.REQUIRED):
  return drafter


def test_gin_builds_a_drafter_from_a_macro():
  gin.clear_config()
  try:
    gin.parse_config(
        "DRAFTER = @drafters.BigramDrafter()\n"
        "drafters.BigramDrafter.top = 3\n"
        "test_drafters._configured.drafter = %DRAFTER"
    )
    assert gin.query_parameter("drafters.BigramDrafter.top") == 3
    assert str(gin.query_parameter("%DRAFTER")) == "@drafters.BigramDrafter()"
    drafter = _configured()
    assert type(drafter) is drafters.BigramDrafter  # pylint: disable=unidiomatic-typecheck
    assert (drafter.top, drafter.vocab_size, drafter.eos_id, drafter.backoff) == (3, 0, None, 0.1)
  finally:
    gin.clear_config()
  with pytest.raises(RuntimeError, match="drafter"):  # gin.REQUIRED: unbound is an error
    _configured()


@dataclasses.dataclass(frozen=True, eq=False)
class _Minimal(drafters.Drafter):
  """Only the abstract methods: proposes token 3."""

  vocab_size: int = 5
  eos_id: int | None = None

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    return ()

  def propose(self, params, state, sequences, length, gamma, u, standardize):
    drafts = jnp.full((sequences.shape[0], gamma), 3, jnp.int32)
    return drafts, jax.nn.one_hot(drafts, self.vocab_size), state

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    return jnp.zeros(decoder_input_tokens.shape + (self.vocab_size,))


def test_protocol_defaults_for_a_drafter_without_weights():
  drafter = _Minimal()
  assert drafter.init_params(jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4)}) == {}
  assert drafter.param_axes() is None
  assert not drafter.needs_checkpoint and not drafter.learns_from_targets
  assert drafter.steps_per_draft == 1
  with pytest.raises(ValueError, match="_Minimal has no checkpoint format .*/some/ckpt"):
    drafter.restore_params("/some/ckpt")
  with pytest.raises(ValueError, match="_Minimal is not fitted from data"):
    drafter.fit_params([np.array([1, 2])])
  with pytest.raises(ValueError, match="_Minimal has no checkpoint format, so .* to /some/ckpt"):
    drafter.save_params("/some/ckpt", {})
  drafter.check_target(CONFIG)  # any target
  assert drafter.network_config is None and drafter.network_encoder_emb_dim is None
  assert drafter.for_target(5, 1).eos_id == 1


def test_a_drafter_missing_an_abstract_method_cannot_be_made():
  class _NoPropose(drafters.Drafter):
    vocab_size, eos_id = 5, None

    def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
      return ()

    def teacher_forced_logits(
        self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
    ):
      return None

  with pytest.raises(TypeError, match="propose"):
    _NoPropose()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: drafters.PromptLookupDrafter(ngram=0), "ngram must be an integer >= 1"),
        (lambda: drafters.PromptLookupDrafter(ngram=2.5), "ngram must be an integer >= 1"),
        (lambda: drafters.PromptLookupDrafter(fallback_token=-1), "fallback_token must be"),
        (
            lambda: drafters.PromptLookupDrafter(vocab_size=10, fallback_token=10),
            r"fallback_token 10 is outside the vocabulary \[0, 10\)",
        ),
        (
            lambda: drafters.PromptLookupDrafter(fallback_token=12).for_target(10, 1),
            "fallback_token 12 is outside",
        ),
        (lambda: drafters.UnigramDrafter(vocab_size=-3), "vocab_size must be an integer >= 0"),
        (lambda: drafters.UnigramDrafter(smoothing=-1.0), "smoothing must be a finite number"),
        (lambda: drafters.BigramDrafter(top=0), "top must be an integer >= 1"),
        (lambda: drafters.BigramDrafter(backoff=1.0), r"backoff must be in \(0, 1\)"),
        (
            lambda: drafters.BigramDrafter.fit([np.array([3, 12])], 10),
            r"token id 12 outside \[0, 10\)",
        ),
        (
            lambda: drafters.UnigramDrafter.fit([np.array([3, 12])], 10),
            r"token id 12 outside \[0, 10\)",
        ),
        (lambda: drafters.UnigramDrafter.fit([np.array([3, -2])], 10), "token id -2 outside"),
        (lambda: drafters.BigramDrafter.fit([np.array([1.5, 2.0])], 10), "integer token ids"),
        (
            lambda: drafters.SharedEncoderDrafter(CONFIG, 0),
            "SharedEncoderDrafter.encoder_emb_dim must be an integer >= 1",
        ),
        (
            lambda: drafters.SharedEncoderDrafter(network.Transformer(CONFIG), 8),
            "SharedEncoderDrafter needs a network.T5Config",
        ),
    ],
)
def test_bad_drafter_settings_and_fitting_data_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()
