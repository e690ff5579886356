r"""Converts checkpoints between T5X, Hugging Face and the project's orbax format.

Modes:
  t5x_to_orbax  --input is a T5X model dir, checkpoint_<step> dir or msgpack file (local or gs://,
                any layout load_t5x_checkpoint reads); the T5Config is read off the parameter
                shapes (gated MLP -> ('gelu', 'linear'), single wi -> ('relu',); override with
                --mlp_activations).
  hf_to_orbax   --input is an HF T5 directory with config.json and model.safetensors or
                pytorch_model.bin (e.g. a local copy of google/t5-v1_1-base).
  orbax_to_hf   --input is a directory written by t5x_to_orbax / hf_to_orbax (or save_model);
                --output gets model.safetensors (lm_head.weight as its own tensor) and config.json.

The orbax output is `checkpoints.save_model`'s layout (params/ + config.json); restore it with
`checkpoints.restore_model` or point CHECKPOINT_PATH at it.

Usage:
  python scripts/convert_checkpoint.py --mode=t5x_to_orbax \
    --input=gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000 \
    --output=/tmp/t5_1_1_small --dtype=bfloat16
  python scripts/convert_checkpoint.py --mode=orbax_to_hf --input=/tmp/t5_1_1_small \
    --output=/tmp/t5_1_1_small_hf
"""

from absl import flags
from absl import logging

from speculative_t5x import checkpoints
from speculative_t5x import gin_utils
from speculative_t5x import hf_weights
from speculative_t5x import t5x_checkpoints

MODES = ("t5x_to_orbax", "hf_to_orbax", "orbax_to_hf")

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", None, MODES, "Which conversion to run.")
flags.DEFINE_string("input", None, "Checkpoint to read (see the modes above).")
flags.DEFINE_string("output", None, "Directory to write.")
flags.DEFINE_integer(
    "step", None, "t5x_to_orbax: the step to read from a model dir (default: the latest)."
)
flags.DEFINE_enum(
    "dtype",
    "bfloat16",
    ("float32", "bfloat16"),
    "Activation dtype stored in the written T5Config (parameters stay float32).",
)
flags.DEFINE_list(
    "mlp_activations",
    None,
    "t5x_to_orbax: override the inferred mlp_activations, e.g. gelu,linear.",
)
flags.DEFINE_bool("overwrite", False, "Replace an existing orbax output.")
flags.mark_flags_as_required(["mode", "input", "output"])


def main(argv):
  del argv
  if FLAGS.mode == "t5x_to_orbax":
    params = t5x_checkpoints.load_t5x_checkpoint(FLAGS.input, FLAGS.step)["target"]
    overrides = {"dtype": FLAGS.dtype}
    if FLAGS.mlp_activations:
      overrides["mlp_activations"] = tuple(FLAGS.mlp_activations)
    config = checkpoints.config_from_params(params, **overrides)
    checkpoints.save_model(FLAGS.output, params, config, overwrite=FLAGS.overwrite)
  elif FLAGS.mode == "hf_to_orbax":
    params, config = hf_weights.load_hf(FLAGS.input, dtype=FLAGS.dtype)
    checkpoints.save_model(FLAGS.output, params, config, overwrite=FLAGS.overwrite)
  else:
    params, config = checkpoints.restore_model(FLAGS.input)
    hf_weights.save_hf(FLAGS.output, params, config)
  logging.info("%s: wrote %s (%s)", FLAGS.mode, FLAGS.output, config)


if __name__ == "__main__":
  gin_utils.run(main)
