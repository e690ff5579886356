r"""The paper's Table 2 row, measured and predicted, and the sweep that measures it.

This module holds the one definition of "speedup" that every script and the notebook report.

What is measured (`sweep`), for a target, its drafters and every (temperature, gamma), on
identical inputs with the same rng, per example, every setting of one example timed side by side
in the same rounds (`benchmark.time_calls`):
  - the wall time of the baseline (`models.EncoderDecoderModel`, `decoding.temperature_sample`)
    and of speculative decoding (`models.SpeculativeEncoderDecoderModel`): compilation excluded,
    `warmup` untimed calls, the median (and IQR) of `repeats` calls, each ended by
    `block_until_ready`;
  - the wall time of each one's prefill (`model.prefill`: encoders and caches, the work before the
    decoding loop);
  - the decoded tokens, each row's up to and including its first EOS (`decoding.decoded_lengths`);
  - the speculative decode's own statistics (`decoding.SpeculativeStats`): alpha (mean beta),
    tokens per target call, acceptance rate;
and per drafter and temperature, on compiled decode steps at the run's encoder and cache lengths
(`benchmark.DecodeCosts`), timed between the examples (ceil(cost_repeats / examples) rounds after
each example's decodes, so the costs and the decodes sample the same minutes of the machine):
  - c, the drafter's single-token step time over the target's (Definition 3.7);
  - the verification cost, the target on gamma + 1 tokens over the target on 1 token;
  - the iteration cost, gamma drafter steps and the verification timed together in one loop, over
    the target's step (apart they cost gamma * c + verification cost), and from it the cost of a
    draft inside the loop, c in loop = (iteration - verification) / gamma in target steps.

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

A draft tree's row (`sweep(draft_trees=)`, M drafts of depth D, gamma = D) reports its verify cost
on M + 1 tokens and predicts only from the realized tokens per call, tokens / (D c + verify
cost): Theorem 3.8's E[tokens](alpha) and the iteration timed together (D drafter steps of one
token, gamma + 1 verified) describe chains, so `predicted`, `predicted_hw`, `iteration_cost`,
`predicted_in_situ` and the efficiencies built on them are NaN there.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tqdm

from speculative_t5x import benchmark
from speculative_t5x import decoding
from speculative_t5x import draft_length
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import tasks
from speculative_t5x import theory
from speculative_t5x import trees

BASELINE = "baseline"  # the settings' key of the baseline; speculative ones are (drafter, gamma).
RANDOM_TASK = "random"  # the task label of random inputs.


@dataclasses.dataclass(frozen=True, eq=False)
class ExampleResult:
  """One setting's decode of one example.

  timing: the decode call; prefill: the setting's prefill call on the same example; decodes:
  [B, L] int32 (the example's B rows, 1 at batch 1); tokens: the decoded tokens of its rows, each
  up to and including its first EOS; stats: the speculative decode's per-row statistics (None for
  the baseline).
  """

  timing: benchmark.Timing
  prefill: benchmark.Timing
  decodes: np.ndarray
  tokens: int
  stats: decoding.SpeculativeStats | None = None

  @classmethod
  def from_decode(
      cls,
      timing: benchmark.Timing,
      prefill: benchmark.Timing,
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
    timings: Sequence[benchmark.Timing],
    tokens: Sequence[int],
    prefills: Sequence[benchmark.Timing] | None = None,
) -> float:
  """Median times summed over the examples (each less its prefill's median, if given) over the
  tokens summed over them, in ms per token."""
  ms = sum(t.median_ms for t in timings) - sum(p.median_ms for p in prefills or ())
  return ms / sum(tokens)


def _summarize(timings: Sequence[benchmark.Timing]) -> dict:
  """Per-example timings -> the mean of their medians and IQRs (ms), and each one."""
  return {
      "mean_median_ms": float(np.mean([t.median_ms for t in timings])),
      "mean_iqr_ms": float(np.mean([t.iqr_ms for t in timings])),
      "per_example": [t.as_dict() for t in timings],
  }


@dataclasses.dataclass(frozen=True)
class SpeedupRow:
  """One Table 2 row: a (task, drafter, temperature, gamma) setting against the baseline.

  Fields are what was measured (see the module docstring); the speedups, predictions and
  efficiencies are properties computed from them, each by one formula. Per-example fields hold
  one entry per example, in order: times of the decodes and of their prefills, decoded tokens.
  """

  task: str
  drafter: str
  temperature: float
  gamma: int
  alpha: float
  tokens_per_target_call: float
  acceptance_rate: float
  stat_totals: Mapping[str, float]
  c: float
  verify_cost: float
  iteration_cost: float
  interference_ms: float
  baseline_ms: tuple[benchmark.Timing, ...]
  speculative_ms: tuple[benchmark.Timing, ...]
  baseline_prefill_ms: tuple[benchmark.Timing, ...]
  speculative_prefill_ms: tuple[benchmark.Timing, ...]
  baseline_tokens: tuple[int, ...]
  speculative_tokens: tuple[int, ...]
  outputs_match_baseline: float
  draft_tree: tuple[int, ...] | None = None  # the tree's parents (`trees.DraftTree`); None: chain
  c_in_loop: float = math.nan  # `DecodeCosts.c_in_loop` (NaN for a tree)

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
      gamma: int,
      costs: benchmark.DecodeCosts,
      baseline: Sequence[ExampleResult],
      speculative: Sequence[ExampleResult],
      draft_tree: trees.DraftTree | None = None,
  ) -> "SpeedupRow":
    """The row of one setting from its per-example results and the baseline's on the same
    examples (in the same order), with the step costs of its drafter at its temperature; alpha
    and tokens per target call pool the speculative results' statistics over all their rows.
    A draft tree's costs must hold its verification on M + 1 tokens (as 'gamma' M)."""
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
    verified = gamma if draft_tree is None else draft_tree.num_nodes
    chain = draft_tree is None
    return cls(
        task=task,
        drafter=drafter,
        temperature=float(temperature),
        gamma=int(gamma),
        alpha=stats.alpha,
        tokens_per_target_call=stats.tokens_per_call,
        acceptance_rate=stats.acceptance_rate,
        stat_totals=stats.totals(),
        c=costs.c,
        verify_cost=costs.verify_cost(verified),
        iteration_cost=costs.iteration_cost(gamma) if chain else math.nan,
        interference_ms=costs.interference_ms(gamma) if chain else math.nan,
        baseline_ms=tuple(r.timing for r in baseline),
        speculative_ms=tuple(r.timing for r in speculative),
        baseline_prefill_ms=tuple(r.prefill for r in baseline),
        speculative_prefill_ms=tuple(r.prefill for r in speculative),
        baseline_tokens=tuple(r.tokens for r in baseline),
        speculative_tokens=tuple(r.tokens for r in speculative),
        outputs_match_baseline=float(np.mean(matches)),
        draft_tree=None if chain else draft_tree.parents,
        c_in_loop=costs.c_in_loop(gamma) if chain else math.nan,
    )

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
    """Theorem 3.8 at the measured alpha and c (NaN for a tree)."""
    if self.draft_tree is not None:
      return math.nan
    return theory.speedup(self.alpha, self.gamma, self.c)

  @property
  def predicted_hw(self) -> float:
    """Theorem 3.8 with the measured verification cost in place of one target step (NaN for a
    tree)."""
    if self.draft_tree is not None:
      return math.nan
    return theory.speedup_hardware_aware(self.alpha, self.gamma, self.c, self.verify_cost)

  @property
  def predicted_hw_realized(self) -> float:
    """The realized tokens per target call over gamma c + verify cost: `predicted_hw` with them
    in place of E[tokens](alpha); for a tree, D drafter calls and its verification."""
    return self.tokens_per_target_call / (self.gamma * self.c + self.verify_cost)

  @property
  def predicted_in_situ(self) -> float:
    """E[tokens](alpha) over the iteration's network work timed together (NaN for a tree)."""
    if self.draft_tree is not None:
      return math.nan
    return theory.expected_tokens(self.alpha, self.gamma) / self.iteration_cost

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
        "gamma": self.gamma,
        "draft_tree": self.draft_tree,
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
    "speedup: per token with each call's prefill (encoders and caches, timed alongside) taken "
    "off, the part Theorem 3.8 models; predicted: Theorem 3.8 at the measured alpha and c; "
    "c in loop: what a draft costs inside the loop, the iteration's time less the verification's, over gamma, in target steps (c is a drafter step timed alone); predicted_hw: with the measured verify cost in place of one target step; efficiency: loop "
    "speedup / predicted_hw; efficiency (realized): the same with the tokens per target call the "
    "run realized in place of E[tokens](alpha), the loop's cost alone. iteration cost: gamma "
    "drafter steps and the verification timed together in one loop, over the target's step "
    "(apart they cost gamma * c + verify cost); efficiency in situ: loop speedup / (expected "
    "tokens per iteration / iteration cost), the speculative loop's own overhead (acceptance, "
    "writes, bookkeeping) alone."
)


