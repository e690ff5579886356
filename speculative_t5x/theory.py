"""The paper's formulas: expected tokens, speedup, optimal gamma, operations, lenience; the
expected tokens of block verification; and expected tokens and speedup of draft trees.

Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML 2023),
section 3 and Appendix A.5. Notation follows the paper:

  alpha    expected acceptance rate, E(beta), in [0, 1] (Corollary 3.6).
  beta     per-position acceptance probability, sum_x min(p(x), q(x)) (Theorem 3.5).
  gamma    tokens drafted per iteration, a positive integer (math.inf where a formula allows it).
  c        cost coefficient: time of one drafter (M_q) step over one target (M_p) step (Def. 3.7).
  c_hat    arithmetic operations per token of M_q over those of M_p (Definition 3.10).
  l        lenience in (0, 1] (Appendix A.5); l = 1 is exact speculative sampling.

Draft trees (beyond the paper): a tree of depth D whose depth-(d - 1) nodes have k_d
children verifies its M drafts in one target call on M + 1 tokens;
  a_d      acceptance at depth d: P(a child is accepted | the path reached depth d - 1).
  alpha_j  P(the j-th sibling is accepted | its earlier siblings were rejected); alpha_1 = alpha.

Every function broadcasts over numpy arrays of alpha (and of gamma, c where it makes sense) and
returns a Python float when all its inputs are scalars. Nothing here depends on JAX or on a model.
"""

import numpy as np

# Largest gamma `optimal_gamma` searches by default. Figure 3's largest finite optimum is 40
# (alpha = 0.95, c = 0.01); alpha = 0.99 with c = 0.001 needs 259.
DEFAULT_MAX_GAMMA = 1000

# How far a distribution's total mass may be from 1 (float32 softmax over 32k tokens is ~1e-5 off),
# and how far a float32 sum of betas may exceed its count before it is an error, not rounding.
_PROBABILITY_SUM_TOLERANCE = 1e-3


def _as_float_array(name, value):
  array = np.asarray(value, dtype=np.float64)
  if np.any(np.isnan(array)):
    raise ValueError(f"{name} contains NaN: {value!r}")
  return array


def _check_alpha(alpha):
  alpha = _as_float_array("alpha", alpha)
  if np.any((alpha < 0) | (alpha > 1)):
    raise ValueError(f"alpha must lie in [0, 1] (it is an acceptance probability), got {alpha!r}")
  return alpha


def _check_gamma(gamma, allow_inf=True):
  gamma = _as_float_array("gamma", gamma)
  finite = np.isfinite(gamma)
  if not allow_inf and not np.all(finite):
    raise ValueError(f"gamma must be finite here, got {gamma!r}")
  if np.any(gamma < 1) or np.any(finite & (gamma != np.floor(gamma))):
    raise ValueError(
        f"gamma must be a positive integer (tokens drafted per step), got {gamma!r}; "
        "gamma = 0 is plain autoregressive decoding"
    )
  return gamma


def _check_cost(name, value):
  value = _as_float_array(name, value)
  if np.any(value < 0) or not np.all(np.isfinite(value)):
    raise ValueError(f"{name} must be a finite non-negative cost ratio, got {value!r}")
  return value


def _to_output(array):
  """A float for 0-d results, the array otherwise."""
  return float(array) if np.ndim(array) == 0 else array


def _expected_tokens(alpha, gamma):
  """Eq. (1) on checked float64 arrays; see `expected_tokens`."""
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    finite_gamma = np.where(np.isinf(gamma), 1.0, gamma)
    capped = np.where(alpha == 1, finite_gamma + 1, (1 - alpha ** (finite_gamma + 1)) / (1 - alpha))
    return np.where(np.isinf(gamma), 1 / (1 - alpha), capped)


def expected_tokens(alpha, gamma):
  """Expected tokens produced per target call, Eq. (1): (1 - alpha^(gamma+1)) / (1 - alpha).

  The count is a geometric variable with success probability 1 - alpha, capped at gamma + 1. Limits
  are returned exactly: alpha == 1 gives gamma + 1 (every draft and the bonus token), and
  gamma == math.inf gives 1 / (1 - alpha) (infinite when alpha == 1 too).

  Args:
    alpha: acceptance rate in [0, 1]; scalar or array.
    gamma: drafted tokens per iteration, an integer >= 1 or math.inf; scalar or array
      broadcastable with alpha.

  Returns:
    E(# generated tokens), a float or an array of the broadcast shape.
  """
  return _to_output(_expected_tokens(_check_alpha(alpha), _check_gamma(gamma)))


