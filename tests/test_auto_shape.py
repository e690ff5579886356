"""auto_shape: the draft shape chosen from measured costs. The predictions against hand-computed
values, the decision (a shape, or the baseline with the figures that rule the others out), its
cache, the input checks, and one real measurement on a tiny pair."""

import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import draft_shapes
from speculative_t5x import drafters
from speculative_t5x import speculative
from speculative_t5x import table_drafters
from speculative_t5x import validation
from speculative_t5x.measuring import auto_shape
from speculative_t5x.measuring import calibration
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep
from speculative_t5x.measuring import workloads
from speculative_t5x.weights import pairs


def ms(value: float) -> stopwatch.Timing:
  return stopwatch.Timing(value, value, value, 0.0, 3)


def costs(verify_ms: dict[int, float], iteration_ms: float, gamma: int, step_ms: float = 2.0):
  """Costs of a target step of `step_ms`, the target on M + 1 tokens taking verify_ms[M], and an
  iteration of `gamma` drafts taking iteration_ms."""
  return auto_shape.Costs(
      ms(step_ms), {m: ms(t) for m, t in verify_ms.items()}, gamma, iteration=ms(iteration_ms)
  )


def expected_tokens(alpha: float, gamma: int) -> float:
  """Eq. (1), summed term by term: 1 + alpha + ... + alpha^gamma."""
  return sum(alpha**i for i in range(gamma + 1))


# Verification of M + 1 tokens: 2.4, 2.8, 3.2 ms against a 2 ms step (1.2, 1.4, 1.6 steps); an
# iteration of 3 drafts 3.8 ms: 3 drafts cost 0.6 ms, a draft 0.1 target steps.
CHEAP_VERIFY = costs({1: 2.4, 2: 2.8, 3: 3.2}, 3.8, 3)
# Verification of 2-4 tokens costing 2.4 steps, as on a slow machine of the developers' kind.
DEAR_VERIFY = costs({1: 4.8, 2: 4.8, 3: 4.8}, 5.4, 3)


def test_chain_predictions_are_expected_tokens_over_drafts_and_verification():
  auto = auto_shape.Auto(max_gamma=3)
  predictions = auto.predictions(CHEAP_VERIFY, alpha=0.7)
  assert [p.label for p in predictions] == ["gamma 1", "gamma 2", "gamma 3"]
  assert CHEAP_VERIFY.c_loop == pytest.approx(0.1)
  for gamma, p in enumerate(predictions, 1):
    cost = gamma * 0.1 + (1.0 + 0.2 * gamma)
    assert p.shape == draft_shapes.Chain(gamma)
    assert p.expected_tokens == pytest.approx(expected_tokens(0.7, gamma))
    assert p.cost == pytest.approx(cost)
    assert p.speedup == pytest.approx(expected_tokens(0.7, gamma) / cost)


def test_tree_prediction_uses_the_branching_model_and_its_verification():
  """A tree (2, 1) of 4 drafts, depth 2: a_1 = 1 - (1 - alpha)^2, a_2 = alpha; E[tokens] =
  1 + a_1 + a_1 a_2; cost: 2 drafts' rounds and the target on 5 tokens."""
  auto = auto_shape.Auto(max_gamma=2, trees=[(2, 1)])
  verify = costs({1: 2.4, 2: 2.8, 4: 3.6}, 3.0, 2)
  tree = auto.predictions(verify, alpha=0.6)[-1]
  a1 = 1 - 0.4**2
  assert tree.label == "tree 2,1" and tree.shape == draft_shapes.Tree((2, 1))
  assert tree.expected_tokens == pytest.approx(1 + a1 + a1 * 0.6)
  assert tree.cost == pytest.approx(2 * verify.c_loop + 1.8)


