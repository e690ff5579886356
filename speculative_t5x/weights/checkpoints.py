"""The project's own checkpoints, and restoring any checkpoint against a model config.

Reading: `restore_params` (and `restore_checked` for other shapes, e.g. a drafter's) reads
every layout `t5x_checkpoints.load_t5x_checkpoint` reads (T5X's, and the directories written
here), casts it, refuses NaN and inf (`t5x_checkpoints.NonFiniteWeightsError`,
unless check_finite=False) and checks its tree against the model config (`check_params`: one
ValueError listing every missing, extra or mis-shaped parameter). `param_checks.config_from_params` reads the
`T5Config` off a T5X parameter tree.

Writing: `save_model` / `restore_model` keep one model's params and `T5Config` as orbax params
plus `config.json`; `stored_dtypes` reads the dtypes a directory stores without restoring it.
`save_drafter` writes any drafter in the same layout, its config.json adding to its network's
T5Config fields the entry "drafter": {"kind": ..., ...}, which its class writes and reads
(`save_drafter_params`, `read_drafter_entry`; `read_drafter` gives the drafter back).
A (target, drafter) pair is `pairs.save_pair`'s.
"""

import dataclasses
import json
import os
import typing
from typing import Any, Callable, Mapping, Protocol

from etils import epath
from flax import traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp

from speculative_t5x import drafters
from speculative_t5x import network
from speculative_t5x import validation
from speculative_t5x.weights import t5x_checkpoints

_CONFIG_FILE = "config.json"
# config.json's entry for a drafter that is not a T5 with an encoder (`Checkpointed`).
_DRAFTER_ENTRY = "drafter"


# ----------------------------------------------------------------------------------------------
# Checking parameters against a config, and restoring them from any checkpoint.
# ----------------------------------------------------------------------------------------------
def check_params(params: Mapping, expected_shapes: Mapping, source: str = "params") -> None:
  """Raises one ValueError listing every missing, extra or mis-shaped parameter by path.

  Args:
    params: nested dict of arrays.
    expected_shapes: nested dict of shape tuples, e.g. `network.param_shapes(config)`.
    source: what `params` came from, for the message.
  """
  flat = traverse_util.flatten_dict(dict(params), sep="/")
  expected = traverse_util.flatten_dict(dict(expected_shapes), sep="/")
  problems = [f"  missing: {k} {tuple(expected[k])}" for k in sorted(expected.keys() - flat.keys())]
  problems += [f"  extra: {k} {np.shape(flat[k])}" for k in sorted(flat.keys() - expected.keys())]
  problems += [
      f"  wrong shape: {k} is {np.shape(flat[k])}, the config needs {tuple(expected[k])}"
      for k in sorted(flat.keys() & expected.keys())
      if tuple(np.shape(flat[k])) != tuple(expected[k])
  ]
  if problems:
    raise ValueError(
        f"{source} does not match the model config ({len(problems)} problem(s)); "
        "use the config (sizes, mlp_activations, logits_via_embedding) the "
        "checkpoint was trained with:\n" + "\n".join(problems)
    )


def restore_params(
    config: network.T5Config,
    path: str | os.PathLike,
    dtype: Any = None,
    step: int | None = None,
    check_finite: bool = True,
    lazy: bool = False,
) -> dict:
  """Parameters for `network.Transformer(config)` from a T5X or project checkpoint at `path`.

  Reads only the 'target' of `path` (see `t5x_checkpoints.load_t5x_checkpoint`), casts
  floating-point parameters to `dtype` if given (e.g. 'bfloat16' for the real sizes; a dtype that
  is not floating-point is refused before anything is read), refuses NaN and inf
  (`t5x_checkpoints.NonFiniteWeightsError`, unless check_finite=False) and checks the tree against
  `network.param_shapes(config)` (one ValueError lists every problem). The result is on the
  default device (jax arrays): numpy parameters would be copied to the device at every call of
  a jitted function. lazy=True: `t5x_checkpoints.LazyArray`s instead, none of them read yet
  (the tree's shapes are checked; each slice is cast and refused where not finite as it is read).
  """
  return restore_checked(
      lambda: network.param_shapes(config),
      path,
      dtype,
      f"checkpoint {path}",
      step,
      check_finite,
      lazy,
  )