def _mean_ms(timings: Sequence[benchmark.Timing]) -> str:
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
  speculative decoding and the speedup, then alpha, tokens per target call, what one
  verification and one draft in the loop cost in target steps; `markdown_table` has every
  figure."""
  lines = []
  for r in rows:
    shape = f"gamma {r.gamma}" if r.draft_tree is None else f"tree {r.draft_tree}"
    baseline = _summarize(r.baseline_ms)["mean_median_ms"]
    speculative = _summarize(r.speculative_ms)["mean_median_ms"]
    verified = r.gamma + 1 if r.draft_tree is None else len(r.draft_tree) + 1
    in_loop = "" if math.isnan(r.c_in_loop) else f", a draft in the loop {r.c_in_loop:.2f}"
    lines.append(
        f"  {r.drafter}, {shape}, temperature {r.temperature:g}: speedup {r.speedup:.2f}x per token\n"
        f"    per example: baseline {baseline:.1f} ms, speculative {speculative:.1f} ms; alpha "
        f"{r.alpha:.2f}, {r.tokens_per_target_call:.2f} tokens per target call\n"
        f"    in target steps: a verification of {verified} tokens {r.verify_cost:.2f}{in_loop}"
    )
  return "\n".join(lines) + "\n"


CostsByTemperature = Mapping[float, Mapping[str, benchmark.DecodeCosts]]


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


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
  """One way to decode: `predict(params, batch, rng, temperature) -> (decodes [B, L], aux)` and
  `prefill(params, batch)`, both jitted, and their params."""

  predict: Callable[..., Any]
  prefill: Callable[..., Any]
  params: Any


# name -> (a `drafters.Drafter`, e.g. `drafters.T5Drafter(config)`; its params).
Drafters = Mapping[str, tuple[drafters_lib.Drafter, Any]]


Verifiers = Mapping[str, speculative.Verifier]
DraftStops = Mapping[str, draft_length.DraftStop | None]
DraftTrees = Mapping[str, trees.DraftTree]


@dataclasses.dataclass(frozen=True)
class SweepSetting:
  """One speculative setting of a sweep: which drafter decodes, with what draft shape and
  verifier, under which row label. A new axis of the benchmark is one more field here, passed on
  by `model_kwargs`.

  label: the rows' drafter label (`SpeedupRow.drafter`); drafter: a key of the sweep's drafters;
  gamma: drafts per target call (a tree's depth); verifier: None is the draft shape's default
  (Algorithm 1 for a chain, `speculative.TreeVerifier` for a tree); draft_stop: a `draft_length`
  rule or None (static gamma); draft_tree: a `trees.DraftTree` or None (a chain).
  """

  label: str
  drafter: str
  gamma: int
  verifier: speculative.Verifier | None = None
  draft_stop: draft_length.DraftStop | None = None
  draft_tree: trees.DraftTree | None = None

  def __post_init__(self):
    if self.draft_tree is not None and self.gamma != self.draft_tree.depth:
      raise ValueError(
          f"setting {self.label!r}: a draft tree of depth {self.draft_tree.depth} runs at gamma "
          f"{self.draft_tree.depth}, got gamma {self.gamma}."
      )

  @property
  def key(self) -> tuple[str, int]:
    """Its key in `build_settings` and `Sweep.results`: (label, gamma)."""
    return self.label, self.gamma

  @property
  def verified(self) -> int:
    """Drafts per verification: gamma for a chain, M for a tree of M nodes."""
    return self.gamma if self.draft_tree is None else self.draft_tree.num_nodes

  def model_kwargs(self) -> dict[str, Any]:
    """The `models.SpeculativeEncoderDecoderModel` arguments it sets."""
    return dict(
        gamma=self.gamma,
        verifier=self.verifier,
        draft_stop=self.draft_stop,
        draft_tree=self.draft_tree,
    )


def grid_settings(
    drafters: Iterable[str],
    gammas: Sequence[int],
    verifiers: Verifiers | None = None,
    draft_stops: DraftStops | None = None,
    draft_trees: DraftTrees | None = None,
) -> list[SweepSetting]:
  """Every drafter with every verifier, draft-length rule and gamma, then with every tree at its
  depth. Labels: the drafter's name, then ', <verifier> verification' where several verifiers
  are swept and ', <rule> draft length' where several rules are (the defaults: Algorithm 1,
  static gamma); '<name>, tree <label>' for a tree (verified by the tree shape's default
  verifier)."""
  verifiers = verifiers or {"token": speculative.ALGORITHM_1}
  draft_stops = draft_stops or {"static": None}
  settings = []
  for name in drafters:
    for verifier_label, verifier in verifiers.items():
      for stop_label, stop in draft_stops.items():
        label = name
        if len(verifiers) > 1:
          label += f", {verifier_label} verification"
        if len(draft_stops) > 1:
          label += f", {stop_label} draft length"
        settings += [
            SweepSetting(label, name, int(g), verifier, stop) for g in sorted({*map(int, gammas)})
        ]
    for tree_label, tree in (draft_trees or {}).items():
      settings.append(SweepSetting(f"{name}, tree {tree_label}", name, tree.depth, draft_tree=tree))
  return settings


def cost_gammas(settings: Sequence[SweepSetting]) -> list[int]:
  """The 'gammas' whose verification the costs time: each setting's drafts per verification
  (the target on that many + 1 tokens)."""
  return sorted({setting.verified for setting in settings})


def build_settings(
    target_config: network.T5Config,
    target_params: Any,
    drafters: Drafters,
    settings: Sequence[SweepSetting],
    vocabulary: seqio.Vocabulary,
) -> dict[Hashable, Setting]:
  """BASELINE and each setting's key (label, gamma) -> Setting, the drafter's parameters in their
  `Drafter.decode_params` form; settings that differ only in their drafter's parameters (drafters
  of one Drafter object) share compiled functions."""
  target = network.Transformer(target_config)
  baseline = models.EncoderDecoderModel(target, vocabulary, vocabulary)
  result = {BASELINE: Setting(baseline.jit_predict(), jax.jit(baseline.prefill), target_params)}
  functions, decode_params = {}, {}
  for setting in settings:
    drafter, drafter_params = drafters[setting.drafter]
    benchmark.check_drafter(drafter, f"drafter {setting.drafter!r}")
    if setting.drafter not in decode_params:
      # The drafter's decode form (`Drafter.decode_params`), made once, as a user decoding many
      # examples with the same parameters would.
      decode_params[setting.drafter] = drafter.decode_params(drafter_params)
    kwargs = setting.model_kwargs()
    key = (drafter, *kwargs.values())
    if key not in functions:
      model = models.SpeculativeEncoderDecoderModel(
          target, drafter, vocabulary, vocabulary, **kwargs
      )
      functions[key] = (model.jit_predict(), jax.jit(model.prefill))
    result[setting.key] = Setting(
        *functions[key], {"target": target_params, "drafter": decode_params[setting.drafter]}
    )
  return result


def time_example(
    decoders: Mapping[Hashable, Setting],
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    temperature: float,
    eos_id: int,
    *,
    repeats: int,
    warmup: int = benchmark.DEFAULT_WARMUP,
) -> dict[Hashable, ExampleResult]:
  """Every setting's decode of one example, and its prefill, timed side by side
  (`benchmark.time_calls`) -> key -> ExampleResult.

  Args:
    batch: {'encoder_input_tokens': [B, Le], 'decoder_input_tokens': [B, L]}.
  """
  temperature = jnp.float32(temperature)
  calls = {}
  for key, setting in decoders.items():
    calls["decode", key] = (setting.predict, (setting.params, batch, rng, temperature))
    calls["prefill", key] = (setting.prefill, (setting.params, batch))
  timings = benchmark.time_calls(calls, repeats=repeats, warmup=warmup)
  results = {}
  for key in decoders:
    fn, args = calls["decode", key]
    decodes, aux = fn(*args)
    results[key] = ExampleResult.from_decode(
        timings["decode", key], timings["prefill", key], decodes, aux, eos_id
    )
  return results


def check_input_source(
    task: str | None,
    split: str,
    input_file: str | None,
    sentencepiece_model: str | None,
    num_examples: int,
) -> None:
  """What `load_inputs` will read, checked without reading it: one source (a task or an input
  file), a registered task with `split`, an input file and sentencepiece model that exist, and a
  count of examples >= 0 (>= 1 for random inputs). Raises ValueError naming the fix."""
  if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)):
    raise ValueError(f"num_examples must be an integer >= 0, got {num_examples!r}.")
  if num_examples < 0:
    raise ValueError(f"num_examples must be >= 0 (0: every example), got {num_examples}.")
  if task is not None and input_file is not None:
    raise ValueError(f"give a task ({task}) or an input file ({input_file}), not both.")
  if task is not None:
    tasks.check_split(tasks.get_task(task), split, "the split")
    return
  if input_file is not None:
    if not sentencepiece_model:
      raise ValueError(f"the input file {input_file!r} needs a sentencepiece model to tokenize it.")
    for path, what in ((input_file, "input file"), (sentencepiece_model, "sentencepiece model")):
      if not os.path.isfile(path):
        raise ValueError(f"the {what} {path!r} does not exist (or is not a file).")
    return
  if num_examples < 1:
    raise ValueError(f"random inputs need num_examples >= 1, got {num_examples}.")


def load_inputs(
    vocab_size: int,
    task_feature_lengths: Mapping[str, int],
    *,
    task: str | None = None,
    split: str = "test",
    input_file: str | None = None,
    sentencepiece_model: str | None = None,
    num_examples: int = 0,
    seed: int = 0,
    eos_id: int = 1,
) -> tuple[str, seqio.Vocabulary, np.ndarray]:
  """A sweep's examples, from one of three sources:
    - `task`: the 'inputs' of its `split` through the task's pipeline (truncated as in T5X), in
      the task's vocabulary;
    - `input_file`: its non-empty lines, tokenized with `sentencepiece_model`;
    - neither: `num_examples` random ones (`benchmark.random_inputs`, seeded by `seed`).
  `num_examples` caps the first two (0: all).

  Args:
    vocab_size: the models' vocabulary size (a task's or file's vocabulary must fit it).
    task_feature_lengths: {'inputs': Le, 'targets': ...}.
  Returns:
    (task label, vocabulary, encoder inputs [N, Le] int32, EOS-ended and 0-padded).
  """
  check_input_source(task, split, input_file, sentencepiece_model, num_examples)
  length = int(task_feature_lengths["inputs"])
  if task:
    seqio_task = tasks.get_task(task)
    vocabulary = seqio_task.output_features["targets"].vocabulary
    benchmark.check_vocabulary(vocabulary, vocab_size, f"task {task}")
    return (
        f"{task}:{split}",
        vocabulary,
        tasks.feature_arrays(
            seqio_task, split, "inputs", task_feature_lengths, num_examples or None
        ),
    )
  if input_file:
    vocabulary = seqio.SentencePieceVocabulary(sentencepiece_model)
    benchmark.check_vocabulary(vocabulary, vocab_size, sentencepiece_model)
    lines = benchmark.read_lines(input_file, num_examples or None)
    return (
        pathlib.Path(input_file).stem,
        vocabulary,
        benchmark.encode_texts(lines, vocabulary, length),
    )
  return (
      RANDOM_TASK,
      seqio.PassThroughVocabulary(vocab_size, eos_id=eos_id),
      benchmark.random_inputs(vocab_size, num_examples, length, seed, eos_id),
  )


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What `sweep` measured.

  rows: one per drafter, gamma and temperature (in that nesting); costs: temperature -> drafter ->
  DecodeCosts; results: temperature -> setting (BASELINE or (drafter, gamma)) -> one
  ExampleResult per example; cost_rounds: the timed rounds behind each step cost.
  """

  rows: list[SpeedupRow]
  costs: dict[float, dict[str, benchmark.DecodeCosts]]
  results: dict[float, dict[Hashable, list[ExampleResult]]]
  cost_rounds: int


