"""theory.py against the paper's printed numbers (Leviathan, Kalman, Matias, ICML 2023).

Every expected value below is typed in from the paper or worked out by hand; none is computed by the
code under test. Tolerances follow the printed precision: half a unit of the last printed digit.
"""

import math

import numpy as np
import pytest

from speculative_t5x import theory
from speculative_t5x.projections import paper

INF = math.inf

# Table 1 (c = c_hat = 0): alpha, gamma, printed operations and speed, then the [derived]
# recomputation at four decimals.
TABLE_1 = [
    (0.6, 2, 1.53, 1.96, 1.5306, 1.9600),
    (0.7, 3, 1.58, 2.53, 1.5792, 2.5330),
    (0.8, 2, 1.23, 2.44, 1.2295, 2.4400),
    (0.8, 5, 1.63, 3.69, 1.6263, 3.6893),
    (0.9, 2, 1.11, 2.71, 1.1070, 2.7100),
    (0.9, 10, 1.60, 6.86, 1.6031, 6.8619),
]

# Theorem 3.8 derived by hand from each Table 2 / Table 4 row's rounded alpha, gamma and c (three
# decimals), in the order of paper.TABLE_2; the printed EXP is paper.TABLE_2's expected_speedup.
TABLE_4_DERIVED = (
    3.157,
    3.251,
    2.497,
    2.258,
    2.347,
    1.934,
    2.402,
    2.619,
    2.025,
    1.891,
    1.803,
    1.541,
)
# EXP was computed from unrounded alpha and c: three rows differ from the derived column by more
# than EXP's own rounding (2.4 vs 2.347, 2.0 vs 1.934, 1.6 vs 1.541), by at most 0.066.
TABLE_4_EXP_TOLERANCE = 0.07

# Table 4's T5-small rows: [derived] tokens per target call at the paper's gamma, and the gamma that
# maximises Theorem 3.8 with its speedup.
TABLE_4_SMALL = [
    ("EnDe t0", 7, 0.75, 0.02, 3.60, 9, 3.20),
    ("EnDe t1", 7, 0.62, 0.02, 2.57, 6, 2.27),
    ("CNNDM t0", 5, 0.65, 0.02, 2.64, 7, 2.43),
    ("CNNDM t1", 5, 0.53, 0.02, 2.08, 5, 1.89),
]

# Figure 3 grid from the paper: for each alpha, (optimal gamma, speedup) for c = 0.01, 0.02, 0.05,
# 0.1, 0.2, and the c = 0 supremum 1 / (1 - alpha) (printed to two decimals, 10.0 and 20.0 to one).
FIGURE_3_C = (0.01, 0.02, 0.05, 0.1, 0.2)
FIGURE_3 = {
    0.5: (2.00, [(5, 1.88), (4, 1.79), (3, 1.63), (2, 1.46), (1, 1.25)]),
    0.6: (2.50, [(7, 2.30), (6, 2.17), (4, 1.92), (3, 1.67), (2, 1.40)]),
    0.7: (3.33, [(9, 2.97), (8, 2.76), (6, 2.35), (4, 1.98), (3, 1.58)]),
    0.75: (4.00, [(11, 3.49), (9, 3.20), (7, 2.67), (5, 2.19), (3, 1.71)]),
    0.8: (5.00, [(14, 4.23), (11, 3.82), (8, 3.09), (6, 2.47), (4, 1.87)]),
    0.85: (6.67, [(17, 5.39), (14, 4.75), (10, 3.70), (7, 2.85), (5, 2.08)]),
    0.9: (10.0, [(24, 7.49), (19, 6.37), (13, 4.67), (10, 3.43), (7, 2.37)]),
    0.95: (20.0, [(40, 12.54), (31, 9.95), (21, 6.60), (15, 4.48), (10, 2.87)]),
}