def restore_checked(
    shapes: Mapping | Callable[[], Mapping],
    path,
    dtype: Any = None,
    source: str | None = None,
    step: int | None = None,
    check_finite: bool = True,
    lazy: bool = False,
) -> dict:
  """The 'target' of the checkpoint at `path`, cast to `dtype` (floating-point leaves), refused
  where not finite, checked against `shapes` (nested dict of tuples, e.g. a drafter's, or a
  function giving it, e.g. `Drafter.param_shapes`) and put on the device; `source` names it in
  errors. lazy=True: checked against `shapes` and left as `t5x_checkpoints.LazyArray`s (see
  `restore_params`). A dtype that is not floating-point and a missing checkpoint are refused
  before anything is read, and before a function `shapes` is called (which traces the model)."""
  validation.check_restore_dtype(dtype)
  t5x_checkpoints.find_checkpoint(path, step)
  if callable(shapes):
    shapes = shapes()
  source = source or f"checkpoint {path}"
  template = {
      "target": t5x_checkpoints.map_leaves(lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes)
  }
  params = t5x_checkpoints.load_checkpoint(
      path, step, dtype, template, only_target=True, check_finite=check_finite, lazy=lazy
  )["target"]
  check_params(params, shapes, source=source)
  return params if lazy else jax.device_put(params)


# ----------------------------------------------------------------------------------------------
# The project's own checkpoints: orbax params + config.json.
# ----------------------------------------------------------------------------------------------
def config_to_json(config: network.T5Config, drafter: Mapping | None = None) -> str:
  """`config` as JSON text (tuples become lists); `drafter`, if given, as its 'drafter' entry
  (the kind of a drafter without an encoder, see `read_drafter_entry`)."""
  fields = dataclasses.asdict(config)
  if drafter is not None:
    fields[_DRAFTER_ENTRY] = dict(drafter)
  return json.dumps(fields, indent=2, sort_keys=True)


def config_from_json(text: str, source: str = "config") -> network.T5Config:
  """The `T5Config` written by `config_to_json` (without a 'drafter' entry)."""
  return _t5_config(_json_object(text, source), source)


def _json_object(text: str, source: str) -> dict:
  try:
    fields = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(
        f"{source} is not valid JSON ({e}): the file is damaged; write it again (save_model, "
        "save_pair)."
    ) from e
  if not isinstance(fields, dict):
    raise ValueError(
        f"{source} holds a JSON {type(fields).__name__}, not the object of T5Config fields "
        "that save_model writes: write it again."
    )
  return fields


def _t5_config(fields: dict, source: str) -> network.T5Config:
  """A T5Config from config.json fields, every problem a ValueError naming `source`."""
  if _DRAFTER_ENTRY in fields:
    raise ValueError(
        f"{source} describes a drafter without an encoder (its '{_DRAFTER_ENTRY}' entry is "
        f"{fields[_DRAFTER_ENTRY]!r}), not a T5 model: read it with checkpoints.read_drafter (or "
        "a whole pair with pairs.PairConfig.from_pair_dir) and restore it with "
        "checkpoints.restore_drafter_params (pairs.load_pair does both)."
    )
  known = {f.name for f in dataclasses.fields(network.T5Config)}
  unknown = sorted(fields.keys() - known)
  if unknown:
    raise ValueError(
        f"{source} has field(s) {unknown} that T5Config does not know: it was written "
        "by another version of speculative_t5x"
    )
  if "vocab_size" not in fields:
    raise ValueError(f"{source} has no vocab_size, which every T5Config needs: write it again.")
  try:
    return network.T5Config(**fields)
  except ValueError as e:
    raise ValueError(f"{source}: {e}") from e


def _epath(directory: str | os.PathLike) -> epath.Path:
  directory = os.fspath(directory)
  return epath.Path(directory if "://" in directory else os.path.abspath(directory))


def _save(
    directory: str | os.PathLike,
    params: Mapping,
    shapes: Mapping,
    config_text: str,
    overwrite: bool,
) -> None:
  """Writes `params`, checked against `shapes`, under `directory/params` (orbax) and
  `config_text` as `directory/config.json`."""
  check_params(params, shapes, source="params to save")
  directory = _epath(directory)
  if (directory / t5x_checkpoints.PARAMS_DIR).exists() and not overwrite:
    raise FileExistsError(
        f"{directory / t5x_checkpoints.PARAMS_DIR} exists: choose a new directory or pass "
        "overwrite=True"
    )
  directory.mkdir(parents=True, exist_ok=True)
  ocp.PyTreeCheckpointer().save(
      directory / t5x_checkpoints.PARAMS_DIR,
      t5x_checkpoints.map_leaves(np.asarray, dict(params)),
      force=overwrite,
  )
  (directory / _CONFIG_FILE).write_text(config_text)


