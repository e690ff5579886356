"""T5X checkpoints without T5X: every layout T5X has written, read into numpy.

`load_t5x_checkpoint` understands every layout T5X has written (see docs/design.md):

* the legacy T5X layout: `checkpoint_<step>/checkpoint`, a flax msgpack file
  `{'version': 3, 'optimizer': {'target': ..., 'state': ...}}` whose leaves are inline arrays
  (msgpack ExtType 1 / 3, bfloat16 included, arrays over 1 GiB in flax's chunked form) or
  tensorstore zarr specs with a `kvstore.path` relative to the checkpoint directory (kvstore
  driver `file`, `gfile` or `gcs`); the zarr `.zarray` file is used when present, otherwise the
  metadata in the spec is all there is;
* the older orbax layout: a msgpack `checkpoint` whose leaves are `'PLACEHOLDER://<name>'` and
  one zarr directory `<name>/` per leaf (also under `checkpoint_<step>/state/`);
* orbax checkpoints (`checkpoint_<step>/state/`, OCDBT), read through orbax-checkpoint;
* the project's own checkpoints written by `checkpoints.save_model` (returned as
  `{'target': params}`).

`checkpoints.restore_params` reads through `find_checkpoint` and `load_checkpoint` (the 'target'
alone) and checks the tree against a model config. `load_checkpoint(..., lazy=True)` reads none
of the target's arrays: its leaves are `LazyArray`s, each read by the slice (only the chunks the
slice covers), so that each process of a multi-process run reads only what its devices hold.

Paths are local or `gs://bucket/...`. Every file of a T5X checkpoint is read through tensorstore
key-value stores (driver `file` locally, `gcs` for `gs://`), so the code that reads a GCS
checkpoint is the code the tests run locally; only the store driver differs. GCS needs
credentials tensorstore can find (e.g. `gcloud auth application-default login`). Orbax-format
checkpoints on GCS go through orbax's own path handling (etils.epath).

Damaged weights are refused, never loaded: a file that fails what its format checks (gzip's CRC
and zstd's frame checks of a zarr chunk, msgpack's framing and array sizes) raises a ValueError
naming the array and the file, and by default (`check_finite=True` on every reading function,
here and in `checkpoints`) a floating-point array holding NaN or inf raises
`NonFiniteWeightsError` naming its path (`check_params_finite`, which `hf_weights` applies to
Hugging Face weights as well). Flipped bits that leave finite numbers are invisible to both:
neither zarr nor orbax stores checksums of the values.
"""

import contextlib
import dataclasses
import json
import os
import posixpath
import re
from typing import Any, Callable, Iterator, Mapping

from etils import epath
from flax import traverse_util
import jax
import ml_dtypes
import msgpack
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from speculative_t5x import validation

_MSGPACK_FILE = "checkpoint"
ORBAX_METADATA = "_METADATA"
_ORBAX_STATE_DIR = "state"
_PLACEHOLDER = "PLACEHOLDER://"
_CHUNKED = "__msgpack_chunked_array__"
_SUPPORTED_VERSIONS = (2, 3)  # T5X rejects < 2; 3 is its current VERSION.
_EXT_NDARRAY, _EXT_COMPLEX, _EXT_SCALAR = 1, 2, 3
_STEP_DIR = re.compile(r"checkpoint_(\d+)")
# The orbax params of the project's own checkpoints (`checkpoints.save_model`) are under params/.
PARAMS_DIR = "params"
# Magic numbers of the zarr compressors orbax and T5X use, for chunks stored without .zarray.
_COMPRESSOR_MAGIC = ((b"\x1f\x8b", {"id": "gzip"}), (b"\x28\xb5\x2f\xfd", {"id": "zstd"}))


# ----------------------------------------------------------------------------------------------
# Damaged weights.
# ----------------------------------------------------------------------------------------------
class NonFiniteWeightsError(ValueError):
  """Weights holding NaN or inf: a damaged file, or a training run that diverged."""


