r"""Ahead-of-time check: speculative decoding of a T5-XXL target on a model-parallel mesh.

Lowers and compiles the whole speculative decode (`Partitioner.partition_predict` of a
`SpeculativeEncoderDecoderModel`: encoders, caches, the `lax.while_loop`) for --num_devices
simulated CPU devices, from abstract parameters (`jax.ShapeDtypeStruct`s of the setup's
param_dtype carrying their shardings: nothing is allocated). The target is split over the 'model'
axis by T5X's standard rules, the drafter replicated (configs/runs/partitioning.gin). It reports
XLA's per-device memory analysis against one TPU-v4 chip's HBM (32 GiB), checks that the lowered
module has no host callbacks and no dynamic shapes, and exits 1 if either check or the memory
fails.

XLA:CPU's buffer assignment stands in for the TPU's: it fixes argument and output sizes exactly,
but its temporaries can differ (for instance where the CPU computes bfloat16 matmuls in float32).

Writes aot_check.json and aot_check.md into AOT_OUTPUT_DIR. The drafter is any
`drafters.Drafter` (configs/drafters/): its parameters are abstract `init_params` and its
shardings come from its `param_axes`, like a trained model's.

Usage (--gin.NAME=value is short for --gin_bindings='NAME = value'):
  python scripts/aot_check.py                             # T5-XXL + T5-small, 4 devices, 1x4
  python scripts/aot_check.py --gin.NUM_PARTITIONS=8 --num_devices=8
  python scripts/aot_check.py --gin.TASK_FEATURE_LENGTHS="{'inputs': 64, 'targets': 64}"
  python scripts/aot_check.py --gin.aot_script.AotSetup.param_dtype="'float32'"
  python scripts/aot_check.py --gin_file=configs/runs/aot_xxl.gin \
    --gin_file=configs/drafters/bigram.gin                # another drafter
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any, Mapping

import speculative_t5x  # noqa: F401  (first: TensorFlow, which seqio imports, is imported quietly)

from absl import app
from absl import flags
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import pairs
from speculative_t5x import partitioning

DEFAULT_GIN_FILE = "configs/runs/aot_xxl.gin"
GIB = 2**30
EOS_ID = 1

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin run files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
flags.DEFINE_integer(
    "num_devices", 4, "Simulated CPU devices (XLA_FLAGS device count), set " "before JAX starts."
)


@gin.configurable(module="aot_script")
@dataclasses.dataclass(frozen=True)
class AotSetup:
  """What is compiled: a target config and a drafter, feature lengths, batch, gamma, the
  parameter dtype (T5X restores inference checkpoints as bfloat16), the HBM per device, and where
  the report goes."""

  target_config: network.T5Config
  drafter: drafters_lib.Drafter
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  batch_size: int = 1
  gamma: int = 7
  param_dtype: str = "bfloat16"
  hbm_gib: float = 32.0

  def __post_init__(self):
    pairs.check_drafter(self.drafter)


def _abstract_params(
    model: models.SpeculativeEncoderDecoderModel,
    partitioner: partitioning.Partitioner,
    dtype: Any,
    input_shapes: Mapping[str, tuple],
) -> Any:
  """{'target': ..., 'drafter': ...} as ShapeDtypeStructs (floating-point leaves of `dtype`)
  carrying the partitioner's shardings; a drafter sharded as a whole (no `param_axes`) gives its
  one sharding to every leaf. Nothing is allocated."""
  shapes = jax.eval_shape(
      lambda rng: model.get_initial_variables(rng, input_shapes)["params"], jax.random.PRNGKey(0)
  )

  def place(sharding, subtree):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype, sharding=sharding
        ),
        subtree,
    )

  return jax.tree.map(place, partitioner.params_shardings(model), shapes)


def _abstract_inputs(
    setup: AotSetup,
    model: models.SpeculativeEncoderDecoderModel,
    partitioner: partitioning.Partitioner,
) -> tuple:
  """(params, batch, rng, temperature) as ShapeDtypeStructs with the partitioner's shardings."""
  lengths = {
      "encoder_input_tokens": setup.task_feature_lengths["inputs"],
      "decoder_input_tokens": setup.task_feature_lengths["targets"],
      "decoder_target_tokens": setup.task_feature_lengths["targets"],
  }
  params = _abstract_params(
      model,
      partitioner,
      jnp.dtype(setup.param_dtype),
      {
          name: (setup.batch_size, lengths[name])
          for name in ("encoder_input_tokens", "decoder_input_tokens")
      },
  )
  batch = {
      name: jax.ShapeDtypeStruct(
          (setup.batch_size, length), jnp.int32, sharding=partitioner.data_sharding
      )
      for name, length in lengths.items()
  }
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=partitioner.replicated)
  temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=partitioner.replicated)
  return params, batch, rng, temperature


