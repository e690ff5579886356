r"""Table 3: alpha, the mean over target-generated tokens of beta = sum_x min(p, q).

For each temperature, the target generates outputs for the inputs of a task split; the target and
every drafter are then teacher-forced on those outputs (`speculative_t5x.alpha`). The target, the
drafters (any `drafters.Drafter`, name -> drafter) and where their weights come from are gin's
(configs/runs/measure_alpha.gin documents them; by default the demo pair's T5 drafter, unigram and
bigram tables fitted on the task's training targets, and prompt lookup). Beside Table 3 it
splits each alpha by the target's top probability at the position (`alpha.CONFIDENCE_EDGES`):
where the target is unsure, its argmax is fragile. Writes alpha.json, alpha.md and config.gin into
ALPHA_OUTPUT_DIR, together once the measurement is done (`run_dir.OutputDir`); the directory is
checked before anything loads (writable; holding no other run's outputs unless --overwrite).

  python scripts/measure_alpha.py                       # the demo pair on the demo task
  python scripts/measure_alpha.py --gin.NUM_TOKENS=1000 --gin.TEMPERATURES="(0.0,)" \
    --gin.ALPHA_OUTPUT_DIR="'/tmp/alpha'"
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Mapping, Sequence

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
from absl import logging
import gin
import seqio
import tqdm

from speculative_t5x import alpha
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import validation
from speculative_t5x.running import run_dir
from speculative_t5x.text import tasks
from speculative_t5x.weights import pairs

DEFAULT_GIN_FILE = "configs/runs/measure_alpha.gin"

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
run_dir.define_overwrite_flag("ALPHA_OUTPUT_DIR")
OUTPUTS = ("alpha.json", "alpha.md", "config.gin")


@gin.configurable(module="measure_alpha")
@dataclasses.dataclass(frozen=True)
class AlphaSetup:
  """What is measured (configs/runs/measure_alpha.gin binds every field).

  pair: the target and its weights; its drafter fields are replaced by each row's.
  drafters: row name -> drafter. drafter_checkpoint_paths: row name -> checkpoint, for the rows
    whose drafter needs one (the others are fitted or have no weights).
  mixture_or_task_name, task_feature_lengths, split: the inputs the target continues, and the
    decode length (task_feature_lengths['targets']).
  ngram_fit_split, ngram_fit_examples: the targets a drafter that learns from targets is fitted on.
  temperatures: one measurement each (0: argmax). num_tokens: target-generated tokens per
    measurement (at least; whole batches). batch_size: examples per generation batch.
  output_dir: where alpha.json, alpha.md and config.gin go.
  """

  pair: pairs.PairConfig
  drafters: Mapping[str, drafters_lib.Drafter]
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  drafter_checkpoint_paths: Mapping[str, str] = dataclasses.field(default_factory=dict)
  split: str = "test"
  ngram_fit_split: str = "train"
  ngram_fit_examples: int = 50000
  temperatures: Sequence[float] = (0.0, 1.0)
  num_tokens: int = 10000
  batch_size: int = 32

  def __post_init__(self):
    if not isinstance(self.pair, pairs.PairConfig):
      raise gin_utils.ConfigError(
          f"measure_alpha.AlphaSetup.pair must be a pairs.PairConfig (configs/runs/"
          f"measure_alpha.gin binds it to @pairs.PairConfig()), got {self.pair!r}"
      )
    if not isinstance(self.drafters, Mapping) or not self.drafters:
      raise gin_utils.ConfigError(
          "measure_alpha.AlphaSetup.drafters is empty: give name -> "
          "drafter, e.g. {'bigram': @drafters.BigramDrafter()}"
      )
    try:
      for name, value in (
          ("MIXTURE_OR_TASK_NAME", self.mixture_or_task_name),
          ("ALPHA_OUTPUT_DIR", self.output_dir),
          ("SPLIT", self.split),
          ("measure_alpha.AlphaSetup.ngram_fit_split", self.ngram_fit_split),
      ):
        validation.check_text(value, name)
      validation.check_feature_lengths(
          self.task_feature_lengths, "TASK_FEATURE_LENGTHS", ("inputs", "targets")
      )
      validation.check_temperatures(self.temperatures, "TEMPERATURES")
      for name, value in (
          ("NUM_TOKENS", self.num_tokens),
          ("BATCH_SIZE", self.batch_size),
          ("NGRAM_FIT_EXAMPLES", self.ngram_fit_examples),
      ):
        validation.check_integer(value, name, 1)
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(str(e)) from e
    if not isinstance(self.drafter_checkpoint_paths, Mapping):
      raise gin_utils.ConfigError(
          "measure_alpha.AlphaSetup.drafter_checkpoint_paths must be a mapping row name -> "
          f"checkpoint, e.g. {{'t5': 'demo_models/drafter'}}, got {self.drafter_checkpoint_paths!r}"
      )
    unknown = sorted(set(self.drafter_checkpoint_paths) - set(self.drafters))
    if unknown:
      raise gin_utils.ConfigError(
          f"measure_alpha.AlphaSetup.drafter_checkpoint_paths names "
          f"{unknown}, which are not rows of AlphaSetup.drafters "
          f"({sorted(self.drafters)})"
      )
    self.row_pairs()  # checks every row before anything loads

  def row_pairs(self) -> dict[str, pairs.PairConfig]:
    """Row name -> the pair of the target and that row's drafter."""
    rows = {}
    for name, drafter in self.drafters.items():
      try:
        rows[name] = dataclasses.replace(
            self.pair,
            drafter=drafter,
            drafter_checkpoint_path=self.drafter_checkpoint_paths.get(name),
        )
      except gin_utils.ConfigError as e:
        raise gin_utils.ConfigError(
            f"row {name!r} of measure_alpha.AlphaSetup.drafters: {e} (a row's DRAFTER is "
            f"drafters[{name!r}], its DRAFTER_CHECKPOINT_PATH drafter_checkpoint_paths[{name!r}])"
        ) from e
    return rows


