"""The draft shape chosen from the costs measured on this device: `Auto`.

Machines of one kind price a k-token verification differently, so a gamma tuned on one loses on
another. `Auto.choose` measures what Theorem 3.8's hardware-aware form needs and picks the
candidate with the highest predicted speedup, or the baseline when none is predicted faster. Only
the draft shape changes, so the output law is the target's whatever is chosen.

With real inputs (`LoopInputs`) the decoding loops themselves are timed, so their own work is in
every cost. Each input's decode less its prefill is fitted over the inputs as F + units x cost
(`_fit_decodes`): b, the baseline per token; L, a shape's loop per target call (chains of 1 and G
= max_gamma drafts timed, linear in gamma between them); F, a loop's fixed part. For a sentence
of n tokens in C target calls (`calibration.chain_decodes`, or Eq. 1 from alpha) the predicted
speedup is (F_b + n b) / (F + C L). The target's single-token step is only the unit.

Without inputs, costs come from steps alone: a chain costs gamma c_loop + verify(gamma) and a tree
D c_loop + verify(M), c_loop being G drafts and a verification timed together less the
verification, over G; a tree's tokens are the branching model's upper bound
(`theory.tree_expected_tokens`).

A candidate is chosen only where it clears `Auto.min_speedup` beyond the timing noise
(`Prediction.clears`), and a chain read off the line between the timed chains only where it beats
the fastest timed candidate by `Auto.interpolation_margin`: the line's own error is not a gain.

Decisions are cached per process, keyed by the device kind, the pair, the geometry, the
temperature and the acceptance; not on disk, since machines of one kind differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import TYPE_CHECKING, Any, Hashable, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import draft_shapes
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import theory
from speculative_t5x import trees as trees_lib
from speculative_t5x import validation
from speculative_t5x.measuring import acceptance_record
from speculative_t5x.measuring import calibration
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep

DRAFTER = "drafter"  # the drafter's name in `step_costs.cost_steps`' step names.
BASELINE = "baseline"
MIN_ROUNDS = 3  # timing rounds at least, whatever the budget: a median needs a few.
MAX_ROUNDS = 30
LOOP_INPUTS = 4  # inputs `Auto.choose_for_pair` times the decoding loops on (`LoopInputs`).
LOW_QUANTILE = 25  # `Prediction.speedup_low`: this percentile of the rounds' predictions.

if TYPE_CHECKING:  # pairs loads every model; measure_acceptance only reads a loaded pair.
  from speculative_t5x.weights import pairs

_DECISIONS: dict[Hashable, "Choice"] = {}


@dataclasses.dataclass(frozen=True)
class Prediction:
  """One candidate (shape None: the baseline): tokens and cost (in target steps) per target
  call, and the speedup they predict from the medians. speedup_low: the lower quartile of the
  speedups the timed rounds predict one by one (`Costs.round_ratios`), at most speedup; None
  where the loops were not timed."""

  shape: draft_shapes.DraftShape | None
  label: str
  expected_tokens: float
  cost: float
  speedup: float
  speedup_low: float | None = None

  def clears(self, min_speedup: float) -> bool:
    """Whether its speedup, and its rounds' lower quartile where kept, reach min_speedup."""
    low = self.speedup if self.speedup_low is None else self.speedup_low
    return min(self.speedup, low) >= min_speedup

  def as_dict(self) -> dict:
    return {
        "label": self.label,
        "shape": None if self.shape is None else self.shape.describe(),
        "expected_tokens": self.expected_tokens,
        "cost_target_steps": self.cost,
        "predicted_speedup": self.speedup,
        "predicted_speedup_lower_quartile": self.speedup_low,
    }


