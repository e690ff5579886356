"""Choosing adaptive draft length's settings from measurements (`scripts/calibrate_draft_length.py`).

Along target-generated sequences (as for Table 3's alpha, `alpha`), every generated position t
gives the drafter's confidence c_t (`draft_length.ConfidenceStop.confidence`, measure 'max') and
beta_t = sum_x min(p_t(x), q_t(x)), the probability that a draft at t is accepted. Grouping beta by
confidence bucket shows how much the confidence tells (`confidence_buckets`).

The model of one iteration that starts at position j, with threshold tau and at most gamma drafts:
the drafter drafts at j, j+1, ... and stops after the first position whose confidence is below tau,

  k_j = min(gamma, 1 + #{leading i >= j with c_i >= tau})   drafts (drafter steps),
  E[n_j] = sum_{i=1..k_j} prod_{l=0..i-1} beta_{j+l}         accepted drafts (beta = 0 past EOS),

treating acceptances as independent with the measured beta (Section 3.1's assumption, position by
position) and the accepted drafts as the target's tokens. With the hardware-aware cost model
(`theory.speedup_hardware_aware`: a drafter step costs c(gamma) target steps, verifying gamma + 1
tokens costs verify_cost(gamma)) and iterations starting at every position alike:

  tokens per call = mean_j (E[n_j] + 1),  cost per call = c(gamma) mean_j k_j + verify_cost(gamma),
  speedup = tokens per call / cost per call.

c may depend on gamma: a draft inside the loop costs what the iteration's time less the
verification's gives (`step_costs.DecodeCosts.c_in_loop`), which on a CPU can be several times a
drafter step timed alone.

tau = 0 is static gamma. `calibrate` searches the (gamma, tau) grid and reports the best static
gamma beside it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import alpha
from speculative_t5x import draft_length
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import validation

if TYPE_CHECKING:  # pairs loads every model; calibration only reads a loaded pair's fields.
  from speculative_t5x.weights import pairs

# Float32 sums of min(p, q) may pass 1 by a rounding error; a probability beyond this is refused.
_ROUNDING = 1e-5


@dataclasses.dataclass(frozen=True)
class Positions:
  """Per generated position of each sequence: confidence [n_s] and beta [n_s] (lists of arrays,
  one per sequence, positions up to and including EOS). Both are probabilities: real numbers in
  [0, 1] (up to float32 rounding), NaN refused (a ValueError at construction)."""

  confidence: list[np.ndarray]
  beta: list[np.ndarray]

  def __post_init__(self):
    if len(self.confidence) != len(self.beta) or not self.confidence:
      raise ValueError(
          f"need one confidence and one beta array per sequence, got {len(self.confidence)} "
          f"and {len(self.beta)} (and at least one)."
      )
    for c, b in zip(self.confidence, self.beta):
      if np.shape(c) != np.shape(b) or np.ndim(c) != 1:
        raise ValueError(
            f"confidence and beta of a sequence must be 1-D of one length, got "
            f"{np.shape(c)} and {np.shape(b)}."
        )
    for name, arrays, meaning in (
        ("confidence", self.confidence, "the drafter's largest probability"),
        ("beta", self.beta, "sum_x min(p(x), q(x)), a draft's acceptance probability"),
    ):
      for s, values in enumerate(arrays):
        _check_probabilities(values, f"{name} of sequence {s}", meaning)

  @property
  def count(self) -> int:
    return int(sum(len(c) for c in self.confidence))

  @classmethod
  def concatenate(cls, parts: Sequence["Positions"]) -> "Positions":
    return cls(
        [c for part in parts for c in part.confidence], [b for part in parts for b in part.beta]
    )


def _check_probabilities(values, name: str, meaning: str) -> None:
  """A ValueError unless `values` holds real numbers in [0, 1] (up to _ROUNDING)."""
  values = np.asarray(values)
  if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
    raise ValueError(f"{name} must hold real numbers ({meaning}), got dtype {values.dtype}.")
  bad = ~((values >= -_ROUNDING) & (values <= 1 + _ROUNDING))  # NaN compares False
  if np.any(bad):
    i = int(np.argmax(bad))
    raise ValueError(
        f"{name} holds {values[i]:.6g} at position {i}: it must be a probability in [0, 1] "
        f"({meaning}); {int(bad.sum())} position(s) are NaN or out of range. Measure them with "
        "score_positions, or fix the values given."
    )


def score_positions(
    target_config: network.T5Config,
    target_params,
    drafter: drafters_lib.Drafter,
    drafter_params,
    encoder_input_tokens: jax.Array,
    sequences: jax.Array,
    temperature,
    topk: int = 0,
    topp: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced on target-generated `sequences` [B, L]: (confidence [B, L], beta [B, L]).

  confidence: max_x softmax(drafter logits)(x) at temperature 1 (what `ConfidenceStop` reads);
  beta: sum_x min(p, q) with p and q standardized as decoding does (`alpha.teacher_forced_betas`;
  at temperature 0 an indicator of argmax agreement)."""
  beta, drafter_logits = alpha.teacher_forced_betas(
      target_config,
      target_params,
      drafter,
      drafter_params,
      encoder_input_tokens,
      sequences,
      temperature,
      topk,
      topp,
  )
  rule = draft_length.ConfidenceStop(0.0)
  confidence = jax.vmap(rule.confidence, in_axes=1, out_axes=1)(drafter_logits, sequences)
  return confidence, beta