def test_timed_loops_price_every_shape_by_its_loop_and_the_baseline_by_its_own():
  """With the loops timed: the baseline's loop 2.2 ms per token (b = 1.1 steps), chains of 1 and
  3 drafts 3.0 and 4.2 ms per call (1.5 and 2.1 steps), gamma 2 on the line between (1.8); the
  tree (2, 1) its own loop, 4.6 ms (2.3 steps), and the 2.4 tokens per call that loop realized.
  No iteration is needed."""
  loop = auto_shape.LoopCosts(
      ms(2.2),
      {"gamma 1": ms(3.0), "gamma 3": ms(4.2), "tree 2,1": ms(4.6)},
      {"gamma 1": 1.6, "gamma 3": 2.2, "tree 2,1": 2.4},
      4,
  )
  timed = auto_shape.Costs(ms(2.0), {3: ms(3.2)}, 3, loop=loop)
  assert timed.baseline_step == pytest.approx(1.1)
  auto = auto_shape.Auto(max_gamma=3, trees=[(2, 1)])
  predictions = auto.predictions(timed, alpha=0.7)
  for gamma, cost in ((1, 1.5), (2, 1.8), (3, 2.1)):
    assert predictions[gamma - 1].cost == pytest.approx(cost)
    assert predictions[gamma - 1].speedup == pytest.approx(expected_tokens(0.7, gamma) * 1.1 / cost)
  tree = predictions[-1]  # its tokens per call as its loop realized them, 2.4
  assert tree.label == "tree 2,1" and tree.cost == pytest.approx(2.3)
  assert tree.expected_tokens == 2.4 and tree.speedup == pytest.approx(2.4 * 1.1 / 2.3)
  record = timed.as_dict()
  assert record["chain_call_cost"] == pytest.approx({"1": 1.5, "2": 1.8, "3": 2.1})
  assert record["loop"]["inputs"] == 4 and record["baseline_loop_step"] == pytest.approx(1.1)
  assert record["c_in_loop"] is None and record["iteration_ms"] is None
  with pytest.raises(ValueError, match="the iteration was not timed"):
    _ = timed.c_loop


def test_the_loop_inputs_span_the_outputs_lengths():
  """Outputs of 9, 13, 5, 5, 41, 5, 16, 7, 5, 5, 13, 16, 20, 5, 17 and 12 tokens: sorted (ties
  in order) rows 2, 3, 5, 8, 9, 13, 7, 0, 15, 1, 10, 6, 11, 14, 12, 4; the 1/8, 3/8, 5/8 and
  7/8 quantiles are its entries 2, 6, 10 and 14: rows 5, 7, 10 and 12 (5, 7, 13 and 20 tokens).
  Positions that are not one sequence per row give the first rows."""
  lengths = [9, 13, 5, 5, 41, 5, 16, 7, 5, 5, 13, 16, 20, 5, 17, 12]
  tokens = np.arange(16)[:, None] * np.ones((1, 3), np.int32)
  positions = calibration.Positions([np.zeros(n) for n in lengths], [np.ones(n) for n in lengths])
  np.testing.assert_array_equal(
      auto_shape.spanning_inputs(tokens, positions, 4)[:, 0], [5, 7, 10, 12]
  )
  np.testing.assert_array_equal(auto_shape.spanning_inputs(tokens[:3], positions, 4), tokens[:3])
  short = calibration.Positions(positions.confidence[:4], positions.beta[:4])
  np.testing.assert_array_equal(auto_shape.spanning_inputs(tokens, short, 4), tokens[:4])


def test_a_decodes_fixed_part_is_fitted_over_the_inputs():
  """t_i = 6 ms + u_i x 2 ms on inputs of 9, 13, 5 and 5 units, in two rounds (the second 10%
  slower): the fit gives back both figures per round. Inputs of one length leave no line to
  fit, nor does a round whose intercept comes out negative: F = 0, x = sum t / sum u."""
  units = np.array([9, 13, 5, 5])
  seconds = np.stack([6e-3 + units * 2e-3, 1.1 * (6e-3 + units * 2e-3)], axis=1)  # [N, rounds]
  per_unit, fixed = auto_shape._fit_decodes(seconds, units)
  np.testing.assert_allclose(per_unit, [2e-3, 2.2e-3])
  np.testing.assert_allclose(fixed, [6e-3, 6.6e-3])
  same = np.array([4, 4, 4, 4])
  per_unit, fixed = auto_shape._fit_decodes(np.stack([same * 3e-3 + 1e-3] * 2, axis=1), same)
  np.testing.assert_allclose(per_unit, [13e-3 / 4] * 2)
  np.testing.assert_array_equal(fixed, 0)
  falling = np.array([[9e-3, 9e-3], [1e-3, 13e-3], [5e-3, 5e-3], [5e-3, 5e-3]])  # round 0: F < 0
  per_unit, fixed = auto_shape._fit_decodes(falling, np.array([9, 1, 5, 5]))
  assert fixed[0] == 0 and per_unit[0] == pytest.approx(20e-3 / 20)
  assert fixed[1] > 0


