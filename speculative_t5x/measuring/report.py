r"""The paper's Table 2 row, measured and predicted, and its Markdown.

This module holds the one definition of "speedup" that every script and the notebook report.

A row is built from what `sweep.sweep` measures (sweep.py's docstring says how) for one setting
against the baseline on the same examples: per example, the wall time of each decode and of its
prefill (timed once per input shape), the decoded tokens and the speculative decode's statistics
(alpha, tokens per target call, acceptance rate); per drafter and temperature, the decode-step
costs (`step_costs.DecodeCosts`): c, the verification cost, the iteration cost and c in loop.

What a `SpeedupRow` reports from them:
  speedup                baseline time per decoded token over speculative time per decoded token,
                         times and tokens summed over the examples (median time per example):
                         sampled decodes of the two differ in length, so time per call would
                         compare different amounts of work;
  speedup_per_example    the mean over examples of baseline time / speculative time (medians):
                         the per-call view, weighing every example alike where `speedup` weighs
                         them by their time (at temperature 1 it also compares decodes of
                         different lengths);
  loop_speedup           `speedup` with each call's prefill time taken off its decode time: the
                         decoding loop, which Theorem 3.8 models;
  predicted              Theorem 3.8 at the measured alpha and c (`theory.speedup`), which assumes
                         verification costs one target step;
  predicted_hw           the hardware-aware prediction with the measured verification cost
                         (`theory.speedup_hardware_aware`);
  predicted_hw_realized  predicted_hw with the tokens per target call the run realized in place of
                         E[tokens](alpha): over a few hundred tokens the acceptances drawn, and the
                         drafts cut by EOS, move the two apart;
  predicted_in_situ      E[tokens](alpha) / iteration cost: the iteration's network work timed
                         together (the two networks evicting each other's weights included);
  efficiency             loop_speedup / predicted_hw; efficiency_realized and efficiency_in_situ
                         divide by the other two predictions (the loop's cost without the luck of
                         the acceptances drawn; the loop's own overhead alone: acceptance, writes,
                         bookkeeping);
  outputs_match_baseline the fraction of examples decoded exactly as the baseline did: 1 at
                         temperature 0; at other temperatures the two sample the same distribution
                         with different draws.

A row asks its draft shape (`draft_shapes.DraftShape.describe`) for its depth and whether it is
a chain. A draft tree's row (`sweep.grid_settings(draft_trees=)`, M drafts of depth D, gamma = D)
reports its verify cost on M + 1 tokens and predicts only from the realized tokens per call,
tokens / (D c + verify cost): Theorem 3.8's E[tokens](alpha) (`expected_tokens`,
`predicted_speedup`) and the iteration timed together (`timed_iteration`: gamma drafter steps of
one token, gamma + 1 verified) describe chains, so `predicted`, `predicted_hw`, `iteration_cost`, `predicted_in_situ` and the efficiencies
built on them are NaN there. A row of a sweep that timed no decode steps (`sweep.sweep` with
cost_repeats=0) has every step-cost figure NaN, and what is built on them; its speedups are
measured as any row's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import draft_shapes
from speculative_t5x import theory
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch


def _chain_gamma(shape: draft_shapes.DraftShape) -> int | None:
  """The shape's gamma where it is a chain (no tree in `describe()`), else None."""
  described = shape.describe()
  return described["gamma"] if described["draft_tree"] is None else None


def expected_tokens(shape: draft_shapes.DraftShape, alpha: float) -> float:
  """Tokens per target call at acceptance rate alpha in the paper's model (each draft accepted
  independently with probability alpha): Eq. (1) at a chain's gamma (under a `draft_stop` rule,
  the most drafts a call proposes); NaN for a tree, which is predicted from its realized tokens."""
  gamma = _chain_gamma(shape)
  return math.nan if gamma is None else theory.expected_tokens(alpha, gamma)


def predicted_speedup(
    shape: draft_shapes.DraftShape, alpha: float, c: float, verify_cost: float = 1.0
) -> float:
  """Theorem 3.8's speedup at acceptance rate alpha and cost coefficient c, a verification
  costing `verify_cost` target steps (the hardware-aware form; 1: the theorem's own); NaN for a
  tree."""
  gamma = _chain_gamma(shape)
  return math.nan if gamma is None else theory.speedup_hardware_aware(alpha, gamma, c, verify_cost)