def measure_positions(
    pair: pairs.Pair,
    encoder_batches: Iterable,
    decode_length: int,
    temperature: float,
    eos_id: int,
    num_tokens: int,
) -> Positions:
  """Confidence and beta (`score_positions`) at about `num_tokens` positions the target generated
  itself (`alpha.target_samples`, seed 0) from the encoder input arrays [B, Le] of
  `encoder_batches`, consumed until that many are counted (or it runs out), for a loaded `pair`
  with a drafter."""
  if pair.drafter is None:
    raise ValueError("the pair has no drafter: calibration scores a drafter against its target.")
  score = jax.jit(
      lambda tp, dp, enc, seq: score_positions(
          pair.target_config, tp, pair.drafter, dp, enc, seq, float(temperature)
      )
  )
  samples = alpha.target_samples(
      pair.target_config,
      pair.target_params,
      encoder_batches,
      decode_length,
      eos_id,
      float(temperature),
  )
  parts = []
  for encoder_tokens, sequences in samples:
    confidence, beta = score(pair.target_params, pair.drafter_params, encoder_tokens, sequences)
    parts.append(
        positions_from_scores(
            np.asarray(confidence), np.asarray(beta), np.asarray(sequences), eos_id
        )
    )
    if sum(part.count for part in parts) >= num_tokens:
      break
  return Positions.concatenate(parts)


def positions_from_scores(
    confidence: np.ndarray, beta: np.ndarray, sequences: np.ndarray, eos_id: int
) -> Positions:
  """[B, L] scores -> Positions, each sequence cut after its first EOS (`alpha`'s positions).
  The three arrays must have one [B, L] shape (nothing is cut to fit) and eos_id be an id >= 1."""
  shapes = [np.shape(confidence), np.shape(beta), np.shape(sequences)]
  if len(set(shapes)) != 1 or len(shapes[0]) != 2:
    raise ValueError(
        f"confidence, beta and sequences must each be [batch, length], one shape (score_positions "
        f"gives them so), got {shapes[0]}, {shapes[1]} and {shapes[2]}."
    )
  if not np.issubdtype(np.asarray(sequences).dtype, np.integer):
    raise ValueError(
        f"sequences must hold integer token ids, got dtype {np.asarray(sequences).dtype}."
    )
  validation.check_eos_id(eos_id)
  lengths = np.asarray(alpha.generated_positions(jnp.asarray(sequences), eos_id)).sum(axis=1)
  confidence, beta = np.asarray(confidence, np.float64), np.asarray(beta, np.float64)
  return Positions(
      [confidence[i, :n] for i, n in enumerate(lengths)],
      [beta[i, :n] for i, n in enumerate(lengths)],
  )


def _blocks(confidence: np.ndarray, beta: np.ndarray, threshold: float, gamma: int):
  """One sequence: (drafts k_j [n], expected accepted drafts E[n_j] [n]) for every start j."""
  n = len(confidence)
  padded_c = np.concatenate([confidence, np.zeros(gamma)])  # past the end: stop
  padded_b = np.concatenate([beta, np.zeros(gamma)])  # past EOS nothing is accepted
  starts = np.arange(n)[:, None] + np.arange(gamma)[None]  # [n, gamma]
  confident = padded_c[starts] >= threshold
  # Slot i (0-based) is drafted iff the drafts before it were all confident.
  drafted = np.concatenate(
      [np.ones((n, 1), bool), np.cumprod(confident[:, :-1], axis=1).astype(bool)], axis=1
  )
  accept_all = np.cumprod(padded_b[starts], axis=1)  # P(drafts 1..i+1 accepted)
  return drafted.sum(axis=1), np.sum(np.where(drafted, accept_all, 0.0), axis=1)


