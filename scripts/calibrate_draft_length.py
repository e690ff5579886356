r"""Chooses adaptive draft length's settings (most drafts gamma, confidence threshold) for a pair.

For each temperature: the target generates outputs for the inputs of a task split; the target and
the pair's drafter are teacher-forced on them, giving per position the drafter's confidence and
beta (`speculative_t5x.calibration`); the drafter's and the target's decode steps are timed on this
machine at batch 1 (`step_costs.measure_costs`: verify_cost(gamma), and what a draft costs inside
the loop at each gamma, the price the model uses, beside c timed alone). The hardware-aware model
then predicts tokens per target call and speedup for every (gamma, threshold) of a grid, and the
best is written as a gin file to include after the run file, beside the best static gamma:

  python scripts/calibrate_draft_length.py          # the demo pair on the demo task
  python scripts/benchmark.py --gin_file=configs/runs/benchmark_draft_length.gin ...

Writes calibration.json, calibration.md, config.gin and draft_length_t<T>.gin (one per
temperature) into CALIBRATION_OUTPUT_DIR.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Mapping, Sequence

from absl import app
from absl import flags
from absl import logging
import gin
import tqdm

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import validation
from speculative_t5x.measuring import calibration
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.text import tasks
from speculative_t5x.weights import pairs

DEFAULT_GIN_FILE = "configs/runs/calibrate_draft_length.gin"
BUCKET_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")


@gin.configurable(module="calibrate_draft_length")
@dataclasses.dataclass(frozen=True)
class CalibrationSetup:
  """What is calibrated (configs/runs/calibrate_draft_length.gin binds every field).

  pair: the target, its drafter and their weights (a drafter that learns from targets is fitted
    on the first ngram_fit_examples targets of ngram_fit_split).
  mixture_or_task_name, task_feature_lengths, split: the inputs the target continues, and the
    decode length (task_feature_lengths['targets']).
  temperatures: one calibration each (0: argmax). gammas: the candidate most-drafts settings.
  num_tokens: target-generated positions measured per temperature (at least; whole batches).
  batch_size: examples per generation batch. cost_repeats: timing rounds of the decode steps.
  output_dir: where the results and the gin files go.
  """

  pair: pairs.PairConfig
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  split: str = "validation"
  ngram_fit_split: str = "train"
  ngram_fit_examples: int = 50000
  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8)
  num_tokens: int = 5000
  batch_size: int = 32
  cost_repeats: int = stopwatch.DEFAULT_REPEATS

  def __post_init__(self):
    if not isinstance(self.pair, pairs.PairConfig) or self.pair.drafter is None:
      raise gin_utils.ConfigError(
          "calibrate_draft_length.CalibrationSetup.pair must be a pairs.PairConfig with a "
          f"DRAFTER (include a configs/drafters/ file), got {self.pair!r}"
      )
    try:
      for name, value in (
          ("MIXTURE_OR_TASK_NAME", self.mixture_or_task_name),
          ("CALIBRATION_OUTPUT_DIR", self.output_dir),
          ("SPLIT", self.split),
      ):
        validation.check_text(value, name)
      validation.check_feature_lengths(
          self.task_feature_lengths, "TASK_FEATURE_LENGTHS", ("inputs", "targets")
      )
      validation.check_temperatures(self.temperatures, "TEMPERATURES")
      if not self.gammas:
        raise validation.InvalidInputError("GAMMAS is empty: give candidate gammas, e.g. (2, 4).")
      for gamma in self.gammas:
        validation.check_integer(gamma, "GAMMAS", 1)
      for name, value in (
          ("NUM_TOKENS", self.num_tokens),
          ("BATCH_SIZE", self.batch_size),
          ("COST_REPEATS", self.cost_repeats),
          ("NGRAM_FIT_EXAMPLES", self.ngram_fit_examples),
      ):
        validation.check_integer(value, name, 1)
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(str(e)) from e
    try:
      tasks.get_task(self.mixture_or_task_name)
    except ValueError as e:
      raise gin_utils.ConfigError(f"MIXTURE_OR_TASK_NAME: {e}") from e
    targets = self.task_feature_lengths["targets"]
    try:  # the geometry measure_costs times the decode steps in
      step_costs.DecodeGeometry.for_decoding(
          self.task_feature_lengths["inputs"], targets, max(self.gammas) + 1
      )
    except ValueError as e:
      raise gin_utils.ConfigError(
          f"TASK_FEATURE_LENGTHS['targets'] = {targets} is too short to time the decode steps "
          f"({e}): the costs are timed over {step_costs.DEFAULT_STEPS_PER_CALL} consecutive steps "
          f"of a decode that long; give a 'targets' length of at least "
          f"{step_costs.DEFAULT_STEPS_PER_CALL - 1}."
      ) from e


def measure_positions(setup, pair, task, eos_id, temperature) -> calibration.Positions:
  """Confidence and beta at about num_tokens target-generated positions of the split."""
  lengths = dict(setup.task_feature_lengths)
  inputs = tasks.feature_arrays(task, setup.split, "inputs", lengths)
  batches = (
      inputs[start : start + setup.batch_size] for start in range(0, len(inputs), setup.batch_size)
  )
  return calibration.measure_positions(
      pair,
      tqdm.tqdm(batches, desc=f"t={temperature:g}"),
      lengths["targets"],
      temperature,
      eos_id,
      setup.num_tokens,
  )


def measure_costs(setup, pair, temperature) -> tuple[float, dict[int, float], dict[int, float]]:
  """(c, gamma -> c in the loop, gamma -> verify_cost) at batch 1, from `step_costs.measure_costs`
  (the drafter's step, or its proposal of one draft for a drafter without a network, the
  target's steps, and gamma drafter steps with the verification in one loop step, timed side by
  side). The calibration prices a draft at its cost in the loop: the iteration's time less the
  verification's, over gamma (`DecodeCosts.c_in_loop`), several times c on this CPU. A draft
  inside the loop costs at least its step alone, so an in-loop figure below c (timing noise on
  a difference of two times) is read as c."""
  gammas = sorted(set(setup.gammas))
  lengths = setup.task_feature_lengths
  costs = step_costs.measure_costs(
      pair.target_config,
      pair.target_params,
      {"drafter": (pair.drafter, pair.drafter_params)},
      gammas,
      step_costs.DecodeGeometry.for_decoding(
          lengths["inputs"], lengths["targets"], max(gammas) + 1
      ),
      temperature=float(temperature),
      repeats=setup.cost_repeats,
  )["drafter"]
  return (
      costs.c,
      {g: max(costs.c, costs.c_in_loop(g)) for g in gammas},
      {g: costs.verify_cost(g) for g in gammas},
  )


def calibrate(setup: CalibrationSetup) -> dict:
  """-> {'t=<T>': {'best', 'best_static', 'grid', 'buckets', 'c', 'verify_cost', 'positions'}}."""
  task = tasks.get_task(setup.mixture_or_task_name)
  eos_id = task.output_features["targets"].vocabulary.eos_id
  lengths = dict(setup.task_feature_lengths)
  pair = pairs.load_pair(
      setup.pair,
      eos_id,
      lambda: tasks.feature_arrays(
          task, setup.ngram_fit_split, "targets", lengths, setup.ngram_fit_examples
      ),
  )
  logging.info("pair: %s", pair.sources)
  results = {}
  for temperature in setup.temperatures:
    positions = measure_positions(setup, pair, task, eos_id, temperature)
    c, c_in_loop, verify_cost = measure_costs(setup, pair, temperature)
    result = calibration.calibrate(positions, setup.gammas, c_in_loop, verify_cost)
    results[f"t={temperature:g}"] = {
        **result.as_dict(),
        "buckets": calibration.confidence_buckets(positions, BUCKET_EDGES),
        "c": c,
        "c_in_loop": {str(g): v for g, v in c_in_loop.items()},
        "verify_cost": {str(g): v for g, v in verify_cost.items()},
        "positions": positions.count,
        "sources": pair.sources,
    }
  return results


def gin_file(key: str, result: dict) -> str:
  """The chosen settings as gin bindings to include after the run file."""
  best, static = result["best"], result["best_static"]
  return (
      f"# Adaptive draft length at {key}, from scripts/calibrate_draft_length.py: predicted "
      f"{best['tokens_per_call']:.2f} tokens per target call and {best['speedup']:.2f}x\n"
      f"# (best static gamma {static['gamma']}: {static['tokens_per_call']:.2f} tokens per call, "
      f"{static['speedup']:.2f}x), c = {result['c']:.3f} alone, "
      f"{result['c_in_loop'][str(best['gamma'])]:.3f} in the loop at gamma {best['gamma']}.\n"
      f"# Most drafts: gamma = {best['gamma']} (infer: --gin.GAMMA={best['gamma']}; benchmark: "
      f"--gammas including {best['gamma']}).\n"
      "from speculative_t5x import draft_length\n"
      f"draft_length.ConfidenceStop.threshold = {best['threshold']:.4f}\n"
  )


def markdown(results: dict) -> str:
  lines = []
  for key, result in results.items():
    best, static = result["best"], result["best_static"]
    lines += [
        f"## {key}: {result['positions']} positions, c = {result['c']:.3f} alone; a draft in "
        "the loop (the price the predictions use) "
        + ", ".join(f"{v:.3f} at gamma {g}" for g, v in result["c_in_loop"].items()),
        "",
        "| setting | gamma | threshold | drafts/call | tokens/call | predicted speedup |",
        "|---|---|---|---|---|---|",
    ]
    for label, p in (("adaptive (chosen)", best), ("best static gamma", static)):
      lines.append(
          f"| {label} | {p['gamma']} | {p['threshold']:.3f} | {p['drafts_per_call']:.2f} | "
          f"{p['tokens_per_call']:.2f} | {p['speedup']:.3f} |"
      )
    lines += ["", "| confidence | share of positions | alpha |", "|---|---|---|"]
    for b in result["buckets"]:
      value = "-" if b["alpha"] is None else f"{b['alpha']:.3f}"
      lines.append(f"| [{b['low']:.1f}, {b['high']:.1f}) | {b['share']:.3f} | {value} |")
    lines.append("")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  logging.set_verbosity(logging.WARNING)
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings, default_files=[DEFAULT_GIN_FILE])
  setup = CalibrationSetup()
  # Before anything loads: a binding this run does not use (the models are built later).
  gin_utils.check_unused_bindings(
      later=(models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel)
  )
  results = calibrate(setup)
  out = pathlib.Path(setup.output_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.gin").write_text(gin.config_str())
  (out / "calibration.json").write_text(json.dumps(results, indent=2))
  for key, result in results.items():
    (out / f"draft_length_{key.replace('=', '')}.gin").write_text(gin_file(key, result))
  table = markdown(results)
  (out / "calibration.md").write_text(table)
  print(table, end="")


if __name__ == "__main__":
  gin_utils.run(main)
