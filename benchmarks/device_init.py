"""Random parameters made on the device, in their final dtype, a leaf at a time.

`network.init_params` runs flax's `init` of the whole model in float32, on the host unless jitted:
44 GB for a T5-XXL, and a jitted init of it all holds every float32 leaf as a temporary. Here each
leaf is drawn by a small jitted program, `(normal or uniform) x its initializer's scale`, cast to
the target dtype inside the program and placed by its output sharding, so no float32 copy of the
model exists anywhere and the largest temporary is one leaf. The programs are cached by shape and
dtype (a T5 has about ten distinct leaf shapes), the scale being an argument.

The scales are those of `layers.py`'s initializers (T5X's): kernels variance_scaling(1, fan_in)
(truncated normal for the MLP and the head, normal for the attention, the query's divided by
sqrt(head_dim)), the embedding normal(1), relative-position tables variance_scaling(1, fan_avg,
uniform), norm scales ones. Random weights time the networks and exercise the loop; they are not a
trained model's.

`truncated_shared_encoder` makes the device bench's drafter: a `drafters.SharedEncoderDrafter` that is
the target's own first decoder layers, embedding, final norm and head (the same arrays, no copy),
reading the target's encoder output. `tree_bytes` and `copy_bandwidth` give a run's bytes and the
device's copy bandwidth.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network

# flax's truncated_normal initializer draws in [-2, 2] and divides by this stddev of the truncated
# standard normal, so its variance is the requested one.
_TRUNCATED_STDDEV = 0.87962566103423978
_ATTENTION_BLOCKS = ("attention", "self_attention", "encoder_decoder_attention")


def leaf_init(keys: tuple[str, ...], shape: tuple[int, ...], head_dim: int) -> tuple[str, float]:
  """The initializer of the parameter at path `keys` (T5X's tree) -> (kind, scale): kind
  'ones', 'normal', 'truncated' (scale = the stddev) or 'uniform' (scale = the half-width)."""
  name = keys[-1]
  if name == "scale":
    return "ones", 1.0
  if name == "embedding":
    return "normal", 1.0
  if name == "rel_embedding":  # [H, buckets], variance_scaling(1, fan_avg, uniform)
    return "uniform", math.sqrt(3.0 / ((shape[0] + shape[1]) / 2))
  if name != "kernel" or len(shape) != 2:
    raise ValueError(f"no initializer known for the parameter {'/'.join(keys)} {shape}.")
  std = 1.0 / math.sqrt(shape[0])  # fan_in of a [in, out] kernel
  if len(keys) >= 3 and keys[-3] in _ATTENTION_BLOCKS:
    return "normal", std / math.sqrt(head_dim) if keys[-2] == "query" else std
  return "truncated", std


@functools.cache
def _draw_fn(kind: str, shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
  """A jitted (key, scale) -> array [shape] of `dtype`, drawn in float32 and cast in-program."""

  def draw(key, scale):
    if kind == "ones":
      return jnp.ones(shape, dtype)
    if kind == "normal":
      x = jax.random.normal(key, shape, jnp.float32)
    elif kind == "truncated":
      x = jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) / _TRUNCATED_STDDEV
    else:
      x = jax.random.uniform(key, shape, jnp.float32, -1.0, 1.0)
    return (x * scale).astype(dtype)

  return jax.jit(draw, out_shardings=sharding)


def random_params_on_device(
    config: network.T5Config,
    seed: int,
    dtype: Any = jnp.bfloat16,
    sharding: Any = None,
    encoder_emb_dim: int | None = None,
) -> dict:
  """Random parameters of a `network.Transformer(config)` (or, with `encoder_emb_dim`, of a
  `network.SharedEncoderDecoder(config)` reading encoder outputs of that width), each leaf drawn on
  the device by its own jitted program in `dtype` (see the module docstring).

  sharding: one `jax.sharding.Sharding` for every leaf, or a tree of them like the parameters'
    (e.g. a partitioner's), or None (the default device).
  Returns the parameter tree (T5X's), every leaf a `jax.Array` of `dtype`.
  """
  shapes = (
      network.param_shapes(config)
      if encoder_emb_dim is None
      else network.shared_encoder_param_shapes(config, encoder_emb_dim)
  )
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)
  if sharding is None or isinstance(sharding, jax.sharding.Sharding):
    shardings = [sharding] * len(flat)
  else:
    shardings = jax.tree_util.tree_leaves(
        sharding, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    if len(shardings) != len(flat):
      raise ValueError(
          f"sharding has {len(shardings)} leaves but the parameters have {len(flat)}: give one "
          "sharding, or a tree of them like the parameters."
      )
  dtype = jnp.dtype(dtype)
  base = jax.random.PRNGKey(seed)
  leaves = []
  for i, ((path, shape), leaf_sharding) in enumerate(zip(flat, shardings)):
    keys = tuple(k.key for k in path)
    kind, scale = leaf_init(keys, tuple(shape), config.head_dim)
    fn = _draw_fn(kind, tuple(shape), dtype, leaf_sharding)
    leaves.append(fn(jax.random.fold_in(base, i), jnp.float32(scale)))
  return jax.tree_util.tree_unflatten(treedef, leaves)


def _is_shape(node: Any) -> bool:
  return isinstance(node, tuple) and all(isinstance(d, (int, np.integer)) for d in node)


def abstract_params(
    config: network.T5Config, dtype: Any = jnp.bfloat16, encoder_emb_dim: int | None = None
) -> dict:
  """What `random_params_on_device` returns, as `jax.ShapeDtypeStruct`s (nothing allocated)."""
  return jax.eval_shape(
      lambda: random_params_on_device(config, 0, dtype, encoder_emb_dim=encoder_emb_dim)
  )


def truncated_shared_encoder(
    config: network.T5Config, params: dict, num_layers: int
) -> tuple[drafters_lib.SharedEncoderDrafter, dict]:
  """The target `config`'s first `num_layers` decoder layers as a shared-encoder drafter
  -> (drafter, params): its token embedding, relative-position table, layers 0..num_layers-1,
  final norm and head are the target's own arrays (no copy), and it cross-attends to the target's
  encoder output. With the target's random weights it agrees with the target as often as the
  first layers steer the last ones: a nonzero alpha at a realistic price per draft."""
  if not 1 <= num_layers <= config.num_decoder_layers:
    raise ValueError(
        f"num_layers must be in 1..{config.num_decoder_layers} (the target's decoder layers), "
        f"got {num_layers}."
    )
  decoder = {
      name: value
      for name, value in params["decoder"].items()
      if not name.startswith("layers_") or int(name.split("_")[1]) < num_layers
  }
  drafter = drafters_lib.SharedEncoderDrafter(
      config.replace(num_decoder_layers=num_layers), config.emb_dim
  )
  return drafter, {"token_embedder": params["token_embedder"], "decoder": decoder}


def tree_bytes(tree: Any) -> int:
  """Bytes of every array (or `jax.ShapeDtypeStruct`) leaf of `tree`, each counted once."""
  seen, total = set(), 0
  for leaf in jax.tree_util.tree_leaves(tree):
    if id(leaf) in seen:
      continue
    seen.add(id(leaf))
    total += int(np.prod(leaf.shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize
  return total


def copy_bandwidth(megabytes: float = 4096.0, repeats: int = 10) -> dict:
  """The default device's bandwidth on a large device-to-device copy: a jitted y = 2 x of a
  float32 array of `megabytes`, which reads and writes every byte once -> {'bytes': the array's,
  'seconds': median of `repeats` timed calls, 'bytes_per_s': 2 bytes / seconds, 'min_seconds'}."""
  n = max(1, int(megabytes * 2**20 / 4))
  x = jax.jit(lambda: jnp.ones((n,), jnp.float32))()
  double = jax.jit(lambda x: x * 2.0)
  jax.block_until_ready(double(x))
  times = []
  for _ in range(int(repeats)):
    start = time.perf_counter()
    jax.block_until_ready(double(x))
    times.append(time.perf_counter() - start)
  seconds = float(np.median(times))
  return {
      "bytes": 4 * n,
      "seconds": seconds,
      "min_seconds": float(np.min(times)),
      "bytes_per_s": 2 * 4 * n / seconds,
  }