# Figure 4 style grid from the paper (c = c_hat = 0): speedup / operations factor per gamma.
FIGURE_4_GAMMAS = (1, 2, 3, 5, 7, 10)
FIGURE_4 = {
    0.5: [(1.50, 1.33), (1.75, 1.71), (1.88, 2.13), (1.97, 3.05), (1.99, 4.02), (2.00, 5.50)],
    0.6: [(1.60, 1.25), (1.96, 1.53), (2.18, 1.84), (2.38, 2.52), (2.46, 3.25), (2.49, 4.42)],
    0.7: [(1.70, 1.18), (2.19, 1.37), (2.53, 1.58), (2.94, 2.04), (3.14, 2.55), (3.27, 3.37)],
    0.8: [(1.80, 1.11), (2.44, 1.23), (2.95, 1.36), (3.69, 1.63), (4.16, 1.92), (4.57, 2.41)],
    0.9: [(1.90, 1.05), (2.71, 1.11), (3.44, 1.16), (4.69, 1.28), (5.70, 1.40), (6.86, 1.60)],
}

# Appendix A.5, T5-small on EnDe, c = 0.015. Temperature 0, gamma = 8: alpha, printed speedup and
# the [derived] value. Temperature 1 (Table 5): alpha and the [derived] optimum.
A5_TEMPERATURE_0 = [(0.75, 3.3, 3.303), (0.80, 3.9, 3.865), (0.87, 4.9, 4.907)]
A5_TEMPERATURE_1 = [(0.62, 7, 2.33), (0.71, 9, 2.94), (0.76, 10, 3.45), (0.84, 15, 4.79)]
A5_C = 0.015


@pytest.mark.parametrize("alpha,gamma,ops,speed,ops_exact,speed_exact", TABLE_1)
def test_table_1(alpha, gamma, ops, speed, ops_exact, speed_exact):
  assert theory.operations_factor(alpha, gamma, 0.0) == pytest.approx(ops, abs=0.005)
  assert theory.speedup(alpha, gamma, 0.0) == pytest.approx(speed, abs=0.005)
  assert theory.operations_factor(alpha, gamma, 0.0) == pytest.approx(ops_exact, abs=5e-5)
  assert theory.speedup(alpha, gamma, 0.0) == pytest.approx(speed_exact, abs=5e-5)


@pytest.mark.parametrize(
    "row, derived",
    list(zip(paper.TABLE_2, TABLE_4_DERIVED)),
    ids=[row.config_name for row in paper.TABLE_2],
)
def test_table_4_expected_speedup(row, derived):
  speedup = theory.speedup(row.alpha, row.gamma, row.c)
  assert speedup == pytest.approx(derived, abs=5e-4)
  assert speedup == pytest.approx(row.expected_speedup, abs=TABLE_4_EXP_TOLERANCE)


@pytest.mark.parametrize("row,gamma,alpha,c,tokens,best_gamma,best_speedup", TABLE_4_SMALL)
def test_table_4_small_drafter_tokens_and_optimum(
    row, gamma, alpha, c, tokens, best_gamma, best_speedup
):
  del row
  assert theory.expected_tokens(alpha, gamma) == pytest.approx(tokens, abs=0.005)
  found_gamma, found_speedup = theory.optimal_gamma(alpha, c)
  assert found_gamma == best_gamma
  assert found_speedup == pytest.approx(best_speedup, abs=0.005)


@pytest.mark.parametrize("alpha", sorted(FIGURE_3))
def test_figure_3_optimal_gamma_grid(alpha):
  supremum, cells = FIGURE_3[alpha]
  for c, (best_gamma, best_speedup) in zip(FIGURE_3_C, cells):
    found_gamma, found_speedup = theory.optimal_gamma(alpha, c)
    assert found_gamma == best_gamma, f"alpha={alpha} c={c}"
    assert found_speedup == pytest.approx(best_speedup, abs=0.005), f"alpha={alpha} c={c}"
  # The c = 0 column: no finite optimum; the search is capped and the limit is 1 / (1 - alpha).
  assert theory.speedup(alpha, INF, 0.0) == pytest.approx(supremum, abs=0.005)
  capped = theory.optimal_gamma(alpha, 0.0, max_gamma=500)
  assert capped == (500, pytest.approx(supremum, abs=0.005))