def check_params_finite(params: Mapping, source: str = "params") -> None:
  """Raises one `NonFiniteWeightsError` naming every floating-point array or scalar of `params`
  that holds NaN or inf, with the counts and the first index; other leaves are ignored.

  Args:
    params: nested dict of arrays (numpy or jax), scalars and other leaves.
    source: what `params` came from, for the message.
  """
  problems = []
  for path, value in sorted(traverse_util.flatten_dict(dict(params)).items()):
    if isinstance(value, (np.ndarray, np.generic, jax.Array, float, complex)):
      array = np.asarray(value)
      problems.append(_non_finite(f"{'/'.join(map(str, path))} {array.shape}", array))
  _refuse_non_finite(source, problems)


def _non_finite(what: str, array: np.ndarray, bounds: tuple[tuple[int, int, int], ...] = ()):
  """A line of `NonFiniteWeightsError`'s message for `array` (named `what`), or None if it is
  finite or not floating-point. bounds: (start, stop, step) per dimension of the slice `array`
  is of a larger array, whose index the first NaN or inf is then given in."""
  if not jax.numpy.issubdtype(array.dtype, jax.numpy.inexact):
    return None  # jax's issubdtype counts bfloat16 as floating; numpy's does not.
  finite = np.isfinite(array)
  if finite.all():
    return None
  nans = int(np.isnan(array).sum())
  first = tuple(int(i) for i in np.unravel_index(np.argmin(finite), array.shape))
  if bounds:
    first = tuple(start + i * step for i, (start, _, step) in zip(first, bounds))
  return (
      f"  {what}: {nans} NaN and {array.size - int(finite.sum()) - nans} inf of {array.size} "
      f"values, the first at index {first}"
  )


def _refuse_non_finite(source: str, problems: list[str | None]) -> None:
  """Raises `NonFiniteWeightsError` for the lines of `problems` (`_non_finite`'s) other than None."""
  problems = [problem for problem in problems if problem]
  if problems:
    raise NonFiniteWeightsError(
        f"{source} holds NaN or inf in {len(problems)} parameter(s):\n"
        + "\n".join(problems)
        + "\nThe file is damaged (copy or download it again) or the training diverged (use an "
        "earlier checkpoint); check_finite=False loads it anyway."
    )


@dataclasses.dataclass(frozen=True)
class LazyArray:
  """A checkpoint's parameter, read slice by slice (`load_checkpoint(..., lazy=True)`): for a
  process that holds some shards of it, not all (`partitioning.Partitioner.
  place_params_per_process` reads the slices its devices hold, each once).

  name: the parameter's path in the checkpoint ('target/decoder/layers_0/mlp/wi_0/kernel').
  shape: its shape, as stored.
  dtype: its dtype as restored: the restore dtype for a floating-point array, else as stored.
  check_finite: whether `read` refuses NaN and inf.
  source: where it is stored ('checkpoint <path>'), for messages.
  reader: index (a tuple of one slice per dimension) -> the stored values there, reading only
    the chunks the slice covers (or a slice of an array already in memory).
  """

  name: str
  shape: tuple[int, ...]
  dtype: np.dtype
  check_finite: bool
  source: str
  reader: Callable[[tuple[slice, ...]], np.ndarray] = dataclasses.field(repr=False)

  def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
    """The values at `index` (one slice per dimension, as `jax.make_array_from_callback` gives;
    None: the whole array) -> an array of the slice's shape, cast to `dtype`.

    Raises `NonFiniteWeightsError` (if `check_finite`) if the slice holds NaN or inf, naming the
    parameter, the slice and the first such index in the whole array; a ValueError naming the
    array and its directory if a chunk cannot be read.
    """
    index = tuple(slice(None) for _ in self.shape) if index is None else tuple(index)
    values = np.asarray(self.reader(index)).astype(self.dtype, copy=False)
    if self.check_finite:
      bounds = tuple(s.indices(n) for s, n in zip(index, self.shape))
      text = ", ".join(
          f"{start}:{stop}" + (f":{step}" if step != 1 else "") for start, stop, step in bounds
      )
      what = f"{self.name} {self.shape}, its slice [{text}]"
      _refuse_non_finite(self.source, [_non_finite(what, values, bounds)])
    return values


