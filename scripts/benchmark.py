r"""The paper's Table 2 harness: batch-1 wall time of the baseline and of speculative decoding.

For a target, its drafters, an input source and every (temperature, gamma), `sweep.sweep` times
each example's decodes (the baseline and every speculative setting side by side, with their
prefills) and, between the examples, the decode steps behind c and the verification cost; each
setting becomes a `report.SpeedupRow` (per-token, per-example and loop speedups, Theorem 3.8's
prediction, the hardware-aware one, and the efficiencies; see speculative_t5x/measuring/report.py for what
each one means).

Configuration is gin (configs/runs/benchmark.gin and the files including it; paths relative to the
working directory or the repository root); the pair is configs/runs/pair.gin's, with a T5 drafter
(configs/drafters/t5.gin). The default is configs/runs/benchmark_tiny.gin, a tiny random pair that
runs in about a minute on 2 CPU cores. With random weights (no DRAFTER_CHECKPOINT_PATH, and
RANDOM_INIT_SEED set) the drafters are 'independent' (its own random weights) and 'copy' (the
target's weights: alpha ~ 1, c = 1): their alpha checks the mechanics and says nothing about real
drafters.

Inputs (`input_data.load_inputs`): random token ids (--num_examples of them, lengths up to the
'inputs' feature length), the lines of --input_file tokenized with --sentencepiece_model, or the
--split of the seqio --task.

Writes results.json and results.md into --output_dir (with --costs_only, only the decode-step
costs: costs.json and costs.md), together at the end (`run_dir.OutputDir`). Before any model
loads: the counts (--repeats, --cost_repeats, --steps_per_call >= 1, --warmup >= 0), the inputs
(read and tokenized: an empty --input_file, a line too long, a vocabulary too large are refused)
and --output_dir (writable; holding no other run's outputs, results.* or costs.*, unless
--overwrite, which replaces them all).

One process only: its timings are one host's. Where JAX runs several processes (a TPU pod
slice's workers) it refuses with status 1 before loading anything (`multihost.refuse_multiprocess`,
docs/multihost.md); decode a split on every host with scripts/infer.py instead.

Usage:
  python scripts/benchmark.py                                   # tiny random pair
  python scripts/benchmark.py --gin_file=configs/runs/benchmark_small.gin --output_dir=/tmp/small
  python scripts/benchmark.py --gin_file=configs/runs/benchmark_small.gin --gammas=4 \
    --temperatures=0 --gin.TASK_FEATURE_LENGTHS="{'inputs': 128, 'targets': 32}"
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from typing import Sequence

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
from absl import logging
import gin
import jax
import numpy as np

from speculative_t5x import draft_shapes
from speculative_t5x import gin_utils
from speculative_t5x import validation
from speculative_t5x.measuring import benchmark_config
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep
from speculative_t5x.running import multihost
from speculative_t5x.running import run_dir
from speculative_t5x.text import input_data

DEFAULT_GIN_FILE = "configs/runs/benchmark_tiny.gin"
EOS_ID = 1
AUTO_EXAMPLES = 16  # BenchmarkSetup.auto: inputs whose target outputs the acceptance is measured on

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin run files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
flags.DEFINE_string(
    "output_dir",
    "/tmp/speculative_t5x/benchmark",
    "Directory for results.json and results.md (created if absent).",
)
flags.DEFINE_list(
    "gammas", None, "Gammas, e.g. 1,2,4,7 (default: benchmark_config.BenchmarkSetup.gammas)."
)
flags.DEFINE_list(
    "temperatures",
    None,
    "Temperatures, e.g. 0,1 (default: benchmark_config.BenchmarkSetup.temperatures).",
)
flags.DEFINE_integer("num_examples", 2, "Examples (batch 1 each); all lines of --input_file if 0.")
flags.DEFINE_integer("repeats", 3, "Timed decodes per example and setting.")
flags.DEFINE_integer("warmup", 1, "Untimed decodes after the compiling one.")
flags.DEFINE_integer(
    "cost_repeats",
    stopwatch.DEFAULT_REPEATS,
    "Timed rounds per decode-step measurement (c and the verification cost), "
    "spread evenly over the examples (sweep.cost_rounds_after: the first gets one, more "
    "examples than rounds leave some without).",
)
flags.DEFINE_integer(
    "steps_per_call",
    step_costs.DEFAULT_STEPS_PER_CALL,
    "Decode steps per timed call when measuring c and the verification cost.",
)
flags.DEFINE_string("input_file", None, "Text file, one input per line (default: random tokens).")
flags.DEFINE_string(
    "task",
    None,
    "seqio task whose split provides the inputs (e.g. demo_ende), "
    "tokenized at TASK_FEATURE_LENGTHS with the task's vocabulary.",
)
flags.DEFINE_string("split", "test", "The --task split.")
flags.DEFINE_string("sentencepiece_model", None, "Sentencepiece model that tokenizes --input_file.")
flags.DEFINE_integer(
    "input_bucket",
    0,
    "0 pads every input to the 'inputs' feature length, as T5X's inference does; N > 0 pads each "
    "to its own multiple of N tokens (sweep.pad_to_buckets; one compilation per length), as a "
    "server bucketing requests would, so a short input does not pay a long one's encoder.",
    lower_bound=0,
)
run_dir.define_overwrite_flag()
flags.DEFINE_bool(
    "costs_only",
    False,
    "Only time the decode steps (c and the verification cost, "
    "per temperature) and write costs.json / costs.md: no decoding.",
)


def _flag_numbers(values: Sequence[str], flag: str, kind: type) -> list:
  """--flag=a,b,c -> numbers of `kind`, each named where it does not parse."""
  numbers = []
  for value in values:
    try:
      numbers.append(kind(value))
    except ValueError:
      raise validation.InvalidInputError(
          f"{flag}={','.join(values)}: {value!r} is not a{'n integer' if kind is int else ' number'}"
      ) from None
  return numbers


OUTPUTS = ("results.json", "results.md", "costs.json", "costs.md")
# The counting flags: (the least value, what it counts).
_COUNTS = {
    "repeats": (1, "timed decodes per example and setting"),
    "warmup": (0, "untimed decodes after the compiling one"),
    "cost_repeats": (1, "timed rounds per decode-step measurement"),
    "steps_per_call": (1, "decode steps per timed call"),
}


def check_flags() -> run_dir.OutputDir:
  """The flags alone, before gin is parsed: the counts, and --output_dir (writable, holding no
  other run's outputs unless --overwrite) -> the checked output directory."""
  for name, (least, meaning) in _COUNTS.items():
    value = FLAGS[name].value
    if value < least:
      raise gin_utils.ConfigError(f"--{name}={value}: give an integer >= {least} ({meaning}).")
  return run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite).check()