@pytest.mark.parametrize("alpha", sorted(FIGURE_4))
def test_figure_4_grid(alpha):
  for gamma, (speed, ops) in zip(FIGURE_4_GAMMAS, FIGURE_4[alpha]):
    assert theory.speedup(alpha, gamma, 0.0) == pytest.approx(speed, abs=0.005), gamma
    assert theory.operations_factor(alpha, gamma, 0.0) == pytest.approx(ops, abs=0.005), gamma


@pytest.mark.parametrize("alpha,printed,derived", A5_TEMPERATURE_0)
def test_lenience_temperature_0_speedups(alpha, printed, derived):
  assert theory.speedup(alpha, 8, A5_C) == pytest.approx(derived, abs=5e-4)
  assert theory.speedup(alpha, 8, A5_C) == pytest.approx(printed, abs=0.05)


@pytest.mark.parametrize("alpha,best_gamma,best_speedup", A5_TEMPERATURE_1)
def test_lenience_temperature_1_optimum(alpha, best_gamma, best_speedup):
  assert theory.optimal_gamma(alpha, A5_C) == (best_gamma, pytest.approx(best_speedup, abs=0.005))


def test_expected_tokens_edge_cases():
  assert theory.expected_tokens(0.0, 5) == 1.0  # Every draft rejected: the correction token only.
  assert theory.expected_tokens(1.0, 5) == 6.0  # Every draft accepted, plus the bonus token.
  assert theory.expected_tokens(0.5, 1) == 1.5  # gamma = 1 gives 1 + alpha.
  assert theory.expected_tokens(0.75, INF) == pytest.approx(4.0)
  assert theory.expected_tokens(0.0, INF) == 1.0
  assert theory.expected_tokens(1.0, INF) == INF
  # Section 3.6: a bigram drafter, alpha = 0.2, c = 0, gamma = 3 gives 1.248.
  assert theory.speedup(0.2, 3, 0.0) == pytest.approx(1.248)
  np.testing.assert_allclose(theory.expected_tokens(np.array([0.0, 0.5, 1.0]), 3), [1, 1.875, 4])
  np.testing.assert_allclose(theory.expected_tokens(0.5, np.array([1, 2, INF])), [1.5, 1.75, 2])


def test_speedup_limits_and_corollary_3_9():
  assert theory.speedup(0.6, 1, 0.05) == pytest.approx(1.6 / 1.05)  # (1 + alpha) / (1 + c).
  assert theory.speedup(0.5, INF, 0.1) == 0.0  # Unbounded drafting cost.
  assert theory.speedup(0.0, 4, 0.0) == 1.0


def test_speedup_hardware_aware():
  assert theory.speedup_hardware_aware(0.75, 7, 0.02, 1.0) == pytest.approx(3.157, abs=5e-4)
  # alpha = 0.5, gamma = 2: 1.75 tokens per iteration costing 2 * 0.1 + 1.5 target steps.
  assert theory.speedup_hardware_aware(0.5, 2, 0.1, 1.5) == pytest.approx(1.75 / 1.7)
  assert theory.speedup_hardware_aware(0.5, INF, 0.0, 2.0) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="verify_cost"):
    theory.speedup_hardware_aware(0.5, 2, 0.1, 0.0)


def test_operations_factor_alpha_1_and_drafter_cost():
  assert theory.operations_factor(1.0, 3, 0.1) == pytest.approx(4.3 / 4)
  # alpha = 0.5, gamma = 1, c_hat = 0.02: 0.5 * 2.02 / 0.75.
  assert theory.operations_factor(0.5, 1, 0.02) == pytest.approx(1.01 / 0.75)


def test_optimal_gamma_ties_and_unbounded_cases():
  assert theory.optimal_gamma(0.0, 0.0) == (1, 1.0)  # Every gamma gives 1: the smallest wins.
  assert theory.optimal_gamma(1.0, 2.0) == (1, pytest.approx(2 / 3))
  assert theory.optimal_gamma(1.0, 0.5, max_gamma=10) == (10, pytest.approx(11 / 6))
  assert theory.optimal_gamma(0.5, 0.0, max_gamma=7) == (7, pytest.approx(1.9921875))
  with pytest.raises(ValueError, match="scalar"):
    theory.optimal_gamma(np.array([0.5, 0.6]), 0.1)