BASELINE_PREDICTION = Prediction(None, BASELINE, 1.0, 1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class LoopInputs:
  """Real inputs on which `Auto.measure` times the decoding loops: encoder_tokens [N, Le], each
  row decoded alone to decode_length tokens; vocabulary, whose EOS ends the decodes."""

  encoder_tokens: np.ndarray
  decode_length: int
  vocabulary: Any

  def __post_init__(self):
    tokens = np.asarray(self.encoder_tokens)
    if tokens.ndim != 2 or not tokens.size or not np.issubdtype(tokens.dtype, np.integer):
      raise validation.InvalidInputError(
          f"LoopInputs.encoder_tokens must be token ids [N, Le] with N, Le >= 1, got shape "
          f"{tokens.shape} of dtype {tokens.dtype}."
      )
    object.__setattr__(self, "encoder_tokens", tokens.astype(np.int32))
    validation.check_integer(self.decode_length, "decode_length", 1)
    validation.check_eos_id(getattr(self.vocabulary, "eos_id", None))

  def key(self) -> Hashable:
    """What the decision depends on."""
    tokens = self.encoder_tokens
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    return digest, tokens.shape, self.decode_length, self.vocabulary.vocab_size, self.eos_id

  @property
  def eos_id(self) -> int:
    return int(self.vocabulary.eos_id)


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """The decoding loops timed on `LoopInputs`, each round's decodes less prefills fitted as
  t_i = F + u_i x (`_fit_decodes`), u_i the decoded tokens (baseline) or target calls (a shape).

  baseline_token: x of the baseline; call: label ('gamma 1', 'tree 2,2,1') -> x of that shape;
  tokens_per_call: label -> what its loop realized; fixed: BASELINE and each label -> F. rounds
  and fixed_rounds: the same per round in ms, for `Costs.round_ratios` (empty: not kept, F = 0).
  """

  baseline_token: stopwatch.Timing
  call: dict[str, stopwatch.Timing]
  tokens_per_call: dict[str, float]
  inputs: int
  rounds: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
  fixed: dict[str, stopwatch.Timing] = dataclasses.field(default_factory=dict)
  fixed_rounds: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)

  def as_dict(self) -> dict:
    return {
        "baseline_ms_per_token": self.baseline_token.as_dict(),
        "ms_per_target_call": {label: t.as_dict() for label, t in self.call.items()},
        "ms_fixed_per_decode": {label: t.as_dict() for label, t in self.fixed.items()},
        "tokens_per_call": dict(self.tokens_per_call),
        "inputs": self.inputs,
        "ms_by_round": {label: list(ms) for label, ms in self.rounds.items()},
        "ms_fixed_by_round": {label: list(ms) for label, ms in self.fixed_rounds.items()},
    }


@dataclasses.dataclass(frozen=True)
class Costs:
  """What `Auto` measures on one device: target_step (1 token); verify, M -> the target on
  M + 1 tokens; gamma, G; iteration, G drafts and a verification in one loop step (timed where
  the loops are not); loop, the timed loops (None: the steps alone)."""

  target_step: stopwatch.Timing
  verify: dict[int, stopwatch.Timing]
  gamma: int
  iteration: stopwatch.Timing | None = None
  loop: LoopCosts | None = None

  def verify_cost(self, drafts: int) -> float:
    """The target on drafts + 1 tokens over its single-token step."""
    return self.verify[drafts].median_ms / self.target_step.median_ms

  @property
  def c_loop(self) -> float:
    """A draft in the loop, in target steps: (iteration - verification) / G, at least 0."""
    if self.iteration is None:
      raise ValueError("the iteration was not timed: Auto times it where no loop is timed.")
    drafting = self.iteration.median_ms - self.verify[self.gamma].median_ms
    return max(drafting / self.gamma / self.target_step.median_ms, 0.0)

  @property
  def baseline_step(self) -> float:
    """b, the baseline's loop per token in target steps; 1 where the loops were not timed."""
    if self.loop is None:
      return 1.0
    return self.loop.baseline_token.median_ms / self.target_step.median_ms

  def chain_cost(self, gamma: int) -> float:
    """A chain's target call in target steps: its timed loop's (`_on_the_line`), else
    gamma c_loop + verify(gamma)."""
    if self.loop is None:
      return gamma * self.c_loop + self.verify_cost(gamma)
    ms = {label: t.median_ms for label, t in self.loop.call.items()}
    return float(self._on_the_line(ms, gamma)) / self.target_step.median_ms

  def fixed(self, label: str, gamma: int | None = None) -> float:
    """F of BASELINE or a shape (a chain: `gamma`, off the line) in target steps; 0 unfitted."""
    if self.loop is None or not self.loop.fixed:
      return 0.0
    if gamma is None:
      return self.loop.fixed[label].median_ms / self.target_step.median_ms
    ms = {label: t.median_ms for label, t in self.loop.fixed.items()}
    return float(self._on_the_line(ms, gamma)) / self.target_step.median_ms

  def _on_the_line(self, by_label: dict[str, Any], gamma: int) -> Any:
    """A chain's figure, linear in gamma between the timed chains' of 1 and G drafts."""
    first = np.asarray(by_label[_chain_label(1)], np.float64)
    last = np.asarray(by_label[_chain_label(self.gamma)], np.float64)
    weight = 0.0 if self.gamma == 1 else (gamma - 1) / (self.gamma - 1)
    return first + weight * (last - first)

  def tree_cost(self, label: str, depth: int, drafts: int) -> float:
    """A tree's target call in target steps: its timed loop's, else depth c_loop +
    verify(drafts)."""
    if self.loop is None:
      return depth * self.c_loop + self.verify_cost(drafts)
    return self.loop.call[label].median_ms / self.target_step.median_ms

  def round_ratios(
      self, label: str, gamma: int | None = None, decode: tuple[float, float] | None = None
  ) -> np.ndarray | None:
    """b_r / L_r per timed round r, both from that round, so a slow spell lands on both (a
    chain: `gamma`, off the line). decode: (tokens, calls), over which each round's F are
    spread. None where the rounds were not kept."""
    if self.loop is None or not self.loop.rounds:
      return None

    def per_round(kept: dict[str, tuple[float, ...]]) -> tuple[np.ndarray, np.ndarray]:
      call = np.asarray(kept[label]) if gamma is None else self._on_the_line(kept, gamma)
      return np.asarray(kept[BASELINE]), call

    baseline, call = per_round(self.loop.rounds)
    if decode is not None and self.loop.fixed_rounds:
      tokens, calls = decode
      baseline_fixed, call_fixed = per_round(self.loop.fixed_rounds)
      baseline, call = baseline + baseline_fixed / tokens, call + call_fixed / calls
    return baseline / call

  def as_dict(self) -> dict:
    timed = self.iteration is not None
    return {
        "target_step_ms": self.target_step.as_dict(),
        "verify_cost": {str(m + 1): self.verify_cost(m) for m in sorted(self.verify)},
        "verify_ms": {str(m + 1): t.as_dict() for m, t in sorted(self.verify.items())},
        "iteration_gamma": self.gamma,
        "iteration_ms": self.iteration.as_dict() if timed else None,
        "c_in_loop": self.c_loop if timed else None,
        "chain_call_cost": {str(g): self.chain_cost(g) for g in range(1, self.gamma + 1)},
        "baseline_loop_step": self.baseline_step,
        "loop": None if self.loop is None else self.loop.as_dict(),
    }


