"""Ahead-of-time compilation of a model's whole decode from abstract arguments.

`compile_decode(model, partitioner, lengths)` lowers and compiles `Partitioner.partition_predict`
for the partitioner's mesh from `jax.ShapeDtypeStruct`s that carry its shardings: parameters of
`param_dtype` (T5X restores inference checkpoints as bfloat16), a batch of the task's feature
lengths, the rng and, for the sampling program, the temperature. Nothing is allocated, so a
T5-XXL decode compiles on a host that could not hold it, and the mesh may be XLA:CPU's
simulated devices or libtpu's compile-only TPU devices (`tpu_topology`).

The result holds the compiler's memory analysis (`memory_sizes`), its cost model
(`compiled.cost_analysis()`) and its optimized HLO (`compiled.as_text()`, read by `hlo_report`).
XLA:TPU refuses a program that does not fit its chip's HBM at compile time; with
`catch_out_of_memory` that is a result (`Compilation.out_of_memory`, the sizes from its message),
as MaxText's `is_oom` reads it, not an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import models
from speculative_t5x.running import partitioning
from speculative_t5x.tpu import tpu_topology

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# XLA:TPU's errors for a program that does not fit, e.g. "RESOURCE_EXHAUSTED: Ran out of memory
# on HBM, the total memory required for HLO temporaries (40.00G) exceeds available HBM (30.75G)."
# or "Ran out of memory in memory space hbm. Used 44.61G of 30.75G hbm.": (used, capacity).
_OUT_OF_MEMORY = (
    re.compile(r"\(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
    re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"),
)
MEMORY_FIELDS = ("argument", "output", "temp", "alias", "generated_code")


def as_abstract(tree: Any, sharding: Any, dtype: Any) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves with `sharding`, floating-point leaves cast to `dtype`."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(
          x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype, sharding=sharding
      ),
      tree,
  )


def abstract_params(
    model: models.EncoderDecoderModel,
    partitioner: partitioning.Partitioner,
    dtype: Any,
    input_shapes: Mapping[str, tuple],
) -> Any:
  """The model's params as ShapeDtypeStructs (floating-point leaves of `dtype`) carrying the
  partitioner's shardings; a drafter sharded as a whole (no `param_axes`) gives its one sharding
  to every leaf. Nothing is allocated."""
  shapes = jax.eval_shape(
      lambda rng: model.get_initial_variables(rng, input_shapes)["params"], jax.random.PRNGKey(0)
  )
  return jax.tree.map(
      lambda sharding, subtree: as_abstract(subtree, sharding, dtype),
      partitioner.params_shardings(model),
      shapes,
  )


def abstract_inputs(
    model: models.EncoderDecoderModel,
    partitioner: partitioning.Partitioner,
    lengths: Mapping[str, int],
    batch_size: int = 1,
    param_dtype: str = "bfloat16",
    greedy: bool = False,
) -> tuple:
  """(params, batch, rng, temperature) as ShapeDtypeStructs with the partitioner's shardings,
  for feature lengths {'inputs': L_enc, 'targets': L_dec}; without the temperature when greedy."""
  sizes = {
      "encoder_input_tokens": lengths["inputs"],
      "decoder_input_tokens": lengths["targets"],
      "decoder_target_tokens": lengths["targets"],
  }
  params = abstract_params(
      model,
      partitioner,
      jnp.dtype(param_dtype),
      {
          name: (batch_size, sizes[name])
          for name in ("encoder_input_tokens", "decoder_input_tokens")
      },
  )
  batch = {
      name: jax.ShapeDtypeStruct((batch_size, size), jnp.int32, sharding=partitioner.data_sharding)
      for name, size in sizes.items()
  }
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=partitioner.replicated)
  if greedy:
    return params, batch, rng
  temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=partitioner.replicated)
  return params, batch, rng, temperature


def bytes_per_device(tree: Any) -> int:
  """Bytes of one device's shards of abstract arrays (the first device's share of each)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard)) * leaf.dtype.itemsize
  return total


def module_problems(stablehlo_text: str) -> list[str]:
  """Host callbacks or dynamic shapes in a lowered StableHLO module (neither runs on a TPU loop
  without a host round trip or recompilation)."""
  problems = []
  if "callback" in stablehlo_text:
    problems.append("host callback in the lowered module")
  if "tensor<?" in stablehlo_text or "x?x" in stablehlo_text:
    problems.append("dynamic shape in the lowered module")
  return problems


def out_of_memory(error: Exception) -> dict | None:
  """XLA:TPU's out-of-memory compile error -> {'used_bytes', 'capacity_bytes', 'message'} (sizes
  where the message gives them), or None for any other error."""
  message = str(error)
  if "RESOURCE_EXHAUSTED" not in message and " hbm" not in message.lower():
    return None
  found = next((m for m in (p.search(message) for p in _OUT_OF_MEMORY) if m), None)
  sizes = {}
  if found:
    sizes = {
        "used_bytes": int(float(found.group(1)) * _UNITS[found.group(2)]),
        "capacity_bytes": int(float(found.group(3)) * _UNITS[found.group(4)]),
    }
  return {**sizes, "message": " ".join(message.split())[:600]}


@dataclasses.dataclass
class Compilation:
  """args: the abstract arguments; compiled: the executable, or None when the compiler ran out
  of memory (out_of_memory then holds what it said); module_problems: `module_problems` of the
  lowered module; seconds of lowering and of compilation."""

  args: tuple
  compiled: Any
  out_of_memory: dict | None
  module_problems: list[str]
  lower_seconds: float
  compile_seconds: float

  def memory_sizes(self) -> dict:
    """The compiler's memory analysis per device: {argument, output, temp, alias,
    generated_code, peak} bytes, peak = argument + output + temp - alias."""
    memory = self.compiled.memory_analysis()
    sizes = {name: int(getattr(memory, f"{name}_size_in_bytes")) for name in MEMORY_FIELDS}
    sizes["peak"] = sizes["argument"] + sizes["output"] + sizes["temp"] - sizes["alias"]
    return sizes


def compile_decode(
    model: models.EncoderDecoderModel,
    partitioner: partitioning.Partitioner,
    lengths: Mapping[str, int],
    *,
    batch_size: int = 1,
    param_dtype: str = "bfloat16",
    greedy: bool = False,
    catch_out_of_memory: bool = False,
    **jit_predict_kwargs,
) -> Compilation:
  """Lowers and compiles the model's decode (`partitioner.partition_predict(model, greedy,
  **jit_predict_kwargs)`, e.g. topk=, topp=) from abstract arguments (`abstract_inputs`)."""
  args = abstract_inputs(model, partitioner, lengths, batch_size, param_dtype, greedy)
  start = time.perf_counter()
  lowered = partitioner.partition_predict(model, greedy=greedy, **jit_predict_kwargs).lower(*args)
  lower_seconds = time.perf_counter() - start
  problems = module_problems(lowered.as_text())
  start = time.perf_counter()
  on_tpu = partitioner.mesh.devices.flat[0].platform == "tpu"
  try:
    with tpu_topology.without_compilation_cache() if on_tpu else contextlib.nullcontext():
      compiled, oom = lowered.compile(), None
  except Exception as e:  # noqa: BLE001  (only the out-of-memory error is a result)
    oom = out_of_memory(e) if catch_out_of_memory else None
    if oom is None:
      raise
    compiled = None
  return Compilation(args, compiled, oom, problems, lower_seconds, time.perf_counter() - start)
