"""report.py: the Table 2 row's formulas on given timings and its Markdown. Every expected number
is worked out by hand in the comments; no timing is measured."""

import json
import math

import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import draft_shapes
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch

GEOMETRY = step_costs.DecodeGeometry(4, 8, 0, 1)
CHAIN = draft_shapes.Chain(2)


def ms(value):
  return stopwatch.Timing(value, value, value, 0.0, 3)


def stats(target_calls, accepted, beta_sum, beta_count, gamma=2):
  return decoding.SpeculativeStats(
      target_calls=np.array([target_calls]),
      drafter_calls=np.array([gamma * target_calls]),
      drafted_tokens=np.array([gamma * target_calls]),
      accepted_tokens=np.array([accepted]),
      beta_sum=np.array([beta_sum], np.float32),
      beta_count=np.array([beta_count]),
  )


# c = 0.5 / 2 = 0.25; verify cost = 3 / 2 = 1.5; iteration cost = 5 / 2 = 2.5; interference =
# 5 - (2 * 0.5 + 3) = 1 ms.
COSTS = step_costs.DecodeCosts(
    GEOMETRY, target_step=ms(2.0), drafter_step=ms(0.5), verify={2: ms(3.0)}, iteration={2: ms(5.0)}
)


def two_examples():
  """Baseline: 10 and 30 ms (prefills 2 and 4 ms), 10 and 20 tokens. Speculative: 4 and 15 ms
  (prefills 1 and 3 ms), 10 and 25 tokens (a sampled decode of another length); the first
  example's decode equals the baseline's, the second's does not. Stats: 4 + 10 target calls, 6 + 15
  accepted drafts, beta 6/8 + 12/16."""
  baseline = [
      report.ExampleResult(ms(10.0), ms(2.0), np.array([[5, 6, 1, 0]]), 10),
      report.ExampleResult(ms(30.0), ms(4.0), np.array([[7, 1, 0, 0]]), 20),
  ]
  speculative = [
      report.ExampleResult(ms(4.0), ms(1.0), np.array([[5, 6, 1, 0]]), 10, stats(4, 6, 6.0, 8)),
      report.ExampleResult(
          ms(15.0), ms(3.0), np.array([[8, 1, 0, 0]]), 25, stats(10, 15, 12.0, 16)
      ),
  ]
  return baseline, speculative


def make_row():
  baseline, speculative = two_examples()
  return report.SpeedupRow.from_results("task", "d", 0.0, CHAIN, COSTS, baseline, speculative)


def test_row_measured_values_from_known_inputs():
  row = make_row()
  # alpha = (6 + 12) / (8 + 16); tokens per call = (21 accepted + 14 calls) / 14 calls;
  # acceptance = 21 accepted / 28 drafted.
  assert (row.alpha, row.tokens_per_target_call, row.acceptance_rate) == (0.75, 2.5, 0.75)
  assert row.stat_totals["target_calls"] == 14 and row.stat_totals["beta_count"] == 24
  assert (row.c, row.verify_cost, row.iteration_cost) == (0.25, 1.5, 2.5)
  assert row.interference_ms == pytest.approx(1.0)
  assert row.c_in_loop == pytest.approx(0.5)  # (5 ms iteration - 3 ms verify) / 2 drafts / 2 ms
  assert row.outputs_match_baseline == 0.5
  assert row.baseline_tokens == (10, 20) and row.speculative_tokens == (10, 25)


def test_per_token_and_per_example_speedups_are_different_quantities():
  row = make_row()
  # Per token: (40 ms / 30 tokens) / (19 ms / 35 tokens) = 140 / 57.
  assert row.speedup == pytest.approx(140 / 57)
  # Per example: mean(10 / 4, 30 / 15) = mean(2.5, 2.0).
  assert row.speedup_per_example == pytest.approx(2.25)
  # Loop: ((40 - 6) ms / 30 tokens) / ((19 - 4) ms / 35 tokens) = 119 / 45.
  assert row.loop_speedup == pytest.approx(119 / 45)


def test_row_predictions_and_efficiencies_from_known_inputs():
  row = make_row()
  # E[tokens](0.75, 2) = (1 - 0.75^3) / 0.25 = 2.3125.
  assert row.predicted == pytest.approx(2.3125 / (2 * 0.25 + 1))  # Theorem 3.8: 37 / 24
  assert row.predicted_hw == pytest.approx(2.3125 / (2 * 0.25 + 1.5))  # 37 / 32
  assert row.predicted_hw_realized == pytest.approx(2.5 / (2 * 0.25 + 1.5))  # 1.25
  assert row.predicted_in_situ == pytest.approx(2.3125 / 2.5)  # 0.925
  assert row.efficiency == pytest.approx((119 / 45) / (37 / 32))
  assert row.efficiency_realized == pytest.approx((119 / 45) / 1.25)
  assert row.efficiency_in_situ == pytest.approx((119 / 45) / 0.925)


