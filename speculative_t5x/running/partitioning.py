"""Sharding over a ('data', 'model') device mesh by T5X's logical axis rules.

Every parameter carries logical axis names (`network.param_axes`, from flax's
`with_logical_partitioning`): embed, mlp, heads, kv, joined_kv, vocab, relpos_buckets. Decoding
state and batches are batch-first arrays named by rank (`state_axes`): [B] is (batch,), [B, L] is
(batch, length) and an attention cache [B, L, H, D] is (batch, length, heads, kv). Rules map the
logical names to mesh axes; XLA's SPMD partitioner does the rest. `standard_logical_axis_rules`
is T5X's 1-D model parallelism: batch over 'data'; mlp, heads, joined_kv and vocab over 'model';
embed, kv, length and relpos_buckets replicated.

`Partitioner` is this project's `PjitPartitioner(num_partitions=..., logical_axis_rules=...)`: it
builds the mesh and jit-compiles a model's whole decode (`partition_predict`) with the parameters
and the batch placed by `NamedSharding`. The target and the drafter share the mesh, since they run
in one program, but each has its own rules, e.g. the target model-parallel and the drafter
replicated (`data_parallel_logical_axis_rules`). Caches are built inside the compiled decode; XLA's
sharding propagation lays them out like the parameters that produce them (a model-parallel
target's caches split over heads, a replicated drafter's only over the batch).
`state_shardings` gives the same layout explicitly, for state placed from outside.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Collection, Mapping, Sequence

import gin
import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.weights import t5x_checkpoints

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)
# (logical axis name, mesh axis, tuple of mesh axes or None) pairs, earlier ones first.
Rules = tuple[tuple[str, Any], ...]

# Logical names of batch-first decoding state (caches, drafter state) and batch arrays, by rank.
_STATE_AXES_BY_RANK = {
    1: ("batch",),
    2: ("batch", "length"),
    4: ("batch", "length", "heads", "kv"),
}
# Logical axes no standard rule shards (T5X's `replicated_rules`, those this network uses).
_REPLICATED_AXES = ("embed", "kv", "length", "relpos_buckets")
_MODEL_PARALLEL_AXES = ("vocab", "mlp", "heads", "joined_kv")
# Feature shapes for abstract parameter initialization (parameter shapes do not depend on them).
_UNIT_SHAPES = {"encoder_input_tokens": (1, 1), "decoder_input_tokens": (1, 1)}


@gin.configurable(module="partitioning")
def standard_logical_axis_rules(additional_rules: Sequence[tuple[str, Any]] = ()) -> Rules:
  """T5X's `standard_logical_axis_rules()` (1-D activation and parameter partitioning).

  batch -> 'data'; vocab, mlp, heads, joined_kv -> 'model'; embed, kv, length, relpos_buckets
  replicated. `additional_rules` are appended (earlier rules win, as in flax).
  """
  rules = (
      (("batch", DATA_AXIS),)
      + tuple((name, MODEL_AXIS) for name in _MODEL_PARALLEL_AXES)
      + tuple((name, None) for name in _REPLICATED_AXES)
  )
  return rules + _as_rules(additional_rules)


@gin.configurable(module="partitioning")
def data_parallel_logical_axis_rules(additional_rules: Sequence[tuple[str, Any]] = ()) -> Rules:
  """batch -> 'data' and every parameter axis replicated: for a drafter small enough to copy onto
  every device, so its steps need no cross-device communication."""
  rules = (("batch", DATA_AXIS),) + tuple(
      (name, None) for name in _MODEL_PARALLEL_AXES + _REPLICATED_AXES
  )
  return rules + _as_rules(additional_rules)


def _as_rules(rules: Sequence[Sequence[Any]]) -> Rules:
  """Lists (as gin writes them) -> a tuple of (name, mesh axis) pairs; checks the form."""
  out = []
  for rule in rules:
    if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(
          f"logical axis rule {rule!r} is not a (logical name, mesh axis or None) "
          "pair, e.g. ('mlp', 'model') or ('embed', None)."
      )
    mesh_axes = tuple(rule[1]) if isinstance(rule[1], list) else rule[1]
    out.append((rule[0], mesh_axes))
  return tuple(out)


def make_mesh(
    num_partitions: int | None = None,
    mesh_shape: Sequence[int] | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A ('data', 'model') mesh over all of `devices` (default `jax.devices()`).

  Give `num_partitions` (the 'model' axis size; 'data' takes the rest, default 1 partition) or
  `mesh_shape` = (data, model), whose product must be the device count. Raises ValueError if the
  mesh does not fit the devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  count = len(devices)
  divisors = [d for d in range(1, count + 1) if count % d == 0]
  if num_partitions is not None and mesh_shape is not None:
    raise ValueError(
        f"give num_partitions ({num_partitions}) or mesh_shape ({mesh_shape}), not "
        "both: the mesh shape already fixes the number of model partitions."
    )
  if mesh_shape is None:
    partitions = 1 if num_partitions is None else num_partitions
    if (
        isinstance(partitions, bool)
        or int(partitions) != partitions
        or partitions < 1
        or (count % partitions)
    ):
      raise ValueError(
          f"num_partitions={partitions} does not divide the {count} available "
          f"device(s): use one of {divisors}."
      )
    mesh_shape = (count // int(partitions), int(partitions))
  shape = tuple(int(s) for s in mesh_shape)
  if len(shape) != 2 or min(shape) < 1 or math.prod(shape) != count:
    raise ValueError(
        f"mesh_shape {tuple(mesh_shape)} does not fit the {count} available "
        f"device(s): give (data, model) with data * model = {count}, e.g. "
        f"{[(count // d, d) for d in divisors]}."
    )
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def _axes_tuple(mesh_axes) -> tuple[str, ...]:
  """None, 'model' or ('data', 'model') -> a tuple of mesh axis names."""
  if mesh_axes is None:
    return ()
  return mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)


def check_rules(rules: Rules, mesh: Mesh) -> None:
  """Raises ValueError if a rule names a mesh axis the mesh lacks."""
  for name, mesh_axes in rules:
    for axis in _axes_tuple(mesh_axes):
      if axis not in mesh.axis_names:
        raise ValueError(
            f"logical axis rule ({name!r}, {mesh_axes!r}) names mesh axis {axis!r}, "
            f"but the mesh has axes {mesh.axis_names}."
        )


def logical_to_spec(
    names: Sequence[str | None], rules: Rules, where: str = "an array"
) -> PartitionSpec:
  """Logical axis names -> PartitionSpec by flax's rule semantics (the first rule whose mesh axis
  is still free wins). Raises ValueError for a name with no rule, where flax would silently
  replicate."""
  known = {name for name, _ in rules}
  for name in names:
    if name is not None and name not in known:
      raise ValueError(
          f"logical axis {name!r} of {where} has no rule in {sorted(known)}: add one, "
          f"e.g. ('{name}', None) to replicate it or ('{name}', '{MODEL_AXIS}') to "
          "shard it."
      )
  return PartitionSpec(*nn.logical_to_mesh_axes(tuple(names), rules))


def _sharding(names, shape, mesh: Mesh, rules: Rules, where: str) -> NamedSharding:
  """One array's NamedSharding; raises ValueError if a sharded dimension does not divide."""
  spec = logical_to_spec(names, rules, where)
  for dim, (size, mesh_axes) in enumerate(zip(shape, spec)):
    axes = _axes_tuple(mesh_axes)
    parts = math.prod(mesh.shape[a] for a in axes)
    if size % parts:
      raise ValueError(
          f"{where} has shape {tuple(shape)}: dimension {dim} ({names[dim]}, size "
          f"{size}) is not divisible by the {parts} devices of mesh axes {axes}: pick "
          "a mesh that divides it or a rule that replicates it."
      )
  return NamedSharding(mesh, spec)


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) or "<root>"


