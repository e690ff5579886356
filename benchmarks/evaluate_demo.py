r"""Assembles the demo pair from two training runs and measures what its model card reports.

  python benchmarks/evaluate_demo.py --target_run=/tmp/demo_target --drafter_run=/tmp/demo_drafter \
    --pair_dir=demo_models --output_dir=/tmp/demo_eval

With --target_run and --drafter_run (scripts/train.py model dirs), it first writes the pair with
`training.export_pair` into --pair_dir (parameters stored as --storage_dtype, float32 or bfloat16
at half the size, and config.json per member, plus each run's train_summary.json) and copies the
corpus vocabulary beside it. The drafter run may hold a T5 drafter or a shared-encoder drafter
(`checkpoints.read_drafter`). Then, on the pair in --pair_dir (restored in its compute dtype), it
measures:
  - BLEU of the target's and the drafter's greedy decodes on the demo task's --split, with their
    teacher-forced loss and accuracy (`training.evaluate`); a drafter that reads the target's
    encoder output (not a T5 drafter) cannot translate on its own, so it gets no BLEU, only a note;
  - whether greedy speculative decoding (every gamma in --gammas) reproduces the baseline's greedy
    output token for token on the first --check_examples examples (`pairs.greedy_check`), with
    its alpha and tokens per target call;
and writes OUTPUT_DIR/evaluation.json (with the dtypes each member stores), plus
OUTPUT_DIR/test_inputs.txt: the first --num_inputs source sentences of the split with the task
prefix, for the timed batch-1 runs of scripts/benchmark.py (configs/demo/benchmark.gin), which
measure alpha, c and the speedup.
"""

import json
import os
import pathlib
import sys

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import validation
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks
from speculative_t5x.training import training
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

NOT_STANDALONE = "reads the target's encoder output: not a standalone translation model"
FEATURE_LENGTHS = {"inputs": 48, "targets": 48}  # configs/runs/train.gin's TASK_FEATURE_LENGTHS

FLAGS = flags.FLAGS
flags.DEFINE_string("pair_dir", "demo_models", "Directory of the pair (pairs.save_pair).")
flags.DEFINE_string("target_run", None, "scripts/train.py model dir of the target to export.")
flags.DEFINE_string("drafter_run", None, "scripts/train.py model dir of the drafter to export.")
flags.DEFINE_bool("overwrite", False, "Replace an existing pair in --pair_dir when exporting.")
flags.DEFINE_enum(
    "storage_dtype",
    "float32",
    ["float32", "bfloat16"],
    "dtype the export stores the floating-point parameters in (bfloat16: half the size); the "
    "pair is restored in config.json's compute dtype (float32 for the demo) either way.",
)
flags.DEFINE_string(
    "output_dir",
    "/tmp/speculative_t5x/demo_eval",
    "Directory for evaluation.json and test_inputs.txt.",
)
flags.DEFINE_enum("split", "test", demo_data.DEMO_SPLITS, "Split of the demo task to evaluate on.")
flags.DEFINE_integer(
    "max_examples", None, "Evaluate on the first examples only (default: all).", lower_bound=1
)
flags.DEFINE_integer("batch_size", 100, "Batch size of the BLEU decodes.", lower_bound=1)
flags.DEFINE_list("gammas", [str(g) for g in range(1, 9)], "Gammas of the greedy equality check.")
flags.DEFINE_integer("check_examples", 100, "Examples of the greedy equality check.", lower_bound=1)
flags.DEFINE_integer(
    "num_inputs", 32, "Source sentences written to test_inputs.txt.", lower_bound=1
)


def standalone_config(drafter: drafters.Drafter) -> network.T5Config | None:
  """The config of the `network.Transformer` a drafter's parameters make on their own (an
  encoder of its own, nothing read from the target), which translates alone: a T5 drafter's.
  None for a drafter that reads the target or runs no network."""
  return drafter.config if isinstance(drafter, drafters.T5Drafter) else None


def evaluate_member(
    member: str, config: network.T5Config, params, examples: training.EvalSet, vocabulary
) -> dict:
  """BLEU, loss and accuracy of `network.Transformer(config)` (a T5 with its own encoder) on
  `examples` (`training.evaluate`), its parameter count and 5 sample predictions."""
  model = models.EncoderDecoderModel(network.Transformer(config), vocabulary, vocabulary)
  metrics, predictions = training.evaluate(model, params, examples)
  print(f"{member}: {metrics}", file=sys.stderr)
  return {
      "parameters": _num_parameters(params),
      **metrics,
      "examples": len(examples.references),
      "samples": [
          {"reference": r, "prediction": p}
          for r, p in zip(examples.references[:5], predictions[:5])
      ],
  }


def _num_parameters(params) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(params)))


def _floating_dtypes(params) -> set[str]:
  """The dtype names of the floating-point leaves of `params`."""
  return {
      np.dtype(x.dtype).name
      for x in jax.tree.leaves(params)
      if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
  }


