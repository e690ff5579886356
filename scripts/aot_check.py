r"""Ahead-of-time check: speculative decoding of a T5-XXL target on a model-parallel mesh.

Lowers and compiles the whole speculative decode (`Partitioner.partition_predict` of a
`SpeculativeEncoderDecoderModel`: encoders, caches, the `lax.while_loop`) from abstract
parameters (`jax.ShapeDtypeStruct`s of the setup's param_dtype carrying their shardings: nothing
is allocated). The target is split over the 'model' axis by T5X's standard rules, the drafter
replicated (configs/runs/partitioning.gin). It checks that the lowered module has no host
callbacks and no dynamic shapes, reports the compiler's per-device memory analysis against the
HBM of one chip, and exits 1 if a check or the memory fails.

Two compilers:
  - `--topology=v4-8` (a Cloud TPU accelerator type: v4-8, v4-16, v5litepod-1, v5litepod-4,
    v5p-8, v6e-1, v6e-4): XLA:TPU itself, from libtpu's compile-only devices on this host
    (`tpu_topology`; no TPU needed, libtpu must be installed). The mesh takes the slice's first
    --num_devices chips (default all of them; v4-16's 8 chips span two hosts and compile from
    this one process). The memory analysis is XLA:TPU's, against that chip's HBM; a program the
    compiler cannot fit is reported with the sizes of its error, not raised. The optimized HLO
    is written beside the report (optimized_hlo.txt) and checked for what the loop must not do
    per iteration (`hlo_report`: host transfers, weight copies, whole-cache copies, cross-
    attention keys and values recomputed).
  - without it, --num_devices simulated CPU devices (default 4), whose buffer assignment stands
    in for the TPU's: argument and output sizes are exact, temporaries can differ (the CPU
    computes bfloat16 matmuls in float32), so the peak is an upper bound.

The temperature is traced (the sampling program, any T > 0), or with
--gin.aot_script.AotSetup.temperature=0.0 the greedy program that T = 0 runs.
--paper_row=ende_small_t0 compiles one row of the paper's Table 2 (configs/paper/): its drafter
size, gamma, temperature and task feature lengths.

Writes aot_check.json and aot_check.md into AOT_OUTPUT_DIR, together once the compilation is done
(`run_dir.OutputDir`). Before JAX builds anything: --num_devices and every AotSetup field
(batch_size and gamma >= 1, a floating param_dtype, the feature lengths), and AOT_OUTPUT_DIR
(writable; holding no other run's outputs unless --overwrite). The drafter is any
`drafters.Drafter` (configs/drafters/): its parameters are abstract `init_params` and its
shardings come from its `param_axes`, like a trained model's.

Usage (--gin.NAME=value is short for --gin_bindings='NAME = value'):
  python scripts/aot_check.py                             # T5-XXL + T5-small, 4 devices, 1x4
  python scripts/aot_check.py --topology=v4-8 --num_devices=1 --gin.NUM_PARTITIONS=1  # 1 chip
  python scripts/aot_check.py --topology=v4-8 --paper_row=cnndm_small_t0   # 4 v4 chips, 1x4
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
from typing import Any, Mapping

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
import gin
import seqio

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import validation
from speculative_t5x.projections import paper
from speculative_t5x.running import inference
from speculative_t5x.running import partitioning
from speculative_t5x.running import run_dir
from speculative_t5x.tpu import aot
from speculative_t5x.tpu import hlo_report
from speculative_t5x.tpu import tpu_topology
from speculative_t5x.weights import pairs

DEFAULT_GIN_FILE = "configs/runs/aot_xxl.gin"
GIB = 2**30
EOS_ID = 1

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin run files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
flags.DEFINE_integer(
    "num_devices",
    None,
    "Devices of the mesh: simulated CPU devices (XLA_FLAGS device count, set before JAX starts; "
    "default 4), or with --topology the slice's first N chips (default all).",
)
flags.DEFINE_string(
    "topology",
    None,
    f"Compile with XLA:TPU for this Cloud TPU slice ({', '.join(tpu_topology.SLICES)}) on "
    "libtpu's compile-only devices; default: XLA:CPU on simulated devices.",
)
flags.DEFINE_string(
    "paper_row",
    None,
    "A row of the paper's Table 2, by its configs/paper/ name (e.g. ende_small_t0): its drafter, "
    "gamma, temperature and feature lengths.",
)
run_dir.define_overwrite_flag("AOT_OUTPUT_DIR")
flags.DEFINE_boolean(
    "write_hlo", True, "With --topology, write the optimized HLO (optimized_hlo.txt)."
)

# The feature lengths of the paper's tasks (configs/tasks/wmt_ende.gin, cnn_dailymail.gin).
PAPER_TASK_LENGTHS = {"EnDe": (64, 64), "CNNDM": (512, 128)}


@gin.configurable(module="aot_script")
@dataclasses.dataclass(frozen=True)
class AotSetup:
  """What is compiled: a target config and a drafter, feature lengths, batch, gamma, the
  parameter dtype (T5X restores inference checkpoints as bfloat16), the temperature (None:
  traced, the sampling program; 0.0: the greedy program), the HBM per device (None: the TPU
  chip's with --topology, else one TPU v4 chip's 32 GiB), and where the report goes."""

  target_config: network.T5Config
  drafter: drafters_lib.Drafter
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  batch_size: int = 1
  gamma: int = 7
  param_dtype: str = "bfloat16"
  temperature: float | None = None
  hbm_gib: float | None = None

  def __post_init__(self):
    """Every field, before jax builds anything: raises gin_utils.ConfigError naming it."""
    if not isinstance(self.target_config, network.T5Config):
      raise gin_utils.ConfigError(
          "aot_script.AotSetup.target_config must be a network.T5Config (e.g. %T5_1_1_XXL after "
          f"configs/models/t5_1_1_xxl.gin), got {self.target_config!r}."
      )
    pairs.check_drafter(self.drafter)
    if not (self.temperature is None or (_is_number(self.temperature) and self.temperature == 0)):
      raise gin_utils.ConfigError(
          f"AotSetup.temperature={self.temperature!r}: give None (the sampling program, which "
          "serves every temperature above 0) or 0.0 (the greedy program)."
      )
    try:
      validation.check_feature_lengths(
          self.task_feature_lengths, "TASK_FEATURE_LENGTHS", ("inputs", "targets")
      )
      validation.check_text(self.output_dir, "AOT_OUTPUT_DIR")
      validation.check_integer(self.batch_size, "aot_script.AotSetup.batch_size", 1)
      validation.check_integer(self.gamma, "aot_script.AotSetup.gamma", 1)
      if self.param_dtype is None:
        raise validation.InvalidInputError(
            "aot_script.AotSetup.param_dtype None is not a dtype: use 'float32' or 'bfloat16'."
        )
      validation.check_restore_dtype(self.param_dtype, "aot_script.AotSetup.param_dtype")
      if self.hbm_gib is not None:
        validation.check_number(self.hbm_gib, "aot_script.AotSetup.hbm_gib", 0)
        if self.hbm_gib <= 0:
          raise validation.InvalidInputError(
              f"aot_script.AotSetup.hbm_gib must be > 0 (GiB per device) or None, got "
              f"{self.hbm_gib}."
          )
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(str(e)) from e


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def paper_row_bindings(name: str) -> tuple[list[str], list[str]]:
  """(gin files, gin bindings) that make the setup one Table 2 row, e.g. 'cnndm_large_t1'.

  Raises ValueError naming the rows for an unknown name."""
  rows = {row.config_name: row for row in paper.TABLE_2}
  if name not in rows:
    raise ValueError(f"--paper_row={name!r} is not a Table 2 row: use one of {sorted(rows)}.")
  row = rows[name]
  inputs, targets = PAPER_TASK_LENGTHS[row.task]
  files = [f"configs/models/t5_1_1_{row.drafter}.gin"]
  bindings = [
      f"DRAFTER_CONFIG = %T5_1_1_{row.drafter.upper()}",
      f"aot_script.AotSetup.gamma = {row.gamma}",
      f"aot_script.AotSetup.temperature = {0.0 if row.temperature == 0 else None}",
      f"TASK_FEATURE_LENGTHS = {{'inputs': {inputs}, 'targets': {targets}}}",
  ]
  return files, bindings


def check(
    setup: AotSetup,
    partitioner: partitioning.Partitioner,
    tpu_slice: tpu_topology.Slice | None = None,
    hlo_path: pathlib.Path | None = None,
) -> dict:
  """Lowers and compiles the speculative decode for `partitioner`'s mesh -> a report dict.

  tpu_slice: the TPU slice whose compile-only devices the mesh holds (the HBM default, the HLO
  checks and out-of-memory as a result), or None for XLA:CPU. hlo_path: where to write the
  optimized HLO (TPU only)."""
  vocab = seqio.PassThroughVocabulary(setup.target_config.vocab_size, eos_id=EOS_ID)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(setup.target_config), setup.drafter, vocab, vocab, gamma=setup.gamma
  )
  if setup.hbm_gib is not None:
    hbm = int(setup.hbm_gib * GIB)
  else:
    hbm = tpu_slice.hbm_bytes if tpu_slice else 32 * GIB
  result = aot.compile_decode(
      model,
      partitioner,
      setup.task_feature_lengths,
      batch_size=setup.batch_size,
      param_dtype=setup.param_dtype,
      greedy=setup.temperature == 0.0,
      catch_out_of_memory=tpu_slice is not None,
  )
  report = {
      "compiler": f"XLA:TPU ({tpu_slice.name})" if tpu_slice else "XLA:CPU",
      "mesh": dict(partitioner.mesh.shape),
      "devices": [str(d) for d in partitioner.mesh.devices.flat],
      "processes": len({d.process_index for d in partitioner.mesh.devices.flat}),
      "target_params_per_device_bytes": aot.bytes_per_device(result.args[0]["target"]),
      "drafter_params_per_device_bytes": aot.bytes_per_device(result.args[0]["drafter"]),
      "hbm_bytes": hbm,
      "module_problems": result.module_problems,
      "lower_seconds": result.lower_seconds,
      "compile_seconds": result.compile_seconds,
  }
  if result.out_of_memory is not None:
    return {**report, "out_of_memory": result.out_of_memory, "fits": False, "ok": False}
  sizes = result.memory_sizes()
  peak = sizes.pop("peak")
  report.update(memory_analysis_bytes=sizes, peak_per_device_bytes=peak, fits=peak <= hbm)
  ok = report["fits"] and not result.module_problems
  if tpu_slice is not None:
    text = result.compiled.as_text()
    if hlo_path is not None:
      hlo_path.write_text(text)
    loop = hlo_report.analyze(text)
    report["hlo_report"] = loop.as_dict()
    ok = ok and not loop.problems
  return {**report, "ok": ok}


def _markdown(setup: AotSetup, report: dict, command: str) -> str:
  gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
  temperature = "0 (greedy program)" if setup.temperature == 0.0 else "traced (sampling program)"
  lines = [
      f"Command: `{command}`",
      "",
      f"{report['compiler']}, mesh {report['mesh']} ({len(report['devices'])} device(s), "
      f"{report['processes']} process(es)), target {setup.target_config.emb_dim}-d / "
      f"{setup.target_config.num_decoder_layers} decoder layers, drafter "
      f"{type(setup.drafter).__name__}, params {setup.param_dtype}, batch "
      f"{setup.batch_size}, gamma {setup.gamma}, temperature {temperature}, lengths "
      f"{dict(setup.task_feature_lengths)}.",
      "",
      "| per device | GiB |",
      "| --- | ---: |",
  ]
  rows = [
      ("target params (analytic, this device's shards)", report["target_params_per_device_bytes"]),
      (
          "drafter params (analytic, this device's shards)",
          report["drafter_params_per_device_bytes"],
      ),
  ]
  if "out_of_memory" in report:
    oom = report["out_of_memory"]
    rows += [
        (f"{report['compiler']}: used (its out-of-memory error)", oom.get("used_bytes", 0)),
        (f"{report['compiler']}: capacity (its out-of-memory error)", oom.get("capacity_bytes", 0)),
    ]
  else:
    sizes = report["memory_analysis_bytes"]
    rows += [
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
  lines += [f"| {name} | {gib(value)} |" for name, value in rows]
  module = ", ".join(report["module_problems"]) or "no host callbacks, no dynamic shapes"
  hbm = f"{report['hbm_bytes'] / GIB:.2f} GiB of HBM"
  if "out_of_memory" in report:
    verdict = f"DOES NOT FIT: the compiler ran out of memory ({report['out_of_memory']['message']})"
  else:
    verdict = "fits" if report["fits"] else "DOES NOT FIT"
    verdict += f" ({100 * report['peak_per_device_bytes'] / report['hbm_bytes']:.1f}%)"
    if report["compiler"] == "XLA:CPU":
      verdict += ", by XLA:CPU's analysis: an upper bound on the TPU's temporaries"
  lines += [
      "",
      f"Against {hbm}: {verdict}. Module: {module}. Lowering {report['lower_seconds']:.0f} s, "
      f"compilation {report['compile_seconds']:.0f} s.",
  ]
  if "hlo_report" in report:
    lines += ["", hlo_report.markdown(report["hlo_report"])]
  return "\n".join(lines) + "\n"


def _devices(topology: str | None, num_devices: int | None) -> tuple[Any, list | None]:
  """(the TPU slice or None, the mesh's devices or None for all of JAX's)."""
  if num_devices is not None and num_devices < 1:
    raise app.UsageError(f"--num_devices={num_devices}: give a device count of at least 1.")
  if topology is None:
    return None, None
  tpu_slice = tpu_topology.get_slice(topology)
  chips = tpu_slice.chips if num_devices is None else num_devices
  if chips > tpu_slice.chips:
    raise app.UsageError(
        f"--num_devices={chips} but a {topology} has {tpu_slice.chips} chips: give at most that."
    )
  return tpu_slice, tpu_topology.devices(topology)[:chips]


OUTPUTS = ("aot_check.json", "aot_check.md", "optimized_hlo.txt")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  if FLAGS.num_devices is not None and FLAGS.num_devices < 1:  # before JAX sees the count
    raise gin_utils.ConfigError(
        f"--num_devices={FLAGS.num_devices}: give a device count of at least 1."
    )
  if FLAGS.topology is not None:
    tpu_topology.get_slice(FLAGS.topology)  # a bad name is an error before anything is built.
    tpu_topology.check_libtpu()
    tpu_topology.prepare_environment()
  else:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={FLAGS.num_devices or 4}"
    ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  files, bindings = list(FLAGS.gin_file or [DEFAULT_GIN_FILE]), list(FLAGS.gin_bindings)
  if FLAGS.paper_row is not None:
    row_files, row_bindings = paper_row_bindings(FLAGS.paper_row)
    files, bindings = files + row_files, row_bindings + bindings
  gin_utils.parse_gin_flags(files, bindings, default_files=[DEFAULT_GIN_FILE])
  setup = AotSetup()
  output = run_dir.OutputDir(setup.output_dir, OUTPUTS, "AOT_OUTPUT_DIR", FLAGS.overwrite).check()
  tpu_slice, devices = _devices(FLAGS.topology, FLAGS.num_devices)
  partitioner = inference.configured_partitioner(devices=devices)
  # Before anything is built: a binding this run does not use (the model is built later).
  gin_utils.check_unused_bindings(
      later=(models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel)
  )
  with output:
    hlo_path = output.stage_dir(OUTPUTS[2]) if tpu_slice and FLAGS.write_hlo else None
    report = check(setup, partitioner, tpu_slice, hlo_path)
    command = " ".join(["python"] + sys.argv)
    output.stage_text(
        "aot_check.json",
        json.dumps({"command": command, "gin_config": gin.config_str(), **report}, indent=2),
    )
    markdown = _markdown(setup, report, command)
    output.stage_text("aot_check.md", markdown)
    output.commit()
  print(markdown)
  if not report["ok"]:
    sys.exit(1)


if __name__ == "__main__":
  gin_utils.run(main)