def _lazy(name: str, stored: Any, dtype: np.dtype | None, check_finite: bool, source: str):
  """A `LazyArray` of `stored` (an `_OpenedArray`, or an array in memory: one inline in a msgpack
  file), restored in `dtype` (floating-point arrays only; None: as stored)."""
  if not isinstance(stored, _OpenedArray):
    stored = np.asarray(stored)
  floating = jax.numpy.issubdtype(stored.dtype, jax.numpy.floating)
  return LazyArray(
      name=name,
      shape=tuple(stored.shape),
      dtype=np.dtype(dtype) if dtype is not None and floating else np.dtype(stored.dtype),
      check_finite=check_finite,
      source=source,
      reader=stored.read if isinstance(stored, _OpenedArray) else stored.__getitem__,
  )


@dataclasses.dataclass(frozen=True)
class _OpenedArray:
  """An opened tensorstore array (zarr, or an orbax array under OCDBT): `read(index)` reads only
  the chunks that `index` covers; a read error names the array and its directory (`where`)."""

  name: str
  where: str
  store: ts.TensorStore

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.store.shape)

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(self.store.dtype.numpy_dtype)

  def read(self, index: tuple[slice, ...]) -> np.ndarray:
    return _guarded(self.name, self.where, lambda: np.asarray(self.store[index].read().result()))


# ----------------------------------------------------------------------------------------------
# Locations: local paths and gs:// URLs, read through tensorstore key-value stores.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Location:
  """An absolute local path or a `gs://bucket/path` URL, without a trailing slash."""

  path: str

  @classmethod
  def of(cls, path: str | os.PathLike) -> "_Location":
    path = os.fspath(path)
    if path.startswith("gs://"):
      return cls(path.rstrip("/"))
    return cls(os.path.abspath(os.path.expanduser(path)))

  def join(self, relative: str) -> "_Location":
    relative = relative.strip("/")
    return _Location(posixpath.join(self.path, relative)) if relative else self

  def parent(self) -> "_Location":
    return _Location(posixpath.dirname(self.path))

  def kvstore_spec(self) -> dict:
    """Tensorstore kvstore spec of this location as a directory."""
    match = re.fullmatch(r"gs://([^/]+)/?(.*)", self.path)
    if match:
      prefix = match.group(2)
      return {"driver": "gcs", "bucket": match.group(1), "path": prefix + "/" if prefix else ""}
    return {"driver": "file", "path": self.path + "/"}

  def kvstore(self) -> ts.KvStore:
    return ts.KvStore.open(self.kvstore_spec()).result()

  def keys(self) -> list[str]:
    """Every key (file path relative to this directory) below this location; [] if none."""
    return sorted(key.decode() for key in self.kvstore().list().result())

  def read_file(self) -> bytes | None:
    """Contents of this location as a file, or None if there is no such file."""
    result = self.parent().kvstore().read(posixpath.basename(self.path)).result()
    return result.value if result.state == "value" else None


# ----------------------------------------------------------------------------------------------
# msgpack (flax serialization) decoding.
# ----------------------------------------------------------------------------------------------
def _np_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _ext_hook(code: int, data: bytes) -> Any:
  """Decodes flax's msgpack extension types: 1 ndarray, 2 complex, 3 numpy scalar."""
  if code in (_EXT_NDARRAY, _EXT_SCALAR):
    shape, dtype_name, buffer = msgpack.unpackb(data, raw=False)
    dtype = _np_dtype(dtype_name)
    if len(buffer) != int(np.prod(shape)) * dtype.itemsize:
      raise ValueError(
          f"inline array of shape {tuple(shape)} and dtype {dtype_name} has "
          f"{len(buffer)} bytes, expected {int(np.prod(shape)) * dtype.itemsize}"
      )
    return np.frombuffer(buffer, dtype).reshape(shape).copy()
  if code == _EXT_COMPLEX:
    real, imag = msgpack.unpackb(data, raw=False)
    return complex(real, imag)
  raise ValueError(f"unknown msgpack extension type {code} (flax uses 1, 2 and 3)")