def chain_decodes(positions: Positions, gamma: int) -> tuple[float, float]:
  """Chains of gamma drafts decoding the sequences these positions are of, each target call
  starting where the one before ended -> (tokens, expected target calls), each the mean per
  sequence.

  A call from position j accepts N drafts, P(N >= i) = prod_{l<i} beta_{j+l} for i <= gamma
  (beta = 0 past the sequence's end), and adds the target's token, so the next call starts at
  j + N + 1: calls(j) = 1 + E[calls(j + N + 1)], calls(j >= n) = 0 for a sequence of n
  positions. Unlike `predict`, whose iterations start at every position alike, the calls start
  where the decode puts them: after a rejection, at the positions a drafter misses. At
  temperature 0 (beta 0 or 1) these are the decode's own calls, exactly."""
  gamma = validation.check_integer(gamma, "gamma", 1, meaning="the most drafts per target call")
  calls = []
  for beta in positions.beta:
    n = len(beta)
    padded = np.concatenate([np.asarray(beta, np.float64), np.zeros(gamma)])
    after = np.zeros(n + gamma + 1)  # after[j]: expected calls from position j; 0 from n on
    for j in range(n - 1, -1, -1):
      reach = np.concatenate([[1.0], np.cumprod(padded[j : j + gamma])])  # P(N >= i), i <= gamma
      p_n = np.append(reach[:-1] - reach[1:], reach[-1])  # P(N = i)
      after[j] = 1.0 + float(np.dot(p_n, after[j + 1 : j + gamma + 2]))
    calls.append(after[0])
  tokens = [len(beta) for beta in positions.beta]
  return float(np.mean(tokens)), float(np.mean(calls))


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The model's outcome of one setting: gamma (the most drafts), threshold, and per target
  call the drafts (drafter steps), the tokens and the predicted speedup."""

  gamma: int
  threshold: float
  drafts_per_call: float
  tokens_per_call: float
  speedup: float

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def predict(
    positions: Positions, gamma: int, threshold: float, c: float, verify_cost: float
) -> Prediction:
  """The module docstring's model at one (gamma, threshold), c and verify_cost(gamma); each is
  checked (a ValueError naming it)."""
  gamma = validation.check_integer(gamma, "gamma", 1, meaning="the most drafts per target call")
  threshold = _check_threshold(threshold)
  c = validation.check_number(c, "c", 0, meaning="drafter step time over target step time")
  verify_cost = _check_verify_cost(verify_cost, gamma)
  drafts, accepted = zip(
      *(
          _blocks(c_s, b_s, threshold, gamma)
          for c_s, b_s in zip(positions.confidence, positions.beta)
      )
  )
  drafts_per_call = float(np.mean(np.concatenate(drafts)))
  tokens_per_call = float(np.mean(np.concatenate(accepted))) + 1.0
  return Prediction(
      gamma,
      threshold,
      drafts_per_call,
      tokens_per_call,
      tokens_per_call / (c * drafts_per_call + verify_cost),
  )


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Every prediction of the grid, the best adaptive setting and the best static gamma."""

  predictions: list[Prediction]
  best: Prediction
  best_static: Prediction

  def as_dict(self) -> dict:
    return {
        "best": self.best.as_dict(),
        "best_static": self.best_static.as_dict(),
        "grid": [p.as_dict() for p in self.predictions],
    }


def _check_threshold(threshold) -> float:
  return validation.check_number(
      threshold, "threshold", 0, 1, meaning="a confidence: 0 never stops, i.e. static gamma"
  )


def _check_verify_cost(verify_cost, gamma: int) -> float:
  name, meaning = (
      f"verify_cost({gamma})",
      "the target's time on gamma + 1 tokens over its time on 1",
  )
  value = validation.check_number(verify_cost, name, meaning=meaning)
  if value <= 0:
    raise ValueError(f"{name} must be > 0 ({meaning}), got {value}.")
  return value


def _non_empty(values, name: str, wanted: str) -> list:
  """`values`, a non-empty sequence (not a string) -> a list."""
  listed = list(values) if isinstance(values, Iterable) and not isinstance(values, str) else []
  if not listed:
    raise ValueError(f"{name} must be a non-empty sequence of {wanted}, got {values!r}.")
  return listed