def test_the_fixed_parts_are_spread_over_the_decodes_tokens_and_calls():
  """One sequence of 4 positions, every draft accepted: 2 calls at gamma 1 (from 0 and 2), 2 at
  gamma 2 (from 0, then 3), 1 at gamma 3. The baseline's loop 2 ms per token + 6 ms per decode;
  the chains of 1 and 3 drafts 3 ms and 4 ms per call + 6 ms and 8 ms per decode (gamma 2: 3.5
  and 7 on the line between). Speedups (6 + 4 x 2) / (F + C L): 14 / 12, 14 / 14, 14 / 12;
  without the fixed parts gamma 1 would be predicted 2 x 2 / 3 = 1.33x."""
  loop = auto_shape.LoopCosts(
      ms(2.0),
      {"gamma 1": ms(3.0), "gamma 3": ms(4.0)},
      {"gamma 1": 2.0, "gamma 3": 4.0},
      4,
      {"baseline": (2.0,), "gamma 1": (3.0,), "gamma 3": (4.0,)},
      {"baseline": ms(6.0), "gamma 1": ms(6.0), "gamma 3": ms(8.0)},
      {"baseline": (6.0,), "gamma 1": (6.0,), "gamma 3": (8.0,)},
  )
  timed = auto_shape.Costs(ms(2.0), {3: ms(3.2)}, 3, loop=loop)
  positions = calibration.Positions([np.full(4, 0.5)], [np.ones(4)])
  predictions = auto_shape.Auto(max_gamma=3).predictions(timed, 1.0, positions)
  assert [p.expected_tokens for p in predictions] == pytest.approx([2.0, 2.0, 4.0])
  assert [p.speedup for p in predictions] == pytest.approx([14 / 12, 14 / 14, 14 / 12])
  assert [p.speedup_low for p in predictions] == pytest.approx([14 / 12, 14 / 14, 14 / 12])
  assert timed.fixed("baseline") == 3.0 and timed.fixed("gamma 2", 2) == 3.5
  assert timed.as_dict()["loop"]["ms_fixed_per_decode"]["gamma 3"]["median_ms"] == 8.0
  plain = auto_shape.Auto(max_gamma=3).predictions(timed, 1.0)  # no positions: no decode
  assert plain[0].speedup == pytest.approx(2 * 2 / 3)


def noisy_loops(baseline_ms, gamma1_ms, gamma3_ms) -> auto_shape.Costs:
  """Costs with the loops timed in three rounds: ms per token (baseline) and per call (chains of
  1 and 3 drafts) round by round; 1.6 and 2.2 tokens per call."""
  loop = auto_shape.LoopCosts(
      ms(float(np.median(baseline_ms))),
      {"gamma 1": ms(float(np.median(gamma1_ms))), "gamma 3": ms(float(np.median(gamma3_ms)))},
      {"gamma 1": 1.6, "gamma 3": 2.2},
      4,
      {"baseline": baseline_ms, "gamma 1": gamma1_ms, "gamma 3": gamma3_ms},
  )
  return auto_shape.Costs(ms(2.0), {3: ms(3.2)}, 3, loop=loop)


def test_each_round_predicts_from_its_own_paired_loops():
  """Round r's ratio is the baseline's loop in round r over the candidate's in round r (gamma 2:
  halfway between the chains of 1 and 3, as the medians are); the lower quartile of tokens x
  ratio (numpy's linear percentile: a quarter of the way from the lowest to the middle of
  three) is the prediction's low."""
  timed = noisy_loops((2.0, 2.4, 2.2), (3.0, 3.0, 3.3), (4.0, 4.8, 4.4))
  np.testing.assert_allclose(timed.round_ratios("gamma 1", 1), [2.0 / 3.0, 0.8, 2.2 / 3.3])
  np.testing.assert_allclose(timed.round_ratios("gamma 2", 2), [2.0 / 3.5, 2.4 / 3.9, 2.2 / 3.85])
  gamma2 = auto_shape.Auto(max_gamma=3).predictions(timed, alpha=0.7)[1]
  low, middle = sorted(expected_tokens(0.7, 2) * np.array([2.0 / 3.5, 2.4 / 3.9, 2.2 / 3.85]))[:2]
  assert gamma2.speedup_low == pytest.approx(low + 0.5 * (middle - low))
  assert gamma2.speedup_low < gamma2.speedup
  assert timed.as_dict()["loop"]["ms_by_round"]["gamma 3"] == [4.0, 4.8, 4.4]
  assert auto_shape.Auto(max_gamma=3).predictions(CHEAP_VERIFY, 0.7)[1].speedup_low is None