def _unchunk(node: dict, name: str) -> np.ndarray:
  """Joins flax's chunked form of an array over 1 GiB: flat chunks '0', '1', ... and a shape."""
  shape = tuple(int(node["shape"][k]) for k in sorted(node["shape"], key=int))
  chunks = [node["chunks"][k] for k in sorted(node["chunks"], key=int)]
  flat = np.concatenate([np.ravel(c) for c in chunks])
  if flat.size != int(np.prod(shape)):
    raise ValueError(
        f"chunked array '{name}' has {flat.size} elements in {len(chunks)} chunks "
        f"but shape {shape}: the checkpoint file is incomplete"
    )
  return flat.reshape(shape)


def _is_ts_spec(node: Any) -> bool:
  return (
      isinstance(node, dict)
      and isinstance(node.get("driver"), str)
      and ("kvstore" in node or "path" in node)
  )


def _decode_msgpack(data: bytes, location: _Location) -> dict:
  try:
    contents = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
  except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException) as e:
    raise ValueError(
        f"checkpoint file {location.path} is not a readable flax msgpack file "
        f"(truncated or corrupted?): {e}"
    ) from e
  if not isinstance(contents, dict):
    raise ValueError(
        f"checkpoint file {location.path} holds a {type(contents).__name__}, "
        "not a T5X state dict"
    )
  return contents


def _optimizer_state(contents: dict, location: _Location) -> dict:
  """The `{'target': ..., 'state': ...}` part of a decoded T5X msgpack file."""
  if "version" in contents:
    version = contents["version"]
    if version not in _SUPPORTED_VERSIONS or "optimizer" not in contents:
      raise ValueError(
          f"checkpoint {location.path} has version {version!r}: only T5X checkpoint versions "
          f"{_SUPPORTED_VERSIONS} with an 'optimizer' entry are supported (T5X itself rejects "
          "versions before 2); re-save it with a current T5X"
      )
    return contents["optimizer"]
  if "_optimizer" in contents:  # Orbax-era T5X TrainState dict (PLACEHOLDER layout).
    return contents["_optimizer"]
  raise ValueError(
      f"checkpoint {location.path} has no 'version' (keys {sorted(contents)}): "
      "it is not a T5X checkpoint of version 2 or later"
  )


# ----------------------------------------------------------------------------------------------
# zarr arrays.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _ArrayRead:
  """One zarr array to read: the parameter `name` and its directory relative to the checkpoint."""

  name: str
  relative_path: str
  dtype: str | None = None
  metadata: dict | None = None


def _spec_read(name: str, spec: dict) -> _ArrayRead:
  """An `_ArrayRead` from a T5X tensorstore spec dict (any tensorstore version's layout)."""
  if spec["driver"] != "zarr":
    raise ValueError(f"array '{name}' uses tensorstore driver {spec['driver']!r}; T5X writes zarr")
  kvstore = spec.get("kvstore", {})
  if isinstance(kvstore, dict) and kvstore.get("driver") not in (None, "file", "gfile", "gcs"):
    raise ValueError(
        f"array '{name}' uses kvstore driver {kvstore['driver']!r}: only file, "
        "gfile and gcs are supported"
    )
  path = kvstore.get("path") if isinstance(kvstore, dict) else None
  path = path or spec.get("path")  # tensorstore < 0.1.14 kept the path at the top level.
  if not path:
    raise ValueError(f"tensorstore spec of array '{name}' has no kvstore.path: {spec}")
  if posixpath.isabs(path) or "://" in path:
    raise ValueError(
        f"array '{name}' has the absolute path {path!r}; T5X writes paths relative "
        "to the checkpoint directory"
    )
  if spec.get("dtype") == "uint16":
    raise ValueError(
        f"array '{name}' is stored as uint16 (bfloat16 in the version-2 format), "
        "which T5X no longer reads either; convert it with an older T5X"
    )
  return _ArrayRead(name, path.rstrip("/"), spec.get("dtype"), dict(spec.get("metadata", {})))