def speedup_hardware_aware(alpha, gamma, c, verify_cost):
  """Walltime improvement when verifying gamma + 1 tokens costs `verify_cost` single target steps.

  One iteration costs gamma * c + verify_cost target steps and yields Eq. (1) tokens, against one
  target step per token for the baseline:

    (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + verify_cost)).

  Theorem 3.8 assumes the gamma + 1 parallel evaluations take no longer than one (verify_cost = 1);
  on real hardware verify_cost is the measured time of the target on gamma + 1 tokens over its time
  on 1 token. With c > 0, gamma == math.inf gives 0; with c == 0 it gives 1 / ((1 - alpha)
  verify_cost).

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, an integer >= 1 or math.inf.
    c: cost coefficient, drafter step time over target step time, >= 0.
    verify_cost: target time on gamma + 1 tokens over target time on 1 token, > 0.
  All four broadcast against each other.

  Returns:
    The expected speedup over autoregressive decoding with the target alone.
  """
  alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
  c = _check_cost("c", c)
  verify_cost = _check_cost("verify_cost", verify_cost)
  if np.any(verify_cost == 0):
    raise ValueError(f"verify_cost must be > 0 (a time ratio), got {verify_cost!r}")
  with np.errstate(invalid="ignore"):
    drafting = np.where(c == 0, 0.0, gamma * c)  # c == 0 costs nothing even for gamma == inf.
  return _to_output(_expected_tokens(alpha, gamma) / (drafting + verify_cost))


def speedup(alpha, gamma, c):
  """Expected walltime improvement factor, Theorem 3.8.

    (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1)).

  Assumes the gamma + 1 target evaluations run in parallel in the time of one, and long generations.
  c == 0 gives Eq. (1); Corollary 3.9: gamma = 1 gives (1 + alpha) / (1 + c).

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, an integer >= 1 or math.inf.
    c: cost coefficient, drafter step time over target step time, >= 0.

  Returns:
    The expected speedup over autoregressive decoding with the target alone.
  """
  return speedup_hardware_aware(alpha, gamma, c, verify_cost=1.0)


def optimal_gamma(alpha, c, max_gamma=DEFAULT_MAX_GAMMA):
  """The integer gamma in [1, max_gamma] that maximises Theorem 3.8, as in Figure 3 (section 3.5).

  An exhaustive search; on ties the smallest gamma wins (e.g. alpha = 0 with c = 0, where every
  gamma gives 1). The speedup has no finite maximiser exactly when it increases with every gamma:
  c == 0 with alpha > 0 (it approaches 1 / (1 - alpha), Figure 3's "infinity" cells; see
  `speedup(alpha, math.inf, 0)`), or alpha == 1 with c < 1. Then the search is capped and returns
  gamma = max_gamma with its speedup.

  Args:
    alpha: acceptance rate in [0, 1], a scalar.
    c: cost coefficient >= 0, a scalar.
    max_gamma: the largest gamma tried, an integer >= 1.

  Returns:
    (gamma, speedup): the best gamma as an int and Theorem 3.8 at that gamma.
  """
  if np.ndim(alpha) != 0 or np.ndim(c) != 0:
    raise ValueError(
        f"optimal_gamma takes scalar alpha and c, got alpha={alpha!r}, c={c!r}; "
        "call it once per (alpha, c) pair"
    )
  max_gamma = int(_check_gamma(max_gamma, allow_inf=False))
  alpha, c = float(_check_alpha(alpha)), float(_check_cost("c", c))
  if (c == 0 and alpha > 0) or (alpha == 1 and c < 1):
    # Increasing in gamma; searching would stop where the float speedup stops changing instead.
    return max_gamma, speedup(alpha, max_gamma, c)
  gammas = np.arange(1, max_gamma + 1)
  speedups = speedup(alpha, gammas, c)
  best = int(np.argmax(speedups))
  return int(gammas[best]), float(speedups[best])