def test_a_shape_faster_only_within_the_noise_leaves_the_baseline(measured):
  """Medians that predict about 1.03x for gamma 1, from rounds that swing apart by 20%: the lower
  quartile is below 1, so the baseline is chosen, and the reason says the noise decided; the
  same medians from steady rounds choose gamma 1."""
  tokens = 1.6  # gamma 1's tokens per call at alpha 0.6 (Eq. 1)
  swinging = noisy_loops((2.6, 3.6, 3.1), (5.0, 4.0, 4.8), (7.0, 7.5, 8.0))
  measured(swinging)
  choice = choose(auto_shape.Auto(max_gamma=3), 0.6)
  gamma1 = choice.predictions[0]
  assert choice.best is gamma1 and gamma1.speedup == pytest.approx(tokens * 3.1 / 4.8)
  assert gamma1.speedup > 1 > gamma1.speedup_low and choice.shape is None
  assert "beyond the timing noise" in choice.reason() and "lower quartile" in choice.reason()
  assert "(low 0.9" in choice.summary() and choice.as_dict()["chosen"]["label"] == "baseline"
  measured(noisy_loops((3.1, 3.1, 3.1), (4.8, 4.8, 4.8), (7.0, 7.5, 8.0)))
  steady = choose(auto_shape.Auto(max_gamma=3), 0.6, params={"w": np.ones(3, np.float32)})
  assert steady.shape == draft_shapes.Chain(1)
  assert steady.chosen.speedup_low == pytest.approx(steady.chosen.speedup)  # no spread


def test_per_position_acceptance_counts_runs_of_acceptances():
  """Betas that come in runs (1, 1, 0, 1, 1, 0, ...) give more tokens per call at gamma 2 than
  their mean alpha = 2/3 does under Eq. (1): the per-position model follows the runs, and the
  calls start where the decode starts them (`calibration.chain_decodes`): every call at a run's
  start, its two drafts accepted, then the target's token at the 0: 3 tokens per call (calls
  starting at every phase alike would give 2: 2 + 1, 1 + 1, 0 + 1)."""
  beta = np.tile([1.0, 1.0, 0.0], 200)
  positions = calibration.Positions([np.full(600, 0.5)], [beta])
  auto = auto_shape.Auto(max_gamma=2)
  runs = auto.predictions(CHEAP_VERIFY, float(beta.mean()), positions)[1]
  iid = auto.predictions(CHEAP_VERIFY, float(beta.mean()))[1]
  assert runs.expected_tokens == pytest.approx(3.0)
  assert iid.expected_tokens == pytest.approx(expected_tokens(2 / 3, 2))


@pytest.fixture
def measured(monkeypatch):
  """Auto.measure replaced by given costs; -> a list recording every call."""
  calls = []

  def install(fixed):
    def measure(self, *args):
      calls.append(args)
      return fixed, 1.5, 0.5, 3

    monkeypatch.setattr(auto_shape.Auto, "measure", measure)
    return calls

  return install


CONFIG = tiny_config(vocab_size=32)
DRAFTER = drafters.T5Drafter(tiny_config(vocab_size=32, num_decoder_layers=1))
GEOMETRY = step_costs.DecodeGeometry.for_decoding(8, 16, 4, 2)


def choose(auto, acceptance, params=None, temperature=0.0):
  params = params if params is not None else {"w": np.zeros(3, np.float32)}
  return auto.choose(CONFIG, params, DRAFTER, params, GEOMETRY, temperature, acceptance)


def test_the_best_predicted_shape_is_chosen_and_cached(measured):
  calls = measured(CHEAP_VERIFY)
  auto = auto_shape.Auto(max_gamma=3)
  choice = choose(auto, 0.8)
  best = max(auto.predictions(CHEAP_VERIFY, 0.8), key=lambda p: p.speedup)
  assert choice.shape == best.shape and choice.chosen == choice.best == best
  assert best.speedup > 1 and not choice.cached
  assert f"predicted {best.speedup:.2f}x" in choice.reason()
  record = choice.as_dict()
  assert record["chosen"]["label"] == best.label and len(record["predictions"]) == 3
  assert record["measurement"]["compile_seconds"] == 1.5
  assert record["costs"]["verify_cost"] == {"2": 1.2, "3": 1.4, "4": 1.6}
  again = choose(auto, 0.8)
  assert again.cached and again.chosen == choice.chosen and len(calls) == 1
  assert "reused" in again.summary()
  choose(auto, 0.8, temperature=1.0)  # another temperature: measured again
  choose(auto, 0.8, params={"w": np.ones(3, np.float32)})  # other weights: measured again
  assert len(calls) == 3


def test_the_baseline_is_chosen_where_verification_is_dear(measured):
  """Where 2-4 tokens cost 2.4 steps no chain reaches 1x: the baseline, and the reason names the
  verification's cost; the best speculative shape is still reported (the demo decodes it)."""
  measured(DEAR_VERIFY)
  choice = choose(auto_shape.Auto(max_gamma=3), 0.65)
  assert choice.shape is None and choice.chosen.label == auto_shape.BASELINE
  assert choice.best.shape is not None and choice.best.speedup < 1
  assert choice.speculative is choice.best  # what the demo still decodes
  assert "a verification of 4 tokens costs 2.40 target steps" in choice.reason()
  assert "about 1" in choice.reason()


