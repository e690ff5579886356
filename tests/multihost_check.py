"""One process of a multi-process inference run; started by tests/test_multihost.py.

A process fixes its device count and its process group when JAX starts, so this runs in a fresh
interpreter:
  python tests/multihost_check.py OUT_DIR DEVICES CHECKPOINTS \
    [COORDINATOR_ADDRESS PROCESS_COUNT PROCESS_INDEX]
It expects DEVICES CPU devices (the caller sets XLA_FLAGS), joins the other processes through
`multihost.initialize` when given an address (T5X's flags), and runs `inference.infer` on the
demo_ende task (the corpus in $SPECULATIVE_T5X_DEMO_DATA), with the tiny random target and T5
drafter saved in CHECKPOINTS/target and CHECKPOINTS/drafter (`save_pair`): each of RUNS on a
data-parallel mesh into OUT_DIR/<run name>, then each of MODEL_PARALLEL_RUNS with the 'model'
axis over every device (across the processes when there are several) into
OUT_DIR/model_parallel/<run name>. Process 0 writes the outputs; the test compares them across
process counts. At the end each process writes to stderr, after READS, the slices of the target's
checkpoint it read lazily (`t5x_checkpoints.LazyArray.read`), as JSON: {run (its directory
under OUT_DIR): [[parameter, shape, [[start, stop] per dimension]], ...]}, runs without any
left out.
"""

import json
import os
import sys

import gin
import jax

# tests/ is this script's sys.path[0].
from conftest import tiny_config
from speculative_t5x import drafters
from speculative_t5x import network
from speculative_t5x.running import inference
from speculative_t5x.running import multihost
from speculative_t5x.running import partitioning
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs
from speculative_t5x.weights import t5x_checkpoints

VOCAB_SIZE = 32  # covers the test vocabulary's 26 pieces
# 4 heads: the model-parallel runs split heads, mlp and vocab over 4 devices.
TINY = tiny_config(VOCAB_SIZE, emb_dim=8, num_heads=4, head_dim=4, mlp_dim=16, num_decoder_layers=1)
LENGTHS = {"inputs": 12, "targets": 6}
BATCH_SIZE = 4
# name -> (temperature, draft tree or None: a chain of GAMMA)
RUNS = {
    "chain_t0": (0.0, None),
    "chain_t1": (1.0, None),
    "tree_t0": (0.0, (2, 1)),
    "tree_t1": (1.0, (2, 1)),
}
MODEL_PARALLEL_RUNS = ("chain_t1",)  # T = 1: sampling, whose reductions run over the model axis
MODEL_PARALLEL_DIR = "model_parallel"
GAMMA = 2
READS = "multihost_check: lazy reads "


def save_pair(directory: str) -> None:
  """The random target (seed 0) and drafter (seed 1) that main() restores."""
  init = jax.jit(network.init_params, static_argnums=0)  # one compile, not one per operation
  for name, seed in (("target", 0), ("drafter", 1)):
    params = init(TINY, jax.random.PRNGKey(seed))
    checkpoints.save_model(os.path.join(directory, name), params, TINY)


def main():
  out, saved = sys.argv[1], sys.argv[3]
  if len(sys.argv) > 4:
    address, count, index = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    multihost.initialize(
        multihost.ProcessFlags(
            multiprocess_gpu=True,
            coordinator_address=address,
            process_count=count,
            process_index=index,
        )
    )
  devices = int(sys.argv[2])
  assert jax.device_count() == devices * jax.process_count(), jax.devices()
  tasks.register_demo_task()
  pair = pairs.PairConfig(
      target_config=TINY,
      drafter=drafters.T5Drafter(TINY),
      checkpoint_path=os.path.join(saved, "target"),
      drafter_checkpoint_path=os.path.join(saved, "drafter"),
      random_init_seed=None,
      restore_dtype="float32",
  )
  reads, log = {}, []
  read = t5x_checkpoints.LazyArray.read

  def logged(leaf, index):
    bounds = [list(s.indices(n)[:2]) for s, n in zip(index, leaf.shape)]
    log.append([leaf.name, list(leaf.shape), bounds])
    return read(leaf, index)

  t5x_checkpoints.LazyArray.read = logged
  model_parallel = os.path.join(out, MODEL_PARALLEL_DIR)
  for names, partitions, directory in (
      (RUNS, 1, out),
      (MODEL_PARALLEL_RUNS, jax.device_count(), model_parallel),
  ):
    for name in names:
      temperature, tree = RUNS[name]
      gin.clear_config()
      if tree is not None:
        gin.bind_parameter("SpeculativeEncoderDecoderModel.draft_tree", tree)
      inference.infer(
          inference.InferConfig(
              mixture_or_task_name=demo_data.DEMO_ENDE_TASK,
              task_feature_lengths=LENGTHS,
              output_dir=os.path.join(directory, name),
              pair=pair,
              gamma=GAMMA,
              temperature=temperature,
              batch_size=BATCH_SIZE,
              decode_seed=7,
          ),
          partitioner=partitioning.Partitioner(num_partitions=partitions),
      )
      if log:
        reads[os.path.relpath(os.path.join(directory, name), out)] = log[:]
        log.clear()
  print(f"\n{READS}{json.dumps(reads)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
  main()