def timed_iteration(shape: draft_shapes.DraftShape) -> int | None:
  """The gamma whose `step_costs.DecodeCosts.iteration` (gamma drafter steps, then the target on
  gamma + 1 tokens, in one loop step) is the shape's iteration: a chain's; None for a tree."""
  return _chain_gamma(shape)


@dataclasses.dataclass(frozen=True, eq=False)
class ExampleResult:
  """One setting's decode of one example.

  timing: the decode call; prefill: the setting's prefill call at the example's shapes
  (`sweep.time_prefills`: it does the same work for every example of them); decodes:
  [B, L] int32 (the example's B rows, 1 at batch 1); tokens: the decoded tokens of its rows, each
  up to and including its first EOS; stats: the speculative decode's per-row statistics (None for
  the baseline).
  """

  timing: stopwatch.Timing
  prefill: stopwatch.Timing
  decodes: np.ndarray
  tokens: int
  stats: decoding.SpeculativeStats | None = None

  @classmethod
  def from_decode(
      cls,
      timing: stopwatch.Timing,
      prefill: stopwatch.Timing,
      decodes: Any,
      aux: Mapping[str, Any],
      eos_id: int,
  ) -> "ExampleResult":
    """From a predict call's output: decodes [B, L] and aux (with 'speculative_stats' for a
    speculative decode)."""
    decodes = np.asarray(jax.device_get(decodes))
    stats = aux.get("speculative_stats")
    return cls(
        timing,
        prefill,
        decodes,
        int(np.sum(decoding.decoded_lengths(decodes, eos_id))),
        None if stats is None else decoding.SpeculativeStats.from_dict(jax.device_get(stats)),
    )


def _per_token_ms(
    timings: Sequence[stopwatch.Timing],
    tokens: Sequence[int],
    prefills: Sequence[stopwatch.Timing] | None = None,
) -> float:
  """Median times summed over the examples (each less its prefill's median, if given) over the
  tokens summed over them, in ms per token."""
  ms = sum(t.median_ms for t in timings) - sum(p.median_ms for p in prefills or ())
  return ms / sum(tokens)


def _summarize(timings: Sequence[stopwatch.Timing]) -> dict:
  """Per-example timings -> the mean of their medians and IQRs (ms), and each one."""
  return {
      "mean_median_ms": float(np.mean([t.median_ms for t in timings])),
      "mean_iqr_ms": float(np.mean([t.iqr_ms for t in timings])),
      "per_example": [t.as_dict() for t in timings],
  }