def test_where_the_baseline_is_chosen_the_timed_chain_within_the_margin_is_shown(measured):
  """The loops of the margin test at alpha 0.55 with min_speedup 1.1: nothing clears it, the
  baseline is chosen, and the candidate shown is the timed gamma 3, not gamma 2, 1.4% faster."""
  measured(noisy_loops((2.2, 2.2, 2.2), (3.4, 3.4, 3.4), (4.2, 4.2, 4.2)))
  choice = choose(auto_shape.Auto(max_gamma=3, min_speedup=1.1), 0.55)
  assert choice.shape is None and choice.best.label == "gamma 2"
  assert choice.speculative.label == "gamma 3"


def test_where_the_baseline_is_chosen_an_untimed_chain_is_not_shown_whatever_its_margin(measured):
  """Loops of 2.2 ms per token and 3.4 / 4.4 ms per call (chains of 1 and 3 drafts) at alpha
  0.55: gamma 2 (3.9 ms per call, read off the line) is predicted 1.8525 x 2.2 / 3.9 = 1.045x,
  3.5% above the timed gamma 3's 2.0189 x 2.2 / 4.4 = 1.009x, beyond the 3% margin, and nothing
  clears min_speedup 1.2: the candidate shown is gamma 3, whose programs the timing compiled.
  (Another min_speedup than the test above's: a decision is cached by the Auto, not the costs.)"""
  measured(noisy_loops((2.2, 2.2, 2.2), (3.4, 3.4, 3.4), (4.4, 4.4, 4.4)))
  choice = choose(auto_shape.Auto(max_gamma=3, min_speedup=1.2), 0.55)
  gamma1, gamma2, gamma3 = choice.predictions
  assert gamma2.speedup == pytest.approx(1.8525 * 2.2 / 3.9)
  assert gamma2.speedup > 1.03 * max(gamma1.speedup, gamma3.speedup)
  assert choice.shape is None and choice.best is gamma2
  assert choice.speculative is gamma3
  assert choice.as_dict()["shown_speculative"]["label"] == "gamma 3"


def test_a_minimum_speedup_keeps_marginal_shapes_out(measured):
  measured(CHEAP_VERIFY)
  best = max(auto_shape.Auto(max_gamma=3).predictions(CHEAP_VERIFY, 0.5), key=lambda p: p.speedup)
  assert 1 < best.speedup < 1.2
  assert choose(auto_shape.Auto(max_gamma=3, min_speedup=1.2), 0.5).shape is None
  assert choose(auto_shape.Auto(max_gamma=3, min_speedup=1.0), 0.5).shape == best.shape


def test_an_interpolated_chain_must_beat_the_timed_ones_by_the_margin(measured):
  """Steady loops of 2.2 ms per token (the baseline) and 3.4 / 4.2 ms per call (chains of 1 and
  3 drafts) at alpha 0.55: gamma 2, its call read off the line (3.8 ms), is predicted
  1.8525 x 2.2 / 3.8 = 1.0725x, 1.4% above the timed gamma 3's 2.0189 x 2.2 / 4.2 = 1.0575x.
  The default 3% margin takes gamma 3 and says why; a 1% margin, or none, takes gamma 2."""
  measured(noisy_loops((2.2, 2.2, 2.2), (3.4, 3.4, 3.4), (4.2, 4.2, 4.2)))
  choice = choose(auto_shape.Auto(max_gamma=3), 0.55)
  gamma2, gamma3 = choice.predictions[1:]
  assert gamma2.speedup == pytest.approx(1.8525 * 2.2 / 3.8)
  assert gamma3.speedup == pytest.approx((1 + 0.55 + 0.55**2 + 0.55**3) * 2.2 / 4.2)
  assert choice.best is gamma2 and choice.chosen is gamma3 and choice.speculative is gamma3
  assert "gamma 2, its loop not timed, is predicted 1.07x" in choice.reason()
  assert "interpolation margin, 3%" in choice.reason()
  for margin in (0.01, 0.0):
    assert choose(auto_shape.Auto(max_gamma=3, interpolation_margin=margin), 0.55).chosen == gamma2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_gamma=0), "max_gamma must be"),
        (dict(interpolation_margin=-0.1), "interpolation_margin must be"),
        (dict(max_gamma=2.5), "max_gamma must be"),
        (dict(budget_s=-1), "budget_s must be"),
        (dict(min_speedup=float("nan")), "min_speedup must be"),
        (dict(trees="2,2,1"), "trees must be a sequence of branchings"),
        (dict(trees=[(2, 0)]), r"each of trees must be a branching, .* got \(2, 0\)"),
        (dict(trees=[5]), "each of trees must be a branching"),
    ],
)
def test_bad_settings_are_refused_at_construction(kwargs, message):
  with pytest.raises(validation.InvalidInputError, match=message):
    auto_shape.Auto(**kwargs)


