r"""Decodes a seqio task split with speculative decoding (or the baseline); writes predictions and
metrics.

A thin shell over `speculative_t5x.inference` (which documents the outputs, truncation and
weights): gin files and bindings in, predictions.jsonl, metrics.json and the run's config.gin out,
in INFER_OUTPUT_DIR. A configuration error (an unknown task, a macro left %gin.REQUIRED, a bad
setting) ends the run before any model loads, with a message naming it and exit status 1.

Usage (T5X's flags; --gin.NAME=value is short for --gin_bindings='NAME = value'):
  python scripts/infer.py --gin_file=configs/paper/ende_small_t0.gin \
    --gin.CHECKPOINT_PATH="'gs://your-bucket/t5_1_1_xxl_ende/checkpoint_N'" \
    --gin.DRAFTER_CHECKPOINT_PATH="'gs://your-bucket/t5_1_1_small_ende/checkpoint_N'" \
    --gin.INFER_OUTPUT_DIR="'/tmp/ende_small_t0'"
  python scripts/infer.py --gin_file=configs/paper/ende_small_t0.gin \
    --gin_file=configs/drafters/bigram.gin \
    --gin.CHECKPOINT_PATH="'gs://your-bucket/t5_1_1_xxl_ende/checkpoint_N'" \
    --gin.INFER_OUTPUT_DIR="'/tmp/ende_bigram_t0'"      # the same row with a bigram drafter
  python scripts/infer.py --gin_file=configs/runs/infer.gin \
    --gin_file=configs/drafters/t5.gin --gin_file=configs/models/t5_1_1_tiny.gin \
    --gin_file=configs/tasks/demo_ende.gin \
    --gin.TARGET_CONFIG=%T5_1_1_TINY --gin.DRAFTER_CONFIG=%T5_1_1_TINY \
    --gin.CHECKPOINT_PATH=None --gin.DRAFTER_CHECKPOINT_PATH=None --gin.RANDOM_INIT_SEED=0 \
    --gin.RESTORE_DTYPE="'float32'" \
    --gin.INFER_OUTPUT_DIR="'/tmp/infer_tiny'"            # random weights: the mechanics only
"""

from absl import app
from absl import flags
import gin

from speculative_t5x import gin_utils
from speculative_t5x import inference

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "gin_file",
    None,
    "Gin files, e.g. configs/runs/infer.gin or "
    "configs/paper/ende_small_t0.gin; later files override earlier ones.",
)
flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, applied after the files; " "--gin.NAME=value is a shorthand."
)


def main(argv):
  """Parses the gin configuration, checks it and runs the inference, which writes config.gin
  once the task, the weights and the settings have passed their checks."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings)
  config = inference.InferConfig()
  inference.get_task(config)  # before anything is loaded
  inference.infer(config, gin_config=gin.config_str())


if __name__ == "__main__":
  gin_utils.run(main)