@dataclasses.dataclass(frozen=True)
class SpeedupRow:
  """One Table 2 row: a (task, drafter, temperature, draft shape) setting against the baseline.

  shape: the `draft_shapes.DraftShape` decoded (`gamma` is its depth). The other fields are what
  was measured (see the module docstring and sweep.py's); the speedups,
  predictions and efficiencies are properties computed from them, each by one formula.
  Per-example fields hold one entry per example, in order: times of the decodes and of their
  prefills, decoded tokens.
  """

  task: str
  drafter: str
  temperature: float
  shape: draft_shapes.DraftShape
  alpha: float
  tokens_per_target_call: float
  acceptance_rate: float
  stat_totals: Mapping[str, float]
  c: float
  verify_cost: float
  iteration_cost: float
  interference_ms: float
  baseline_ms: tuple[stopwatch.Timing, ...]
  speculative_ms: tuple[stopwatch.Timing, ...]
  baseline_prefill_ms: tuple[stopwatch.Timing, ...]
  speculative_prefill_ms: tuple[stopwatch.Timing, ...]
  baseline_tokens: tuple[int, ...]
  speculative_tokens: tuple[int, ...]
  outputs_match_baseline: float
  c_in_loop: float = math.nan  # `DecodeCosts.c_in_loop` (NaN where no iteration is timed)

  def __post_init__(self):
    counts = {
        len(getattr(self, name))
        for name in (
            "baseline_ms",
            "speculative_ms",
            "baseline_prefill_ms",
            "speculative_prefill_ms",
            "baseline_tokens",
            "speculative_tokens",
        )
    }
    if len(counts) != 1 or 0 in counts:
      raise ValueError(
          f"a row needs the same non-zero number of examples in every per-example "
          f"field, got {sorted(counts)}."
      )

  @classmethod
  def from_results(
      cls,
      task: str,
      drafter: str,
      temperature: float,
      shape: draft_shapes.DraftShape,
      costs: step_costs.DecodeCosts | None,
      baseline: Sequence[ExampleResult],
      speculative: Sequence[ExampleResult],
  ) -> "SpeedupRow":
    """The row of one setting from its per-example results and the baseline's on the same
    examples (in the same order), with the step costs of its drafter at its temperature; alpha
    and tokens per target call pool the speculative results' statistics over all their rows.
    The costs must hold the shape's verification of M + 1 tokens (as 'gamma' M) and, where the
    shape has one, its timed iteration; None (no step costs timed, `sweep.sweep` with
    cost_repeats=0) leaves c, the verification and iteration costs NaN, and the predictions
    made from them."""
    if len(baseline) != len(speculative) or not baseline:
      raise ValueError(
          f"need the baseline's and the speculative decode's results on the same "
          f"examples, got {len(baseline)} and {len(speculative)}."
      )
    if any(result.stats is None for result in speculative):
      raise ValueError(
          "a speculative result has no stats: build it from a speculative decode's "
          "aux (ExampleResult.from_decode)."
      )
    stats = decoding.SpeculativeStats.concatenate([result.stats for result in speculative])
    matches = [np.array_equal(b.decodes, s.decodes) for b, s in zip(baseline, speculative)]
    timed = None if costs is None else timed_iteration(shape)
    return cls(
        task=task,
        drafter=drafter,
        temperature=float(temperature),
        shape=shape,
        alpha=stats.alpha,
        tokens_per_target_call=stats.tokens_per_call,
        acceptance_rate=stats.acceptance_rate,
        stat_totals=stats.totals(),
        c=math.nan if costs is None else costs.c,
        verify_cost=math.nan if costs is None else costs.verify_cost(shape.num_drafts),
        iteration_cost=math.nan if timed is None else costs.iteration_cost(timed),
        interference_ms=math.nan if timed is None else costs.interference_ms(timed),
        baseline_ms=tuple(r.timing for r in baseline),
        speculative_ms=tuple(r.timing for r in speculative),
        baseline_prefill_ms=tuple(r.prefill for r in baseline),
        speculative_prefill_ms=tuple(r.prefill for r in speculative),
        baseline_tokens=tuple(r.tokens for r in baseline),
        speculative_tokens=tuple(r.tokens for r in speculative),
        outputs_match_baseline=float(np.mean(matches)),
        c_in_loop=math.nan if timed is None else costs.c_in_loop(timed),
    )

  @property
  def gamma(self) -> int:
    """Drafts per call along one path: gamma of a chain, a tree's depth D."""
    return self.shape.depth

  # ---- measured
  @property
  def speedup(self) -> float:
    """Baseline ms per decoded token over speculative ms per decoded token."""
    return _per_token_ms(self.baseline_ms, self.baseline_tokens) / _per_token_ms(
        self.speculative_ms, self.speculative_tokens
    )

  @property
  def speedup_per_example(self) -> float:
    """The mean over examples of baseline time over speculative time (medians)."""
    return float(
        np.mean([b.median_ms / s.median_ms for b, s in zip(self.baseline_ms, self.speculative_ms)])
    )

  @property
  def loop_speedup(self) -> float:
    """`speedup` with each call's prefill time taken off: the decoding loops alone."""
    return _per_token_ms(
        self.baseline_ms, self.baseline_tokens, self.baseline_prefill_ms
    ) / _per_token_ms(self.speculative_ms, self.speculative_tokens, self.speculative_prefill_ms)

  # ---- predicted
  @property
  def predicted(self) -> float:
    """Theorem 3.8 at the measured alpha and c (NaN for a tree, or without step costs)."""
    if math.isnan(self.c):
      return math.nan
    return predicted_speedup(self.shape, self.alpha, self.c)

  @property
  def predicted_hw(self) -> float:
    """Theorem 3.8 with the measured verification cost in place of one target step (NaN for a
    tree, or without step costs)."""
    if math.isnan(self.c):
      return math.nan
    return predicted_speedup(self.shape, self.alpha, self.c, self.verify_cost)

  @property
  def predicted_hw_realized(self) -> float:
    """The realized tokens per target call over gamma c + verify cost: `predicted_hw` with them
    in place of E[tokens](alpha); for a tree, D drafter calls and its verification."""
    return self.tokens_per_target_call / (self.gamma * self.c + self.verify_cost)

  @property
  def predicted_in_situ(self) -> float:
    """E[tokens](alpha) over the iteration's network work timed together (NaN for a tree)."""
    return expected_tokens(self.shape, self.alpha) / self.iteration_cost

  # ---- measured over predicted
  @property
  def efficiency(self) -> float:
    return self.loop_speedup / self.predicted_hw

  @property
  def efficiency_realized(self) -> float:
    return self.loop_speedup / self.predicted_hw_realized

  @property
  def efficiency_in_situ(self) -> float:
    return self.loop_speedup / self.predicted_in_situ

  def as_dict(self) -> dict:
    """The row as results.json writes it (times in ms: per-example timings and their means)."""
    return {
        "task": self.task,
        "drafter": self.drafter,
        "temperature": self.temperature,
        **self.shape.describe(),
        "alpha": self.alpha,
        "tokens_per_target_call": self.tokens_per_target_call,
        "acceptance_rate": self.acceptance_rate,
        "c": self.c,
        "c_in_loop": self.c_in_loop,
        "verify_cost": self.verify_cost,
        "speedup": self.speedup,
        "speedup_per_example": self.speedup_per_example,
        "loop_speedup": self.loop_speedup,
        "predicted": self.predicted,
        "predicted_hw": self.predicted_hw,
        "efficiency": self.efficiency,
        "predicted_hw_realized": self.predicted_hw_realized,
        "efficiency_realized": self.efficiency_realized,
        "iteration_cost": self.iteration_cost,
        "interference_ms": self.interference_ms,
        "predicted_in_situ": self.predicted_in_situ,
        "efficiency_in_situ": self.efficiency_in_situ,
        "baseline_ms": _summarize(self.baseline_ms),
        "speculative_ms": _summarize(self.speculative_ms),
        "baseline_prefill_ms": _summarize(self.baseline_prefill_ms),
        "speculative_prefill_ms": _summarize(self.speculative_prefill_ms),
        "baseline_tokens": list(self.baseline_tokens),
        "speculative_tokens": list(self.speculative_tokens),
        "outputs_match_baseline": self.outputs_match_baseline,
        "stats": {
            "alpha": self.alpha,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_target_call": self.tokens_per_target_call,
            **self.stat_totals,
        },
    }