def load_setup() -> benchmark_config.BenchmarkSetup:
  """The gin configuration, with --gammas and --temperatures applied and checked, and the
  inputs checked (`input_data.check_input_source`): a bad setting is refused before the models load.
  """
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings, default_files=[DEFAULT_GIN_FILE])
  try:
    gammas = _flag_numbers(FLAGS.gammas, "--gammas", int) if FLAGS.gammas else None
    temperatures = (
        _flag_numbers(FLAGS.temperatures, "--temperatures", float) if FLAGS.temperatures else None
    )
  except ValueError as e:
    raise gin_utils.ConfigError(str(e)) from e
  setup = benchmark_config.BenchmarkSetup().checked(gammas, temperatures)
  if not FLAGS.costs_only:  # the inputs are read after the models load: check them before
    try:
      input_data.check_input_source(
          FLAGS.task, FLAGS.split, FLAGS.input_file, FLAGS.sentencepiece_model, FLAGS.num_examples
      )
    except ValueError as e:
      raise gin_utils.ConfigError(
          f"the inputs (--task, --split, --input_file, --num_examples): {e}"
      ) from e
  return setup


def load_inputs(setup: benchmark_config.BenchmarkSetup) -> tuple[str, object, np.ndarray]:
  """`input_data.load_inputs` for the flags, before any model loads (it reads and tokenizes the
  inputs, and needs only the target's vocab_size): an empty or over-long input is refused
  first."""
  try:
    return input_data.load_inputs(
        setup.pair.target_config.vocab_size,
        setup.task_feature_lengths,
        task=FLAGS.task,
        split=FLAGS.split,
        input_file=FLAGS.input_file,
        sentencepiece_model=FLAGS.sentencepiece_model,
        num_examples=FLAGS.num_examples,
        seed=setup.seed,
        eos_id=EOS_ID,
    )
  except (ValueError, OSError) as e:
    raise gin_utils.ConfigError(
        f"the inputs (--task, --split, --input_file, --num_examples): {e}"
    ) from e