def test_identical_examples_give_one_speedup_per_token_and_per_example():
  baseline = [report.ExampleResult(ms(12.0), ms(2.0), np.array([[4, 1]]), 8)] * 2
  speculative = [
      report.ExampleResult(ms(4.0), ms(1.0), np.array([[4, 1]]), 8, stats(3, 5, 5.0, 6))
  ] * 2
  row = report.SpeedupRow.from_results("t", "d", 0.0, CHAIN, COSTS, baseline, speculative)
  assert row.speedup == pytest.approx(3.0) and row.speedup_per_example == pytest.approx(3.0)
  assert row.loop_speedup == pytest.approx(10 / 3) and row.outputs_match_baseline == 1.0


def test_a_tree_row_asks_its_shape_and_predicts_from_its_realized_tokens_only():
  """A tree of branching (2, 1): M = 4 drafts of depth D = 2, parents (0, 0, 1, 2). Its
  verification is the target on 5 tokens (4 ms / 2 ms = 2.0); Theorem 3.8 and the chain's timed iteration describe chains, so those
  columns are NaN, and the rest is measured as for a chain."""
  baseline, speculative = two_examples()
  costs = step_costs.DecodeCosts(
      GEOMETRY, target_step=ms(2.0), drafter_step=ms(0.5), verify={4: ms(4.0)}, iteration={}
  )
  tree = draft_shapes.Tree((2, 1))
  row = report.SpeedupRow.from_results("t", "d", 1.0, tree, costs, baseline, speculative)
  assert (row.gamma, row.c, row.verify_cost, row.tokens_per_target_call) == (2, 0.25, 2.0, 2.5)
  for nan in ("predicted", "predicted_hw", "iteration_cost", "interference_ms", "c_in_loop"):
    assert math.isnan(getattr(row, nan)), nan
  assert math.isnan(row.predicted_in_situ) and math.isnan(row.efficiency)
  assert row.predicted_hw_realized == pytest.approx(2.5 / (2 * 0.25 + 2.0))  # 1.0
  assert row.efficiency_realized == pytest.approx(119 / 45)
  record = json.loads(json.dumps(row.as_dict()))
  assert (record["gamma"], record["draft_tree"]) == (2, [0, 0, 1, 2])
  assert json.loads(json.dumps(make_row().as_dict()))["draft_tree"] is None
  assert report.plain_summary([row]) == (
      "  d, 4 drafts in a tree of depth 2, temperature 1: speedup 2.46x per token\n"
      "    per example: baseline 20.0 ms, speculative 9.5 ms; alpha 0.75, 2.50 tokens per "
      "target call\n"
      "    in target steps: a verification of 5 tokens 2.00\n"
  )


def test_as_dict_is_the_results_json_row():
  row = make_row()
  record = json.loads(json.dumps(row.as_dict()))
  assert {
      "task",
      "drafter",
      "temperature",
      "gamma",
      "alpha",
      "tokens_per_target_call",
      "c",
      "verify_cost",
      "speedup",
      "speedup_per_example",
      "loop_speedup",
      "predicted",
      "predicted_hw",
      "efficiency",
      "predicted_hw_realized",
      "efficiency_realized",
      "iteration_cost",
      "interference_ms",
      "predicted_in_situ",
      "efficiency_in_situ",
      "outputs_match_baseline",
      "baseline_tokens",
      "speculative_tokens",
      "stats",
  } <= set(record)
  assert record["speedup"] == pytest.approx(140 / 57)
  assert record["baseline_ms"]["mean_median_ms"] == 20.0
  assert record["speculative_prefill_ms"]["mean_median_ms"] == 2.0
  assert [t["median_ms"] for t in record["speculative_ms"]["per_example"]] == [4.0, 15.0]
  assert record["stats"]["alpha"] == 0.75 and record["stats"]["accepted_tokens"] == 21


def test_row_needs_matching_examples_and_stats():
  baseline, speculative = two_examples()
  with pytest.raises(ValueError, match="same examples, got 2 and 1"):
    report.SpeedupRow.from_results("t", "d", 0.0, CHAIN, COSTS, baseline, speculative[:1])
  no_stats = [report.ExampleResult(r.timing, r.prefill, r.decodes, r.tokens) for r in speculative]
  with pytest.raises(ValueError, match="has no stats"):
    report.SpeedupRow.from_results("t", "d", 0.0, CHAIN, COSTS, baseline, no_stats)
  with pytest.raises(ValueError, match="no timing for gamma=3"):
    report.SpeedupRow.from_results(
        "t", "d", 0.0, draft_shapes.Chain(3), COSTS, baseline, speculative
    )