def save_model(
    directory: str | os.PathLike, params: Mapping, config: network.T5Config, overwrite: bool = False
) -> None:
  """Writes `params` (orbax, under `directory/params`) and `config` (`directory/config.json`).

  The params are checked against `config` first, so a saved model always restores.
  """
  _save(directory, params, network.param_shapes(config), config_to_json(config), overwrite)


def save_drafter(
    directory: str | os.PathLike,
    params: Mapping,
    shapes: Mapping,
    config: network.T5Config,
    entry: Mapping[str, Any],
    overwrite: bool = False,
) -> None:
  """Writes a drafter of any kind: orbax params (checked against `shapes`) under
  `directory/params`, and `directory/config.json` holding its network's T5Config fields and its
  'drafter' entry (`entry`: at least {"kind": ...}, what `read_drafter_entry` gives back)."""
  if not isinstance(entry.get("kind"), str):
    raise ValueError(f"a drafter entry needs a 'kind' string, got {dict(entry)!r}.")
  _save(directory, params, shapes, config_to_json(config, entry), overwrite)


def read_drafter_entry(directory: str | os.PathLike) -> tuple[network.T5Config, dict | None]:
  """(config, the 'drafter' entry of config.json or None) of a drafter's directory; None for a
  T5 drafter (a `save_model` directory). The entry's kind is its drafter class's to read."""
  fields, source = _read_config_file(directory)
  entry = fields.pop(_DRAFTER_ENTRY, None)
  config = _t5_config(fields, source)
  if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("kind"), str)):
    raise ValueError(
        f"{source} has the '{_DRAFTER_ENTRY}' entry {entry!r}, which names no kind: save the "
        'drafter again (save_drafter_params writes {"kind": ..., ...}).'
    )
  return config, entry


def _read_config_file(directory: str | os.PathLike) -> tuple[dict, str]:
  """(the fields of directory/config.json, its path)."""
  config_file = _epath(directory) / _CONFIG_FILE
  if not config_file.exists():
    raise FileNotFoundError(
        f"{config_file} does not exist: {directory} is not a directory " "written by save_model"
    )
  return _json_object(config_file.read_text(), str(config_file)), str(config_file)


def read_config(directory: str | os.PathLike) -> network.T5Config:
  """The config.json of a directory written by `save_model`."""
  return _t5_config(*_read_config_file(directory))


def restore_model(
    directory: str | os.PathLike, dtype: Any = None, check_finite: bool = True
) -> tuple[dict, network.T5Config]:
  """(params, config) written by `save_model`, params cast to `dtype` if given and checked as by
  `restore_params`."""
  validation.check_restore_dtype(dtype)  # before config.json is read
  config = read_config(directory)
  params = restore_params(config, _epath(directory), dtype=dtype, check_finite=check_finite)
  return params, config


def stored_dtypes(directory: str | os.PathLike) -> set[str]:
  """The dtype names (e.g. {'float32'} or {'bfloat16'}) of the floating-point arrays stored under
  `directory/params` by `save_model` or `save_drafter_params` (`save_drafter`),
  read from orbax's array metadata (each array's zarr `.zarray`, where tensorstore records
  bfloat16 as "bfloat16") without restoring the arrays."""
  location = _epath(directory) / t5x_checkpoints.PARAMS_DIR
  metadata_file = location / t5x_checkpoints.ORBAX_METADATA
  if not metadata_file.exists():
    raise FileNotFoundError(
        f"{metadata_file} does not exist: {directory} is not a directory written by save_model "
        "(or save_drafter_params)."
    )
  try:
    metadata = ocp.PyTreeCheckpointer().metadata(location).item_metadata
    if metadata is None:
      raise ValueError("its tree metadata cannot be read (missing, or its chunk is damaged)")
  except (ValueError, OSError) as e:
    raise ValueError(
        f"cannot read the array metadata of the orbax checkpoint at {location}: {e}. A damaged or "
        "incomplete copy: copy the checkpoint again"
    ) from e
  leaves = traverse_util.flatten_dict(dict(metadata.tree)).values()
  dtypes = [getattr(leaf, "dtype", None) for leaf in leaves]  # None: a leaf without an array.
  return {
      np.dtype(dtype).name
      for dtype in dtypes
      if dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.floating)
  }


# ----------------------------------------------------------------------------- drafters
# A drafter kind describes its checkpoint (`Checkpointed`); reading and writing it happen here,
# so that decoding never loads orbax or tensorstore.


