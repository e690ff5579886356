r"""Times one cached decode of k tokens for T5 1.1 tiny, small and base shapes (random weights).

time(k)/time(1) is the price of verification that speculative decoding pays: the target scores
gamma + 1 = k tokens per call where the baseline scores 1. Each size's T5Config comes from
configs/models/t5_1_1_<size>.gin; its activation dtype is overridden by --dtype (default
float32: bfloat16 matmuls are emulated, and several times slower, on CPUs; pass --dtype=config to
keep the gin file's bfloat16).

Per-step times follow `speculative_t5x.step_costs.time_decode_steps`, every k of a size timed side
by side: jitted fori_loops of --steps_per_call steps and of 1 + step_costs.EXTRA_PASSES times as
many (cache carried in place, as in the decoding loop), compilation excluded, one warm-up call,
the median (and IQR) over --repeats rounds of their difference divided by the extra steps.

Writes bench_network.json and bench_network.md into --output_dir and prints the Markdown table.

Usage:
  python benchmarks/bench_network.py --output_dir=/tmp/bench_network
  python benchmarks/bench_network.py --output_dir=/tmp/bench_network --sizes=tiny --repeats=5
"""

import dataclasses
import json
import pathlib
import platform

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import flags
from absl import logging
import gin
import jax

from speculative_t5x import gin_utils
from speculative_t5x import network  # noqa: F401  (registers network.T5Config with gin)
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import workloads
from speculative_t5x.running import run_dir

MODEL_GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs" / "models"
SIZES = ("tiny", "small", "base", "large", "xl", "xxl")

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Directory for bench_network.json and bench_network.md.")
flags.DEFINE_list("sizes", ["tiny", "small", "base"], f"Model sizes, from {SIZES}.")
flags.DEFINE_list("ks", ["1", "4", "8"], "Tokens per decode call; must include 1.")
flags.DEFINE_integer("repeats", 20, "Timed rounds per size; the median is reported.")
flags.DEFINE_integer(
    "steps_per_call",
    step_costs.DEFAULT_STEPS_PER_CALL,
    "Decode steps per timed call (in a fori_loop); 1 times a single call.",
)
flags.DEFINE_enum(
    "dtype",
    "float32",
    ("float32", "bfloat16", "config"),
    "Activation dtype; 'config' keeps the gin file's (bfloat16 for small and up).",
)
flags.DEFINE_integer("encoder_length", 64, "Encoder input length.")
flags.DEFINE_integer("decode_length", 64, "Decode length; the cache holds it plus max(ks) tokens.")
flags.DEFINE_integer("seed", 0, "Seed of the random weights and tokens.")
flags.mark_flag_as_required("output_dir")


@gin.configurable
def model_config(config=gin.REQUIRED):
  """Returns the T5Config gin binds here (from a model file's T5_1_1_<SIZE> macro)."""
  return config


run_dir.define_overwrite_flag()
OUTPUTS = ("bench_network.json", "bench_network.md")


def load_config(size: str) -> network.T5Config:
  """T5Config of configs/models/t5_1_1_<size>.gin."""
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}: use one of {SIZES}.")
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [str(MODEL_GIN_DIR / f"t5_1_1_{size}.gin")], [f"model_config.config = %T5_1_1_{size.upper()}"]
  )
  return model_config()


def markdown(rows: list[dict], ks: list[int]) -> str:
  """The table: per-step median (IQR) in ms for each k, then time(k)/time(1)."""
  others = [k for k in ks if k != 1]
  header = (
      ["size", "dtype", "params (M)"]
      + [f"k={k} ms (IQR)" for k in ks]
      + [f"t({k})/t(1)" for k in others]
  )
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    cells = [row["size"], row["dtype"], f"{row['params_millions']:.1f}"]
    cells += [
        f"{row['ms'][str(k)]['median_ms']:.3f} ({row['ms'][str(k)]['iqr_ms']:.3f})" for k in ks
    ]
    cells += [f"{row['ratio_to_k1'][str(k)]:.2f}" for k in others]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  output = run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite)
  output.check()  # before any work
  ks = sorted({int(k) for k in FLAGS.ks})
  if 1 not in ks:
    raise ValueError(f"--ks={FLAGS.ks} must include 1: every ratio is time(k)/time(1).")
  geometry = step_costs.DecodeGeometry.for_decoding(
      FLAGS.encoder_length, FLAGS.decode_length, max(ks), FLAGS.steps_per_call
  )
  rows = []
  for size in FLAGS.sizes:
    config = load_config(size)
    if FLAGS.dtype != "config":
      config = config.replace(dtype=FLAGS.dtype)
    params = workloads.random_params(config, FLAGS.seed)
    # Every k of one size timed side by side: their ratios are the point.
    ms = step_costs.time_decode_steps(
        {k: [step_costs.Stage(config, params, k)] for k in ks},
        geometry,
        repeats=FLAGS.repeats,
        seed=FLAGS.seed,
    )
    logging.info("%s: %s", size, ms)
    rows.append(
        {
            "size": size,
            "dtype": config.dtype,
            "params_millions": sum(x.size for x in jax.tree.leaves(params)) / 1e6,
            "ms": {str(k): t.as_dict() for k, t in ms.items()},
            "ratio_to_k1": {str(k): ms[k].median_ms / ms[1].median_ms for k in ks},
        }
    )
  table = markdown(rows, ks)
  run = {
      "geometry": dataclasses.asdict(geometry),
      "repeats": FLAGS.repeats,
      "seed": FLAGS.seed,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "jax": jax.__version__,
      "machine": platform.platform(),
  }
  output.write(
      {
          "bench_network.json": json.dumps({"run": run, "rows": rows}, indent=2),
          "bench_network.md": f"Per-step time of one cached decode of k tokens, batch 1, random weights; encoder length "
          f"{geometry.encoder_length}, cache length {geometry.cache_length}, steps from position "
          f"{geometry.position}; marginal time per step (calls of {geometry.steps_per_call} and "
          f"{(1 + step_costs.EXTRA_PASSES) * geometry.steps_per_call} steps), median over "
          f"{FLAGS.repeats} rounds ({jax.default_backend()}).\n\n{table}",
      }
  )
  print(table)


if __name__ == "__main__":
  gin_utils.run(main)