def _random_distributions(rng, shape):
  logits = 3 * rng.standard_normal(shape)
  return np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)


def test_lenient_alpha_hand_example():
  p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
  assert theory.lenient_alpha(p, q, 1.0) == pytest.approx(0.7)  # 0.2 + 0.3 + 0.2.
  assert theory.lenient_alpha(p, q, 0.5) == pytest.approx(0.9)  # min([1, .6, .4], q) = .2+.3+.4.
  assert theory.lenient_alpha(p, p) == pytest.approx(1.0)
  assert theory.lenient_alpha([1, 0], [0, 1]) == 0.0  # Disjoint supports: D_LK = 1.


def test_lenient_alpha_at_1_is_beta():
  rng = np.random.default_rng(0)
  p, q = _random_distributions(rng, (2, 3, 11)), _random_distributions(rng, (2, 3, 11))
  alpha = theory.lenient_alpha(p, q, 1.0)
  assert alpha.shape == (2, 3)
  np.testing.assert_allclose(alpha, np.minimum(p, q).sum(-1), rtol=1e-12)
  np.testing.assert_allclose(alpha, 1 - 0.5 * np.abs(p - q).sum(-1), rtol=1e-12)  # Lemma 3.3.
  np.testing.assert_allclose(alpha, (q * np.minimum(1, p / q)).sum(-1), rtol=1e-12)  # Thm. 3.5.


def test_lenient_alpha_matches_acceptance_expectation():
  # A.5: alpha_l = E_{x~q} p(x) / max(p(x), l q(x)), and lenience only raises acceptance.
  rng = np.random.default_rng(1)
  p, q = _random_distributions(rng, (4, 7)), _random_distributions(rng, (4, 7))
  previous = np.zeros(4)
  for lenience in (1.0, 0.5, 0.3, 0.1):
    alpha = theory.lenient_alpha(p, q, lenience)
    np.testing.assert_allclose(alpha, (q * p / np.maximum(p, lenience * q)).sum(-1), rtol=1e-12)
    assert np.all(alpha >= previous)
    previous = alpha