@typing.runtime_checkable
class Checkpointed(Protocol):
  """A drafter kind with a checkpoint format: useful parameters come only from its checkpoint
  (random ones, `init_params`, are for tests and demos)."""

  def checkpoint_layout(self) -> drafters.CheckpointLayout:
    """What its checkpoint holds."""


@typing.runtime_checkable
class CompletedFromTarget(Protocol):
  """A `Checkpointed` kind whose restored parameters may need what it takes from its target."""

  def from_checkpoint(
      self,
      restore: Callable[[drafters.Drafter], Any],
      saved_entry: Mapping[str, Any] | None,
      target_params: Any,
      path: str | os.PathLike,
  ) -> Any:
    """Parameters from the checkpoint at `path` whose config.json drafter entry is `saved_entry`
    (None: none, or no config.json), completed with what the drafter takes from its target that
    the checkpoint may not hold. `restore(drafter)` reads the checkpoint as `drafter`'s."""


def needs_checkpoint(drafter: drafters.Drafter) -> bool:
  """Whether `drafter`'s useful parameters come only from a checkpoint (`Checkpointed`)."""
  return isinstance(drafter, Checkpointed)


def _layout(drafter: drafters.Drafter) -> drafters.CheckpointLayout | None:
  return drafter.checkpoint_layout() if isinstance(drafter, Checkpointed) else None


def read_drafter(directory: str | os.PathLike) -> drafters.Drafter:
  """The drafter whose checkpoint `save_drafter_params` (or `pairs.save_pair`) wrote to
  `directory`, from its config.json: the reader registered for its entry's kind
  (`drafters.register_kind`), or the `T5Drafter` of its config where it has no entry."""
  config, entry = read_drafter_entry(directory)
  if entry is None:
    return drafters.T5Drafter(config)
  reader = drafters.kind_reader(entry["kind"])
  if reader is None:
    raise ValueError(
        f"{directory}/config.json records a drafter of kind {entry['kind']!r}, which no imported "
        f"module reads (known: {drafters.known_kinds()}): import the module that defines it "
        "(e.g. speculative_t5x.feature_drafter), or save the drafter again."
    )
  try:
    return reader(config, entry)
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(
        f"{directory}/config.json's drafter entry {entry!r} cannot be read ({e}): save the "
        "drafter again."
    ) from e


def restore_drafter_params(
    drafter: drafters.Drafter, path: str | os.PathLike, dtype: Any = None
) -> Any:
  """`drafter`'s parameters from a checkpoint directory, cast to `dtype` (None: as stored)."""
  layout = _layout(drafter)
  if layout is None:
    raise ValueError(
        f"{type(drafter).__name__} has no checkpoint format (got the path {path}): "
        "leave the drafter's checkpoint path unset."
    )
  if layout.entry is None:
    return restore_params(layout.config, path, dtype=dtype)
  return restore_checked(
      drafter.param_shapes, path, dtype, f"checkpoint {path} ({layout.description})"
  )


def restore_drafter_with_target(
    drafter: drafters.Drafter, path: str | os.PathLike, target_params: Any, dtype: Any = None
) -> Any:
  """`restore_drafter_params`, completed with what the drafter takes from its target that the
  checkpoint may not hold (`CompletedFromTarget`; `pairs.load_drafter` restores so)."""
  try:
    _, saved_entry = read_drafter_entry(path)
  except (FileNotFoundError, ValueError):
    saved_entry = None  # a bare checkpoint (T5X's) or none: the drafter restores as itself
  restore = lambda as_drafter: restore_drafter_params(as_drafter, path, dtype)
  if isinstance(drafter, CompletedFromTarget):
    return drafter.from_checkpoint(restore, saved_entry, target_params, path)
  return restore(drafter)


def save_drafter_params(
    drafter: drafters.Drafter, directory: str | os.PathLike, params: Any, overwrite: bool = False
) -> None:
  """Writes `params` to `directory` as a checkpoint `restore_drafter_params` reads back (refusing
  an existing one unless `overwrite`)."""
  layout = _layout(drafter)
  if layout is None:
    raise ValueError(
        f"{type(drafter).__name__} has no checkpoint format, so there is nothing to write to "
        f"{directory}: its parameters come from fitting or need none (see `restore_params`)."
    )
  if layout.entry is None:
    save_model(directory, params, layout.config, overwrite=overwrite)
  else:
    entry = dict(layout.entry)
    save_drafter(directory, params, drafter.param_shapes(), layout.config, entry, overwrite)
