r"""Does the drafter slow the target down inside the loop by evicting its weights from the caches?

Inside the speculative loop a drafter step and the target's verification, timed together, cost
more than the two timed apart (`step_costs.DecodeCosts.interference_ms`). The explanation to test:
the drafter's weights and the target's (about 75 MB of decoder weights per step for the demo
target) evict each other from the processor's last-level cache, so each runs from memory in the
loop where, timed alone, its weights stayed cached.

This isolates it. Beside the target's single-token step, a stage that does nothing but stream X MB
of float32 weights through a matrix-vector product (`StreamStage`: no attention, no cache, no logits)
is timed alone and together with the target step, for several X. If eviction is the cause, the
extra time of the pair over its parts grows with X and, at the drafter's parameter bytes, is about
the drafter's own interference, timed in the same rounds:

  interference(stage) = t(stage, then target step, in one loop step) - t(stage) - t(target step)

Every step is timed as the benchmark times them (`step_costs.time_decode_steps`: marginal steps of
jitted fori_loops, all calls side by side in the same rounds). Writes interference.json (with
the machine's load before and after) into --output_dir and prints a table. Needs a quiet machine:
it warns when the load average says otherwise.

  python benchmarks/bench_interference.py --output_dir=/tmp/interference
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import gin_utils
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.running import run_dir
from speculative_t5x.weights import pairs

STREAM_WIDTH = 256  # columns of a StreamStage's matrix: rows = bytes / (4 * STREAM_WIDTH).


@dataclasses.dataclass(frozen=True)
class StreamStage:
  """A stage that only reads memory: every byte of params [rows, STREAM_WIDTH] float32 once per
  step, in a matrix-vector product whose vector comes from the incoming tokens (so it is neither
  dead nor loop-invariant), passing the tokens on unchanged. Beside a network's stage it shows
  what streaming that many bytes does to the network's step."""

  params: jax.Array
  vocab_size: int
  k: int = 1
  span: int = 1

  @classmethod
  def of_megabytes(cls, megabytes: float, vocab_size: int, seed: int = 0) -> "StreamStage":
    rows = max(1, int(megabytes * 2**20 / (4 * STREAM_WIDTH)))
    weights = jax.random.normal(jax.random.PRNGKey(seed), (rows, STREAM_WIDTH), jnp.float32)
    return cls(weights * 1e-3, vocab_size)

  init_key = "stream"

  def init_cache(self, params, encoder_tokens, cache_length, rng):
    del params, encoder_tokens, cache_length, rng
    return ()

  def run(self, params, cache, tokens, position, u, standardize, temperature):
    del position, u, standardize, temperature
    # Not a multiple of one fixed vector (XLA would factor the product and hoist it out of the
    # loop): a different vector for each token value.
    vector = jnp.cos(jnp.arange(STREAM_WIDTH) * (tokens[0, 0] % 7 + 1).astype(jnp.float32))
    total = jnp.sum(params @ vector)
    return jnp.where(total > 1e30, tokens + 1, tokens), cache


FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Directory for interference.json.")
flags.DEFINE_string("pair_dir", "demo_models", "Pair directory (pairs.save_pair).")
flags.DEFINE_list("stream_mb", ["1", "4", "14", "28", "56"], "Streamed megabytes per stage.")
flags.DEFINE_integer("repeats", 30, "Timed rounds; medians are reported.", lower_bound=1)
flags.DEFINE_integer("encoder_length", 32, "Encoder input length.", lower_bound=1)
flags.DEFINE_integer("decode_length", 64, "Decode length.", lower_bound=1)
flags.mark_flag_as_required("output_dir")

run_dir.define_overwrite_flag()
OUTPUTS = ("interference.json",)


def _bytes(params) -> int:
  return int(sum(np.size(x) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params)))


def check_flags() -> list[float]:
  try:
    sizes = [float(mb) for mb in FLAGS.stream_mb]
  except ValueError as e:
    raise gin_utils.ConfigError(f"--stream_mb={FLAGS.stream_mb}: {e}: give numbers") from e
  if not sizes or min(sizes) <= 0:
    raise gin_utils.ConfigError(f"--stream_mb={FLAGS.stream_mb}: give sizes > 0, e.g. 4,28")
  if not (pathlib.Path(FLAGS.pair_dir) / "target").is_dir():
    raise gin_utils.ConfigError(
        f"--pair_dir={FLAGS.pair_dir} has no target/: give a pairs.save_pair directory"
    )
  return sizes


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  written = run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite)
  written.check()  # before any work
  sizes = check_flags()
  load = stopwatch.machine_load()
  warning = stopwatch.busy_warning(load)
  if warning:
    print(warning, file=sys.stderr)
  logging.set_verbosity(logging.WARNING)
  config = pairs.PairConfig.from_pair_dir(FLAGS.pair_dir)
  pair = pairs.load_pair(config, 1)
  target = step_costs.Stage(pair.target_config, pair.target_params, 1)
  vocab = pair.target_config.vocab_size
  drafter_steps = step_costs.cost_steps(
      pair.target_config, pair.target_params, {"drafter": (pair.drafter, pair.drafter_params)}, [1]
  )
  drafter_stage = drafter_steps["drafter", "drafter"][0]
  stages = {
      "drafter": drafter_stage,
      **{mb: StreamStage.of_megabytes(mb, vocab) for mb in sizes},
  }
  steps = {"target": [target]}
  for name, stage in stages.items():
    steps[name, "alone"] = [stage]
    steps[name, "with target"] = [stage, target]
  geometry = step_costs.DecodeGeometry.for_decoding(FLAGS.encoder_length, FLAGS.decode_length, 2)
  timings = step_costs.time_decode_steps(steps, geometry, temperature=0.0, repeats=FLAGS.repeats)
  target_ms = timings["target"].median_ms
  rows = []
  for name, stage in stages.items():
    alone = timings[name, "alone"].median_ms
    together = timings[name, "with target"].median_ms
    rows.append(
        {
            "stage": "drafter step" if name == "drafter" else f"stream {name:g} MB",
            "megabytes": (
                _bytes(pair.drafter_params) if name == "drafter" else _bytes(stage.params)
            )
            / 2**20,
            "alone_ms": alone,
            "with_target_ms": together,
            "interference_ms": together - alone - target_ms,
            "interference_target_steps": (together - alone - target_ms) / target_ms,
        }
    )
  output = {
      "command": sys.argv,
      "target_step_ms": target_ms,
      "target_megabytes": _bytes(pair.target_params) / 2**20,
      "rows": rows,
      "timings": {str(k): t.as_dict() for k, t in timings.items()},
      "load_before": load,
      "load_after": stopwatch.machine_load(),
      "busy": warning is not None,
  }
  written.write({"interference.json": json.dumps(output, indent=2)})
  print(
      f"target step {target_ms:.3f} ms (parameters {output['target_megabytes']:.0f} MB); "
      f"1-minute load average before {load['load_1m']:.2f}, after "
      f"{output['load_after']['load_1m']:.2f}"
  )
  print("| stage | MB | alone ms | with target ms | interference ms | in target steps |")
  print("|---|---|---|---|---|---|")
  for row in rows:
    print(
        f"| {row['stage']} | {row['megabytes']:.1f} | {row['alone_ms']:.3f} | "
        f"{row['with_target_ms']:.3f} | {row['interference_ms']:.3f} | "
        f"{row['interference_target_steps']:.3f} |"
    )


if __name__ == "__main__":
  gin_utils.run(main)