def operations_factor(alpha, gamma, c_hat):
  """Expected factor of increase in total arithmetic operations, Theorem 3.11.

    (1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).

  One iteration runs gamma drafter steps (gamma c_hat target-step equivalents) and the target on
  gamma + 1 positions, and yields Eq. (1) tokens. alpha == 1 gives (gamma c_hat + gamma + 1) /
  (gamma + 1).

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, a finite integer >= 1.
    c_hat: drafter operations per token over target operations per token, >= 0.

  Returns:
    Total operations of speculative decoding over those of the target decoding alone.
  """
  alpha, gamma = _check_alpha(alpha), _check_gamma(gamma, allow_inf=False)
  c_hat = _check_cost("c_hat", c_hat)
  return _to_output((gamma * c_hat + gamma + 1) / _expected_tokens(alpha, gamma))


def lenient_alpha(p, q, lenience=1.0):
  """Acceptance probability with lenience l (Appendix A.5): sum_x min(p(x) / l, q(x)).

  Lenient speculative sampling compares p(x) with l q(x) instead of q(x), so that
    alpha_l = E_{x~q} p(x) / max(p(x), l q(x)) = sum_x min(p(x) / l, q(x)).
  With l = 1 this is beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q) (Theorem 3.5).

  Args:
    p: target distributions, [..., vocab], non-negative and each summing to 1.
    q: drafter distributions, the same shape as p.
    lenience: l in (0, 1]; 1 is exact sampling.

  Returns:
    alpha_l per distribution, [...] (a float for a single pair of distributions).
  """
  p, q = _as_float_array("p", p), _as_float_array("q", q)
  lenience = float(lenience)
  if not 0 < lenience <= 1:
    raise ValueError(f"lenience must lie in (0, 1] (1 is exact sampling), got {lenience}")
  if p.shape != q.shape or p.ndim == 0:
    raise ValueError(
        f"p and q must be distributions of the same shape [..., vocab], "
        f"got {p.shape} and {q.shape}"
    )
  for name, dist in (("p", p), ("q", q)):
    if np.any(dist < 0) or np.any(np.abs(dist.sum(axis=-1) - 1) > _PROBABILITY_SUM_TOLERANCE):
      raise ValueError(
          f"{name} must hold probabilities (non-negative, summing to 1 over the last "
          "axis); pass softmax outputs, not logits"
      )
  return _to_output(np.minimum(p / lenience, q).sum(axis=-1))


def block_expected_tokens(p, q, gamma):
  """Expected tokens per target call under block verification, for context-independent p and q.

  Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR
  2025) keeps prefix weights w_i = min(w_{i-1} p(x_i) / q(x_i), 1), w_0 = 1, over the drafts
  x_i ~ q, and accepts at least i drafts with probability E[w_i]. So

    E(# generated tokens) = 1 + sum_{i=1..gamma} E_{x_1..x_i ~ q}[w_i],

  computed here exactly by propagating the distribution of w_i (one draft at a time). Algorithm 1
  instead accepts at least i drafts with probability prod_{j<=i} E[min(1, p/q)] = beta^i, giving
  `expected_tokens(beta, gamma)` with beta = sum_x min(p(x), q(x)); block verification is never
  below it (the paper's Theorem 2). On the paper's example (p = (1/3, 2/3), q = (2/3, 1/3),
  gamma = 2) the two give 1 + 11/9 and 1 + 10/9.

  Args:
    p, q: the target's and the drafter's distributions over one vocabulary [V], the same at every
      position (the paper's i.i.d. setting, where alpha = beta).
    gamma: drafted tokens per iteration, a positive integer (the cost grows with the number of
      distinct weights, at most V^gamma).

  Returns:
    The expected number of tokens per target call, a float in [1, gamma + 1].
  """
  p = _as_float_array("p", p)
  q = _as_float_array("q", q)
  if p.ndim != 1 or p.shape != q.shape:
    raise ValueError(
        f"p and q must be distributions over one vocabulary, shape [V], got "
        f"{p.shape} and {q.shape}"
    )
  for name, dist in (("p", p), ("q", q)):
    if np.any(dist < 0) or abs(dist.sum() - 1) > _PROBABILITY_SUM_TOLERANCE:
      raise ValueError(f"{name} must be a distribution (non-negative, summing to 1)")
  gamma = int(_check_gamma(gamma, allow_inf=False))
  drawn = q > 0
  ratios, chances = p[drawn] / q[drawn], q[drawn]
  weights = {1.0: 1.0}  # the distribution of w_i: value -> probability
  tokens = 1.0
  for _ in range(gamma):
    following = {}
    for weight, chance in weights.items():
      for value, probability in zip(np.minimum(weight * ratios, 1.0), chance * chances):
        following[float(value)] = following.get(float(value), 0.0) + float(probability)
    weights = following
    tokens += sum(weight * chance for weight, chance in weights.items())
  return tokens