def test_bad_acceptance_and_a_chain_only_drafter_with_trees_are_refused(measured):
  measured(CHEAP_VERIFY)
  for acceptance in (1.5, -0.1, float("nan"), "0.5"):
    with pytest.raises(validation.InvalidInputError, match="acceptance must be"):
      choose(auto_shape.Auto(), acceptance)
  with pytest.raises(validation.InvalidInputError, match="proposes chains only"):
    auto_shape.Auto(trees=[(2, 1)]).choose(
        CONFIG, {}, table_drafters.PromptLookupDrafter(), {}, GEOMETRY, 0.0, 0.5
    )


def test_a_real_measurement_on_a_tiny_pair():
  """The steps are compiled and timed on this machine: every cost is a positive time, the
  rounds fill the budget (at least MIN_ROUNDS), and the shared step programs compile once."""
  target_params = workloads.random_params(CONFIG, 0)
  drafter_params = workloads.random_params(DRAFTER.config, 1)
  auto = auto_shape.Auto(max_gamma=2, budget_s=1.0)
  geometry = step_costs.DecodeGeometry.for_decoding(8, 32, 3, 8)  # tiny steps: 8 per call
  measured, compile_s, timing_s, rounds = auto.measure(
      CONFIG, target_params, DRAFTER, drafter_params, geometry, 1.0
  )
  assert auto_shape.MIN_ROUNDS <= rounds <= auto_shape.MAX_ROUNDS
  assert compile_s > 0 and timing_s > 0
  assert sorted(measured.verify) == [1, 2] and measured.gamma == 2
  assert measured.target_step.median_ms > 0 and measured.target_step.repeats == rounds
  assert all(measured.verify_cost(m) > 0 for m in (1, 2)) and measured.c_loop >= 0
  steps = {("target", 2): [step_costs.Stage(CONFIG, target_params, 2)]}
  first = step_costs.decode_step_calls(steps, geometry, temperature=1.0)
  again = step_costs.decode_step_calls(steps, geometry, temperature=1.0)
  assert all(first[name][0] is again[name][0] for name in first)  # one compiled program


def test_a_real_measurement_of_the_loops_on_a_tiny_pair():
  """With inputs, the baseline's loop, the chains' of 1 and G drafts and the tree's are timed on
  them: every time positive, tokens per call within 1..D + 1, the verification at G + 1 tokens
  alone of the target's k-token steps; the decoders are the ones a sweep of the same vocabulary
  reuses."""
  target_params = workloads.random_params(CONFIG, 0)
  drafter_params = workloads.random_params(DRAFTER.config, 1)
  vocabulary = seqio.PassThroughVocabulary(CONFIG.vocab_size, eos_id=1)
  tokens = np.random.default_rng(0).integers(2, CONFIG.vocab_size, (2, 8))
  inputs = auto_shape.LoopInputs(tokens, 8, vocabulary)
  auto = auto_shape.Auto(max_gamma=2, trees=[(2, 1)], budget_s=0.5)
  geometry = step_costs.DecodeGeometry.for_decoding(8, 48, 5, 8)  # 32 extra steps: resolvable
  measured = auto.measure(CONFIG, target_params, DRAFTER, drafter_params, geometry, 0.0, inputs)[0]
  loop = measured.loop
  assert loop is not None and loop.inputs == 2
  assert list(loop.call) == ["gamma 1", "gamma 2", "tree 2,1"]
  assert sorted(measured.verify) == [2] and measured.iteration is None
  assert loop.baseline_token.median_ms > 0 and all(t.median_ms > 0 for t in loop.call.values())
  assert all(1 <= loop.tokens_per_call[f"gamma {g}"] <= g + 1 for g in (1, 2))
  assert 1 <= loop.tokens_per_call["tree 2,1"] <= 3  # depth 2: at most 2 drafts and a token
  assert measured.chain_cost(2) == pytest.approx(
      loop.call["gamma 2"].median_ms / measured.target_step.median_ms
  )
  setting = sweep.SweepSetting("x", "x", draft_shapes.Chain(2), speculative.ALGORITHM_1)
  twice = [
      sweep.build_settings(
          CONFIG, target_params, {"x": (DRAFTER, drafter_params)}, [setting], vocabulary
      )
      for _ in range(2)
  ]
  assert twice[0][setting.key].predict is twice[1][setting.key].predict


