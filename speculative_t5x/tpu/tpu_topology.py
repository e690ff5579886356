"""Compile-only Cloud TPU devices on any host: XLA:TPU (libtpu) without a TPU.

libtpu's compiler runs on a CPU host. `jax.experimental.topologies.get_topology_desc` builds the
devices of a TPU slice that programs can be lowered and compiled for, but not run on (MaxText's
`train_compile.py` does this). `devices("v4-8")` gives the 4 chips of a v4-8 slice; a program
compiled with shardings over them reports XLA:TPU's own memory analysis, cost model and
optimized HLO.

Slices are named as Cloud TPU names accelerator types (`v4-8`, `v5litepod-4`, `v5p-8`, `v6e-4`)
and mapped to libtpu's topology specs as MaxText maps them (`accelerator_to_spec_map.py`): the
topology name, the chip config ("megacore": one device per v4 / v5p chip, its two TensorCores
together; "default" on the one-TensorCore v5e and v6e), the chips per host and no wrap-around.
A slice of more chips than one host holds (`v4-16`) spans several `process_index` values; one
process compiles the whole SPMD program for it.

libtpu must be the version jax pins in its `tpu` extra: any other fails inside the plugin
("Mismatched PJRT plugin PJRT API version"). `check_libtpu` says so, with the install command,
before anything is loaded. Set the environment (`prepare_environment`) before JAX starts a
backend: JAX_PLATFORMS=cpu, so that JAX does not try to run on a TPU it lacks, and
TPU_SKIP_MDS_QUERY=1, so that libtpu does not query a GCE metadata server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import re

GIB = 2**30
GB = 10**9
# The libtpu release jax pins in its `tpu` extra, by jax version (jax's setup.py).
LIBTPU_FOR_JAX = {"0.10.2": "0.0.42"}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A Cloud TPU slice as libtpu's topology arguments describe it, and its chips' published
  figures (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): HBM bytes per chip, HBM bandwidth in
  bytes/s and bf16 peak FLOP/s per chip."""

  name: str
  topology_name: str
  chip_config_name: str
  chips_per_host_bounds: tuple[int, int, int]
  chips: int
  hbm_bytes: int
  hbm_bandwidth: float
  peak_bf16_flops: float

  @property
  def generation(self) -> str:
    return self.name.split("-")[0]

  @property
  def hosts(self) -> int:
    return max(1, self.chips // _prod(self.chips_per_host_bounds))


def _prod(values) -> int:
  out = 1
  for v in values:
    out *= v
  return out


_V4 = dict(hbm_bytes=32 * GIB, hbm_bandwidth=1200 * GB, peak_bf16_flops=275e12)
_V5E = dict(hbm_bytes=16 * GB, hbm_bandwidth=819 * GB, peak_bf16_flops=197e12)
_V5P = dict(hbm_bytes=95 * GB, hbm_bandwidth=2765 * GB, peak_bf16_flops=459e12)
_V6E = dict(hbm_bytes=32 * GB, hbm_bandwidth=1638 * GB, peak_bf16_flops=918e12)
_ONE_HOST = (2, 2, 1)

SLICES = {
    s.name: s
    for s in (
        Slice("v4-8", "v4:2x2x1", "megacore", _ONE_HOST, 4, **_V4),
        Slice("v4-16", "v4:2x2x2", "megacore", _ONE_HOST, 8, **_V4),
        Slice("v5litepod-1", "v5e:1x1", "default", (1, 1, 1), 1, **_V5E),
        Slice("v5litepod-4", "v5e:2x2", "default", _ONE_HOST, 4, **_V5E),
        Slice("v5p-8", "v5:2x2x1", "megacore", _ONE_HOST, 4, **_V5P),
        Slice("v6e-1", "v6e:1x1", "default", (1, 1, 1), 1, **_V6E),
        Slice("v6e-4", "v6e:2x2", "default", _ONE_HOST, 4, **_V6E),
    )
}
# One slice per TPU generation, the smallest whole host: the cost-model tables' columns.
GENERATIONS = ("v4-8", "v5litepod-4", "v5p-8", "v6e-4")


def get_slice(name: str) -> Slice:
  """The slice named `name` (a Cloud TPU accelerator type); ValueError naming the known ones."""
  if name not in SLICES:
    raise ValueError(
        f"unknown TPU slice {name!r}: use a Cloud TPU accelerator type, one of {sorted(SLICES)}."
    )
  return SLICES[name]


def prepare_environment() -> None:
  """JAX on the CPU, libtpu without a metadata server, and several libtpu processes at once (the
  suite's workers): call before JAX starts a backend. TPU_ACCELERATOR_TYPE and
  TPU_WORKER_HOSTNAMES describe this host to libtpu's runtime, which has no chip to find here;
  unset, it prints a warning and an INVALID_ARGUMENT error for each (the topology and the
  compiled programs are the same either way). Values already set are kept."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "true")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def libtpu_problem() -> str | None:
  """Why libtpu cannot compile for TPU here, with the fix, or None if it can (installed, and the
  release jax pins)."""
  jax_version = importlib.metadata.version("jax")
  wanted = LIBTPU_FOR_JAX.get(jax_version)
  install = (
      f'pip install "jax[tpu]=={jax_version}"'
      if wanted is None
      else f'pip install "libtpu=={wanted}.*"'
  )
  if importlib.util.find_spec("libtpu") is None:
    return f"libtpu is not installed: {install} (compiling for TPU needs no TPU, only libtpu)."
  if wanted is None:
    return None  # a jax this table does not know: its own `tpu` extra pins the right libtpu.
  found = importlib.metadata.version("libtpu")
  if not re.fullmatch(re.escape(wanted) + r"(\.\d+)*", found):
    return (
        f"libtpu {found} does not match jax {jax_version}, which pins libtpu {wanted}: {install}."
    )
  return None


def check_libtpu() -> None:
  """Raises RuntimeError naming the problem and the install command (`libtpu_problem`)."""
  problem = libtpu_problem()
  if problem is not None:
    raise RuntimeError(problem)


def devices(name: str) -> list:
  """The compile-only devices of slice `name`, one per chip, ordered by id. They lower and compile
  programs (shardings over them, `jax.ShapeDtypeStruct` arguments) but hold no arrays.

  Raises ValueError for an unknown slice and RuntimeError for a missing or mismatched libtpu.
  """
  spec = get_slice(name)
  check_libtpu()
  prepare_environment()
  from jax.experimental import topologies  # after the environment is set.

  topology = topologies.get_topology_desc(
      platform="tpu",
      topology_name=spec.topology_name,
      chip_config_name=spec.chip_config_name,
      chips_per_host_bounds=spec.chips_per_host_bounds,
      num_slices=1,
      wrap=(False, False, False),
  )
  found = sorted(topology.devices, key=lambda d: d.id)
  if len(found) != spec.chips:
    raise RuntimeError(
        f"libtpu gave {len(found)} devices for {name} ({spec.topology_name}, "
        f"{spec.chip_config_name}), not its {spec.chips} chips."
    )
  return found


@contextlib.contextmanager
def without_compilation_cache():
  """JAX's persistent compilation cache off for the block: it cannot hold a compile-only
  executable (reading one back needs a TPU client, and fails with a warning), so compiles for
  these devices neither read nor write it."""
  import jax  # pylint: disable=g-import-not-at-top  (the environment comes first)

  saved = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", saved)