def _check_counts(numerator_name, numerator, count_name, count):
  numerator = _as_float_array(numerator_name, numerator)
  count = _as_float_array(count_name, count)
  if numerator.shape != count.shape:
    raise ValueError(
        f"{numerator_name} and {count_name} must have the same shape, "
        f"got {numerator.shape} and {count.shape}"
    )
  if np.any(numerator < 0) or np.any(count < 0):
    raise ValueError(f"{numerator_name} and {count_name} must be non-negative")
  total = count.sum()
  if total == 0:
    raise ValueError(f"{count_name} is 0 in total: nothing was verified, so there is no estimate")
  return numerator.sum(), total


def alpha_from_stats(beta_sum, beta_count):
  """alpha = E(beta) (Corollary 3.6), the mean of beta over every verified position.

  Decoding returns per-row sums of beta = sum_x min(p, q) and per-row counts of the positions they
  cover; rows are pooled, so alpha is the mean over tokens (as in Table 3), not over rows.

  Args:
    beta_sum: sum of beta over verified positions; a scalar or per-row array, e.g. [batch].
    beta_count: number of positions in each sum; the same shape.

  Returns:
    alpha, a float in [0, 1] (float32 sums a hair above their count are rounded down to 1).
  """
  beta_total, count = _check_counts("beta_sum", beta_sum, "beta_count", beta_count)
  if beta_total > count * (1 + _PROBABILITY_SUM_TOLERANCE):
    raise ValueError(f"beta_sum {beta_total} exceeds beta_count {count}: each beta is at most 1")
  return min(1.0, float(beta_total / count))


def tokens_per_call(accepted_drafts, target_calls):
  """Measured tokens per target call, the empirical counterpart of Eq. (1).

  Each target call verifies a block, accepts n of its drafts and adds one token of its own, so it
  yields n + 1 tokens; summed over calls, tokens = accepted drafts + target calls.

  Args:
    accepted_drafts: accepted draft tokens; a scalar or per-row array, e.g. [batch].
    target_calls: target calls; the same shape.

  Returns:
    The mean number of tokens per target call, pooled over rows, a float >= 1.
  """
  accepted, calls = _check_counts("accepted_drafts", accepted_drafts, "target_calls", target_calls)
  return float((accepted + calls) / calls)


# ---- Draft trees: several candidates per position, verified in one target call.
#
# A tree's call accepts a root-to-node path: at a reached node of depth d - 1 its children are tried
# in sibling order, and the path goes on through the first child accepted (recursive rejection
# sampling; a chain, k_d = 1, is Algorithm 1). a_d, the acceptance at depth d, is P(some child of
# the reached depth-(d - 1) node is accepted | the path reached depth d - 1). Like Eq. (1), these
# formulas treat the a_d as the same in every context (the paper's i.i.d. assumption on beta).


def _check_acceptance(acceptance_by_depth):
  acceptance = _as_float_array("acceptance_by_depth", acceptance_by_depth)
  if acceptance.ndim == 0 or acceptance.shape[-1] == 0:
    raise ValueError(
        f"acceptance_by_depth must have a last axis of depths d = 1..D with D >= 1, got shape "
        f"{acceptance.shape}: pass [a_1, ..., a_D]"
    )
  if np.any((acceptance < 0) | (acceptance > 1)):
    raise ValueError(
        f"acceptance_by_depth must lie in [0, 1] (each a_d is a probability), got {acceptance!r}"
    )
  return acceptance


