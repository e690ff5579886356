r"""Decodes a seqio task split with speculative decoding (or the baseline); writes predictions and
metrics.

A thin shell over `speculative_t5x.inference` (which documents the outputs, truncation and
weights): gin files and bindings in, predictions.jsonl, metrics.json and the run's config.gin out,
in INFER_OUTPUT_DIR, written together once the split is decoded. A configuration error (an unknown
task, a macro left %gin.REQUIRED, a bad setting, a binding the run does not use, an output
directory that cannot be written or that holds another run's outputs without --overwrite) ends
the run before any model loads, with a message naming it and exit status 1.

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

Several processes (T5X's flags, with T5X's meaning; docs/multihost.md): every process runs the same
command with its own --process_index; each decodes its shard of the split, and process 0 writes
the outputs. On localhost, two CPU processes:
  python scripts/infer.py <the flags above> --multiprocess_gpu \
    --coordinator_address=localhost:12345 --process_count=2 --process_index=0 &
  python scripts/infer.py <the flags above> --multiprocess_gpu \
    --coordinator_address=localhost:12345 --process_count=2 --process_index=1
On a Cloud TPU pod slice, --multiprocess_gpu alone (JAX detects the rest), on every worker:
  gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --worker=all \
    --command="cd speculative_t5x && python scripts/infer.py <the flags above> --multiprocess_gpu"
The flags are checked before anything starts, the processes' configurations are compared once
they have joined, before any model loads; a process that dies or never joins ends the others with
a non-zero status within --multiprocess_timeout_seconds (and a message naming it).
"""

from absl import app
from absl import flags
import gin

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x.running import inference
from speculative_t5x.running import multihost
from speculative_t5x.running import partitioning
from speculative_t5x.running import run_dir

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
# T5X's multi-process flags (t5x/infer.py), with its meaning; see speculative_t5x/running/multihost.py.
flags.DEFINE_bool(
    "multiprocess_gpu",
    False,
    "Initialize JAX's distributed runtime, using --coordinator_address, --process_count and "
    "--process_index (all three, or none: detected on a TPU pod slice, Slurm or Open MPI).",
)
flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator.")
flags.DEFINE_integer("process_count", None, "Number of processes.")
flags.DEFINE_integer("process_index", None, "Index of this process, 0 .. process_count - 1.")
run_dir.define_overwrite_flag("INFER_OUTPUT_DIR")
flags.DEFINE_integer(
    "multiprocess_timeout_seconds",
    multihost.DEFAULT_TIMEOUT_SECONDS,
    "Seconds to wait for every process to join, and after which a silent process is dead.",
)


def main(argv):
  """Checks the flags, the gin configuration (every binding but those of what the inference
  builds later) and the output directory (writable; no other run's outputs unless --overwrite),
  joins the other processes (if any) and compares their configurations, then runs the
  inference, which writes config.gin with the predictions and the metrics, all at once."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  process_flags = multihost.ProcessFlags(
      multiprocess_gpu=FLAGS.multiprocess_gpu,
      coordinator_address=FLAGS.coordinator_address,
      process_count=FLAGS.process_count,
      process_index=FLAGS.process_index,
      timeout_seconds=FLAGS.multiprocess_timeout_seconds,
  )
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings)
  config = inference.InferConfig()
  # Before any work: a binding this run does not use. `inference.infer` builds the partitioner
  # (and its default rules) and the model later, and with the model what its bindings name.
  gin_utils.check_unused_bindings(
      later=(
          models.EncoderDecoderModel,
          models.SpeculativeEncoderDecoderModel,
          partitioning.Partitioner,
          partitioning.standard_logical_axis_rules,
      )
  )
  if process_flags.process_index in (None, 0):  # the process that writes (or any, if detected)
    inference.output_dir(config, FLAGS.overwrite).check()
  multihost.initialize(process_flags)
  multihost.check_same_everywhere({"gin configuration": gin.config_str()})
  inference.get_task(config)  # before anything is loaded
  inference.infer(config, gin_config=gin.config_str(), overwrite=FLAGS.overwrite)


if __name__ == "__main__":
  gin_utils.run(main)
