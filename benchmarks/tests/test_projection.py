"""projection.py: draft trees against chains for Table 2's rows on the TPU-v4 roofline (numpy only)."""

import pytest

from speculative_t5x.projections import paper
import projection
from speculative_t5x.projections import roofline


def _projector():
  return projection.Projector(roofline.TPU_V4, context_length=128, encoder_length=512)


def test_branchings_are_the_non_increasing_trees_within_the_node_budget():
  # Depth first: (1,) then its extensions, then (2,) (whose (2, 1) would need 4 nodes), (3,).
  assert projection.branchings(3) == [(1,), (1, 1), (1, 1, 1), (2,), (3,)]
  for max_nodes, count in ((24, 107), (64, 438)):
    found = projection.branchings(max_nodes)
    assert len(found) == len(set(found)) == count
    for branching in found:
      assert list(branching) == sorted(branching, reverse=True)
      nodes, level = 0, 1
      for k in branching:
        level *= k
        nodes += level
      assert nodes <= max_nodes, branching


def test_families_grow_by_ones_within_the_node_budget():
  assert projection.family_members((), 3) == [(1,), (1, 1), (1, 1, 1)]
  # (2,): 2 nodes, (2, 1): 4, (2, 1, 1): 6, (2, 1, 1, 1): 8 > 7.
  assert projection.family_members((2,), 7) == [(2,), (2, 1), (2, 1, 1)]
  assert projection.family_members((3, 3), 11) == []
  assert projection.family_name(()) == "chain (1, ...)"
  assert projection.family_name((3, 2)) == "(3, 2, 1, ...)"


def test_a_tree_projected_by_hand():
  """(2, 1) with a = (.75, .5): 1 + .75 + .75 x .5 = 2.125 tokens per call."""
  projected = _projector().project((2, 1), [0.75, 0.5], 0.02, "small")
  # Verification is flat on the roofline up to 229 tokens: two single-token-cost drafter calls
  # (on 1, then 2 tokens) and one target call on 5 tokens; 2.125 / (2 x 0.02 + 1) = 2.043x.
  assert projected["branching"] == [2, 1]
  assert (projected["nodes"], projected["depth"]) == (4, 2)
  assert projected["drafter_calls"] == 2.0 and projected["verify_cost"] == 1.0
  assert projected["tokens"] == pytest.approx(2.125)
  assert projected["speedup"] == pytest.approx(2.125 / 1.04)


def test_best_takes_the_fastest_candidate():
  projector = _projector()
  candidates = projection.family_members((), 12)
  fastest = projection.best(projector, candidates, 0.75, 0.02, "small")
  assert fastest["speedup"] == max(
      projector.project(b, [0.75] * len(b), 0.02, "small")["speedup"] for b in candidates
  )
  # A second child at alpha_2 = alpha beats the chain; never accepted (ratio 0), it adds no token.
  assert projection.best(projector, [(1, 1), (2, 1)], 0.75, 0.02, "small")["branching"] == [2, 1]
  ratio_zero = projection.best(projector, [(2, 1)], 0.75, 0.02, "small", (0.0,))
  assert ratio_zero["tokens"] == pytest.approx(1 + 0.75 + 0.75**2)


def test_projects_every_row_and_marks_the_best_tree():
  table = projection.project_table(
      _projector(),
      max_nodes=24,  # 107 trees searched instead of 438 at 64.
      c_source="paper",
      ratios=(0.0,),
      measured=((2, 1), (0.75, 0.5)),
  )
  out = projection.markdown(table)
  assert out.startswith("PROJECTION, not a measurement: T5-XXL target on one TPU-v4")
  assert table["projection"] and len(table["rows"]) == len(paper.TABLE_2) == 12
  assert table["chip"] == {"name": "TPU-v4", "bandwidth_tb_s": 1.2, "peak_tflops": 275.0}
  # Every chain is Theorem 3.8 with Table 4's c. EnDe, T5-small, t=0: 3.157 (derived by hand in
  # test_theory.py).
  assert "| EnDe | T5-small | 0 | 0.75 | 0.0200 | 7 | 3.60 | 3.16x |" in out
  assert table["target_verify_cost"][64] == 1.0
  for row in table["rows"]:
    trees = row["models"]["alpha_j = alpha"]
    fastest = max(p["speedup"] for p in trees.values())
    # The search covers every family, and no tree is slower than the paper's chain of its size.
    assert fastest == trees["best of 107 searched"]["speedup"]
    assert fastest >= row["best_chain"]["speedup"] >= row["chain"]["speedup"]
    assert all(p["nodes"] <= 24 for p in trees.values())
    # Ratio 0: later siblings are never accepted, so no tree beats the best chain.
    ratio_zero = row["models"]["alpha_j = r_j alpha"]
    assert max(p["speedup"] for p in ratio_zero.values()) == pytest.approx(
        row["best_chain"]["speedup"]
    )
  # One family table per row, each with its fastest tree starred (once per model).
  assert out.count("(* = fastest tree)") == 12
  assert out.count("x * |") >= 24
  # The measured tree of test_a_tree_projected_by_hand, with each drafter's Table 4 c.
  assert [p["drafter"] for p in table["measured"]] == ["small", "base", "large"]
  assert "| T5-small | 0.0200 | 4 | 2.12 | 2.00 | 1.00 | 2.04x |" in out


def test_without_ratios_or_measurement_there_is_one_model_and_no_measured_table():
  table = projection.project_table(_projector(), max_nodes=16, c_source="roofline")
  assert all(list(row["models"]) == ["alpha_j = alpha"] for row in table["rows"])
  assert "measured" not in table
  assert "Measured per-depth acceptance" not in projection.markdown(table)
  assert (
      table["rows"][0]["c"]
      == table["drafter_c"]["small"]["roofline"]
      == pytest.approx(_projector().c("small"))
  )


def test_a_node_budget_below_the_largest_familys_smallest_tree_is_refused():
  assert projection.MIN_NODES == 16  # the (16,) family: 16 chains of one node
  with pytest.raises(ValueError, match="max_nodes=15: .* at least 16 nodes"):
    projection.project_table(_projector(), max_nodes=15, c_source="roofline")