def _tree_expected_tokens(acceptance):
  """1 + sum_d prod_{j<=d} a_j on a checked array [..., D]; see `tree_expected_tokens`."""
  return 1 + np.cumprod(acceptance, axis=-1).sum(axis=-1)


def tree_expected_tokens(acceptance_by_depth):
  """Expected tokens produced per target call by a draft tree of depth D:

    E(# generated tokens) = 1 + sum_{d=1..D} prod_{j<=d} a_j,

  since the call accepts at least d drafts exactly when its path reaches depth d, with probability
  a_1 ... a_d, and it always adds one token of its own. With a_d = alpha at every depth (a chain of
  gamma = D drafts) this is Eq. (1), (1 - alpha^(gamma+1)) / (1 - alpha).

  Args:
    acceptance_by_depth: a_1..a_D in [0, 1] on the last axis, [..., D]; leading axes are
      independent cases (e.g. one per alpha).

  Returns:
    A float in [1, D + 1] for a 1-D input, an array [...] otherwise.
  """
  return _to_output(_tree_expected_tokens(_check_acceptance(acceptance_by_depth)))


def acceptance_by_depth(accepted, depth):
  """Measured per-depth acceptance a_d = #{n >= d} / #{n >= d - 1}, d = 1..depth.

  n is the number of drafts a target call accepted (the depth its path reached); a call that
  reached depth d - 1 went one deeper with the empirical probability above, and
  `tree_expected_tokens` of the result is the measured mean of n + 1 (where no entry is nan).

  a_d is nan where no call reached depth d - 1 (no evidence: 0 would claim that depth was reached
  and failed). Its first nan always follows an a_{d-1} = 0, which already zeroes every deeper term
  of `tree_expected_tokens`, so `np.nan_to_num` of the result gives the same expected tokens.

  Args:
    accepted: accepted drafts per target call, integers in [0, depth]; any shape (pooled), with at
      least one call.
    depth: D, the tree's depth (the most drafts a call can accept), an integer >= 1.

  Returns:
    [depth] float64: a_1..a_D.
  """
  depth = int(_check_gamma(depth, allow_inf=False))
  counts = _as_float_array("accepted", accepted).ravel()
  if counts.size == 0:
    raise ValueError("accepted is empty: give the accepted-draft count of at least one target call")
  if np.any((counts < 0) | (counts > depth) | (counts != np.floor(counts))):
    raise ValueError(
        f"accepted must hold integers in [0, depth={depth}] (drafts accepted per call), "
        f"got {accepted!r}"
    )
  reached = (counts[:, None] >= np.arange(depth + 1)).sum(axis=0)  # #{n >= d}, d = 0..depth
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(reached[:-1] > 0, reached[1:] / reached[:-1], np.nan)