# ----------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------
COLUMNS = (
    "task",
    "drafter",
    "temp",
    "gamma",
    "alpha",
    "tokens/call",
    "c",
    "c in loop",
    "verify cost",
    "baseline ms (IQR)",
    "speculative ms (IQR)",
    "prefill ms (base / spec)",
    "speedup",
    "speedup per example",
    "loop speedup",
    "predicted",
    "predicted_hw",
    "efficiency",
    "efficiency (realized)",
    "iteration cost",
    "efficiency in situ",
)
NOTES = (
    "speedup: baseline over speculative time per decoded token (whole calls, median per example); "
    "speedup per example: the mean over examples of baseline over speculative time; loop "
    "speedup: per token with each call's prefill (encoders and caches, timed once per input "
    "shape) taken off, the part Theorem 3.8 models; predicted: Theorem 3.8 at the measured "
    "alpha and c; "
    "c in loop: what a draft costs inside the loop, the iteration's time less the verification's, over gamma, in target steps (c is a drafter step timed alone); predicted_hw: with the measured verify cost in place of one target step; efficiency: loop "
    "speedup / predicted_hw; efficiency (realized): the same with the tokens per target call the "
    "run realized in place of E[tokens](alpha), the loop's cost alone. iteration cost: gamma "
    "drafter steps and the verification timed together in one loop, over the target's step "
    "(apart they cost gamma * c + verify cost); efficiency in situ: loop speedup / (expected "
    "tokens per iteration / iteration cost), the speculative loop's own overhead (acceptance, "
    "writes, bookkeeping) alone."
)


def _mean_ms(timings: Sequence[stopwatch.Timing]) -> str:
  summary = _summarize(timings)
  return f"{summary['mean_median_ms']:.1f} ({summary['mean_iqr_ms']:.1f})"


