"""The draft-length calibration model on values worked out by hand, and the teacher-forced scores
it reads."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import alpha, drafters, models, network
from speculative_t5x.measuring import calibration
from speculative_t5x.weights import pairs

# One sequence of 4 generated positions.
CONFIDENCE = np.array([0.9, 0.2, 0.9, 0.9])
BETA = np.array([0.5, 0.8, 1.0, 0.4])
POSITIONS = calibration.Positions([CONFIDENCE], [BETA])


def test_blocks_by_hand():
  """gamma 2, threshold 0.5. Start 0: confident, so 2 drafts, E[n] = 0.5 + 0.5 * 0.8 = 0.9.
  Start 1: unsure, 1 draft, E[n] = 0.8. Start 2: 2 drafts, 1.0 + 1.0 * 0.4 = 1.4. Start 3: 2
  drafts, the second past the end (beta 0): 0.4."""
  prediction = calibration.predict(POSITIONS, 2, 0.5, c=0.1, verify_cost=1.2)
  assert prediction.drafts_per_call == pytest.approx(7 / 4)
  assert prediction.tokens_per_call == pytest.approx((0.9 + 0.8 + 1.4 + 0.4) / 4 + 1)
  assert prediction.speedup == pytest.approx(1.875 / (0.1 * 1.75 + 1.2))


def test_threshold_zero_is_static_gamma():
  """Start 1 now drafts twice: E[n] = 0.8 + 0.8 * 1.0 = 1.6."""
  prediction = calibration.predict(POSITIONS, 2, 0.0, c=0.1, verify_cost=1.2)
  assert prediction.drafts_per_call == 2.0
  assert prediction.tokens_per_call == pytest.approx((0.9 + 1.6 + 1.4 + 0.4) / 4 + 1)


def test_static_gamma_matches_the_papers_expected_tokens_at_constant_beta():
  """With one beta everywhere (and no end in reach), static gamma gives Eq. (1)."""
  long = calibration.Positions([np.full(2000, 0.5)], [np.full(2000, 0.7)])
  prediction = calibration.predict(long, 4, 0.0, c=0.0, verify_cost=1.0)
  expected = (1 - 0.7**5) / (1 - 0.7)
  assert prediction.tokens_per_call == pytest.approx(expected, rel=2e-3)  # edge: last 4 starts


def test_calibrate_searches_the_grid_and_reports_the_best_static_gamma():
  """c = 1, verify cost 1: static gamma 1 gives 1.675 / 2 = 0.8375; static gamma 2,
  2.075 / 3; threshold 0.5 at gamma 2, 1.875 / 2.75."""
  result = calibration.calibrate(POSITIONS, [1, 2], 1.0, {1: 1.0, 2: 1.0}, thresholds=[0.0, 0.5])
  assert (result.best_static.gamma, result.best_static.threshold) == (1, 0.0)
  assert result.best_static.speedup == pytest.approx(1.675 / 2)
  assert len(result.predictions) == 4
  assert result.best.speedup == max(p.speedup for p in result.predictions)
  # A cheap drafter: drafting on is worth it, the static gamma 2 wins.
  cheap = calibration.calibrate(POSITIONS, [1, 2], 0.01, lambda g: 1.0, thresholds=[0.0, 0.5])
  assert (cheap.best.gamma, cheap.best.threshold) == (2, 0.0)


def test_a_draft_may_cost_a_different_price_at_each_gamma():
  """c per gamma (a draft's price inside the loop): static gamma 1 gives 1.675 tokens per call,
  static gamma 2 2.075 (the test above), each over c(gamma) * drafts + 1."""
  by_gamma = calibration.calibrate(
      POSITIONS, [1, 2], {1: 1.0, 2: 0.01}, {1: 1.0, 2: 1.0}, thresholds=[0.0]
  )
  assert by_gamma.best.gamma == 2
  assert by_gamma.best.speedup == pytest.approx(2.075 / (0.01 * 2 + 1.0))
  assert by_gamma.predictions[0].speedup == pytest.approx(1.675 / (1.0 + 1.0))
  swapped = calibration.calibrate(
      POSITIONS, [1, 2], lambda g: 0.01 if g == 1 else 1.0, lambda g: 1.0, thresholds=[0.0]
  )
  assert swapped.best.gamma == 1
  assert swapped.best.speedup == pytest.approx(1.675 / 1.01)


def test_default_thresholds_are_zero_and_the_measured_percentiles():
  result = calibration.calibrate(POSITIONS, [2], 0.1, {2: 1.2})
  thresholds = sorted({p.threshold for p in result.predictions})
  assert thresholds[0] == 0.0 and thresholds[-1] <= 0.9 and len(thresholds) >= 3


def test_confidence_buckets():
  rows = calibration.confidence_buckets(POSITIONS, [0.0, 0.5, 1.0])
  assert rows[0] == {"low": 0.0, "high": 0.5, "positions": 1, "share": 0.25, "alpha": 0.8}
  assert rows[1]["positions"] == 3 and rows[1]["alpha"] == pytest.approx((0.5 + 1.0 + 0.4) / 3)
  empty = calibration.confidence_buckets(POSITIONS, [0.0, 0.1, 1.0])[0]
  assert empty["positions"] == 0 and empty["alpha"] is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: calibration.Positions([CONFIDENCE], []), "one confidence and one beta"),
        (lambda: calibration.Positions([CONFIDENCE], [BETA[:2]]), "of one length"),
        (
            lambda: calibration.predict(POSITIONS, 2, 0.5, -1.0, 1.0),
            "c must be a finite number >= 0",
        ),
        (lambda: calibration.predict(POSITIONS, 2, 0.5, 0.1, 0.0), r"verify_cost\(2\) must be > 0"),
        (lambda: calibration.calibrate(POSITIONS, [], 0.1, {}), "gammas must be a non-empty"),
        (
            lambda: calibration.calibrate(POSITIONS, [0], 0.1, {0: 1.0}),
            "each of gammas must be an integer >= 1",
        ),
        # NaN and out-of-range values, which gave NaN or impossible figures.
        (
            lambda: calibration.calibrate(
                POSITIONS, [2], 0.1, {2: 1.2}, thresholds=[0.0, math.nan]
            ),
            r"threshold must be a finite number >= 0 and <= 1 \(a confidence.*got nan",
        ),
        (
            lambda: calibration.calibrate(POSITIONS, [2], math.nan, {2: 1.2}),
            r"c must be a finite number >= 0 \(drafter step time over target step time\), got nan",
        ),
        (
            lambda: calibration.Positions([CONFIDENCE], [BETA + 0.6]),
            r"beta of sequence 0 holds 1.1 at position 0: it must be a probability in \[0, 1\]",
        ),
        (
            lambda: calibration.Positions([CONFIDENCE], [BETA - 0.6]),
            r"beta of sequence 0 holds -0.1 at position 0: it must be a probability",
        ),
        (
            lambda: calibration.Positions([np.array([0.9, math.nan, 0.9, 0.9])], [BETA]),
            r"confidence of sequence 0 holds nan at position 1: .* 1 position\(s\) are NaN",
        ),
        (
            lambda: calibration.calibrate(POSITIONS, [2, 4], 0.1, {2: 1.2}),
            r"verify_cost has no entry for gamma \[4\] \(it has \[2\]\): measure",
        ),
        (
            lambda: calibration.calibrate(POSITIONS, [2, 4], {2: 0.1}, {2: 1.2, 4: 1.3}),
            r"c has no entry for gamma \[4\] \(it has \[2\]\): measure a draft's cost",
        ),
        (
            lambda: calibration.calibrate(POSITIONS, [2], {2: math.nan}, {2: 1.2}),
            r"c\(2\) must be a finite number >= 0 \(what a draft costs in target steps",
        ),
    ],
)
def test_bad_input_is_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_positions_are_cut_after_eos():
  sequences = np.array([[5, 1, 0, 0], [5, 6, 7, 8]])
  scores = np.arange(8, dtype=np.float64).reshape(2, 4) / 10
  positions = calibration.positions_from_scores(scores, 1 - scores, sequences, eos_id=1)
  np.testing.assert_allclose(positions.confidence[0], [0.0, 0.1])
  np.testing.assert_allclose(positions.beta[1], 1 - scores[1])
  assert positions.count == 6


def _tiny_pair():
  """-> (target config, target params, a T5 drafter, its params), random."""
  target_config = tiny_config(13)
  drafter_config = target_config.replace(emb_dim=8, num_decoder_layers=1, num_encoder_layers=1)
  target = network.init_params(target_config, jax.random.PRNGKey(0))
  params = network.init_params(drafter_config, jax.random.PRNGKey(1))
  return target_config, target, drafters.T5Drafter(drafter_config), params


def test_scores_are_the_drafters_top_probability_and_alphas_beta():
  target_config, target, drafter, params = _tiny_pair()
  encoder = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]], jnp.int32)
  sequences = jnp.array([[4, 5, 1, 0, 0], [8, 9, 10, 11, 12]], jnp.int32)
  confidence, beta = calibration.score_positions(
      target_config, target, drafter, params, encoder, sequences, 1.0
  )
  logits = drafter.teacher_forced_logits(params, encoder, alpha.shift_right(sequences))
  np.testing.assert_allclose(confidence, jnp.max(jax.nn.softmax(logits), axis=-1), rtol=1e-6)
  beta_sum, count = alpha.beta_totals(
      target_config, target, drafter, params, encoder, sequences, 1, 1.0
  )
  positions = calibration.positions_from_scores(confidence, beta, sequences, 1)
  np.testing.assert_allclose([b.sum() for b in positions.beta], beta_sum, rtol=1e-5)
  assert [len(b) for b in positions.beta] == list(np.asarray(count))


def test_measure_positions_scores_the_targets_own_samples_until_enough():
  """Batch by batch on `alpha.target_samples`, stopping at the first batch that reaches
  num_tokens (the second batch is never read)."""
  target_config, target, drafter, params = _tiny_pair()
  first = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], np.int32)

  def batches():
    yield first
    raise AssertionError("read a batch after num_tokens were counted")

  pair = pairs.Pair(
      pairs.PairConfig(target_config, drafter, random_init_seed=0), drafter, target, params, {}
  )
  positions = calibration.measure_positions(pair, batches(), 6, 1.0, 1, num_tokens=1)
  [(encoder, sequences)] = list(alpha.target_samples(target_config, target, [first], 6, 1, 1.0))
  confidence, beta = calibration.score_positions(
      target_config, target, drafter, params, encoder, sequences, 1.0
  )
  expected = calibration.positions_from_scores(
      np.asarray(confidence), np.asarray(beta), np.asarray(sequences), 1
  )
  assert positions.count == expected.count > 0
  for got, want in zip(positions.beta + positions.confidence, expected.beta + expected.confidence):
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_measure_positions_refuses_a_pair_without_a_drafter():
  target_config, target, _, _ = _tiny_pair()
  pair = pairs.Pair(pairs.PairConfig(target_config, random_init_seed=0), None, target, None, {})
  with pytest.raises(ValueError, match="no drafter"):
    calibration.measure_positions(pair, [], 6, 1.0, 1, num_tokens=1)


def test_chain_decodes_by_hand():
  """One sequence of 2 positions, beta 0.5 each, gamma 1: from 0 the draft is accepted (0.5: the
  call ends past the sequence, 1 call) or not (0.5: a second call from position 1): 1.5 calls.
  Betas 1, 1, 1, 0, 1 at gamma 2: calls from 0 (two drafts, then the target's token at 2), from 3
  (rejected, the target's token at 3), from 4: 3 calls; starting at every position alike
  (`predict`: 2, 2, 1, 0 and 1 accepted from the five starts) would count 1.2 + 1 = 2.2 tokens
  per call instead of 5 / 3. The same at gamma 1: calls from 0 (the target's token at 1), from 2
  (its token at 3) and from 4: 3."""
  half = calibration.Positions([np.zeros(2)], [np.array([0.5, 0.5])])
  assert calibration.chain_decodes(half, 1) == pytest.approx((2.0, 1.5))
  runs = calibration.Positions([np.zeros(5)], [np.array([1.0, 1.0, 1.0, 0.0, 1.0])])
  assert calibration.chain_decodes(runs, 2) == pytest.approx((5.0, 3.0))
  assert calibration.predict(runs, 2, 0.0, 0.0, 1.0).tokens_per_call == pytest.approx(2.2)
  both = calibration.Positions.concatenate([half, runs])
  assert calibration.chain_decodes(both, 1) == pytest.approx((3.5, (1.5 + 3.0) / 2))


def test_chain_decodes_are_the_greedy_decodes_own_target_calls():
  """At temperature 0, on the positions measured along the target's own greedy outputs, each
  sequence's expected calls are the calls the speculative decode makes, exactly: a drafter that
  is the target less a decoder layer agrees with it at some positions and not at others."""
  target_config = tiny_config(13, num_decoder_layers=3)
  target = network.init_params(target_config, jax.random.PRNGKey(0))
  drafter_config, drafter_params = network.without_decoder_layers(target_config, target, (2,))
  drafter = drafters.T5Drafter(drafter_config)
  pair = pairs.Pair(
      pairs.PairConfig(target_config, drafter, random_init_seed=0),
      drafter,
      target,
      drafter_params,
      {},
  )
  encoder = np.array([[3, 4, 5, 6, 0], [6, 7, 2, 0, 0], [9, 8, 7, 6, 5], [2, 3, 0, 0, 0]])
  decode_length = 12
  positions = calibration.measure_positions(pair, [encoder], decode_length, 0.0, 1, 10**6)
  betas = np.concatenate(positions.beta)
  assert 0.2 < betas.mean() < 0.9  # agreement at some positions only
  vocabulary = seqio.PassThroughVocabulary(target_config.vocab_size, eos_id=1)
  for gamma in (1, 3):
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(target_config), drafter, vocabulary, vocabulary, gamma=gamma
    )
    params = {"target": target, "drafter": drafter_params}
    for row, beta in enumerate(positions.beta):
      batch = {
          "encoder_input_tokens": encoder[row : row + 1],
          "decoder_input_tokens": np.zeros((1, decode_length), np.int32),
      }
      _, aux = model.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})
      one = calibration.Positions([np.zeros(len(beta))], [beta])
      calls = calibration.chain_decodes(one, gamma)[1]
      assert calls == int(aux["speculative_stats"]["target_calls"][0]), (gamma, row)