def branching_acceptance(alpha, branching, sibling_ratios=()):
  """A model of a_d for the tree whose depth-(d - 1) nodes have k_d = branching[d - 1] children:

    a_d = 1 - prod_{j=1..k_d} (1 - alpha_j),

  where alpha_j is the probability that the j-th child is accepted given that its earlier siblings
  were rejected. alpha_1 = alpha, the chain's acceptance rate; alpha_j = r_j alpha for j >= 2 with
  (r_2, r_3, ...) = sibling_ratios, the last ratio standing for every later sibling; no ratios
  (the default) is the one-parameter model alpha_j = alpha.

  This is a model, not a theorem: it takes each alpha_j to be the same in every context and
  the children's outcomes to multiply as if independent. With the one-parameter default it
  OVER-estimates a_d for children drawn i.i.d. from the drafter's q and verified by recursive
  rejection: a rejection replaces p by its residual p' = norm(max(p - q, 0)), which lives on
  {p > q}, so the next child's acceptance sum_x min(p'(x), q(x)) <= q({p > q}) <= sum_x
  min(p(x), q(x)) = alpha, and so on down the siblings (alpha_1 >= alpha_2 >= ...). The
  default is exact when
    - k_d = 1 (a chain: a_d = alpha, Eq. (1));
    - alpha is 0 or 1;
    - the target is deterministic (temperature 0, p a point mass at x*) and the children are drawn
      i.i.d. (with replacement) from q: each is accepted iff it is x*, with probability q(x*) =
      alpha whatever the earlier siblings were.
  Measured alpha_j (or sibling_ratios below 1), or a_d measured per depth (`acceptance_by_depth`),
  correct the rest.

  Args:
    alpha: the first child's acceptance rate in [0, 1]; scalar or array [...].
    branching: (k_1, ..., k_D), children per node at each depth, integers >= 1.
    sibling_ratios: (r_2, r_3, ...), alpha_j / alpha for later siblings, >= 0, with every r_j alpha
      <= 1; the last ratio repeats.

  Returns:
    a_1..a_D, [..., D] (alpha's shape plus a depth axis).
  """
  alpha = _check_alpha(alpha)
  if isinstance(branching, (str, bytes)) or np.ndim(branching) != 1 or len(branching) == 0:
    raise ValueError(
        f"branching must be a non-empty sequence (k_1, ..., k_D) of children per depth, got "
        f"{branching!r}"
    )
  widths = np.asarray(branching)
  if not np.issubdtype(widths.dtype, np.integer) or np.any(widths < 1):
    raise ValueError(f"branching must hold integers >= 1 (children per node), got {branching!r}")
  ratios = _as_float_array("sibling_ratios", sibling_ratios)
  if ratios.ndim != 1 or np.any(ratios < 0) or not np.all(np.isfinite(ratios)):
    raise ValueError(
        f"sibling_ratios must be a sequence (r_2, r_3, ...) of finite ratios >= 0, got "
        f"{sibling_ratios!r}"
    )
  if ratios.size and np.any(ratios.max() * alpha > 1):
    raise ValueError(
        f"sibling_ratios {sibling_ratios!r} times alpha exceed 1: each alpha_j = r_j alpha is a "
        "probability"
    )
  # alpha_j / alpha for j = 1..K (K = max k_d), the last ratio repeating.
  factors = np.ones(int(widths.max()))
  if ratios.size:
    factors[1:] = ratios[np.minimum(np.arange(factors.size - 1), ratios.size - 1)]
  # prod_{j<=k} (1 - alpha_j) for k = 1..K [..., K], picked at each k_d.
  rejected = np.cumprod(1 - alpha[..., None] * factors, axis=-1)
  return 1 - rejected[..., widths - 1]


def tree_speedup_hardware_aware(acceptance_by_depth, c, drafter_calls, verify_cost):
  """Walltime improvement of a draft tree: E(# tokens) / (drafter_calls c + verify_cost).

  One iteration runs the drafter drafter_calls times (a tree of depth D drafts level by level, in D
  calls; count a wider call as several when it costs more than one single-token step) and the
  target once on the M + 1 tokens of the root and its M nodes, which costs verify_cost single
  target steps; it yields `tree_expected_tokens` tokens, against one target step per token for
  the baseline. For a chain (a_d = alpha, drafter_calls = gamma, verify_cost on gamma + 1 tokens)
  this is `speedup_hardware_aware(alpha, gamma, c, verify_cost)`.

  Args:
    acceptance_by_depth: a_1..a_D in [0, 1] on the last axis, [..., D].
    c: cost coefficient, drafter step time over target step time, >= 0.
    drafter_calls: drafter steps per iteration, in single-token drafter steps, >= 0.
    verify_cost: target time on M + 1 tokens over target time on 1 token, > 0.
  The leading axes of acceptance_by_depth, c, drafter_calls and verify_cost broadcast.

  Returns:
    The expected speedup over autoregressive decoding with the target alone.
  """
  tokens = _tree_expected_tokens(_check_acceptance(acceptance_by_depth))
  c = _check_cost("c", c)
  drafter_calls = _check_cost("drafter_calls", drafter_calls)
  verify_cost = _check_cost("verify_cost", verify_cost)
  if np.any(verify_cost == 0):
    raise ValueError(f"verify_cost must be > 0 (a time ratio), got {verify_cost!r}")
  return _to_output(tokens / (drafter_calls * c + verify_cost))