def check_flags() -> list[int]:
  """The flags absl's bounds leave, before anything loads: --gammas integers >= 1, both runs
  (each an existing train.py model dir) or neither, and without them an existing --pair_dir
  -> the gammas."""
  wanted = f"--gammas={','.join(FLAGS.gammas)}: give integers >= 1, e.g. --gammas=1,2,4"
  if not FLAGS.gammas:
    raise gin_utils.ConfigError(wanted)
  try:
    gammas = [validation.check_gamma(int(gamma)) for gamma in FLAGS.gammas]
  except ValueError as e:
    raise gin_utils.ConfigError(f"{wanted} ({e})") from e
  if bool(FLAGS.target_run) != bool(FLAGS.drafter_run):
    raise gin_utils.ConfigError(
        "give both --target_run and --drafter_run (to export a pair) or neither."
    )
  for flag, run in (("--target_run", FLAGS.target_run), ("--drafter_run", FLAGS.drafter_run)):
    if run and not os.path.isdir(os.path.join(run, training.EXPORT_DIR)):
      raise gin_utils.ConfigError(
          f"{flag}={run} has no {training.EXPORT_DIR}/: give a scripts/train.py --model_dir"
      )
  if not FLAGS.target_run and not os.path.isdir(FLAGS.pair_dir):
    raise gin_utils.ConfigError(
        f"--pair_dir={FLAGS.pair_dir} does not exist: give a pairs.save_pair directory "
        "(e.g. demo_models), or --target_run and --drafter_run to export one"
    )
  return gammas


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  gammas = check_flags()
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO.
  pair_dir = pathlib.Path(FLAGS.pair_dir)
  if FLAGS.target_run:
    training.export_pair(
        pair_dir, FLAGS.target_run, FLAGS.drafter_run, FLAGS.storage_dtype, FLAGS.overwrite
    )
  vocabulary = tasks.get_vocabulary(str(pair_dir / demo_data.DEMO_VOCABULARY_FILE))
  # Restored in the compute dtype the target's config.json records (float32 for the demo pair),
  # whatever the storage dtype (from_pair_dir's default), as scripts/demo.py does.
  pair = pairs.load_pair(pairs.PairConfig.from_pair_dir(pair_dir), vocabulary.eos_id)
  task = tasks.register_demo_task(vocabulary=vocabulary)

  report = {"pair_dir": str(pair_dir), "split": FLAGS.split, "stored_dtypes": {}}
  for member, params in (("target", pair.target_params), ("drafter", pair.drafter_params)):
    stored = sorted(checkpoints.stored_dtypes(pair_dir / member))
    report["stored_dtypes"][member] = stored
    print(
        f"{member}: stored as {', '.join(stored)}, restored as "
        f"{', '.join(sorted(_floating_dtypes(params)))}",
        file=sys.stderr,
    )
  examples = training.eval_set(
      task, FLAGS.split, FEATURE_LENGTHS, FLAGS.batch_size, FLAGS.max_examples
  )
  report["target"] = evaluate_member(
      "target", pair.target_config, pair.target_params, examples, vocabulary
  )
  standalone = standalone_config(pair.drafter)
  if standalone is not None:
    report["drafter"] = evaluate_member(
        "drafter", standalone, pair.drafter_params, examples, vocabulary
    )
  else:  # It has no encoder of its own: recorded as such, never silently skipped.
    kind = type(pair.drafter).__name__
    report["drafter"] = {
        "parameters": _num_parameters(pair.drafter_params),
        "kind": kind,
        "bleu": None,
        "note": NOT_STANDALONE,
    }
    print(f"drafter: no BLEU: the {kind} {NOT_STANDALONE}", file=sys.stderr)

  check = training.eval_set(
      task, FLAGS.split, FEATURE_LENGTHS, FLAGS.check_examples, FLAGS.check_examples
  )
  report["greedy_check"] = pairs.greedy_check(
      pair, check.batches[0], vocabulary, gammas, check.rows[0]
  )
  for gamma, result in report["greedy_check"].items():
    print(f"gamma {gamma}: {result}", file=sys.stderr)

  output_dir = pathlib.Path(FLAGS.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  dataset = (
      tasks.get_task(task)
      .get_dataset(FEATURE_LENGTHS, split=FLAGS.split, shuffle=False, use_cached=False)
      .take(FLAGS.num_inputs)
  )
  lines = [ex["inputs_pretokenized"].decode("utf-8") for ex in dataset.as_numpy_iterator()]
  (output_dir / "test_inputs.txt").write_text("\n".join(lines) + "\n")
  (output_dir / "evaluation.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
  print(
      json.dumps(
          {
              m: {k: report[m].get(k) for k in ("parameters", "bleu", "eval_loss")}
              for m in pairs.MEMBERS
          },
          indent=1,
      )
  )


if __name__ == "__main__":
  gin_utils.run(main)