def _bytes_per_device(tree: Any) -> int:
  """Bytes of one device's shards of abstract arrays (the first device's share of each)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard)) * leaf.dtype.itemsize
  return total


def _module_problems(hlo_text: str) -> list[str]:
  """Host callbacks or dynamic shapes in a lowered StableHLO module (neither runs on a TPU loop
  without a host round trip or recompilation)."""
  problems = []
  if "callback" in hlo_text:
    problems.append("host callback in the lowered module")
  if "tensor<?" in hlo_text or "x?x" in hlo_text:
    problems.append("dynamic shape in the lowered module")
  return problems


def check(setup: AotSetup, partitioner: partitioning.Partitioner) -> dict:
  """Lowers and compiles the speculative decode for `partitioner`'s mesh -> a report dict."""
  vocab = seqio.PassThroughVocabulary(setup.target_config.vocab_size, eos_id=EOS_ID)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(setup.target_config), setup.drafter, vocab, vocab, gamma=setup.gamma
  )
  args = _abstract_inputs(setup, model, partitioner)
  start = time.perf_counter()
  lowered = partitioner.partition_predict(model).lower(*args)
  lower_seconds = time.perf_counter() - start
  problems = _module_problems(lowered.as_text())
  start = time.perf_counter()
  compiled = lowered.compile()
  compile_seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  sizes = {
      name: int(getattr(memory, f"{name}_size_in_bytes"))
      for name in ("argument", "output", "temp", "alias", "generated_code")
  }
  peak = sizes["argument"] + sizes["output"] + sizes["temp"] - sizes["alias"]
  fits = peak <= setup.hbm_gib * GIB
  return {
      "mesh": dict(partitioner.mesh.shape),
      "devices": [str(d) for d in partitioner.mesh.devices.flat],
      "target_params_per_device_bytes": _bytes_per_device(args[0]["target"]),
      "drafter_params_per_device_bytes": _bytes_per_device(args[0]["drafter"]),
      "memory_analysis_bytes": sizes,
      "peak_per_device_bytes": peak,
      "hbm_bytes": int(setup.hbm_gib * GIB),
      "fits": fits,
      "module_problems": problems,
      "lower_seconds": lower_seconds,
      "compile_seconds": compile_seconds,
      "ok": fits and not problems,
  }


def _markdown(setup: AotSetup, report: dict, command: str) -> str:
  gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
  sizes = report["memory_analysis_bytes"]
  rows = [
      ("target params (analytic, this device's shards)", report["target_params_per_device_bytes"]),
      (
          "drafter params (analytic, this device's shards)",
          report["drafter_params_per_device_bytes"],
      ),
      ("XLA arguments", sizes["argument"]),
      ("XLA outputs", sizes["output"]),
      ("XLA temporaries", sizes["temp"]),
      ("XLA aliased (subtracted)", sizes["alias"]),
      ("XLA generated code (not counted)", sizes["generated_code"]),
      (
          "**peak per device** (arguments + outputs + temporaries - aliased)",
          report["peak_per_device_bytes"],
      ),
  ]
  lines = [
      f"Command: `{command}`",
      "",
      f"Mesh {report['mesh']}, target {setup.target_config.emb_dim}-d / "
      f"{setup.target_config.num_decoder_layers} decoder layers, drafter "
      f"{type(setup.drafter).__name__}, params {setup.param_dtype}, batch "
      f"{setup.batch_size}, gamma {setup.gamma}, lengths {dict(setup.task_feature_lengths)}.",
      "",
      "| per device | GiB |",
      "| --- | ---: |",
  ]
  lines += [f"| {name} | {gib(value)} |" for name, value in rows]
  verdict = "fits" if report["fits"] else "DOES NOT FIT"
  module = ", ".join(report["module_problems"]) or "no host callbacks, no dynamic shapes"
  lines += [
      "",
      f"Against {setup.hbm_gib:g} GiB of HBM: {verdict} "
      f"({100 * report['peak_per_device_bytes'] / report['hbm_bytes']:.1f}%). Module: "
      f"{module}. Lowering {report['lower_seconds']:.0f} s, compilation "
      f"{report['compile_seconds']:.0f} s.",
  ]
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={FLAGS.num_devices}"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings, default_files=[DEFAULT_GIN_FILE])
  setup = AotSetup()
  partitioner = partitioning.Partitioner()
  # Before anything is built: a binding this run does not use (the model is built later).
  gin_utils.check_unused_bindings(
      later=(models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel)
  )
  report = check(setup, partitioner)
  command = " ".join(["python"] + sys.argv)
  output_dir = pathlib.Path(setup.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "aot_check.json").write_text(
      json.dumps({"command": command, "gin_config": gin.config_str(), **report}, indent=2)
  )
  markdown = _markdown(setup, report, command)
  (output_dir / "aot_check.md").write_text(markdown)
  print(markdown)
  if not report["ok"]:
    sys.exit(1)


if __name__ == "__main__":
  gin_utils.run(main)