def test_example_result_from_a_decode():
  decodes = np.array([[5, 6, 1, 0], [7, 8, 9, 9]])  # 3 tokens up to EOS; no EOS: all 4.
  aux = {"scores": np.zeros(2), "speculative_stats": stats(4, 6, 6.0, 8).as_dict()}
  result = report.ExampleResult.from_decode(ms(1.0), ms(0.5), decodes, aux, eos_id=1)
  assert result.tokens == 7 and result.stats.tokens_per_call == 2.5
  assert report.ExampleResult.from_decode(ms(1.0), ms(0.5), decodes, {}, 1).stats is None


def test_markdown_table_and_costs_table():
  row = make_row()
  table = report.markdown_table([row])
  assert table.startswith("| " + " | ".join(report.COLUMNS) + " |\n")
  assert (
      "| task | d | 0 | 2 | 0.750 | 2.50 | 0.250 | 0.500 | 1.50 | 20.0 (0.0) | 9.5 (0.0) | "
      "3.0 / 2.0 | 2.46 | 2.25 | 2.64 | 1.54 | 1.16 | 2.29 | 2.12 | 2.50 | 2.86 |"
  ) in table
  costs = report.costs_table({0.0: {"d": COSTS}})
  assert "| 0 | d | 2.000 | 0.500 | 0.250 | 2: 1.50 | 2: 0.500 | 2: 2.50 | 2: 1.000 |" in costs
  full = report.results_markdown([row], {0.0: {"d": COSTS}}, "Header.")
  assert full.startswith("Header.\n\n| task |") and report.NOTES in full and costs in full
  assert report.costs_as_dict({1.0: {"d": COSTS}})["t=1"]["d"]["c"] == 0.25


def test_plain_summary_gives_a_newcomer_the_few_figures_that_matter():
  summary = report.plain_summary([make_row()])
  assert summary == (
      "  d, gamma 2, temperature 0: speedup 2.46x per token\n"
      "    per example: baseline 20.0 ms, speculative 9.5 ms; alpha 0.75, 2.50 tokens per "
      "target call\n"
      "    in target steps: a verification of 3 tokens 1.50, a draft in the loop 0.50\n"
  )
  assert max(len(line) for line in summary.splitlines()) < 100


def test_a_row_without_step_costs_measures_its_speedups_and_leaves_the_rest_nan():
  """costs=None (a sweep with cost_repeats=0): the speedups and statistics are the decodes' own,
  every figure made from step costs is NaN, and the plain summary drops their line."""
  baseline, speculative = two_examples()
  row = report.SpeedupRow.from_results("t", "d", 0.0, CHAIN, None, baseline, speculative)
  timed = report.SpeedupRow.from_results("t", "d", 0.0, CHAIN, COSTS, baseline, speculative)
  assert (row.speedup, row.loop_speedup, row.alpha) == (timed.speedup, timed.loop_speedup, 0.75)
  for nan in ("c", "verify_cost", "iteration_cost", "c_in_loop", "predicted", "predicted_hw"):
    assert math.isnan(getattr(row, nan)), nan
  assert math.isnan(row.efficiency) and math.isnan(row.efficiency_in_situ)
  assert "| nan | nan | nan |" in report.markdown_table([row])  # --verbose shows what was not timed
  assert report.plain_summary([row]) == (
      "  d, gamma 2, temperature 0: speedup 2.46x per token\n"
      "    per example: baseline 20.0 ms, speculative 9.5 ms; alpha 0.75, 2.50 tokens per "
      "target call\n"
  )


def test_what_a_report_predicts_from_a_shape():
  chain, tree = draft_shapes.Chain(3), draft_shapes.Tree((2, 1))
  # Eq. (1) at alpha 0.5, gamma 3: 1 + 0.5 + 0.25 + 0.125; Theorem 3.8 divides by 3 c + verify.
  assert report.expected_tokens(chain, 0.5) == pytest.approx(1.875)
  assert report.predicted_speedup(chain, 0.5, 0.1) == pytest.approx(1.875 / 1.3)
  assert report.predicted_speedup(chain, 0.5, 0.1, 1.7) == pytest.approx(1.875 / 2.0)
  assert (report.timed_iteration(chain), report.timed_iteration(tree)) == (3, None)
  assert np.isnan(report.expected_tokens(tree, 0.5)) and np.isnan(
      report.predicted_speedup(tree, 0.5, 0.1)
  )