def axes_shardings(axes: Any, shapes: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings of a parameter tree from its logical axis names (a tree of tuples of names)
  and its shapes (the same tree of shape tuples). Raises ValueError for a logical axis with no
  rule or a sharded dimension the mesh does not divide."""
  check_rules(rules, mesh)
  is_names = lambda x: isinstance(x, tuple) and all(isinstance(n, str) for n in x)  # noqa: E731
  shapes = jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple))
  axes_with_paths, treedef = jax.tree_util.tree_flatten_with_path(axes, is_leaf=is_names)
  shardings = [
      _sharding(names, shape, mesh, rules, f"parameter {_path_name(path)}")
      for (path, names), shape in zip(axes_with_paths, shapes)
  ]
  return jax.tree.unflatten(treedef, shardings)


def param_shardings(config: network.T5Config, mesh: Mesh, rules: Rules) -> dict:
  """NamedSharding of every parameter of a T5 with `config` (T5X's tree)."""
  return axes_shardings(network.param_axes(config), network.param_shapes(config), mesh, rules)


def drafter_shardings(drafter: drafters_lib.Drafter, mesh: Mesh, rules: Rules) -> Any:
  """Shardings of a drafter's parameters from its `param_axes` (None: replicated, one sharding
  for the whole tree)."""
  axes = drafter.param_axes()
  if axes is None:
    return NamedSharding(mesh, PartitionSpec())
  abstract = jax.eval_shape(lambda: drafter.init_params(jax.random.PRNGKey(0), _UNIT_SHAPES))
  return axes_shardings(axes, jax.tree.map(lambda x: tuple(x.shape), abstract), mesh, rules)


def _state_names(path, leaf) -> tuple[str, ...]:
  rank = len(np.shape(leaf))
  if rank not in _STATE_AXES_BY_RANK:
    raise ValueError(
        f"decoding state {_path_name(path)} has rank {rank} (shape {np.shape(leaf)}); "
        f"only batch-first ranks {sorted(_STATE_AXES_BY_RANK)} have logical names: "
        "[B], [B, L], [B, L, H, D]."
    )
  return _STATE_AXES_BY_RANK[rank]


def state_axes(tree: Any) -> Any:
  """Logical names of batch-first arrays (caches, drafter state, batches) by rank:
  [B] (batch,), [B, L] (batch, length), [B, L, H, D] (batch, length, heads, kv)."""
  return jax.tree_util.tree_map_with_path(_state_names, tree)


def state_shardings(tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedSharding of every array of batch-first decoding state or of a batch (see `state_axes`):
  with the standard rules a cache [B, L, H, D] is split over batch ('data') and heads ('model')."""
  check_rules(rules, mesh)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: _sharding(
          _state_names(path, leaf),
          np.shape(leaf),
          mesh,
          rules,
          f"decoding state {_path_name(path)}",
      ),
      tree,
  )


def abstract_params(config: network.T5Config, shardings: Any, dtype: Any) -> Any:
  """Parameters as `jax.ShapeDtypeStruct`s of `dtype` carrying `shardings` (nothing allocated),
  for ahead-of-time lowering."""
  return jax.tree.map(
      lambda shape, sharding: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding),
      network.param_shapes(config),
      shardings,
      is_leaf=lambda x: isinstance(x, tuple),
  )


@dataclasses.dataclass(frozen=True)
class DataLayout:
  """How one process feeds each global batch (T5X's `partitioning.DataLayout`).

  rows: the rows it feeds per global batch: those of its devices on the 'data' axis.
  shard_id, num_shards: the shard of the data it reads (`seqio.ShardInfo(shard_id,
    num_shards)`). Processes whose devices hold the same rows (a 'model' axis across processes)
    form a replica set: they read the same shard and feed the same rows.
  is_first_host_in_replica_set: whether it is the lowest-numbered process of its replica set, the
    one whose results count (so each example counts once).
  """

  rows: int
  shard_id: int
  num_shards: int
  is_first_host_in_replica_set: bool


def data_layout(
    rows_by_process: Mapping[int, Collection[tuple[int, int]]], process: int, global_rows: int
) -> DataLayout:
  """`process`'s DataLayout, from the rows each process's devices hold of a batch of
  `global_rows` rows: {process index: its devices' (start, stop) row ranges}.

  Works when every process holds as many rows as every other, and two processes hold either the
  same rows or none in common: the replica sets are then the distinct sets of rows, numbered by
  their first row. Raises ValueError naming the processes and their rows otherwise: a process
  cannot feed rows that another process feeds only in part.
  """
  held = {p: frozenset(ranges) for p, ranges in rows_by_process.items()}
  counts = {p: sum(stop - start for start, stop in ranges) for p, ranges in held.items()}
  fix = (
      "give NUM_PARTITIONS (the 'model' axis) dividing the local device count (each process's "
      "devices then hold rows of their own) or a multiple of it (the 'model' axis then spans "
      "whole processes, which feed the same rows)"
  )
  if len(set(counts.values())) > 1:
    raise ValueError(
        f"the processes hold different numbers of rows of a batch of {global_rows} "
        f"({dict(sorted(counts.items()))}): {fix}"
    )
  replica_sets = sorted(set(held.values()), key=min)
  for i, a in enumerate(replica_sets):
    for b in replica_sets[i + 1 :]:
      if a & b:
        p, q = (min(k for k, v in held.items() if v == s) for s in (a, b))
        raise ValueError(
            f"processes {p} and {q} hold rows {sorted(a)} and {sorted(b)} (start, stop) of a "
            f"batch of {global_rows}, which overlap without being the same, so neither can "
            f"feed its rows alone: {fix}"
        )
  mine = held[process]
  return DataLayout(
      rows=counts[process],
      shard_id=replica_sets.index(mine),
      num_shards=len(replica_sets),
      is_first_host_in_replica_set=process == min(p for p, v in held.items() if v == mine),
  )


def _once_per_index(read: Callable[[tuple[slice, ...]], Any]) -> Callable[[tuple[slice, ...]], Any]:
  """`read` (index -> values) calling the underlying read once per distinct index: devices that
  hold the same slice (a parameter replicated over 'data') get one copy of it, read once."""
  values = {}

  def once(index: tuple[slice, ...]) -> Any:
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in values:
      values[key] = read(index)
    return values[key]

  return once


@gin.configurable(module="partitioning")
class Partitioner:
  """A mesh and the logical axis rules of a target and its drafter (T5X's PjitPartitioner).

  Args:
    num_partitions: size of the 'model' axis; 'data' takes the remaining devices (default 1).
    mesh_shape: (data, model) instead of num_partitions.
    logical_axis_rules: the target's rules (default `standard_logical_axis_rules()`).
    drafter_logical_axis_rules: the drafter's rules (default: the target's).
    devices: the devices to use (default `jax.devices()`).

  Raises ValueError at construction for a mesh that does not fit the devices or rules naming an
  axis the mesh lacks; parameter shardings raise for logical axes with no rule.
  """

  def __init__(
      self,
      num_partitions: int | None = None,
      mesh_shape: Sequence[int] | None = None,
      logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
      drafter_logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
      devices: Sequence[jax.Device] | None = None,
  ):
    self.mesh = make_mesh(num_partitions, mesh_shape, devices)
    self.rules = (
        standard_logical_axis_rules()
        if logical_axis_rules is None
        else _as_rules(logical_axis_rules)
    )
    self.drafter_rules = (
        self.rules if drafter_logical_axis_rules is None else _as_rules(drafter_logical_axis_rules)
    )
    check_rules(self.rules, self.mesh)
    check_rules(self.drafter_rules, self.mesh)

  @property
  def data_sharding(self) -> NamedSharding:
    """Batch-first arrays split over 'data' on their first axis (batches and decode outputs)."""
    return NamedSharding(self.mesh, logical_to_spec(("batch",), self.rules, "the batch"))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def params_shardings(self, model: models.EncoderDecoderModel) -> Any:
    """Shardings of `model`'s params: the target's tree, or {'target', 'drafter'} for a
    speculative model (a T5 drafter by the drafter rules, a table drafter replicated)."""
    target = param_shardings(model.module.config, self.mesh, self.rules)
    if not isinstance(model, models.SpeculativeEncoderDecoderModel):
      return target
    return {
        "target": target,
        "drafter": drafter_shardings(model.drafter, self.mesh, self.drafter_rules),
    }

  def place_params(self, model: models.EncoderDecoderModel, params: Any) -> Any:
    """Puts `params` on the mesh with `params_shardings(model)`."""
    return jax.device_put(params, self.params_shardings(model))

  def place_batch(self, batch: Any) -> Any:
    """Puts a batch of batch-first arrays on the mesh, split over 'data'."""
    return jax.device_put(batch, state_shardings(batch, self.mesh, self.rules))

  def partition_predict(
      self, model: models.EncoderDecoderModel, greedy: bool = False, **jit_predict_kwargs
  ) -> Callable:
    """`model.jit_predict(**kwargs)` compiled for the mesh: `fn(params, batch, rng, temperature)
    -> (decodes, aux)` with params placed by `params_shardings(model)`, the batch and every output
    split over 'data' (batch sizes must divide the 'data' axis), rng and temperature replicated.
    greedy: `fn(params, batch, rng)`, the greedy program (temperature 0, static: argmaxes, no
    distributions), which a concrete temperature 0 runs. The returned jitted function also lowers
    ahead of time (`fn.lower(...)` with abstract arguments)."""
    predict = model.jit_predict(**jit_predict_kwargs)
    in_shardings = (self.params_shardings(model), self.data_sharding, self.replicated)
    if greedy:
      return jax.jit(
          lambda params, batch, rng: predict(params, batch, rng, 0.0),
          in_shardings=in_shardings,
          out_shardings=self.data_sharding,
      )
    return jax.jit(
        predict, in_shardings=in_shardings + (self.replicated,), out_shardings=self.data_sharding
    )

  # --------------------------------------------------------------------------- several processes

  def get_data_layout(self, global_rows: int) -> DataLayout:
    """How this process feeds a batch-first array of `global_rows` rows split over 'data'
    (`data_sharding`): the rows it passes to `place_process_batch` and the shard of the data
    they come from (T5X's `get_data_layout`). With one process, DataLayout(global_rows, 0, 1,
    True); see `data_layout` for several.

    Raises ValueError if `global_rows` does not divide over the 'data' axis, or for a mesh whose
    processes hold rows that overlap without being the same (`data_layout`).
    """
    data = self.mesh.shape[DATA_AXIS]
    if global_rows % data:
      raise ValueError(
          f"a batch of {global_rows} rows does not split over the {data} devices of the mesh's "
          f"'data' axis: use a multiple of {data}"
      )
    rows_by_process = {}
    for device, index in self.data_sharding.devices_indices_map((global_rows,)).items():
      start, stop, _ = index[0].indices(global_rows)
      rows_by_process.setdefault(device.process_index, set()).add((start, stop))
    return data_layout(rows_by_process, jax.process_index(), global_rows)

  def place_process_batch(self, local: Any, global_rows: int) -> Any:
    """Assembles a global batch from every process's rows (`jax.make_array_from_process_local_data`):
    `local` is a tree of batch-first arrays of `get_data_layout(global_rows).rows` rows, the
    rows of this process's devices in order; processes whose devices hold the same rows (a
    'model' axis across processes) pass the same arrays. The result is split over 'data' like
    `place_batch`."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(
            self.data_sharding, np.asarray(x), (global_rows,) + np.shape(x)[1:]
        ),
        local,
    )

  def place_params_per_process(
      self, model: models.EncoderDecoderModel, params: Any, shardings: Any = None
  ) -> Any:
    """`place_params` for a mesh across processes: every process builds only the shards its own
    devices hold (`jax.make_array_from_callback`), each distinct slice once, from its `params`
    (the same on every process): arrays, or `t5x_checkpoints.LazyArray`s, of which it then
    reads only those slices (`LazyArray.read`, which raises for NaN or inf in them).
    shardings: `params_shardings(model)`, if already computed."""

    def place(sharding: NamedSharding, subtree: Any) -> Any:
      def one(x):
        if isinstance(x, t5x_checkpoints.LazyArray):
          shape, read = x.shape, x.read
        else:
          host = np.asarray(x)
          shape, read = host.shape, host.__getitem__
        return jax.make_array_from_callback(shape, sharding, _once_per_index(read))

      return jax.tree.map(one, subtree)

    return jax.tree.map(
        place,
        self.params_shardings(model) if shardings is None else shardings,
        params,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