def _per_gamma(value, gammas: list[int], name: str, measured: str) -> dict:
  """A mapping gamma -> value (with every gamma) or a function of gamma -> {gamma: value}."""
  if isinstance(value, Mapping):
    missing = [int(g) for g in gammas if g not in value]
    if missing:
      raise ValueError(
          f"{name} has no entry for gamma {missing} (it has {list(value)}): measure {measured} "
          "for every gamma searched, or search fewer gammas."
      )
    return {g: value[g] for g in gammas}
  if callable(value):
    return {g: value(g) for g in gammas}
  raise ValueError(f"{name} must be a mapping or a function gamma -> cost, got {value!r}.")


def calibrate(
    positions: Positions,
    gammas: Sequence[int],
    c: float | Callable[[int], float] | Mapping[int, float],
    verify_cost: Callable[[int], float] | Mapping[int, float],
    thresholds: Sequence[float] | None = None,
) -> Calibration:
  """Searches gamma in `gammas` and tau in `thresholds` (default: 0 and the measured confidences'
  percentiles 5, 10, ..., 95) for the highest predicted speedup.

  Args:
    positions: the measured confidences and betas.
    gammas: candidate most-drafts settings (integers >= 1).
    c: what a draft costs in target steps: one number for every gamma, or gamma -> it (a mapping
      needs an entry for every gamma), e.g. its price inside the loop at that gamma.
    verify_cost: gamma -> the target's time on gamma + 1 tokens over its time on 1 (a
      mapping needs an entry for every gamma).
    thresholds: candidate thresholds, each in [0, 1].

  Every argument is checked before the search (a ValueError naming it): each c finite and >= 0,
  each threshold in [0, 1], each verify cost finite and > 0.
  """
  if not isinstance(positions, Positions):
    raise ValueError(f"positions must be a calibration.Positions, got {type(positions).__name__}.")
  gammas = [
      validation.check_integer(g, "each of gammas", 1, meaning="the most drafts per target call")
      for g in _non_empty(gammas, "gammas", "integers >= 1, e.g. (1, 2, 4)")
  ]
  if isinstance(c, Mapping) or callable(c):
    draft_costs = {
        g: validation.check_number(
            value, f"c({g})", 0, meaning="what a draft costs in target steps at that gamma"
        )
        for g, value in _per_gamma(c, gammas, "c", "a draft's cost").items()
    }
  else:
    c = validation.check_number(c, "c", 0, meaning="drafter step time over target step time")
    draft_costs = {g: c for g in gammas}
  costs = {
      g: _check_verify_cost(value, g)
      for g, value in _per_gamma(
          verify_cost, gammas, "verify_cost", "the target's time on gamma + 1 tokens"
      ).items()
  }
  if thresholds is None:
    measured = np.concatenate(positions.confidence)
    thresholds = [0.0] + sorted({float(x) for x in np.percentile(measured, range(5, 100, 5))})
  thresholds = [
      _check_threshold(t) for t in _non_empty(thresholds, "thresholds", "numbers in [0, 1]")
  ]
  predictions = [
      predict(positions, g, t, draft_costs[g], costs[g]) for g in gammas for t in thresholds
  ]
  static = [p for p in predictions if p.threshold == 0.0] or [
      predict(positions, g, 0.0, draft_costs[g], costs[g]) for g in gammas
  ]
  return Calibration(
      predictions,
      max(predictions, key=lambda p: p.speedup),
      max(static, key=lambda p: p.speedup),
  )


def confidence_buckets(positions: Positions, edges: Sequence[float]) -> list[dict]:
  """alpha per confidence bucket [edges[i], edges[i+1]): rows {'low', 'high', 'positions',
  'share', 'alpha'} (alpha None for an empty bucket); the last bucket includes its high edge.
  edges: at least two finite numbers, increasing (a ValueError otherwise)."""
  edges = [
      validation.check_number(e, "each of edges") for e in _non_empty(edges, "edges", "numbers")
  ]
  if len(edges) < 2 or any(high <= low for low, high in zip(edges[:-1], edges[1:])):
    raise ValueError(
        f"edges must be at least two increasing numbers (bucket i is [edges[i], edges[i+1])), "
        f"got {edges}."
    )
  confidence = np.concatenate(positions.confidence)
  beta = np.concatenate(positions.beta)
  rows = []
  for i, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
    last = i == len(edges) - 2
    inside = (confidence >= low) & ((confidence <= high) if last else (confidence < high))
    count = int(inside.sum())
    rows.append(
        {
            "low": float(low),
            "high": float(high),
            "positions": count,
            "share": count / len(confidence),
            "alpha": float(beta[inside].mean()) if count else None,
        }
    )
  return rows