def _check_sweep(
    target_config,
    drafters,
    settings,
    temperatures,
    encoder_inputs,
    decode_length,
    repeats,
    cost_repeats,
) -> None:
  if not drafters:
    raise ValueError("no drafters to sweep: give at least one name -> (drafter, params).")
  for name, (drafter, _) in drafters.items():
    benchmark.check_drafter(drafter, f"drafter {name!r}")
    vocab_size = drafter.vocab_size
    if vocab_size != target_config.vocab_size:
      raise ValueError(
          f"drafter {name!r} has vocab_size {vocab_size} but the target has "
          f"{target_config.vocab_size}: speculative decoding needs one vocabulary (a drafter "
          "whose vocab_size is unset takes the target's through `Drafter.for_target`, as "
          "`pairs.load_pair` does)."
      )
  if not settings:
    raise ValueError("no settings to sweep: give at least one (report.grid_settings).")
  for setting in settings:
    if not isinstance(setting, SweepSetting):
      raise ValueError(
          f"settings must be report.SweepSetting objects (report.grid_settings makes them), got "
          f"{setting!r}."
      )
    if setting.drafter not in drafters:
      raise ValueError(
          f"setting {setting.label!r} names drafter {setting.drafter!r}, which is not one of "
          f"the drafters {sorted(drafters)}."
      )
    if isinstance(setting.gamma, bool) or not isinstance(setting.gamma, int) or setting.gamma < 1:
      raise ValueError(
          f"setting {setting.label!r}: gamma must be an integer >= 1, got {setting.gamma!r}."
      )
  keys = [setting.key for setting in settings]
  if len(set(keys)) != len(keys):
    raise ValueError(f"two settings share a (label, gamma): {sorted(keys)}; give distinct labels.")
  if not temperatures:
    raise ValueError("no temperatures to sweep: give at least one (0 is greedy).")
  if np.ndim(encoder_inputs) != 3 or min(np.shape(encoder_inputs)) < 1:
    raise ValueError(
        f"encoder_inputs must be [examples, batch, length] with every size >= 1, got "
        f"shape {np.shape(encoder_inputs)} (one batch-1 example per row of x [N, Le]: "
        "pass x[:, None])."
    )
  if min(decode_length, repeats, cost_repeats) < 1:
    raise ValueError(
        f"decode_length, repeats and cost_repeats must be >= 1, got {decode_length}, "
        f"{repeats} and {cost_repeats}."
    )


