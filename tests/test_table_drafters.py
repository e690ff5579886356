"""What the drafters without a model call propose, pinned down by values worked out by hand.

The exactness tests (test_decoding.py) pass for any q, so a wrong proposal would only lower alpha
silently. Here: the unigram and bigram tables `fit` builds and the distributions they give; what
prompt lookup copies; their teacher-forced logits, `for_target`, parameters, settings and gin names
(the `drafters` module's).
"""

import functools

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import layers, sampling, table_drafters
from speculative_t5x.validation import InvalidInputError

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
  params = table_drafters.UnigramDrafter.fit(corpus, 5, smoothing=0.5)
  np.testing.assert_allclose(params["logits"], np.log([0.5, 1.5, 3.5, 1.5, 0.5]), rtol=1e-6)
  drafter = table_drafters.UnigramDrafter(vocab_size=5, smoothing=0.5)
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
  params = table_drafters.BigramDrafter.fit(CORPUS, TABLE_V, top=2, smoothing=1.0, backoff=0.1)
  np.testing.assert_allclose(np.exp(params["unigram"]), UNIGRAM, rtol=1e-6)
  np.testing.assert_array_equal(params["next_ids"][0], [3, 4])  # most frequent first, then by id
  np.testing.assert_array_equal(params["next_ids"][3], [4, 5])
  np.testing.assert_array_equal(params["next_ids"][4][:1], [3])
  drafter = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  logits = drafter.next_logits(params, jnp.arange(TABLE_V))
  np.testing.assert_allclose(_softmax(logits), np.array(BIGRAM_TOP2), rtol=1e-5, atol=1e-7)
  # The logits are the log-probabilities themselves, not just up to a constant.
  np.testing.assert_allclose(np.exp(logits).sum(-1), 1.0, rtol=1e-5)


def test_bigram_fit_params_use_the_drafters_settings():
  """top=1 keeps the smaller id of a tie and renormalizes the kept successors; backoff 0.3."""
  drafter = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=1, backoff=0.3)
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
  top1 = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=1)
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
      table_drafters.BigramDrafter.fit(CORPUS, TABLE_V, backoff=backoff)


def test_table_drafters_propose_a_chain_from_the_last_decoded_token():
  drafter = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
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
  bigram = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  logits = bigram.teacher_forced_logits(bigram.fit_params(CORPUS), None, decoder_inputs)
  assert logits.shape == (2, 6, TABLE_V)
  expected = np.array(BIGRAM_TOP2)[np.asarray(decoder_inputs)]
  np.testing.assert_allclose(_softmax(logits), expected, rtol=1e-5, atol=1e-7)
  unigram = table_drafters.UnigramDrafter(vocab_size=TABLE_V)
  logits = unigram.teacher_forced_logits(unigram.fit_params(CORPUS), None, decoder_inputs)
  np.testing.assert_allclose(_softmax(logits), np.broadcast_to(UNIGRAM, (2, 6, TABLE_V)), rtol=1e-5)


def test_bigram_drafter_takes_the_params_fit_returns_outside_jit():
  """`fit` returns NumPy tables; indexed by traced tokens (vmap, scan) outside jit."""
  bigram = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=2)
  decoder_inputs = jnp.array([[0, 3, 4]], jnp.int32)
  logits = bigram.teacher_forced_logits(bigram.fit_params(CORPUS), None, decoder_inputs)
  np.testing.assert_allclose(_softmax(logits), np.array(BIGRAM_TOP2)[[[0, 3, 4]]], rtol=1e-5)


# --- prompt lookup -------------------------------------------------------------------------------
LOOKUP_V, FALLBACK = 20, 2


@functools.lru_cache(maxsize=None)
def _jit_propose(ngram, fallback, gamma):
  drafter = table_drafters.PromptLookupDrafter(
      vocab_size=LOOKUP_V, ngram=ngram, fallback_token=fallback
  )
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
  drafter = table_drafters.PromptLookupDrafter(
      vocab_size=LOOKUP_V, ngram=1, fallback_token=FALLBACK
  )
  encoder = jnp.array([[7, 8, 9, 0], [5, 6, 7, 8]], jnp.int32)
  decoder_inputs = jnp.array([[0, 8, 12, 8, 9], [0, 6, 7, 6, 5]], jnp.int32)
  logits = np.asarray(drafter.teacher_forced_logits({}, encoder, decoder_inputs))
  # By hand, the first draft at position t continues the latest earlier occurrence of x_t:
  # row 0: BOS (only padding matches: fallback), 8 -> 9 (input), 12 (none), 8 -> x_2 = 12
  # (prefix), 9 -> padding (fallback); row 1: BOS, 6 -> 7, 7 -> 8, 6 -> x_2 = 7, 5 -> 6.
  first = np.array([[FALLBACK, 9, FALLBACK, 12, FALLBACK], [FALLBACK, 7, 8, 7, 6]])
  assert logits.shape == (2, 5, LOOKUP_V)
  np.testing.assert_array_equal(
      logits, np.where(np.eye(LOOKUP_V, dtype=bool)[first], 0.0, np.float32(layers.MASK_VALUE))
  )


