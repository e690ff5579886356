r"""Trains a T5 1.1 model T5X-style (gin-configured); rerunning with the same --model_dir resumes.

  python scripts/train.py --gin_file=configs/demo/train_target.gin --model_dir=/tmp/demo_target
  python scripts/train.py --gin_file=configs/runs/train.gin \
    --gin_file=configs/models/t5_1_1_tiny.gin --gin.MODEL_CONFIG=%T5_1_1_TINY --gin.NUM_STEPS=100 \
    --model_dir=/tmp/tiny

Distilling a drafter against a trained target (DistillSpec: speculative_t5x/training/distillation.py; the
divergence, the data and their temperatures are distillation.Distillation's bindings):

  python scripts/train.py --gin_file=configs/demo/distill_drafter.gin --model_dir=/tmp/distilled
  python scripts/train.py --gin_file=configs/runs/distill.gin \
    --gin_file=configs/demo/drafter.gin --gin.MODEL_CONFIG=%DEMO_DRAFTER \
    --gin.CHECKPOINT_PATH="'/tmp/demo_target/model'" \
    --gin.distillation.Distillation.divergence="'jsd'" --model_dir=/tmp/jsd

--distill_from (with --distill_temperature) is the shorthand for cross-entropy on the target's
own decodes, Distillation(target_dir, divergence='cross_entropy', data='target'):

  python scripts/train.py --gin_file=configs/demo/train_drafter.gin --model_dir=/tmp/drafter \
    --distill_from=/tmp/demo_target/model

Writes orbax checkpoints to MODEL_DIR/checkpoints, the final parameters to MODEL_DIR/model (a
model's checkpoints.save_model, a distilled drafter's checkpoints.save_drafter_params), the summary to
MODEL_DIR/train_summary.json and the gin config to MODEL_DIR/config.gin, the last three together
at each checkpoint (and the export at the end), renamed into place at once. See
speculative_t5x/training/training.py for what `train` does. A flag or setting that `train` refuses (a
gin_utils.ConfigError, before anything is built) ends the run with nothing written, and so does a
rerun that cannot resume the run in MODEL_DIR (NUM_STEPS below its checkpoint's step, another
model: the error names both values). A rerun of a complete run (NUM_STEPS its step) writes
nothing.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
import gin

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import validation
from speculative_t5x.running import run_dir
from speculative_t5x.training import training

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "gin_file", None, "Gin files (relative to the working directory or the repository root)."
)
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
flags.DEFINE_string("model_dir", None, "Directory for checkpoints, the exported model and logs.")
flags.DEFINE_string(
    "distill_from",
    None,
    "A checkpoints.save_model directory (e.g. a trained target's MODEL_DIR/model): distil on "
    "its decodes (cross-entropy) instead of training on the references; sets pack = False.",
)
flags.DEFINE_float("distill_temperature", None, "Teacher sampling temperature (0: greedy).")
flags.mark_flags_as_required(["gin_file", "model_dir"])


def check_flags() -> None:
  """The flags, before anything is parsed or built: --distill_temperature finite and >= 0 and
  only with --distill_from, a local --distill_from an existing directory, --model_dir a directory
  this process can write."""
  if FLAGS.distill_temperature is not None:
    if not FLAGS.distill_from:
      raise gin_utils.ConfigError(
          "--distill_temperature is the teacher's temperature: it needs --distill_from"
      )
    try:
      validation.check_temperature(FLAGS.distill_temperature)
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(f"--distill_temperature={FLAGS.distill_temperature}: {e}") from e
  distill_from = FLAGS.distill_from
  if distill_from and "://" not in distill_from and not os.path.isdir(distill_from):
    raise gin_utils.ConfigError(
        f"--distill_from={distill_from} is not a directory: give a checkpoints.save_model "
        "directory, e.g. a trained target's MODEL_DIR/model"
    )
  run_dir.check_writable(FLAGS.model_dir, "--model_dir")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check_flags()
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO.
  bindings = list(FLAGS.gin_bindings)
  if FLAGS.distill_from:
    bindings += [
        f"training.train.distill_from = '{FLAGS.distill_from}'",
        "training.train.pack = False",
    ]
  if FLAGS.distill_temperature is not None:
    bindings.append(f"training.train.distill_temperature = {FLAGS.distill_temperature}")
  gin_utils.parse_gin_flags(FLAGS.gin_file, bindings)
  config = gin.config_str()

  def on_checked():
    # Every configurable of the run has been called once train has checked its settings: an
    # unused binding is refused now, before any work.
    gin_utils.check_unused_bindings(
        later=(models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel)
    )

  summary = training.train(FLAGS.model_dir, on_checked=on_checked, gin_config=config)
  if summary.get("already_complete"):
    print(
        f"{FLAGS.model_dir} holds a complete run of {summary['steps']} steps: nothing to train "
        "(raise NUM_STEPS to train on); nothing was written.",
        file=sys.stderr,
    )
    return
  print(
      f"{summary['steps']} steps in {summary['train_seconds']:.0f} s: train loss "
      f"{summary['train'].get('loss', float('nan')):.4f}, eval {summary['eval']}; model in "
      f"{os.path.join(FLAGS.model_dir, training.EXPORT_DIR)}",
      file=sys.stderr,
  )


if __name__ == "__main__":
  gin_utils.run(main)