def test_the_loops_time_each_inputs_decode_and_one_prefill_per_loop():
  """The inputs share their shapes, and so one prefill: each loop's is timed once per round and
  taken off every input's decode, not timed again per input. Nothing is compiled here."""
  target_params = workloads.random_params(CONFIG, 0)
  drafter_params = workloads.random_params(DRAFTER.config, 1)
  vocabulary = seqio.PassThroughVocabulary(CONFIG.vocab_size, eos_id=1)
  inputs = auto_shape.LoopInputs(np.full((3, 8), 5), 8, vocabulary)
  calls = auto_shape._loop_calls(
      CONFIG,
      target_params,
      DRAFTER,
      drafter_params,
      {"gamma 1": draft_shapes.Chain(1)},
      inputs,
      0.0,
  )
  labels = (auto_shape.BASELINE, "gamma 1")
  assert sorted(calls, key=str) == sorted(
      [("loop", label, i, "decode") for label in labels for i in range(3)]
      + [("loop", label, "prefill") for label in labels],
      key=str,
  )


def test_with_the_loops_timed_the_steps_are_greedy_at_every_temperature(monkeypatch):
  """The steps are the unit of loop-timed predictions only: at temperature 1 they are timed at the
  greedy draw (the programs a temperature-0 choice compiled), and at the temperature where no
  loop is timed. Stopped at the step calls, before anything compiles."""
  temperatures = []

  class Stop(Exception):
    pass

  def decode_step_calls(steps, geometry, *, temperature):
    temperatures.append(temperature)
    raise Stop

  monkeypatch.setattr(auto_shape.step_costs, "decode_step_calls", decode_step_calls)
  vocabulary = seqio.PassThroughVocabulary(CONFIG.vocab_size, eos_id=1)
  inputs = auto_shape.LoopInputs(np.full((1, 8), 5), 8, vocabulary)
  target_params = workloads.random_params(CONFIG, 0)
  drafter_params = workloads.random_params(DRAFTER.config, 1)
  for loop_inputs in (inputs, None):
    with pytest.raises(Stop):
      auto_shape.Auto(max_gamma=2).measure(
          CONFIG, target_params, DRAFTER, drafter_params, GEOMETRY, 1.0, loop_inputs
      )
  assert temperatures == [0.0, 1.0]


@pytest.mark.parametrize(
    "tokens, length, eos, message",
    [
        (np.zeros((0, 4), np.int32), 8, 1, r"encoder_tokens must be token ids \[N, Le\]"),
        (np.ones(4, np.int32), 8, 1, r"encoder_tokens must be token ids \[N, Le\]"),
        (np.ones((2, 4), np.float32), 8, 1, r"encoder_tokens must be token ids \[N, Le\]"),
        (np.ones((2, 4), np.int32), 0, 1, "decode_length must be"),
        (np.ones((2, 4), np.int32), 8, 0, "eos"),
    ],
)
def test_bad_loop_inputs_are_refused(tokens, length, eos, message):
  vocabulary = seqio.PassThroughVocabulary(32, eos_id=eos)
  with pytest.raises(validation.InvalidInputError, match=message):
    auto_shape.LoopInputs(tokens, length, vocabulary)


def test_loops_within_the_noise_are_refused_not_priced():
  """A loop whose decodes took no longer than their prefills cannot be priced: a ValueError that
  names it (Auto.measure then times more rounds, up to MAX_ROUNDS)."""
  vocabulary = seqio.PassThroughVocabulary(32, eos_id=1)
  inputs = auto_shape.LoopInputs(np.full((1, 4), 5), 4, vocabulary)
  decodes = np.array([[5, 1, 0, 0]])
  stats = {"speculative_stats": {"target_calls": np.array([1])}}
  outputs = {
      ("loop", auto_shape.BASELINE, 0, "decode"): (decodes, {}),
      ("loop", "gamma 1", 0, "decode"): (decodes, stats),
  }
  seconds = {
      ("loop", auto_shape.BASELINE, 0, "decode"): np.array([2.0, 2.0, 2.0]),
      ("loop", auto_shape.BASELINE, "prefill"): np.array([1.0, 1.0, 1.0]),
      ("loop", "gamma 1", 0, "decode"): np.array([1.0, 1.0, 1.0]),
      ("loop", "gamma 1", "prefill"): np.array([1.0, 1.2, 0.9]),
  }
  with pytest.raises(ValueError, match="could not resolve the gamma 1 loop's time on 1 inputs"):
    auto_shape._loop_costs(seconds, outputs, inputs)
  seconds["loop", "gamma 1", 0, "decode"] = np.array([1.5, 1.5, 1.5])
  loop = auto_shape._loop_costs(seconds, outputs, inputs)
  assert loop.baseline_token.median_ms == pytest.approx(500.0)  # 1 s over 2 tokens
  assert loop.call["gamma 1"].median_ms == pytest.approx(500.0)  # 0.5 s over 1 call
  assert loop.tokens_per_call["gamma 1"] == 2