def _metadata_from_chunks(
    read: _ArrayRead, keys: list[str], template: Mapping[str, Any], directory: _Location
) -> None:
  """Fills in zarr metadata for an array stored without `.zarray` and without a spec.

  Shape and dtype come from `template`; the chunk grid from the chunk file names (chunk shape =
  shape / grid, as T5X and orbax chunk by divisors); the compressor from the chunk's magic number.
  """
  where = directory.join(read.relative_path).path
  if read.name not in template:
    raise ValueError(
        f"array '{read.name}' at {where} has no .zarray metadata file and no spec: "
        "pass template= (a tree of arrays or jax.ShapeDtypeStruct with its shape "
        "and dtype), or restore the .zarray files (copy checkpoints with `cp -a`)"
    )
  shape = tuple(template[read.name].shape)
  indices = [tuple(int(i) for i in key.split(".")) for key in keys]
  grid = [max(index[d] for index in indices) + 1 for d in range(len(shape))]
  if any(s % g for s, g in zip(shape, grid)) or (not shape and keys != ["0"]):
    raise ValueError(
        f"chunk files {keys} of array '{read.name}' at {where} do not tile its "
        f"template shape {shape}"
    )
  first = directory.join(f"{read.relative_path}/{keys[0]}").read_file() or b""
  compressor = next((c for magic, c in _COMPRESSOR_MAGIC if first.startswith(magic)), None)
  if compressor is None:
    raise ValueError(
        f"cannot tell the compressor of array '{read.name}' at {where} without "
        ".zarray: its chunk is neither gzip nor zstd"
    )
  read.dtype = np.dtype(template[read.name].dtype).name
  read.metadata = {
      "shape": list(shape),
      "chunks": [s // g for s, g in zip(shape, grid)],
      "compressor": compressor,
  }


def _open_arrays(
    reads: list[_ArrayRead], directory: _Location, template: Mapping[str, Any]
) -> dict[str, _OpenedArray]:
  """Opens zarr arrays below `directory`, all in flight at once; returns {name: opened array}.

  An array uses its `.zarray` when there is one (the spec's shape and dtype are then checked
  against it) and otherwise the metadata of its spec. Missing chunks are errors, never zeros.
  """
  store = directory.kvstore()
  zarray_reads = {r.name: store.read(f"{r.relative_path}/.zarray") for r in reads}
  has_zarray = {name: future.result().state == "value" for name, future in zarray_reads.items()}
  for read in reads:
    if has_zarray[read.name]:
      read.metadata = {"shape": read.metadata["shape"]} if read.metadata else {}
    elif not read.metadata:
      keys = [k for k in directory.join(read.relative_path).keys() if not k.startswith(".")]
      if not keys:
        raise FileNotFoundError(
            f"array directory {directory.join(read.relative_path).path} of "
            f"'{read.name}' is missing or empty"
        )
      _metadata_from_chunks(read, keys, template, directory)
    elif not {"shape", "chunks"} <= read.metadata.keys():
      raise ValueError(
          f"array '{read.name}' has no .zarray file and its spec metadata lacks "
          f"shape/chunks: {read.metadata}"
      )
  opening = {}
  for read in reads:
    spec = {
        "driver": "zarr",
        "kvstore": directory.join(read.relative_path).kvstore_spec(),
        "metadata": read.metadata,
        "fill_missing_data_reads": False,
    }
    if read.dtype:
      spec["dtype"] = read.dtype
    opening[read.name] = ts.open(
        spec, open=True, read=True, assume_metadata=not has_zarray[read.name]
    )
  opened = {}
  for read in reads:
    where = directory.join(read.relative_path).path
    opened[read.name] = _OpenedArray(
        read.name, where, _guarded(read.name, where, opening[read.name].result)
    )
  return opened


def _read_arrays(opened: Mapping[str, _OpenedArray]) -> dict[str, np.ndarray]:
  """Reads opened arrays whole, all in flight at once; returns {name: array}."""
  reading = {name: array.store.read() for name, array in opened.items()}
  return {
      name: _guarded(name, array.where, lambda f=reading[name]: np.asarray(f.result()))
      for name, array in opened.items()
  }


def _guarded(name: str, where: str, fn):
  """Runs `fn`, turning tensorstore errors into one naming the array `name` and its directory."""
  try:
    return fn()
  except ValueError as e:
    raise ValueError(
        f"cannot read array '{name}' from {where}: {e}. A missing or truncated chunk "
        "file, or one that fails its compressor's checks (a flipped byte), means a damaged or "
        "incomplete copy: copy the checkpoint again"
    ) from e


# ----------------------------------------------------------------------------------------------
# Finding the checkpoint.
# ----------------------------------------------------------------------------------------------
def _layout(keys: list[str]) -> tuple[str, str] | None:
  """(kind, sub-directory) of a checkpoint directory from its keys, or None if it is not one."""
  keys = set(keys)
  for kind, marker in (
      ("orbax", f"{_ORBAX_STATE_DIR}/{ORBAX_METADATA}"),
      ("msgpack", f"{_ORBAX_STATE_DIR}/{_MSGPACK_FILE}"),
      ("project", f"{PARAMS_DIR}/{ORBAX_METADATA}"),
      ("orbax", ORBAX_METADATA),
      ("msgpack", _MSGPACK_FILE),
  ):
    if marker in keys:
      return kind, "" if kind == "project" else posixpath.dirname(marker)
  return None


def find_checkpoint(path, step: int | None) -> tuple[str, _Location]:
  """(kind, directory) of the checkpoint at `path`: a model dir, a checkpoint dir or a file.

  kind is 'file' (a msgpack file), 'msgpack' (a directory holding one), 'orbax' (an orbax
  item directory) or 'project' (a `checkpoints.save_model` directory).
  """
  location = _Location.of(path)
  if location.read_file() is not None:
    if step is not None:
      raise ValueError(f"step={step} was given but {location.path} is a checkpoint file")
    return "file", location
  keys = location.keys()
  if not keys:
    raise FileNotFoundError(f"no checkpoint at {location.path}: no such file or directory")
  own = _layout(keys)
  if own and step is None:
    return own[0], location.join(own[1])
  by_step: dict[int, list[str]] = {}
  for key in keys:
    head, _, rest = key.partition("/")
    if _STEP_DIR.fullmatch(head):
      by_step.setdefault(int(head.split("_")[1]), []).append(rest)
  steps = sorted(s for s, step_keys in by_step.items() if _layout(step_keys))
  if not steps:
    raise FileNotFoundError(
        f"{location.path} holds no checkpoint"
        + (f" for step={step}" if own else "")
        + f": no '{_MSGPACK_FILE}' file, no orbax '{ORBAX_METADATA}' and no checkpoint_<step>/ "
        "directories"
    )
  chosen = steps[-1] if step is None else step
  if chosen not in steps:
    raise FileNotFoundError(f"no checkpoint_{step} in {location.path}; steps found: {steps}")
  kind, sub = _layout(by_step[chosen])
  return kind, location.join(f"checkpoint_{chosen}/{sub}")


# ----------------------------------------------------------------------------------------------
# Public reading API.
# ----------------------------------------------------------------------------------------------
def load_t5x_checkpoint(
    path: str | os.PathLike,
    step: int | None = None,
    restore_dtype: Any = None,
    template: Mapping[str, Any] | None = None,
    check_finite: bool = True,
) -> dict:
  """Reads a T5X checkpoint (any layout in the module docstring) into numpy, without T5X.

  Args:
    path: a model directory (the latest `checkpoint_<step>` is read, or `step`), a checkpoint
      directory, or the msgpack `checkpoint` file itself; local or `gs://`.
    step: which `checkpoint_<step>` of a model directory to read.
    restore_dtype: if given (e.g. 'bfloat16'), floating-point arrays under 'target' are cast to it;
      a name that is not a floating-point dtype is refused before anything is read
      (`validation.check_restore_dtype`, an InvalidInputError).
    template: nested dict (same paths as the result) of arrays or `jax.ShapeDtypeStruct`s; only
      consulted for arrays stored with neither a `.zarray` file nor a spec (old orbax copies).
    check_finite: raise `NonFiniteWeightsError` if a floating-point array (parameters and
      optimizer state) holds NaN or inf; False loads it as it is.

  Returns:
    {'target': nested params, 'state': nested optimizer state, ...} of numpy arrays: the entries
    of the checkpoint's optimizer state dict, 'target' and 'state' always present.
  """
  return load_checkpoint(
      path, step, restore_dtype, template or {}, only_target=False, check_finite=check_finite
  )


def load_checkpoint(
    path,
    step,
    restore_dtype,
    template: Mapping[str, Any],
    only_target: bool,
    check_finite: bool,
    lazy: bool = False,
) -> dict:
  """`load_t5x_checkpoint`'s reading; only_target=True reads (and checks) the 'target' alone, the
  optimizer state is left unread ({'target': ..., 'state': {}}).

  lazy=True reads the 'target' alone (as only_target=True) and none of its arrays: it reads only
  the metadata (and a msgpack file, with the arrays stored inline in it), and the 'target' holds
  `LazyArray`s, each of which reads only the chunks of the slice it is asked for, casts it to
  `restore_dtype` and refuses NaN and inf in it (if `check_finite`). Zarr arrays (T5X's
  msgpack layouts) and orbax arrays (T5X's orbax layout, `checkpoints.save_model`'s) are read by
  the slice; arrays inline in a msgpack file are read with the file, whole.
  """
  dtype = validation.check_restore_dtype(restore_dtype)  # before anything is read
  only_target = only_target or lazy
  kind, location = find_checkpoint(path, step)
  if kind == "project":
    params = location.join(PARAMS_DIR)
    tree = {"target": _orbax_open(params, lambda t: t) if lazy else _orbax_numpy_restore(params)}
  elif kind == "orbax":
    # Orbax-era T5X wrapped the state dict in '_optimizer'.
    unwrap = lambda tree: tree.get("_optimizer", tree)  # noqa: E731
    tree = (
        {"target": _orbax_open(location, lambda t: unwrap(t).get("target", {}))}
        if lazy
        else unwrap(_orbax_numpy_restore(location))
    )
  else:
    file = location if kind == "file" else location.join(_MSGPACK_FILE)
    tree = _read_msgpack_checkpoint(file, template, only_target, lazy)
  if only_target:
    tree = {"target": tree.get("target", {})}
  tree.setdefault("target", {})
  tree.setdefault("state", {})
  source = f"checkpoint {location.path}"
  if lazy:
    flat = traverse_util.flatten_dict(tree["target"], sep="/")
    tree["target"] = traverse_util.unflatten_dict(
        {k: _lazy(f"target/{k}", v, dtype, check_finite, source) for k, v in flat.items()},
        sep="/",
    )
    return tree
  if dtype is not None:
    tree["target"] = map_leaves(  # jax's issubdtype counts bfloat16 as floating; numpy's does not.
        lambda x: x.astype(dtype) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x,
        tree["target"],
    )
  if check_finite:  # After the cast: an overflow to float16's inf is refused as well.
    check_params_finite(tree, source=source)
  return tree


def _read_msgpack_checkpoint(
    file: _Location, template: Mapping[str, Any], only_target: bool, lazy: bool
) -> dict:
  """The optimizer state dict of a msgpack checkpoint file, its zarr arrays read in (lazy: opened,
  as `_OpenedArray`s)."""
  data = file.read_file()
  if data is None:
    raise FileNotFoundError(f"checkpoint file {file.path} does not exist")
  state = _optimizer_state(_decode_msgpack(data, file), file)
  if only_target:
    state = {"target": state.get("target", {})}
  flat = traverse_util.flatten_dict(
      state,
      keep_empty_nodes=True,
      sep="/",
      is_leaf=lambda _, node: _is_ts_spec(node) or _CHUNKED in node,
  )
  reads = []
  for name, leaf in flat.items():
    if _is_ts_spec(leaf):
      reads.append(_spec_read(name, leaf))
    elif isinstance(leaf, str) and leaf.startswith(_PLACEHOLDER):
      reads.append(_ArrayRead(name, leaf[len(_PLACEHOLDER) :]))
    elif isinstance(leaf, dict) and _CHUNKED in leaf:
      flat[name] = _unchunk(leaf, name)
  opened = _open_arrays(reads, file.parent(), traverse_util.flatten_dict(dict(template), sep="/"))
  flat.update(opened if lazy else _read_arrays(opened))
  return traverse_util.unflatten_dict(flat, sep="/")


def _orbax_numpy_restore(location: _Location) -> dict:
  """Restores an orbax PyTree checkpoint as numpy arrays on the host (no device memory)."""
  checkpointer = ocp.PyTreeCheckpointer()
  with _orbax_errors(location):
    args = map_leaves(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), _orbax_tree(checkpointer, location)
    )
    return checkpointer.restore(location.path, restore_args=args)