def _predicted(prediction: Prediction) -> str:
  """'<label> <speedup>x', with ' (low <speedup_low>x)' where kept."""
  low = prediction.speedup_low
  return f"{prediction.label} {prediction.speedup:.2f}x" + (
      "" if low is None else f" (low {low:.2f}x)"
  )


def _chain_label(gamma: int) -> str:
  return f"gamma {gamma}"


def _tree_label(branching: Sequence[int]) -> str:
  return f"tree {','.join(map(str, branching))}"


@dataclasses.dataclass(frozen=True)
class Choice:
  """What `Auto.choose` decided and every number behind it.

  chosen: the fastest candidate that clears `Auto.min_speedup`, or the baseline; best: the
  fastest speculative one by its medians; speculative: the one to show (chosen, or the fastest
  timed where the baseline is); acceptance_tokens: the positions alpha was measured at (0:
  given); cached: decided before in this process.
  """

  chosen: Prediction
  best: Prediction
  speculative: Prediction
  predictions: list[Prediction]
  costs: Costs
  alpha: float
  alpha_source: str
  temperature: float
  compile_seconds: float
  timing_seconds: float
  rounds: int
  device_kind: str
  acceptance_tokens: int = 0
  cached: bool = False
  min_speedup: float = 1.0
  interpolation_margin: float = 0.03

  @property
  def shape(self) -> draft_shapes.DraftShape | None:
    """The chosen draft shape, None for the baseline."""
    return self.chosen.shape

  def reason(self) -> str:
    """Why the choice is what it is, with the figures."""
    if self.chosen.shape is None:
      best = f"{self.best.speedup:.2f}x"
      noise = self.best.speedup >= self.min_speedup  # the noise kept it out, not the cost
      if noise:
        best += f" from the medians, {self.best.speedup_low:.2f}x at its rounds' lower quartile"
      return (
          "no draft shape is predicted faster than the baseline here"
          f"{' beyond the timing noise' if noise else ''} (the best, {self.best.label}, {best}): "
          f"a verification of {self.costs.gamma + 1} tokens costs "
          f"{self.costs.verify_cost(self.costs.gamma):.2f} target steps on this device, and "
          "speculative decoding pays where it costs about 1"
      )
    interpolated = ""
    if self.best != self.chosen and self.best.clears(self.min_speedup):
      interpolated = (
          f" ({self.best.label}, its loop not timed, is predicted {self.best.speedup:.2f}x: "
          f"within the interpolation margin, {self.interpolation_margin:.0%})"
      )
    chosen = self.chosen
    baseline = chosen.speedup * chosen.cost / chosen.expected_tokens  # per token, F spread
    return (
        f"{chosen.expected_tokens:.2f} tokens per target call at alpha {self.alpha:.2f} "
        f"for {chosen.cost:.2f} target steps per call here, against {baseline:.2f} per token "
        f"for the baseline: predicted {chosen.speedup:.2f}x{interpolated}"
    )

  def summary(self) -> str:
    """Lines for a terminal: the decision, the measured costs, every candidate."""
    costs = self.costs
    verify = ", ".join(f"{m + 1}: {costs.verify_cost(m):.2f}" for m in sorted(costs.verify))
    drafting = "" if costs.iteration is None else f"; a draft in the loop {costs.c_loop:.3f}"
    lines = [
        f"auto draft shape at temperature {self.temperature:g}: {self.chosen.label}, "
        f"{self.reason()}.",
        f"  measured on {self.device_kind}: target step {costs.target_step.median_ms:.2f} ms; "
        f"verifying k tokens, in target steps: {verify}{drafting}; alpha {self.alpha:.3f} "
        f"({self.alpha_source})",
    ]
    if costs.loop is None:
      lines.append("  the loops' own work (acceptance, writes) is not in these costs: no inputs")
    else:
      calls = ", ".join(
          f"{label} {t.median_ms / costs.target_step.median_ms:.2f}"
          for label, t in costs.loop.call.items()
      )
      fixed = ""
      if costs.loop.fixed:
        fixed = "; per decode, fixed: " + ", ".join(
            f"{label} {costs.fixed(label):.2f}" for label in costs.loop.fixed
        )
      lines.append(
          f"  the decoding loops on {costs.loop.inputs} inputs, in target steps: the baseline "
          f"{costs.baseline_step:.2f} per token; per target call {calls}{fixed}"
      )
    lines += [
        "  predicted: " + ", ".join(_predicted(p) for p in self.predictions),
        f"  measuring took {self.compile_seconds:.1f} s compiling, {self.timing_seconds:.1f} s "
        f"timing ({self.rounds} rounds)"
        + (" (decided before in this process: reused)" if self.cached else ""),
    ]
    return "\n".join(lines)

  def as_dict(self) -> dict:
    return {
        "chosen": self.chosen.as_dict(),
        "best_speculative": self.best.as_dict(),
        "shown_speculative": self.speculative.as_dict(),
        "reason": self.reason(),
        "predictions": [p.as_dict() for p in self.predictions],
        "alpha": self.alpha,
        "alpha_source": self.alpha_source,
        "acceptance_tokens": self.acceptance_tokens,
        "temperature": self.temperature,
        "costs": self.costs.as_dict(),
        "measurement": {
            "compile_seconds": self.compile_seconds,
            "timing_seconds": self.timing_seconds,
            "rounds": self.rounds,
            "device_kind": self.device_kind,
            "cached": self.cached,
        },
    }


