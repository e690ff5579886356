r"""The timed sweep behind Table 2: every (temperature, setting) against the baseline, on the
same inputs with the same rng, each becoming a `report.SpeedupRow`.

Per example, every setting's decode is timed side by side in the same rounds
(`stopwatch.time_calls`), compilation excluded; each prefill once per encoder shape, since its
work depends on the shapes alone. The decode-step costs (`step_costs.DecodeCosts`) are timed
between the examples (`cost_rounds_after`), so costs and decodes sample the same minutes of the
machine; with cost_repeats=0 they are not, and the rows' step-cost figures are NaN.

The settings (`SweepSetting`, crossed by `grid_settings`) are drafters, gammas, verifiers,
draft-length rules and trees; the examples (`input_data.load_inputs`) come from a seqio task, a
file of lines or random token ids, and may differ in encoder length (`pad_to_buckets`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from speculative_t5x import draft_length
from speculative_t5x import draft_shapes
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x import validation
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.text import vocabularies

BASELINE = "baseline"  # the settings' key of the baseline; speculative ones are (drafter, gamma).
EXTRA_COST_ROUNDS = 10  # more rounds of the decode steps where one is within the noise,
MAX_EXTRA_COST_ROUNDS = 30  # up to this many (`sweep`), before its error.
# Rounds of each setting's prefill per encoder shape and temperature (`time_prefills`).
PREFILL_REPEATS = 10


@dataclasses.dataclass(frozen=True)
class Setting:
  """Jitted `predict(params, batch, rng, temperature) -> (decodes [B, L], aux)` and
  `prefill(params, batch)`, and their params."""

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
  """One speculative setting: the rows' label, a key of the sweep's drafters, a
  `draft_shapes.DraftShape` and a verifier (None: the shape's default). A new axis of the
  benchmark is one more field here, passed on by `model_kwargs`."""

  label: str
  drafter: str
  shape: draft_shapes.DraftShape
  verifier: speculative.Verifier | None = None

  @property
  def gamma(self) -> int:
    """Drafts per call along one path."""
    return self.shape.depth

  @property
  def key(self) -> tuple[str, int]:
    """(label, gamma): its key in `build_settings` and `Sweep.results`."""
    return self.label, self.gamma

  def model_kwargs(self) -> dict[str, Any]:
    """The `models.SpeculativeEncoderDecoderModel` arguments it sets."""
    return dict(draft_shape=self.shape, verifier=self.verifier)


def grid_settings(
    drafters: Iterable[str],
    gammas: Sequence[int],
    verifiers: Verifiers | None = None,
    draft_stops: DraftStops | None = None,
    draft_trees: DraftTrees | None = None,
) -> list[SweepSetting]:
  """Every drafter with every verifier, draft-length rule and gamma, then every tree. Labels:
  the drafter's name, with ', <verifier> verification' and ', <rule> draft length' where
  several are swept; '<name>, tree <label>' for a tree."""
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
            SweepSetting(label, name, draft_shapes.Chain(g, stop), verifier)
            for g in sorted({*map(int, gammas)})
        ]
    for tree_label, tree in (draft_trees or {}).items():
      settings.append(SweepSetting(f"{name}, tree {tree_label}", name, draft_shapes.Tree(tree)))
  return settings


def cost_gammas(settings: Sequence[SweepSetting]) -> list[int]:
  """Each setting's drafts per verification: the gammas whose verification the costs time."""
  return sorted({setting.shape.num_drafts for setting in settings})


def build_settings(
    target_config: network.T5Config,
    target_params: Any,
    drafters: Drafters,
    settings: Sequence[SweepSetting],
    vocabulary: vocabularies.Vocabulary,
) -> dict[Hashable, Setting]:
  """BASELINE and each setting's key -> Setting. The compiled functions are kept per process
  (`step_costs.shared`) without the parameters, so a sweep reuses those `auto_shape` timed."""
  validation.check_vocabulary(vocabulary, target_config.vocab_size, "vocabulary")
  result = {BASELINE: Setting(*_decode_functions(target_config, vocabulary), target_params)}
  decode_params = {}
  for setting in settings:
    drafter, drafter_params = drafters[setting.drafter]
    step_costs.check_drafter(drafter, f"drafter {setting.drafter!r}")
    if setting.drafter not in decode_params:
      # Made once, as a user decoding many examples with the same parameters would.
      decode_params[setting.drafter] = drafter.decode_params(drafter_params)
    result[setting.key] = Setting(
        *_decode_functions(target_config, vocabulary, drafter, setting.model_kwargs()),
        {"target": target_params, "drafter": decode_params[setting.drafter]},
    )
  return result


def _decode_functions(
    target_config: network.T5Config,
    vocabulary: vocabularies.Vocabulary,
    drafter: drafters_lib.Drafter | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """(jitted predict, jitted prefill) of the baseline (no drafter) or of speculative decoding."""
  model_kwargs = dict(model_kwargs or {})

  def make():
    target = network.Transformer(target_config)
    if drafter is None:
      model = models.EncoderDecoderModel(target, vocabulary, vocabulary)
    else:
      model = models.SpeculativeEncoderDecoderModel(
          target, drafter, vocabulary, vocabulary, **model_kwargs
      )
    return model.jit_predict(), model.jit_prefill()

  key = ("decode", target_config, vocabulary.vocab_size, vocabulary.eos_id, drafter)
  return step_costs.shared(key + tuple(model_kwargs.items()), make)


def time_example(
    decoders: Mapping[Hashable, Setting],
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    temperature: float,
    eos_id: int,
    *,
    repeats: int,
    warmup: int = stopwatch.DEFAULT_WARMUP,
    compiled: bool = False,
    prefills: Mapping[Hashable, stopwatch.Timing] | None = None,
) -> dict[Hashable, report.ExampleResult]:
  """Every setting's decode of one batch ({'encoder_input_tokens': [B, Le],
  'decoder_input_tokens': [B, L]}) timed side by side -> key -> report.ExampleResult. prefills:
  key -> Timing at these shapes (`time_prefills`); None: timed here with the decodes."""
  calls = {}
  for key, setting in decoders.items():
    for part, call in example_calls(setting, batch, rng, temperature).items():
      if part == "decode" or prefills is None:
        calls[part, key] = call
  outputs = {}
  timings = stopwatch.time_calls(
      calls, repeats=repeats, warmup=warmup, compiled=compiled, outputs=outputs
  )
  results = {}
  for key in decoders:
    decodes, aux = outputs["decode", key]
    prefill = timings["prefill", key] if prefills is None else prefills[key]
    results[key] = report.ExampleResult.from_decode(
        timings["decode", key], prefill, decodes, aux, eos_id
    )
  return results


def time_prefills(
    decoders: Mapping[Hashable, Setting], batch: Mapping[str, jax.Array]
) -> dict[Hashable, stopwatch.Timing]:
  """key -> every setting's prefill Timing at one batch's shapes, which serves every batch of
  them: a prefill has no data-dependent work."""
  calls = {key: _prefill_call(setting, batch) for key, setting in decoders.items()}
  return stopwatch.time_calls(calls, repeats=PREFILL_REPEATS, warmup=0)


def _prefill_call(setting: Setting, batch: Mapping[str, jax.Array]) -> tuple[Callable, tuple]:
  return setting.prefill, (setting.params, batch)


def example_calls(
    setting: Setting, batch: Mapping[str, jax.Array], rng: jax.Array, temperature: float
) -> dict[str, tuple[Callable[..., Any], tuple]]:
  """'decode' (at `temperature`) and 'prefill' -> (fn, args) of one setting on one example."""
  return {
      "decode": (setting.predict, (setting.params, batch, rng, jnp.float32(temperature))),
      "prefill": _prefill_call(setting, batch),
  }


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What `sweep` measured: rows per setting and temperature; costs: temperature -> drafter ->
  DecodeCosts; results: temperature -> setting key -> an ExampleResult per example;
  cost_rounds: the most rounds behind a step cost at any temperature."""

  rows: list[report.SpeedupRow]
  costs: dict[float, dict[str, step_costs.DecodeCosts]]
  results: dict[float, dict[Hashable, list[report.ExampleResult]]]
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
    step_costs.check_drafter(drafter, f"drafter {name!r}")
    vocab_size = drafter.vocab_size
    if vocab_size != target_config.vocab_size:
      raise ValueError(
          f"drafter {name!r} has vocab_size {vocab_size} but the target has "
          f"{target_config.vocab_size}: speculative decoding needs one vocabulary (a drafter "
          "whose vocab_size is unset takes the target's through `Drafter.for_target`, as "
          "`pairs.load_pair` does)."
      )
  if not settings:
    raise ValueError("no settings to sweep: give at least one (sweep.grid_settings).")
  for setting in settings:
    if not isinstance(setting, SweepSetting):
      raise ValueError(
          f"settings must be sweep.SweepSetting objects (sweep.grid_settings makes them), got "
          f"{setting!r}."
      )
    if setting.drafter not in drafters:
      raise ValueError(
          f"setting {setting.label!r} names drafter {setting.drafter!r}, which is not one of "
          f"the drafters {sorted(drafters)}."
      )
    if not isinstance(setting.shape, draft_shapes.DraftShape):
      raise ValueError(
          f"setting {setting.label!r}: shape must be a draft_shapes.DraftShape (e.g. "
          f"draft_shapes.Chain(2) or draft_shapes.Tree((2, 1))), got {setting.shape!r}."
      )
  keys = [setting.key for setting in settings]
  if len(set(keys)) != len(keys):
    raise ValueError(f"two settings share a (label, gamma): {sorted(keys)}; give distinct labels.")
  if not temperatures:
    raise ValueError("no temperatures to sweep: give at least one (0 is greedy).")
  shapes = [np.shape(x) for x in encoder_inputs]
  if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
    raise ValueError(
        "encoder_inputs must be one or more examples, each [batch, length] with both sizes "
        f">= 1 (an array [examples, batch, length] is such a sequence), got shapes "
        f"{sorted(set(shapes))[:4]} (one batch-1 example per row of x [N, Le]: pass x[:, None])."
    )
  if len({batch for batch, _ in shapes}) > 1:
    raise ValueError(
        f"the examples' batch sizes differ ({sorted({batch for batch, _ in shapes})}): a sweep "
        "times one batch size; sweep each separately."
    )
  if min(decode_length, repeats) < 1 or cost_repeats < 0:
    raise ValueError(
        f"decode_length and repeats must be >= 1 and cost_repeats >= 0 (0: no step costs), got "
        f"{decode_length}, {repeats} and {cost_repeats}."
    )


def encoder_lengths(encoder_inputs: Sequence[np.ndarray]) -> dict[int, int]:
  """Examples [B, Le] -> {Le: count}, by increasing Le."""
  counts = collections.Counter(np.shape(x)[-1] for x in encoder_inputs)
  return dict(sorted(counts.items()))


def most_common_length(encoder_inputs: Sequence[np.ndarray]) -> int:
  """The Le most examples [B, Le] have, the longest of those tied."""
  counts = encoder_lengths(encoder_inputs)
  return max(counts, key=lambda length: (counts[length], length))


def _resolved_step_timings(
    calls: Mapping[Hashable, tuple[Callable[..., Any], tuple]],
    seconds: Mapping[Hashable, list[np.ndarray]],
    geometry: step_costs.DecodeGeometry,
) -> tuple[dict[Hashable, stopwatch.Timing], int]:
  """The step timings of the rounds between the examples, timing more rounds where a step is
  within the noise -> (timings, extra rounds run)."""
  return stopwatch.until_resolved(
      calls,
      {key: np.concatenate(times) for key, times in seconds.items()},
      lambda stacked: step_costs.marginal_step_timings(stacked, geometry),
      more=EXTRA_COST_ROUNDS,
      limit=MAX_EXTRA_COST_ROUNDS,
  )


def cost_rounds_after(cost_repeats: int, examples: int) -> list[int]:
  """Cost rounds after each example: cost_repeats R in all over N examples, spread evenly, one
  at least after the first; entry i is ceil((i + 1) R / N) - ceil(i R / N)."""
  if cost_repeats < 1 or examples < 1:
    raise ValueError(f"need cost_repeats >= 1 and examples >= 1, got {cost_repeats}, {examples}.")
  return [
      -(-(i + 1) * cost_repeats // examples) - -(-i * cost_repeats // examples)
      for i in range(examples)
  ]


def pad_to_buckets(encoder_inputs: np.ndarray, multiple: int) -> list[np.ndarray]:
  """[examples, B, Le] -> a list of [B, Le_i], Le_i the example's longest row rounded up to a
  `multiple` (at most Le). Only trailing padding goes, which is masked, so decodes are
  unchanged; a sweep compiles once per bucket."""
  encoder_inputs = np.asarray(encoder_inputs)
  if encoder_inputs.ndim != 3 or isinstance(multiple, bool) or int(multiple) < 1:
    raise ValueError(
        f"need encoder inputs [examples, batch, length] and a multiple >= 1, got shape "
        f"{encoder_inputs.shape} and multiple {multiple!r}."
    )
  length = encoder_inputs.shape[-1]
  buckets = []
  for example in encoder_inputs:
    used = np.nonzero(example.any(axis=0))[0]
    end = int(used[-1]) + 1 if used.size else 1
    buckets.append(example[:, : min(length, -(-end // multiple) * multiple)])
  return buckets


def sweep(
    target_config: network.T5Config,
    target_params: Any,
    drafters: Drafters,
    settings: Sequence[SweepSetting],
    temperatures: Sequence[float],
    encoder_inputs: np.ndarray,
    decode_length: int,
    *,
    vocabulary: vocabularies.Vocabulary,
    task: str,
    seed: int = 0,
    repeats: int = 3,
    warmup: int = stopwatch.DEFAULT_WARMUP,
    cost_repeats: int = stopwatch.DEFAULT_REPEATS,
    steps_per_call: int = step_costs.DEFAULT_STEPS_PER_CALL,
    cost_geometry: step_costs.DecodeGeometry | None = None,
    progress: bool = False,
) -> Sweep:
  """Every setting at every temperature against the baseline (the module docstring), example i
  with the rng fold_in(PRNGKey(seed), i).

  Args:
    drafters: name -> (a `drafters.Drafter`, params).
    encoder_inputs: examples [B, Le_i] int32 (B = 1 for Table 2); an array [examples, B, Le].
    decode_length: tokens decoded per row.
    task: the rows' task label.
    cost_repeats: rounds of the decode steps per temperature; 0: none.
    cost_geometry: where the steps are timed; give an earlier timing's (`auto_shape`) to reuse
      its programs. None: the most common encoder length, a cache for decode_length.
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
  examples = len(encoder_inputs)
  batch_size = np.shape(encoder_inputs[0])[0]
  timed = cost_gammas(settings)
  geometry, steps = None, {}
  used = {setting.drafter: drafters[setting.drafter] for setting in settings}
  if cost_repeats:
    geometry = cost_geometry or step_costs.DecodeGeometry.for_decoding(
        most_common_length(encoder_inputs), decode_length, max(timed) + 1, steps_per_call
    )
    geometry.check(max(timed) + 1)
    steps = step_costs.cost_steps(target_config, target_params, used, timed)
  decoders = build_settings(target_config, target_params, drafters, settings, vocabulary)
  batches = [
      {
          "encoder_input_tokens": jnp.asarray(x, jnp.int32),
          "decoder_input_tokens": jnp.zeros((batch_size, decode_length), jnp.int32),
      }
      for x in encoder_inputs
  ]
  rngs = [jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(examples)]
  cost_rounds = cost_rounds_after(cost_repeats, examples) if cost_repeats else [0] * examples
  rounds_done = sum(cost_rounds)
  results = {t: {key: [] for key in decoders} for t in temperatures}
  costs = {}
  bar = tqdm.tqdm(
      total=len(temperatures) * examples, desc="examples", unit="example", disable=not progress
  )
  for temperature in temperatures:
    calls = {}
    if cost_repeats:
      calls = step_costs.decode_step_calls(
          steps, geometry, temperature=temperature, batch=batch_size
      )
    seconds = {key: [] for key in calls}
    prefills = {}  # encoder shape -> key -> the setting's prefill timing (`time_prefills`)
    for i, (batch, rng) in enumerate(zip(batches, rngs)):
      # Only the first example of each shape compiles and warms up.
      shape = batch["encoder_input_tokens"].shape
      first = shape not in prefills
      if first:
        prefills[shape] = time_prefills(decoders, batch)
      for key, result in time_example(
          decoders,
          batch,
          rng,
          temperature,
          vocabulary.eos_id,
          repeats=repeats,
          warmup=warmup if first else 0,
          compiled=not first,
          prefills=prefills[shape],
      ).items():
        results[temperature][key].append(result)
      if cost_rounds[i]:
        # The decode steps compile in the first example's rounds.
        for key, times in stopwatch.time_rounds(
            calls, repeats=cost_rounds[i], warmup=warmup if i == 0 else 0, compiled=i > 0
        ).items():
          seconds[key].append(times)
      bar.update()
    costs[temperature] = {}
    if cost_repeats:
      timings, extra = _resolved_step_timings(calls, seconds, geometry)
      rounds_done = max(rounds_done, sum(cost_rounds) + extra)
      costs[temperature] = step_costs.costs_from_timings(timings, list(used), timed, geometry)
  bar.close()
  rows = [
      report.SpeedupRow.from_results(
          task,
          setting.label,
          t,
          setting.shape,
          costs[t].get(setting.drafter),
          results[t][BASELINE],
          results[t][setting.key],
      )
      for setting in settings
      for t in temperatures
  ]
  return Sweep(rows, costs, results, rounds_done)