def measure(setup: AlphaSetup) -> tuple[dict, str]:
  """-> ({'t=<temperature>': {row: {'alpha', 'tokens'}}}, where the target's weights came from)."""
  try:
    task = tasks.get_task(setup.mixture_or_task_name)
  except ValueError as e:
    raise gin_utils.ConfigError(f"MIXTURE_OR_TASK_NAME: {e}") from e
  check_task(setup, task)
  eos_id = task.output_features["targets"].vocabulary.eos_id
  lengths = dict(setup.task_feature_lengths)
  fit_targets = functools.cache(
      lambda: tasks.feature_arrays(
          task, setup.ngram_fit_split, "targets", lengths, setup.ngram_fit_examples
      )
  )
  target_params, target_source = pairs.load_target(setup.pair)
  rows = {}
  for name, row in setup.row_pairs().items():
    drafter, params, source = pairs.load_drafter(row, eos_id, fit_targets, target_params)
    logging.info("row %r: %s", name, source)
    rows[name] = (drafter, params)
  inputs = tasks.feature_arrays(task, setup.split, "inputs", lengths)
  batches = [inputs[i : i + setup.batch_size] for i in range(0, len(inputs), setup.batch_size)]
  results = {}
  for temperature in setup.temperatures:
    key = f"t={temperature:g}"
    results[key] = alpha.measure(
        setup.pair.target_config,
        target_params,
        rows,
        tqdm.tqdm(batches, desc=key),
        lengths["targets"],
        float(temperature),
        eos_id,
        setup.num_tokens,
    )
  return results, target_source


def check_task(setup: AlphaSetup, task: seqio.Task) -> None:
  """Before anything loads: the task has the splits read (the fitting split where a drafter
  learns from targets) and 'inputs' and 'targets' features whose vocabularies the target's
  vocab_size covers."""
  read = [("SPLIT", setup.split)]
  if any(pairs.learns_from_targets(drafter) for drafter in setup.drafters.values()):
    read.append(("measure_alpha.AlphaSetup.ngram_fit_split", setup.ngram_fit_split))
  for macro, split in read:
    try:
      tasks.check_split(task, split, macro)
    except ValueError as e:
      raise gin_utils.ConfigError(str(e)) from e
  vocab_size = setup.pair.target_config.vocab_size
  for feature in ("inputs", "targets"):
    if feature not in task.output_features:
      raise gin_utils.ConfigError(f"task {task.name} has no {feature!r} feature")
    pieces = task.output_features[feature].vocabulary.vocab_size
    if pieces > vocab_size:
      raise gin_utils.ConfigError(
          f"TARGET_CONFIG vocab_size {vocab_size} < the {pieces} pieces of {task.name}'s "
          f"{feature!r} vocabulary: set the target's vocab_size to cover it"
      )


def markdown(setup: AlphaSetup, results: dict, target_source: str) -> str:
  """The Table 3 layout: a row per drafter, a column per temperature, and the tokens counted."""
  lines = [
      f"Alpha on `{setup.mixture_or_task_name}` ({setup.split}), target from " f"{target_source}",
      "",
      "| drafter | " + " | ".join(results) + " | tokens |",
      "|---|" + "---|" * (len(results) + 1),
  ]
  for name in setup.drafters:
    cells = [f"{results[t][name]['alpha']:.3f}" for t in results]
    tokens = min(results[t][name]["tokens"] for t in results)
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {tokens} |")
  for t, rows in results.items():
    bins = next(iter(rows.values()))["by_confidence"]
    heads = [
        f"[{b['top_p'][0]:g}, {b['top_p'][1]:g}{']' if b['top_p'][1] == 1 else ')'}" for b in bins
    ]
    lines += [
        "",
        f"{t}: alpha by the target's top probability max_x p(x) (at temperature 1) at the "
        "position",
        "",
        "| drafter | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(bins),
        "| share of positions | " + " | ".join(f"{b['share']:.3f}" for b in bins) + " |",
    ]
    for name, row in rows.items():
      cells = ["-" if b["alpha"] is None else f"{b['alpha']:.3f}" for b in row["by_confidence"]]
      lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  logging.set_verbosity(logging.WARNING)
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings, default_files=[DEFAULT_GIN_FILE])
  setup = AlphaSetup()
  # Before anything loads: a binding this run does not use (the models are built later).
  gin_utils.check_unused_bindings(
      later=(models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel)
  )
  output = run_dir.OutputDir(setup.output_dir, OUTPUTS, "ALPHA_OUTPUT_DIR", FLAGS.overwrite)
  output.check()
  results, target_source = measure(setup)
  table = markdown(setup, results, target_source)
  with output:
    output.stage_text("config.gin", gin.config_str())
    output.stage_text("alpha.json", json.dumps(results, indent=2))
    output.stage_text("alpha.md", table)
    output.commit()
  print(table, end="")


if __name__ == "__main__":
  gin_utils.run(main)