def write_costs(
    output: run_dir.OutputDir,
    costs_by_temperature,
    setup: benchmark_config.BenchmarkSetup,
    load: dict,
) -> None:
  """--costs_only: costs.json and costs.md (with the machine's load before and after)."""
  target = setup.pair.target_config
  header = (
      f"Target {target.emb_dim}d x {target.num_encoder_layers}+{target.num_decoder_layers} "
      f"layers ({target.dtype}), feature lengths {dict(setup.task_feature_lengths)}, "
      f"{jax.default_backend()}; steps include standardization and draw."
  )
  output.stage_text(
      "costs.json",
      json.dumps(
          {
              "command": sys.argv,
              "target_config": dataclasses.asdict(target),
              "load_before": load,
              "load_after": stopwatch.machine_load(),
              "costs": report.costs_as_dict(costs_by_temperature),
          },
          indent=2,
      ),
  )
  table = f"{header}\n\n{report.costs_table(costs_by_temperature)}"
  output.stage_text("costs.md", table)
  output.commit()
  print(table)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  multihost.refuse_multiprocess("scripts/benchmark.py")  # timings are one process's
  output = check_flags()
  setup = load_setup()
  inputs = None if FLAGS.costs_only else load_inputs(setup)
  load = stopwatch.machine_load()  # before anything of ours runs: other work on the machine.
  warning = stopwatch.busy_warning(load)
  if warning:
    print(warning, file=sys.stderr)
  pair, drafters = benchmark_config.load_models(setup, EOS_ID)
  with output:
    run(output, setup, inputs, pair, drafters, load, warning)