def test_alpha_and_tokens_from_stats():
  assert theory.alpha_from_stats(np.array([1.5, 3.0]), np.array([2, 4])) == pytest.approx(0.75)
  assert theory.alpha_from_stats(6.2, 10) == pytest.approx(0.62)
  assert theory.alpha_from_stats(np.float32(10_000.2), 10_000) == 1.0  # float32 rounding.
  assert theory.tokens_per_call(np.array([6, 3]), np.array([2, 3])) == pytest.approx(2.8)
  with pytest.raises(ValueError, match="nothing was verified"):
    theory.alpha_from_stats(np.zeros(2), np.zeros(2))
  with pytest.raises(ValueError, match="at most 1"):
    theory.alpha_from_stats(5.0, 4)
  with pytest.raises(ValueError, match="same shape"):
    theory.tokens_per_call(np.ones(2), np.ones(3))


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: theory.expected_tokens(1.2, 3), "alpha must lie in"),
        (lambda: theory.expected_tokens(-0.1, 3), "alpha must lie in"),
        (lambda: theory.expected_tokens(np.array([0.5, math.nan]), 3), "NaN"),
        (lambda: theory.expected_tokens(0.5, 0), "positive integer"),
        (lambda: theory.expected_tokens(0.5, 2.5), "positive integer"),
        (lambda: theory.speedup(0.5, 3, -0.01), "c must be"),
        (lambda: theory.operations_factor(0.5, INF, 0.0), "finite"),
        (lambda: theory.operations_factor(0.5, 3, -1.0), "c_hat must be"),
        (lambda: theory.optimal_gamma(0.5, 0.1, max_gamma=0), "positive integer"),
        (
            lambda: theory.lenient_alpha([0.5, 0.5], [0.5, 0.5], 0.0),
            r"lenience must lie in \(0, 1\]",
        ),
        (
            lambda: theory.lenient_alpha([0.5, 0.5], [0.5, 0.5], 1.5),
            r"lenience must lie in \(0, 1\]",
        ),
        (lambda: theory.lenient_alpha([0.5, 0.5], [1.0], 1.0), "same shape"),
        (lambda: theory.lenient_alpha([2.0, -1.0], [0.5, 0.5], 1.0), "not logits"),
    ],
)
def test_invalid_inputs_raise(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_block_expected_tokens_on_the_papers_example():
  """Sun et al.'s example (p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2): 10/9 accepted drafts per
  block with token verification, 11/9 with block verification."""
  assert theory.block_expected_tokens([1 / 3, 2 / 3], [2 / 3, 1 / 3], 2) == pytest.approx(20 / 9)
  assert theory.expected_tokens(2 / 3, 2) == pytest.approx(19 / 9)


def test_block_expected_tokens_bounds():
  rng = np.random.default_rng(0)
  for gamma in (1, 3, 5):
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    token = theory.expected_tokens(np.minimum(p, q).sum(), gamma)
    block = theory.block_expected_tokens(p, q, gamma)
    if gamma == 1:
      assert block == pytest.approx(token)  # one draft: the two rules coincide
    else:
      assert token < block <= gamma + 1
  assert theory.block_expected_tokens(p, p, 4) == pytest.approx(5.0)  # p == q: all accepted
  with pytest.raises(ValueError, match="distribution"):
    theory.block_expected_tokens([0.5, 0.6], [0.5, 0.5], 2)


# ---- Draft trees. Every expected value is worked out by hand in its comment.


def test_tree_expected_tokens_by_hand():
  assert theory.tree_expected_tokens([0.5, 0.5]) == pytest.approx(1.75)  # 1 + .5 + .25.
  assert theory.tree_expected_tokens([0.8, 0.5, 0.25]) == pytest.approx(2.3)  # 1 + .8 + .4 + .1.
  assert theory.tree_expected_tokens([0.0, 1.0]) == 1.0  # Nothing past a depth nobody reaches.
  assert theory.tree_expected_tokens([1.0] * 4) == 5.0  # Every depth and the bonus token.
  # Leading axes are cases: [[1, 1, 1], [0.5, 0.5, 0.5]] -> [4, 1.875].
  np.testing.assert_allclose(theory.tree_expected_tokens([[1, 1, 1], [0.5] * 3]), [4, 1.875])


def test_acceptance_by_depth_by_hand():
  # n = 0, 1, 2, 2, 1, 0, 3: #{n >= d} for d = 0..3 is 7, 5, 3, 1.
  accepted = np.array([0, 1, 2, 2, 1, 0, 3])
  a = theory.acceptance_by_depth(accepted, 3)
  np.testing.assert_allclose(a, [5 / 7, 3 / 5, 1 / 3])
  # Expected tokens are the measured mean of n + 1: (1 + 2 + 3 + 3 + 2 + 1 + 4) / 7 = 16 / 7.
  assert theory.tree_expected_tokens(a) == pytest.approx(16 / 7)
  # Pooled over any shape: per-row arrays give the same.
  np.testing.assert_allclose(
      theory.acceptance_by_depth(accepted[:6].reshape(2, 3), 3), [4 / 6, 2 / 4, 0]
  )
  # Nobody reached depth 1, so a_2 is unknown (nan), after a_1 = 0.
  a = theory.acceptance_by_depth([0, 0], 2)
  assert a[0] == 0.0 and np.isnan(a[1])
  assert theory.tree_expected_tokens(np.nan_to_num(a)) == 1.0


def test_branching_acceptance_by_hand():
  # alpha = 0.5: one child 0.5, two 1 - 0.5^2 = 0.75, three 1 - 0.5^3 = 0.875.
  np.testing.assert_allclose(theory.branching_acceptance(0.5, (2, 1, 3)), [0.75, 0.5, 0.875])
  np.testing.assert_allclose(theory.branching_acceptance(0.6, (1, 1)), [0.6, 0.6])  # A chain.
  # Ratios (0.5, 0.25): alpha_j = 0.5, 0.25, 0.125 -> 1 - .5 * .75 = .625, 1 - .5 * .75 * .875.
  np.testing.assert_allclose(
      theory.branching_acceptance(0.5, (2, 1, 3), (0.5, 0.25)), [0.625, 0.5, 0.671875]
  )
  # The last ratio repeats: alpha_j = 0.5, 0.25, 0.25 -> 1 - .5 * .75 * .75 = 0.71875.
  assert theory.branching_acceptance(0.5, (3,), (0.5,)) == pytest.approx([0.71875])
  # alpha broadcasts: [2] alphas -> [2, D]; alpha = 0.6, 0.3, 0.15: 1 - .4 * .7 = .72.
  np.testing.assert_allclose(
      theory.branching_acceptance(np.array([0.5, 0.6]), (2, 1), (0.5,)), [[0.625, 0.5], [0.72, 0.6]]
  )


def test_tree_speedup_by_hand():
  # Tree (2, 1) at alpha = 0.5: a = (.75, .5), tokens 1 + .75 + .375 = 2.125; two drafter calls
  # at c = 0.1 and a verification costing 1.5 steps: 2.125 / 1.7 = 1.25.
  a = theory.branching_acceptance(0.5, (2, 1))
  assert theory.tree_speedup_hardware_aware(a, 0.1, 2, 1.5) == pytest.approx(1.25)
  # Free drafting and verification: the speedup is the tokens per call.
  assert theory.tree_speedup_hardware_aware(a, 0.0, 2, 1.0) == pytest.approx(2.125)


@pytest.mark.parametrize(
    "alpha,gamma,c,verify_cost",
    [(0.75, 7, 0.02, 1.0), (0.62, 5, 0.04, 1.3), (0.0, 3, 0.1, 2.0), (1.0, 4, 0.05, 1.1)],
)
def test_tree_speedup_of_a_chain_is_the_chain_speedup(alpha, gamma, c, verify_cost):
  chain = theory.branching_acceptance(alpha, (1,) * gamma)
  assert theory.tree_expected_tokens(chain) == pytest.approx(theory.expected_tokens(alpha, gamma))
  assert theory.tree_speedup_hardware_aware(chain, c, gamma, verify_cost) == pytest.approx(
      theory.speedup_hardware_aware(alpha, gamma, c, verify_cost)
  )


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: theory.tree_expected_tokens(0.5), "last axis of depths"),
        (lambda: theory.tree_expected_tokens([]), "last axis of depths"),
        (lambda: theory.tree_expected_tokens([0.5, 1.2]), r"must lie in \[0, 1\]"),
        (lambda: theory.tree_expected_tokens([0.5, math.nan]), "NaN"),
        (lambda: theory.acceptance_by_depth([], 3), "at least one target call"),
        (lambda: theory.acceptance_by_depth([1, 4], 3), r"integers in \[0, depth=3\]"),
        (lambda: theory.acceptance_by_depth([0.5], 3), r"integers in \[0, depth=3\]"),
        (lambda: theory.acceptance_by_depth([-1], 3), r"integers in \[0, depth=3\]"),
        (lambda: theory.acceptance_by_depth([0], 0), "positive integer"),
        (lambda: theory.branching_acceptance(0.5, ()), "non-empty sequence"),
        (lambda: theory.branching_acceptance(0.5, "21"), "non-empty sequence"),
        (lambda: theory.branching_acceptance(0.5, (2, 0)), "integers >= 1"),
        (lambda: theory.branching_acceptance(0.5, (2.5,)), "integers >= 1"),
        (lambda: theory.branching_acceptance(1.5, (2,)), "alpha must lie in"),
        (lambda: theory.branching_acceptance(0.5, (2,), (-0.5,)), "finite ratios >= 0"),
        (lambda: theory.branching_acceptance(0.5, (2,), (3.0,)), "exceed 1"),
        (lambda: theory.tree_speedup_hardware_aware([0.5], 0.1, 1, 0.0), "verify_cost must be > 0"),
        (lambda: theory.tree_speedup_hardware_aware([0.5], 0.1, -1, 1.0), "drafter_calls must be"),
        (lambda: theory.tree_speedup_hardware_aware([0.5], -0.1, 1, 1.0), "c must be"),
    ],
)
def test_tree_invalid_inputs_raise(call, message):
  with pytest.raises(ValueError, match=message):
    call()
