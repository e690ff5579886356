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

Before anything is read: the input must be of the mode's format (an input of another format is
named, with the mode that reads it), every flag given must be one the mode uses (--step and
--mlp_activations: t5x_to_orbax; --dtype: the two *_to_orbax modes), no positional argument, and
--output must be writable and hold no earlier conversion unless --overwrite. The outputs are
written under temporary names and renamed into place together (`run_dir.OutputDir`): an
interrupted conversion leaves --output as it was; --overwrite replaces the earlier output whole.

Usage:
  python scripts/convert_checkpoint.py --mode=t5x_to_orbax \
    --input=gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000 \
    --output=/tmp/t5_1_1_small --dtype=bfloat16
  python scripts/convert_checkpoint.py --mode=orbax_to_hf --input=/tmp/t5_1_1_small \
    --output=/tmp/t5_1_1_small_hf
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from speculative_t5x.running import bootstrap

bootstrap.start(tensorflow=False)  # first: keeps JAX off an absent TPU (no seqio task read)

from speculative_t5x import gin_utils
from speculative_t5x import param_checks
from speculative_t5x.running import run_dir
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import hf_weights
from speculative_t5x.weights import t5x_checkpoints

MODES = ("t5x_to_orbax", "hf_to_orbax", "orbax_to_hf")
# The format each mode reads, and the mode that reads each format into the other.
READS = {"t5x_to_orbax": "t5x", "hf_to_orbax": "hf", "orbax_to_hf": "orbax"}
FORMAT_NAMES = {
    "t5x": "a T5X checkpoint (msgpack or orbax, as T5X writes it)",
    "hf": "a Hugging Face T5 directory (config.json with d_model, and its weights)",
    "orbax": "this project's orbax directory (params/ and config.json with emb_dim)",
}
# What each format is converted with.
CONVERT_WITH = {"t5x": "t5x_to_orbax", "hf": "hf_to_orbax", "orbax": "orbax_to_hf"}
# The flags only some modes use.
MODE_FLAGS = {
    "step": ("t5x_to_orbax",),
    "mlp_activations": ("t5x_to_orbax",),
    "dtype": ("t5x_to_orbax", "hf_to_orbax"),
}
ORBAX_OUTPUTS = (t5x_checkpoints.PARAMS_DIR, "config.json")
HF_OUTPUTS = (
    hf_weights.SAFETENSORS_FILE,
    hf_weights.CONFIG_FILE,
    hf_weights.TORCH_FILE,
    hf_weights.SAFETENSORS_FILE + ".index.json",
    hf_weights.TORCH_FILE + ".index.json",
)

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
    "t5x_to_orbax, hf_to_orbax: activation dtype stored in the written T5Config (parameters "
    "stay float32).",
)
flags.DEFINE_list(
    "mlp_activations",
    None,
    "t5x_to_orbax: override the inferred mlp_activations, e.g. gelu,linear.",
)
flags.DEFINE_bool("overwrite", False, "Replace an earlier conversion in --output (all of it).")
flags.mark_flags_as_required(["mode", "input", "output"])


def input_format(path: str) -> str | None:
  """'t5x', 'hf' or 'orbax': the format of the checkpoint at `path`, by its files; None for a
  URL (left to the reader). Raises gin_utils.ConfigError if nothing is at `path`."""
  if "://" in path:
    return None
  if not os.path.exists(path):
    raise gin_utils.ConfigError(f"--input={path} does not exist: give the checkpoint to convert.")
  if os.path.isfile(path):
    return "t5x"  # a msgpack checkpoint file
  config_file = os.path.join(path, "config.json")
  if os.path.isfile(config_file):
    try:
      with open(config_file) as f:
        fields = json.load(f)
    except (OSError, ValueError):
      fields = None
    if isinstance(fields, dict) and ("d_model" in fields or fields.get("model_type") == "t5"):
      return "hf"
    if isinstance(fields, dict) and "emb_dim" in fields:
      return "orbax"
  if any(os.path.exists(os.path.join(path, name)) for name in HF_OUTPUTS[::2]):
    return "hf"
  return "t5x"  # a model dir or checkpoint dir: load_t5x_checkpoint names what it lacks


def check_flags(argv) -> run_dir.OutputDir:
  """Everything the command line decides, before anything is read -> the checked output."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  unused = [
      name for name, modes in MODE_FLAGS.items() if FLAGS[name].present and FLAGS.mode not in modes
  ]
  if unused:
    uses = "; ".join(f"--{name} is for {' and '.join(MODE_FLAGS[name])}" for name in unused)
    raise gin_utils.ConfigError(
        f"--mode={FLAGS.mode} does not use {', '.join('--' + n for n in unused)} ({uses}): drop it"
    )
  found = input_format(FLAGS.input)
  wanted = READS[FLAGS.mode]
  if (
      found is not None
      and found != wanted
      and not (FLAGS.mode == "t5x_to_orbax" and found == "orbax")
  ):
    raise gin_utils.ConfigError(
        f"--input={FLAGS.input} is {FORMAT_NAMES[found]}, not {FORMAT_NAMES[wanted]} that "
        f"--mode={FLAGS.mode} reads: convert it with --mode={CONVERT_WITH[found]}"
    )
  if "://" not in FLAGS.input and os.path.realpath(FLAGS.input) == os.path.realpath(FLAGS.output):
    raise gin_utils.ConfigError(
        f"--output={FLAGS.output} is --input: write the conversion to another directory"
    )
  names = HF_OUTPUTS if FLAGS.mode == "orbax_to_hf" else ORBAX_OUTPUTS
  return run_dir.OutputDir(FLAGS.output, names, "--output", FLAGS.overwrite).check()


def main(argv):
  output = check_flags(argv)
  with output:
    scratch = output.scratch_dir()
    if FLAGS.mode == "t5x_to_orbax":
      params = t5x_checkpoints.load_t5x_checkpoint(FLAGS.input, FLAGS.step)["target"]
      overrides = {"dtype": FLAGS.dtype}
      if FLAGS.mlp_activations:
        overrides["mlp_activations"] = tuple(FLAGS.mlp_activations)
      config = param_checks.config_from_params(params, **overrides)
      checkpoints.save_model(scratch, params, config)
    elif FLAGS.mode == "hf_to_orbax":
      params, config = hf_weights.load_hf(FLAGS.input, dtype=FLAGS.dtype)
      checkpoints.save_model(scratch, params, config)
    else:
      params, config = checkpoints.restore_model(FLAGS.input)
      hf_weights.save_hf(scratch, params, config)
    output.adopt(scratch)
    output.commit()
  logging.info("%s: wrote %s (%s)", FLAGS.mode, FLAGS.output, config)


if __name__ == "__main__":
  gin_utils.run(main)