@gin.configurable(module="auto_shape")
@dataclasses.dataclass(frozen=True)
class Auto:
  """The candidates and the measurement's budget.

  max_gamma: chains of 1..max_gamma drafts; trees: branchings (children per depth, e.g. (2, 2,
  1)) for a drafter that proposes trees; budget_s: seconds of timing rounds, compilation apart,
  MIN_ROUNDS at least; min_speedup and interpolation_margin: the module docstring.
  """

  max_gamma: int = 4
  trees: Sequence[Any] = ()
  budget_s: float = 4.0
  min_speedup: float = 1.0
  interpolation_margin: float = 0.03

  def __post_init__(self):
    validation.check_integer(self.max_gamma, "max_gamma", 1, meaning="the longest chain tried")
    validation.check_number(self.budget_s, "budget_s", 0, meaning="seconds of timing rounds")
    validation.check_number(
        self.min_speedup, "min_speedup", 0, meaning="the predicted speedup a shape must reach"
    )
    validation.check_number(
        self.interpolation_margin,
        "interpolation_margin",
        0,
        meaning="the predicted gain an untimed chain needs over a timed candidate",
    )
    if isinstance(self.trees, (str, bytes)):
      raise validation.InvalidInputError(
          f"trees must be a sequence of branchings, e.g. ((2, 2, 1),), got {self.trees!r}."
      )
    object.__setattr__(self, "trees", tuple(_branching(t) for t in self.trees))

  @property
  def max_block(self) -> int:
    """The most tokens a candidate's target call scores: the k a geometry must admit."""
    return max(shape.num_drafts for shape in self.candidates()) + 1

  def candidates(self) -> list[draft_shapes.DraftShape]:
    """Chains of 1..max_gamma drafts, then the trees."""
    chains = [draft_shapes.Chain(g) for g in range(1, self.max_gamma + 1)]
    return chains + [draft_shapes.Tree(branching) for branching in self.trees]

  def choose(
      self,
      target_config: network.T5Config,
      target_params: Any,
      drafter: drafters_lib.Drafter,
      drafter_params: Any,
      geometry: step_costs.DecodeGeometry,
      temperature: float,
      acceptance: float | calibration.Positions,
      acceptance_source: str = "given",
      loop_inputs: LoopInputs | None = None,
  ) -> Choice:
    """Measures the costs on the default device (`measure`) and predicts every candidate at
    `acceptance`, alpha or the betas per position (`measure_acceptance`) -> the Choice, cached
    per process."""
    step_costs.check_drafter(drafter)
    if isinstance(acceptance, calibration.Positions):
      alpha = float(np.mean(np.concatenate(acceptance.beta)))
      acceptance_key = hashlib.sha256(np.concatenate(acceptance.beta).tobytes()).hexdigest()
    else:
      alpha = validation.check_number(
          acceptance, "acceptance", 0, 1, meaning="alpha, the acceptance rate"
      )
      acceptance, acceptance_key = None, alpha
    temperature = validation.check_number(temperature, "temperature", 0)
    if self.trees and type(drafter).propose_tree is drafters_lib.Drafter.propose_tree:
      raise validation.InvalidInputError(
          f"{type(drafter).__name__} proposes chains only: give Auto(trees=()) for it."
      )
    device_kind = jax.devices()[0].device_kind
    key = (
        self,
        device_kind,
        acceptance_record.pair_fingerprint(target_config, target_params, drafter, drafter_params),
        geometry,
        temperature,
        acceptance_key,
        None if loop_inputs is None else loop_inputs.key(),
    )
    if key in _DECISIONS:
      # The same acceptance, bit for bit, whether measured or read this time: say which.
      return dataclasses.replace(_DECISIONS[key], cached=True, alpha_source=acceptance_source)
    costs, compile_seconds, timing_seconds, rounds = self.measure(
        target_config, target_params, drafter, drafter_params, geometry, temperature, loop_inputs
    )
    predictions = self.predictions(costs, alpha, acceptance)
    best = max(predictions, key=lambda p: p.speedup)
    clear = [p for p in predictions if p.clears(self.min_speedup)]
    chosen = self._fastest(clear, costs) if clear else BASELINE_PREDICTION
    _DECISIONS[key] = Choice(
        chosen=chosen,
        best=best,
        speculative=self._shown(predictions, costs) if chosen.shape is None else chosen,
        predictions=predictions,
        costs=costs,
        alpha=alpha,
        alpha_source=acceptance_source,
        temperature=temperature,
        compile_seconds=compile_seconds,
        timing_seconds=timing_seconds,
        rounds=rounds,
        device_kind=device_kind,
        acceptance_tokens=0 if acceptance is None else acceptance.count,
        min_speedup=self.min_speedup,
        interpolation_margin=self.interpolation_margin,
    )
    return _DECISIONS[key]

  def _fastest(self, candidates: list[Prediction], costs: Costs) -> Prediction:
    """The fastest candidate, or the fastest timed one where within `interpolation_margin`."""
    fastest = max(candidates, key=lambda p: p.speedup)
    fastest_timed = _fastest_timed(candidates, costs)
    if fastest_timed is None or fastest.speedup > fastest_timed.speedup * (
        1 + self.interpolation_margin
    ):
      return fastest
    return fastest_timed

  def _shown(self, candidates: list[Prediction], costs: Costs) -> Prediction:
    """Shown where the baseline is chosen: the fastest timed candidate, compiled already."""
    return _fastest_timed(candidates, costs) or self._fastest(candidates, costs)

  def choose_for_pair(
      self,
      pair: pairs.Pair,
      encoder_tokens: np.ndarray,
      decode_length: int,
      geometry: step_costs.DecodeGeometry,
      temperature: float,
      vocabulary: Any,
      inputs: str = "inputs",
      acceptance_file: str | os.PathLike | None = None,
      record: bool = False,
  ) -> Choice:
    """`choose` for a loaded pair: the acceptance per position along the target's own outputs
    for encoder_tokens [N, Le] (`measure_acceptance`), the loops timed on LOOP_INPUTS of them
    (`spanning_inputs`). `inputs` names them in the Choice.

    acceptance_file: records (`acceptance_record`) whose entry for this pair and inputs is used
    instead of measuring; record: measure anyway and write the entry."""
    if record and acceptance_file is None:
      raise validation.InvalidInputError(
          "record=True writes the measured acceptance into acceptance_file: give one."
      )
    eos_id = validation.check_eos_id(getattr(vocabulary, "eos_id", None))
    key = found = None
    if acceptance_file is not None:
      key = acceptance_record.Key.of(
          pair.target_config,
          pair.target_params,
          pair.drafter,
          pair.drafter_params,
          temperature,
          decode_length,
          encoder_tokens,
      )
      found = None if record else acceptance_record.find(acceptance_file, key)
    if found is None:
      positions = measure_acceptance(
          pair,
          [encoder_tokens],
          decode_length,
          temperature,
          eos_id,
          decode_length * len(encoder_tokens),
      )
      measured_on = (
          f"the {positions.count} tokens the target generated for {len(encoder_tokens)} {inputs}"
      )
      source = f"measured on {measured_on}"
      if record:
        acceptance_record.write(
            acceptance_file, acceptance_record.Record(key, positions, measured_on)
        )
        source += f", recorded in {acceptance_file}"
    else:
      positions = found.positions
      source = (
          f"recorded in {acceptance_file} for this pair and these {inputs}: {found.measured_on}"
      )
    loop_inputs = LoopInputs(
        spanning_inputs(np.asarray(encoder_tokens), positions, LOOP_INPUTS),
        decode_length,
        vocabulary,
    )
    return self.choose(
        pair.target_config,
        pair.target_params,
        pair.drafter,
        pair.drafter_params,
        geometry,
        temperature,
        positions,
        source,
        loop_inputs,
    )

  def measure(
      self,
      target_config,
      target_params,
      drafter,
      drafter_params,
      geometry,
      temperature,
      loop_inputs: LoopInputs | None = None,
  ) -> tuple[Costs, float, float, int]:
    """Times side by side the target's steps at `geometry` and, with `loop_inputs`, the loops
    (baseline, chains of 1 and max_gamma, each tree); without, the steps of every candidate and
    one iteration -> (Costs, compile seconds, timing seconds, rounds). The rounds fill
    `budget_s`, MIN_ROUNDS to MAX_ROUNDS."""
    gamma = self.max_gamma
    if loop_inputs is None:
      widths = {k + 1 for k in range(gamma + 1)} | {
          shape.num_drafts + 1 for shape in self.candidates()
      }
    else:
      widths = {1, gamma + 1}
    steps = {("target", k): [step_costs.Stage(target_config, target_params, k)] for k in widths}
    loop_calls = {}
    if loop_inputs is None:
      steps["iteration"] = step_costs.cost_steps(
          target_config, target_params, {DRAFTER: (drafter, drafter_params)}, [gamma]
      )["iteration", DRAFTER, gamma]
    else:
      shapes = {_chain_label(g): draft_shapes.Chain(g) for g in sorted({1, gamma})}
      shapes |= {_tree_label(b): draft_shapes.Tree(b) for b in self.trees}
      loop_calls = _loop_calls(
          target_config, target_params, drafter, drafter_params, shapes, loop_inputs, temperature
      )
    # With the loops timed the steps are the predictions' unit only: greedy at every temperature.
    step_temperature = temperature if loop_inputs is None else 0.0
    step_calls = step_costs.decode_step_calls(steps, geometry, temperature=step_temperature)
    calls = {**step_calls, **loop_calls}
    start = time.perf_counter()
    outputs = stopwatch.first_calls(calls)
    compile_seconds = time.perf_counter() - start
    # The compiling runs are the warm-up: a loop's second run is within the spread of the next
    # ones (docs/results.md).
    start = time.perf_counter()
    first = stopwatch.time_rounds(calls, repeats=1, warmup=0, compiled=True)
    round_seconds = sum(float(s[0]) for s in first.values())
    rounds = int(np.clip(self.budget_s // max(round_seconds, 1e-9), MIN_ROUNDS, MAX_ROUNDS))
    seconds = first
    if rounds > 1:
      rest = stopwatch.time_rounds(calls, repeats=rounds - 1, warmup=0, compiled=True)
      seconds = {name: np.concatenate([first[name], rest[name]]) for name in calls}

    def resolve(seconds):
      timings = step_costs.marginal_step_timings(
          {name: seconds[name] for name in step_calls}, geometry
      )
      loop = None
      if loop_inputs is not None:
        loop = _loop_costs({name: seconds[name] for name in loop_calls}, outputs, loop_inputs)
      return timings, loop

    # Steps or loops too short for the noise: up to MAX_ROUNDS, then its error.
    (timings, loop), added = stopwatch.until_resolved(
        calls, seconds, resolve, more=MAX_ROUNDS - rounds, limit=MAX_ROUNDS - rounds
    )
    rounds += added
    timing_seconds = time.perf_counter() - start
    costs = Costs(
        target_step=timings["target", 1],
        verify={k - 1: timings["target", k] for k in sorted(widths) if k > 1},
        gamma=gamma,
        iteration=timings.get("iteration"),
        loop=loop,
    )
    return costs, compile_seconds, timing_seconds, rounds

  def predictions(
      self, costs: Costs, alpha: float, positions: calibration.Positions | None = None
  ) -> list[Prediction]:
    """Every candidate's Prediction (the module docstring), chains first."""
    predictions = []
    sequence_tokens = None
    if positions is not None:
      sequence_tokens = float(np.mean([len(beta) for beta in positions.beta]))
    for gamma in range(1, self.max_gamma + 1):
      decode = None
      if positions is None:
        tokens = float(theory.expected_tokens(alpha, gamma))
      else:
        decode = calibration.chain_decodes(positions, gamma)
        tokens = decode[0] / decode[1]
      predictions.append(
          _prediction(
              costs,
              draft_shapes.Chain(gamma),
              _chain_label(gamma),
              tokens,
              costs.chain_cost(gamma),
              decode,
              gamma,
          )
      )
    for branching in self.trees:
      shape = draft_shapes.Tree(branching)
      label = _tree_label(branching)
      if costs.loop is not None:
        tokens = costs.loop.tokens_per_call[label]
      else:
        tokens = float(theory.tree_expected_tokens(theory.branching_acceptance(alpha, branching)))
      decode = None if sequence_tokens is None else (sequence_tokens, sequence_tokens / tokens)
      cost = costs.tree_cost(label, shape.depth, shape.num_drafts)
      predictions.append(_prediction(costs, shape, label, tokens, cost, decode))
    return predictions


def _prediction(
    costs: Costs,
    shape: draft_shapes.DraftShape,
    label: str,
    tokens: float,
    cost: float,
    decode: tuple[float, float] | None,
    gamma: int | None = None,
) -> Prediction:
  """A Prediction; with `decode` (n tokens, C calls), (F_b + n b) / (F + C L) per token."""
  baseline = costs.baseline_step
  if decode is not None:
    baseline += costs.fixed(BASELINE) / decode[0]
    cost += costs.fixed(label, gamma) / decode[1]
  speedup = tokens * baseline / cost
  return Prediction(
      shape,
      label,
      tokens,
      cost,
      speedup,
      _low(tokens, costs.round_ratios(label, gamma, decode), speedup),
  )


def spanning_inputs(
    encoder_tokens: np.ndarray, positions: calibration.Positions, count: int
) -> np.ndarray:
  """encoder_tokens [N, Le] -> the rows [min(count, N), Le] whose outputs' lengths (one
  `positions` sequence per row) sit at the (2i + 1) / (2 count) quantiles, so a fixed part and
  a per-unit cost can be told apart; else the first `count` rows."""
  if len(positions.beta) != len(encoder_tokens) or len(encoder_tokens) <= count:
    return encoder_tokens[:count]
  order = np.argsort([len(beta) for beta in positions.beta], kind="stable")
  picks = order[(2 * np.arange(count) + 1) * len(order) // (2 * count)]
  return encoder_tokens[np.sort(picks)]


def _fastest_timed(candidates: list[Prediction], costs: Costs) -> Prediction | None:
  """The fastest timed candidate, or None."""
  timed = [] if costs.loop is None else [p for p in candidates if p.label in costs.loop.call]
  return max(timed, key=lambda p: p.speedup) if timed else None


def _low(tokens: float, ratios: np.ndarray | None, speedup: float) -> float | None:
  """The LOW_QUANTILE-th percentile of tokens x ratios, at most `speedup`."""
  if ratios is None:
    return None
  return min(float(np.percentile(tokens * ratios, LOW_QUANTILE)), speedup)


def _loop_calls(
    target_config, target_params, drafter, drafter_params, shapes, loop_inputs, temperature
) -> dict[Hashable, tuple[Any, tuple]]:
  """("loop", label, i, "decode") and ("loop", label, "prefill") -> (fn, args) for the
  baseline and each of `shapes` (label -> shape): each input's decode and one prefill, whose
  work depends on the shapes alone. The decoders are `sweep.build_settings`', so a sweep after
  reuses them compiled."""
  settings = {
      label: sweep.SweepSetting(
          label,
          DRAFTER,
          shape,
          speculative.ALGORITHM_1 if isinstance(shape, draft_shapes.Chain) else None,
      )
      for label, shape in shapes.items()
  }
  decoders = sweep.build_settings(
      target_config,
      target_params,
      {DRAFTER: (drafter, drafter_params)},
      list(settings.values()),
      loop_inputs.vocabulary,
  )
  by_label = {BASELINE: decoders[sweep.BASELINE]}
  by_label |= {label: decoders[setting.key] for label, setting in settings.items()}
  calls = {}
  for i, row in enumerate(loop_inputs.encoder_tokens):
    batch = {
        "encoder_input_tokens": jnp.asarray(row[None]),
        "decoder_input_tokens": jnp.zeros((1, loop_inputs.decode_length), jnp.int32),
    }
    rng = jax.random.fold_in(jax.random.PRNGKey(0), i)
    for label, decoder in by_label.items():
      example = sweep.example_calls(decoder, batch, rng, temperature)
      calls["loop", label, i, "decode"] = example["decode"]
      calls.setdefault(("loop", label, "prefill"), example["prefill"])
  return calls


def _loop_costs(
    seconds: dict[Hashable, np.ndarray], outputs: dict[Hashable, Any], loop_inputs: LoopInputs
) -> LoopCosts:
  """`_loop_calls`' seconds [rounds] and outputs -> LoopCosts. Raises ValueError where a loop's
  time is not positive (the noise, not a price)."""
  inputs = range(len(loop_inputs.encoder_tokens))
  labels = list(dict.fromkeys(name[1] for name in seconds))
  per_unit, fixed, tokens, calls = {}, {}, {}, {}
  for label in labels:
    loops = np.stack(
        [seconds["loop", label, i, "decode"] - seconds["loop", label, "prefill"] for i in inputs]
    )  # [N, rounds]
    median = float(np.median(loops.sum(axis=0)))
    if median <= 0:
      raise ValueError(
          f"could not resolve the {label} loop's time on {len(inputs)} inputs: its decodes less "
          f"their prefills took a median of {median * 1e3:.4f} ms, within the noise; give "
          "longer inputs or a longer decode_length."
      )
    decodes, aux = zip(*(outputs["loop", label, i, "decode"] for i in inputs))
    decoded = np.array(
        [int(np.sum(decoding.decoded_lengths(np.asarray(d), loop_inputs.eos_id))) for d in decodes]
    )
    tokens[label] = int(decoded.sum())
    units = decoded
    if label != BASELINE:
      units = np.array(
          [int(np.sum(jax.device_get(a["speculative_stats"]["target_calls"]))) for a in aux]
      )
      calls[label] = int(units.sum())
    per_unit[label], fixed[label] = _fit_decodes(loops, units)
  return LoopCosts(
      baseline_token=stopwatch.Timing.from_seconds(per_unit[BASELINE]),
      call={label: stopwatch.Timing.from_seconds(per_unit[label]) for label in calls},
      tokens_per_call={label: tokens[label] / n for label, n in calls.items()},
      inputs=len(inputs),
      rounds={label: tuple(float(x) * 1e3 for x in s) for label, s in per_unit.items()},
      fixed={label: stopwatch.Timing.from_seconds(f) for label, f in fixed.items()},
      fixed_rounds={label: tuple(float(x) * 1e3 for x in f) for label, f in fixed.items()},
  )


def _fit_decodes(seconds: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """t_i = F + u_i x by least squares: seconds [N, rounds], units [N] -> (x, F), each
  [rounds]. Where noise hides the line (equal units, a round's F negative, or a median x not
  positive: time falling as the units grow), F = 0 and x = sum t / sum u: in that round, or in
  every round for the median."""
  units = np.asarray(units, np.float64)
  through_origin = seconds.sum(axis=0) / units.sum()
  if np.ptp(units) == 0:
    return through_origin, np.zeros_like(through_origin)
  centered = units - units.mean()
  slope = centered @ (seconds - seconds.mean(axis=0)) / (centered @ centered)
  intercept = seconds.mean(axis=0) - slope * units.mean()
  fitted = intercept >= 0
  per_unit = np.where(fitted, slope, through_origin)
  if np.median(per_unit) <= 0:
    return through_origin, np.zeros_like(through_origin)
  return per_unit, np.where(fitted, intercept, 0.0)


def _branching(tree: Any) -> tuple[int, ...]:
  """A branching (k_1, ..., k_D) as a tuple, or an InvalidInputError naming it."""
  try:
    branching = tuple(int(k) for k in tree)
    trees_lib.DraftTree.from_branching(branching)
  except (TypeError, ValueError) as e:
    raise validation.InvalidInputError(
        f"each of trees must be a branching, children per depth, e.g. (2, 2, 1), got {tree!r}: "
        f"{e}"
    ) from e
  return branching


def measure_acceptance(
    pair: pairs.Pair,
    encoder_batches,
    decode_length: int,
    temperature: float,
    eos_id: int,
    num_tokens: int,
) -> calibration.Positions:
  """beta per position along about `num_tokens` tokens the target generates from
  `encoder_batches` [B, Le] (`calibration.measure_positions`)."""
  positions = calibration.measure_positions(
      pair, encoder_batches, decode_length, temperature, eos_id, num_tokens
  )
  if not positions.count:
    raise ValueError("the target generated no token to measure acceptance on: give inputs.")
  return positions