def _orbax_open(location: _Location, select: Callable[[dict], dict]) -> dict:
  """Opens the arrays of `select(an orbax PyTree checkpoint's tree)`, reading none of them:
  `_OpenedArray`s, through the tensorstore specs orbax itself reads them with."""
  with _orbax_errors(location):
    tree = select(_orbax_tree(ocp.PyTreeCheckpointer(), location))
    directory = epath.Path(location.path)
    use_ocdbt = ocp.type_handlers.is_ocdbt_checkpoint(directory)
    use_zarr3 = bool(json.loads(location.join(ORBAX_METADATA).read_file()).get("use_zarr3"))
    context = ocp.type_handlers.get_ts_context(use_ocdbt=use_ocdbt)

    def spec(metadata) -> dict:
      info = ocp.type_handlers.ParamInfo(
          name=metadata.name, parent_dir=directory, use_zarr3=use_zarr3, ts_context=context
      )
      return ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt)

    opening = map_leaves(lambda m: (m.name, ts.open(spec(m), context=context)), tree)
    return map_leaves(lambda o: _OpenedArray(o[0], location.path, o[1].result()), opening)


def _orbax_tree(checkpointer: ocp.PyTreeCheckpointer, location: _Location) -> dict:
  """The tree of an orbax checkpoint's metadata (`ArrayMetadata` leaves)."""
  metadata = checkpointer.metadata(location.path).item_metadata
  if metadata is None:
    raise ValueError("its tree metadata cannot be read (missing, or its chunk is damaged)")
  return dict(metadata.tree)


@contextlib.contextmanager
def _orbax_errors(location: _Location) -> Iterator[None]:
  """Turns a read error of the orbax checkpoint at `location` into one naming it."""
  try:
    yield
  except (ValueError, OSError) as e:
    raise ValueError(
        f"cannot restore the orbax checkpoint at {location.path}: {e}. A read or decompression "
        "error means a damaged or incomplete copy: copy the checkpoint again"
    ) from e


def map_leaves(fn, tree):
  """`fn` on every leaf of a nested dict (tuples and None are leaves; None stays None)."""
  if isinstance(tree, Mapping):
    return {k: map_leaves(fn, v) for k, v in tree.items()}
  return tree if tree is None else fn(tree)