def markdown_table(rows: Sequence[SpeedupRow]) -> str:
  """The rows as a Markdown table (`COLUMNS`; `NOTES` explains them), one line per row."""
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for r in rows:
    prefill = (
        f"{_summarize(r.baseline_prefill_ms)['mean_median_ms']:.1f} / "
        f"{_summarize(r.speculative_prefill_ms)['mean_median_ms']:.1f}"
    )
    lines.append(
        "| "
        + " | ".join(
            [
                r.task,
                r.drafter,
                f"{r.temperature:g}",
                str(r.gamma),
                f"{r.alpha:.3f}",
                f"{r.tokens_per_target_call:.2f}",
                f"{r.c:.3f}",
                f"{r.c_in_loop:.3f}",
                f"{r.verify_cost:.2f}",
                _mean_ms(r.baseline_ms),
                _mean_ms(r.speculative_ms),
                prefill,
                f"{r.speedup:.2f}",
                f"{r.speedup_per_example:.2f}",
                f"{r.loop_speedup:.2f}",
                f"{r.predicted:.2f}",
                f"{r.predicted_hw:.2f}",
                f"{r.efficiency:.2f}",
                f"{r.efficiency_realized:.2f}",
                f"{r.iteration_cost:.2f}",
                f"{r.efficiency_in_situ:.2f}",
            ]
        )
        + " |"
    )
  return "\n".join(lines) + "\n"


def plain_summary(rows: Sequence[SpeedupRow]) -> str:
  """The rows as a few lines a newcomer reads: per row, ms per example of the baseline and of
  speculative decoding and the speedup, then alpha, tokens per target call, and where the step
  costs were timed, what one verification and one draft in the loop cost in target steps;
  `markdown_table` has every figure."""
  lines = []
  for r in rows:
    baseline = _summarize(r.baseline_ms)["mean_median_ms"]
    speculative = _summarize(r.speculative_ms)["mean_median_ms"]
    lines.append(
        f"  {r.drafter}, {r.shape.label}, temperature {r.temperature:g}: speedup {r.speedup:.2f}x per token\n"
        f"    per example: baseline {baseline:.1f} ms, speculative {speculative:.1f} ms; alpha "
        f"{r.alpha:.2f}, {r.tokens_per_target_call:.2f} tokens per target call"
    )
    if not math.isnan(r.verify_cost):
      in_loop = "" if math.isnan(r.c_in_loop) else f", a draft in the loop {r.c_in_loop:.2f}"
      lines[-1] += (
          f"\n    in target steps: a verification of {r.shape.width} tokens "
          f"{r.verify_cost:.2f}{in_loop}"
      )
  return "\n".join(lines) + "\n"


CostsByTemperature = Mapping[float, Mapping[str, step_costs.DecodeCosts]]


def costs_table(costs_by_temperature: CostsByTemperature) -> str:
  """The decode-step costs, one line per temperature and drafter, as a Markdown table."""
  lines = [
      "| temp | drafter | target step ms | drafter step ms | c | verify cost by gamma | "
      "c in loop by gamma | iteration cost by gamma | interference ms by gamma |",
      "|---" * 9 + "|",
  ]
  for temperature, costs in costs_by_temperature.items():
    for name, cost in costs.items():
      gammas = sorted(cost.verify)
      by_gamma = [
          ", ".join(f"{g}: {f(g):.{digits}f}" for g in gammas)
          for f, digits in (
              (cost.verify_cost, 2),
              (cost.c_in_loop, 3),
              (cost.iteration_cost, 2),
              (cost.interference_ms, 3),
          )
      ]
      lines.append(
          f"| {temperature:g} | {name} | {cost.target_step.median_ms:.3f} | "
          f"{cost.drafter_step.median_ms:.3f} | {cost.c:.3f} | " + " | ".join(by_gamma) + " |"
      )
  return "\n".join(lines) + "\n"


def costs_as_dict(costs_by_temperature: CostsByTemperature) -> dict:
  """{'t=<temperature>': {drafter: DecodeCosts.as_dict()}}, as results.json and costs.json hold
  them."""
  return {
      f"t={t:g}": {name: cost.as_dict() for name, cost in costs.items()}
      for t, costs in costs_by_temperature.items()
  }


def results_markdown(
    rows: Sequence[SpeedupRow], costs_by_temperature: CostsByTemperature, header: str
) -> str:
  """A run's report: the header, the rows' table and its notes, then the step costs."""
  return "\n".join(
      [
          header,
          "",
          markdown_table(rows),
          NOTES,
          "",
          "Decode-step costs (marginal time per step incl. standardization and draw, median over the "
          "timed rounds):",
          "",
          costs_table(costs_by_temperature),
      ]
  )