def sweep(
    target_config: network.T5Config,
    target_params: Any,
    drafters: Drafters,
    settings: Sequence[SweepSetting],
    temperatures: Sequence[float],
    encoder_inputs: np.ndarray,
    decode_length: int,
    *,
    vocabulary: seqio.Vocabulary,
    task: str,
    seed: int = 0,
    repeats: int = 3,
    warmup: int = benchmark.DEFAULT_WARMUP,
    cost_repeats: int = benchmark.DEFAULT_REPEATS,
    steps_per_call: int = benchmark.DEFAULT_STEPS_PER_CALL,
    progress: bool = False,
) -> Sweep:
  """Measures every setting at every temperature against the baseline (the module docstring).

  For each temperature, each example's decodes (the baseline and every speculative setting, with
  the rng fold_in(PRNGKey(seed), example)) are timed side by side (`time_example`); after them,
  ceil(cost_repeats / examples) rounds of the decode steps behind the costs
  (`benchmark.cost_steps`, at the examples' batch size, encoder length and cache length, with the
  temperature's standardization and draw).

  Args:
    drafters: name -> (a `drafters.Drafter`, params).
    settings: the speculative settings (`SweepSetting`; `grid_settings` crosses drafters,
      gammas, verifiers, draft-length rules and trees), all timed side by side per example.
    encoder_inputs: [examples, B, Le] int32: each example a batch of B rows (1 for Table 2).
    decode_length: tokens decoded per row (the decoder input length).
    vocabulary: the models' output vocabulary (its eos_id ends the decodes).
    task: the rows' task label.
    progress: show a progress bar over the examples.
  Returns:
    The rows, the costs, every example's results and the cost rounds.
  """
  temperatures = [float(t) for t in temperatures]
  _check_sweep(
      target_config,
      drafters,
      settings,
      temperatures,
      encoder_inputs,
      decode_length,
      repeats,
      cost_repeats,
  )
  examples, batch_size, encoder_length = np.shape(encoder_inputs)
  timed = cost_gammas(settings)
  geometry = benchmark.DecodeGeometry.for_decoding(
      encoder_length, decode_length, max(timed) + 1, steps_per_call
  )
  decoders = build_settings(target_config, target_params, drafters, settings, vocabulary)
  used = {setting.drafter: drafters[setting.drafter] for setting in settings}
  steps = benchmark.cost_steps(target_config, target_params, used, timed)
  batches = [
      {
          "encoder_input_tokens": jnp.asarray(x, jnp.int32),
          "decoder_input_tokens": jnp.zeros((batch_size, decode_length), jnp.int32),
      }
      for x in encoder_inputs
  ]
  rngs = [jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(examples)]
  cost_rounds = max(1, math.ceil(cost_repeats / examples))
  results = {t: {key: [] for key in decoders} for t in temperatures}
  costs = {}
  bar = tqdm.tqdm(
      total=len(temperatures) * examples, desc="examples", unit="example", disable=not progress
  )
  for temperature in temperatures:
    calls = benchmark.decode_step_calls(steps, geometry, temperature=temperature, batch=batch_size)
    seconds = {key: [] for key in calls}
    for i, (batch, rng) in enumerate(zip(batches, rngs)):
      for key, result in time_example(
          decoders, batch, rng, temperature, vocabulary.eos_id, repeats=repeats, warmup=warmup
      ).items():
        results[temperature][key].append(result)
      for key, times in benchmark.time_rounds(
          calls, repeats=cost_rounds, warmup=warmup if i == 0 else 0, compiled=i > 0
      ).items():
        seconds[key].append(times)
      bar.update()
    timings = benchmark.marginal_step_timings(
        {key: np.concatenate(times) for key, times in seconds.items()}, geometry
    )
    costs[temperature] = benchmark.costs_from_timings(timings, list(used), timed, geometry)
  bar.close()
  rows = [
      SpeedupRow.from_results(
          task,
          setting.label,
          t,
          setting.gamma,
          costs[t][setting.drafter],
          results[t][BASELINE],
          results[t][setting.key],
          draft_tree=setting.draft_tree,
      )
      for setting in settings
      for t in temperatures
  ]
  return Sweep(rows, costs, results, cost_rounds * examples)