def run(output, setup, inputs, pair, drafters, load, warning) -> None:
  """The timings, staged in `output` and committed at the end (`run_dir.OutputDir`)."""
  gammas, temperatures = sorted(set(setup.gammas)), list(setup.temperatures)
  if FLAGS.costs_only:
    geometry = step_costs.DecodeGeometry.for_decoding(
        setup.task_feature_lengths["inputs"],
        setup.task_feature_lengths["targets"],
        max(gammas) + 1,
        FLAGS.steps_per_call,
    )
    logging.info("Timing decode steps for c and the verification cost (%s).", geometry)
    write_costs(
        output,
        {
            t: step_costs.measure_costs(
                pair.target_config,
                pair.target_params,
                drafters,
                gammas,
                geometry,
                temperature=t,
                repeats=FLAGS.cost_repeats,
            )
            for t in temperatures
        },
        setup,
        load,
    )
    return
  task, vocabulary, inputs = inputs
  examples = inputs[:, None]
  if FLAGS.input_bucket:
    examples = sweep.pad_to_buckets(examples, FLAGS.input_bucket)
  encoder_lengths = sweep.encoder_lengths(examples)
  decode_length = int(setup.task_feature_lengths["targets"])
  choices, geometry, trees = {}, None, dict(setup.draft_trees or {})
  if setup.auto is not None:
    choices, geometry = choose_shapes(setup, pair, drafters, inputs, examples, gammas, vocabulary)
    for by_drafter in choices.values():
      for choice in by_drafter.values():
        print(choice.summary())
        shape = choice.speculative.shape
        if isinstance(shape, draft_shapes.Tree):
          trees.setdefault(choice.speculative.label, shape.tree)
        else:
          gammas = sorted({*gammas, shape.gamma})
  result = sweep.sweep(
      pair.target_config,
      pair.target_params,
      drafters,
      sweep.grid_settings(drafters, gammas, setup.verifiers, setup.draft_stops, trees or None),
      temperatures,
      examples,
      decode_length,
      vocabulary=vocabulary,
      task=task,
      seed=setup.seed,
      repeats=FLAGS.repeats,
      warmup=FLAGS.warmup,
      cost_repeats=FLAGS.cost_repeats,
      steps_per_call=FLAGS.steps_per_call,
      cost_geometry=geometry,
      progress=True,
  )

  header = (
      f"Batch 1, {len(inputs)} example(s) of task '{task}', {FLAGS.repeats} timed decodes "
      f"each (median per example); feature lengths {dict(setup.task_feature_lengths)}, "
      f"examples by encoder length {encoder_lengths}; "
      f"{jax.default_backend()} backend; decode-step costs from {result.cost_rounds} rounds "
      f"timed between the examples; before the run: 1-minute load average {load['load_1m']:.2f}, "
      f"other processes running {load['runnable_others']}."
  )
  if warning:
    header += f" {warning}"
  if pair.random_weights:
    header += (
        " Random weights: alpha and speedups check the mechanics only ('copy of target' "
        "drafts with the target's own weights, so alpha ~ 1 and c = 1)."
    )
  run_info = {
      "command": sys.argv,
      "gin_config": gin.config_str(),
      "task": task,
      "num_examples": len(inputs),
      "repeats": FLAGS.repeats,
      "warmup": FLAGS.warmup,
      "cost_rounds": result.cost_rounds,
      "target_config": dataclasses.asdict(pair.target_config),
      "drafter_configs": {n: step_costs.drafter_record(d) for n, (d, _) in drafters.items()},
      "checkpoint_path": setup.pair.checkpoint_path,
      "drafter_checkpoint_path": setup.pair.drafter_checkpoint_path,
      "weights": pair.sources,
      "task_feature_lengths": dict(setup.task_feature_lengths),
      "input_bucket": FLAGS.input_bucket,
      "encoder_lengths": {str(n): count for n, count in encoder_lengths.items()},
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "jax": jax.__version__,
      "machine": platform.platform(),
      "load_before": load,
      "load_after": stopwatch.machine_load(),
      "busy": warning is not None,
  }
  output.stage_text(
      "results.json",
      json.dumps(
          {
              "run": run_info,
              "rows": [row.as_dict() for row in result.rows],
              "costs": report.costs_as_dict(result.costs),
              "auto_shape": {
                  str(t): {name: choice.as_dict() for name, choice in by_drafter.items()}
                  for t, by_drafter in choices.items()
              },
          },
          indent=2,
      ),
  )
  table = report.results_markdown(result.rows, result.costs, header)
  if choices:
    table += (
        "\n## Auto draft shape\n\n"
        + "\n\n".join(
            choice.summary() for by_drafter in choices.values() for choice in by_drafter.values()
        )
        + "\n"
    )
  output.stage_text("results.md", table)
  output.commit()
  print(table)
  logging.info("Wrote %s and %s.", output.path / "results.json", output.path / "results.md")


def choose_shapes(setup, pair, drafters, inputs, examples, gammas, vocabulary):
  """BenchmarkSetup.auto: per temperature and drafter, the acceptance per position along the
  target's own outputs for the first AUTO_EXAMPLES inputs, then `auto_shape.Auto.choose` ->
  ({temperature: {drafter: Choice}}, the geometry its steps were timed in, which the sweep's
  costs reuse)."""
  auto = setup.auto
  decode_length = int(setup.task_feature_lengths["targets"])
  geometry = step_costs.DecodeGeometry.for_decoding(
      sweep.most_common_length(examples),
      decode_length,
      max(auto.max_block, max(gammas) + 1),
      FLAGS.steps_per_call,
  )
  first = inputs[:AUTO_EXAMPLES]
  choices = {}
  for temperature in setup.temperatures:
    choices[temperature] = {}
    for name, (drafter, params) in drafters.items():
      member = dataclasses.replace(pair, drafter=drafter, drafter_params=params)
      choices[temperature][name] = auto.choose_for_pair(
          member, first, decode_length, geometry, temperature, vocabulary
      )
  return choices, geometry


if __name__ == "__main__":
  gin_utils.run(main)