# --- for_target, parameters, settings, gin ------------------------------------------------------
def test_check_params_of_a_bigram_table_takes_any_number_of_successors():
  """`top` is what fitting keeps; the tables of any top serve, those of another vocabulary not."""
  drafter = table_drafters.BigramDrafter(vocab_size=TABLE_V, top=32)
  drafter.check_params(table_drafters.BigramDrafter.fit([np.array([3, 4, 1])], TABLE_V, top=2))
  other = table_drafters.BigramDrafter.fit([], TABLE_V + 1, top=2)
  with pytest.raises(
      InvalidInputError,
      match=rf"the first: backoff is \({TABLE_V + 1},\), the BigramDrafter needs \({TABLE_V},\)",
  ):
    drafter.check_params(other)


def test_for_target_fills_unset_fields_and_rejects_mismatches():
  bigram = table_drafters.BigramDrafter(top=3, backoff=0.2).for_target(10, 1)
  assert (bigram.vocab_size, bigram.eos_id, bigram.top, bigram.backoff) == (10, 1, 3, 0.2)
  lookup = table_drafters.PromptLookupDrafter(ngram=3, fallback_token=4).for_target(10, 2)
  assert (lookup.vocab_size, lookup.eos_id, lookup.ngram, lookup.fallback_token) == (10, 2, 3, 4)
  complete = table_drafters.UnigramDrafter(vocab_size=10, eos_id=1)
  assert complete.for_target(10, 1) is complete
  with pytest.raises(ValueError, match="drafter vocab_size 9 != target vocab_size 10"):
    table_drafters.PromptLookupDrafter(vocab_size=9).for_target(10, 1)
  with pytest.raises(ValueError, match="drafter eos_id 2 != the output vocabulary's eos_id 1"):
    table_drafters.UnigramDrafter(eos_id=2).for_target(10, 1)


def test_check_params_of_prompt_lookup_takes_only_a_tree_without_leaves():
  lookup = table_drafters.PromptLookupDrafter(vocab_size=11)
  lookup.check_params({})
  lookup.check_params(None)
  with pytest.raises(InvalidInputError, match=r"the first: logits \(11,\) is not a parameter"):
    lookup.check_params({"logits": np.zeros(11)})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: table_drafters.PromptLookupDrafter(ngram=0), "ngram must be an integer >= 1"),
        (lambda: table_drafters.PromptLookupDrafter(ngram=2.5), "ngram must be an integer >= 1"),
        (lambda: table_drafters.PromptLookupDrafter(fallback_token=-1), "fallback_token must be"),
        (
            lambda: table_drafters.PromptLookupDrafter(vocab_size=10, fallback_token=10),
            r"fallback_token 10 is outside the vocabulary \[0, 10\)",
        ),
        (
            lambda: table_drafters.PromptLookupDrafter(fallback_token=12).for_target(10, 1),
            "fallback_token 12 is outside",
        ),
        (
            lambda: table_drafters.UnigramDrafter(vocab_size=-3),
            "vocab_size must be an integer >= 0",
        ),
        (
            lambda: table_drafters.UnigramDrafter(smoothing=-1.0),
            "smoothing must be a finite number",
        ),
        (lambda: table_drafters.BigramDrafter(top=0), "top must be an integer >= 1"),
        (lambda: table_drafters.BigramDrafter(backoff=1.0), r"backoff must be in \(0, 1\)"),
        (
            lambda: table_drafters.BigramDrafter.fit([np.array([3, 12])], 10),
            r"token id 12 outside \[0, 10\)",
        ),
        (
            lambda: table_drafters.UnigramDrafter.fit([np.array([3, 12])], 10),
            r"token id 12 outside \[0, 10\)",
        ),
        (lambda: table_drafters.UnigramDrafter.fit([np.array([3, -2])], 10), "token id -2 outside"),
        (lambda: table_drafters.BigramDrafter.fit([np.array([1.5, 2.0])], 10), "integer token ids"),
    ],
)
def test_bad_settings_and_fitting_data_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()


@gin.configurable(module="test_table_drafters")
def _configured(drafter=gin.REQUIRED):
  return drafter


def test_gin_builds_a_drafter_from_a_macro_by_its_drafters_name():
  """The gin names are the `drafters` module's, wherever the class is defined."""
  gin.clear_config()
  try:
    gin.parse_config(
        "DRAFTER = @drafters.BigramDrafter()\n"
        "drafters.BigramDrafter.top = 3\n"
        "test_table_drafters._configured.drafter = %DRAFTER"
    )
    assert gin.query_parameter("drafters.BigramDrafter.top") == 3
    assert str(gin.query_parameter("%DRAFTER")) == "@drafters.BigramDrafter()"
    drafter = _configured()
    assert type(drafter) is table_drafters.BigramDrafter  # pylint: disable=unidiomatic-typecheck
    assert (drafter.top, drafter.vocab_size, drafter.eos_id, drafter.backoff) == (3, 0, None, 0.1)
  finally:
    gin.clear_config()
  with pytest.raises(RuntimeError, match="drafter"):  # gin.REQUIRED: unbound is an error
    _configured()
