"""One process of a multi-process inference run; started by tests/test_multihost.py.

A process fixes its device count and its process group when JAX starts, so this runs in a fresh
interpreter:
  python tests/multihost_check.py OUT_DIR DEVICES CHECKPOINTS \
    [COORDINATOR_ADDRESS PROCESS_COUNT PROCESS_INDEX]
It expects DEVICES CPU devices (the caller sets XLA_FLAGS), joins the other processes through `multihost.initialize` when
given an address (T5X's flags), and runs `inference.infer` on the demo_ende task (the corpus in
$SPECULATIVE_T5X_DEMO_DATA) for each of RUNS, with the tiny random target and T5 drafter saved in
CHECKPOINTS/target and CHECKPOINTS/drafter (`save_pair`), into OUT_DIR/<run name>. Process 0
writes the outputs; the test compares them across process counts.
"""

import os
import sys

import gin
import jax

# tests/ is this script's sys.path[0].
from conftest import tiny_config
from speculative_t5x import checkpoints
from speculative_t5x import drafters
from speculative_t5x import inference
from speculative_t5x import multihost
from speculative_t5x import network
from speculative_t5x import pairs
from speculative_t5x import tasks

VOCAB_SIZE = 32  # covers the test vocabulary's 26 pieces
TINY = tiny_config(VOCAB_SIZE, emb_dim=8, head_dim=4, mlp_dim=16, num_decoder_layers=1)
LENGTHS = {"inputs": 12, "targets": 6}
BATCH_SIZE = 4
# name -> (temperature, draft tree or None: a chain of GAMMA)
RUNS = {
    "chain_t0": (0.0, None),
    "chain_t1": (1.0, None),
    "tree_t0": (0.0, (2, 1)),
    "tree_t1": (1.0, (2, 1)),
}
GAMMA = 2


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
  for name, (temperature, tree) in RUNS.items():
    gin.clear_config()
    if tree is not None:
      gin.bind_parameter("SpeculativeEncoderDecoderModel.draft_tree", tree)
    inference.infer(
        inference.InferConfig(
            mixture_or_task_name=tasks.DEMO_ENDE_TASK,
            task_feature_lengths=LENGTHS,
            output_dir=os.path.join(out, name),
            pair=pair,
            gamma=GAMMA,
            temperature=temperature,
            batch_size=BATCH_SIZE,
            decode_seed=7,
        )
    )


if __name__ == "__main__":
  main()