def test_a_loop_whose_fit_falls_with_its_tokens_is_priced_through_the_origin():
  """Two inputs of 2 and 4 tokens whose decodes took 3 s and 2 s beyond their prefills: the fit
  gives a negative time per token (a fixed part of 4 s), which is the noise hiding the line, not
  a price: the loop is priced through the origin, 5 s over 6 tokens, F = 0."""
  vocabulary = seqio.PassThroughVocabulary(32, eos_id=1)
  inputs = auto_shape.LoopInputs(np.full((2, 4), 5), 4, vocabulary)
  stats = {"speculative_stats": {"target_calls": np.array([1])}}
  short, long = np.array([[5, 1, 0, 0]]), np.array([[5, 5, 5, 1]])
  outputs = {
      ("loop", auto_shape.BASELINE, 0, "decode"): (short, {}),
      ("loop", auto_shape.BASELINE, 1, "decode"): (long, {}),
      ("loop", "gamma 1", 0, "decode"): (short, stats),
      ("loop", "gamma 1", 1, "decode"): (long, stats),
  }
  seconds = {
      ("loop", auto_shape.BASELINE, 0, "decode"): np.array([4.0, 4.0, 4.0]),
      ("loop", auto_shape.BASELINE, 1, "decode"): np.array([3.0, 3.0, 3.0]),
      ("loop", auto_shape.BASELINE, "prefill"): np.array([1.0, 1.0, 1.0]),
      ("loop", "gamma 1", 0, "decode"): np.array([2.0, 2.0, 2.0]),
      ("loop", "gamma 1", 1, "decode"): np.array([2.0, 2.0, 2.0]),
      ("loop", "gamma 1", "prefill"): np.array([1.0, 1.0, 1.0]),
  }
  falling = auto_shape._loop_costs(seconds, outputs, inputs)
  assert falling.baseline_token.median_ms == pytest.approx(5000.0 / 6)
  assert falling.fixed[auto_shape.BASELINE].median_ms == 0.0
  seconds["loop", auto_shape.BASELINE, 1, "decode"] = np.array([5.0, 5.0, 5.0])
  loop = auto_shape._loop_costs(seconds, outputs, inputs)
  assert loop.baseline_token.median_ms == pytest.approx(500.0)  # 1 s more for 2 tokens more
  assert loop.fixed[auto_shape.BASELINE].median_ms == pytest.approx(2000.0)


def test_choose_for_pair_reads_a_recorded_acceptance_and_records_a_measured_one(
    measured, monkeypatch, tmp_path
):
  """With an acceptance file: record=True measures and writes; a later call finds the record of
  the same pair, temperature, length and inputs and measures nothing, saying where alpha came
  from; another temperature has no record and is measured. record=True needs a file."""
  measured(CHEAP_VERIFY)
  measurements = []

  def measure_acceptance(pair, batches, decode_length, temperature, eos_id, num_tokens):
    measurements.append(temperature)
    return calibration.Positions([np.array([0.5, 1.0])], [np.array([0.8, 0.6])])

  monkeypatch.setattr(auto_shape, "measure_acceptance", measure_acceptance)
  params = {"w": np.zeros(3, np.float32)}
  pair = pairs.Pair(
      pairs.PairConfig(CONFIG, DRAFTER, random_init_seed=0), DRAFTER, params, params, {}
  )
  tokens = np.array([[5, 6, 1], [7, 1, 0]], np.int32)
  vocabulary = seqio.PassThroughVocabulary(CONFIG.vocab_size, eos_id=1)
  path = tmp_path / "acceptance.json"
  auto = auto_shape.Auto(max_gamma=3)

  def choose_for(temperature, **kwargs):
    return auto.choose_for_pair(
        pair, tokens, 8, GEOMETRY, temperature, vocabulary, "sentences", **kwargs
    )

  first = choose_for(0.0, acceptance_file=path, record=True)
  assert measurements == [0.0] and first.alpha == pytest.approx(0.7)
  assert first.alpha_source == (
      f"measured on the 2 tokens the target generated for 2 sentences, recorded in {path}"
  )
  again = choose_for(0.0, acceptance_file=path)
  assert measurements == [0.0] and again.alpha == first.alpha  # read, not measured
  assert again.alpha_source == (
      f"recorded in {path} for this pair and these sentences: the 2 tokens the target generated "
      "for 2 sentences"
  )
  hot = choose_for(1.0, acceptance_file=path)
  assert measurements == [0.0, 1.0] and hot.alpha_source.startswith("measured on")
  choose_for(0.0)  # no file: measured
  assert measurements == [0.0, 1.0, 0.0]
  with pytest.raises(validation.InvalidInputError, match="record=True writes .*: give one"):
    choose_for(0.0, record=True)
