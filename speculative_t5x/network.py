"""T5 1.1 encoder-decoder in flax linen, parameter for parameter T5X's minimal network.

The parameter tree equals `t5x/examples/t5/network.py` (2-D float32 kernels, one relative-position
bias table per stack, RMSNorm `scale`s, gated-GELU MLP), so T5X checkpoints load unchanged.

Unlike T5X's decoder, `Transformer.decode` scores k >= 1 new tokens per row against a partly filled
cache, at a per-row position `cache_index` (`[batch]` int32). Keys and values are written by
overwrite, queries attend causally inside the block and to every cached position before it, and the
relative-position bias is built for the `k x L` block. Rolling back after a rejection is only setting
`cache_index` back: slots at or after it are masked and later overwritten. Cross-attention keys and
values are computed once per sequence, in `init_decode_cache`.

Tree decoding (`Transformer.decode(..., tree=, slots=)`) scores a static `trees.DraftTree` in one
call: block slot b (0 the root, 1..M the nodes) is written at cache slot `cache_index + b`, sits at
relative position `cache_index + tree.depths[b]` and attends to the prefix (cache slots below
`cache_index`) and to its ancestors and itself (`tree.visible[b]`). `slots=(start, stop)` scores
only block slots start..stop-1, reading the keys of slots below `start` from the cache, so a drafter
can feed a tree one depth at a time. Once a node's path is accepted,
`move_cache_slots(cache, length + 1, length + tree.paths[node])` copies the path's keys and values
to the slots after the root, so the cache again holds a chain and rollback stays "reset the index".

`SharedEncoderDecoder` is the same token embedding and decoder without an encoder: it
cross-attends to another model's encoder output [B, Le, E_enc] (a drafter reading the target's,
E_enc the target's emb_dim), with `Transformer`'s teacher forcing, cache and `decode`; the
`shared_encoder_*` functions are its `init_params`, `param_axes`, `param_shapes` and
`teacher_forced_logits`.

Shapes: B batch, Le encoder length, k new decoder tokens, L cache length, H heads, D head_dim,
E emb_dim, E_enc the width of the encoder output read, V vocab_size, M draft-tree nodes, n moved
cache slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import trees

Array = jax.Array

# Attention-mask value used by T5X (`layers.combine_biases` path): masked logits get -1e10.
MASK_VALUE = -1e10
RMS_EPSILON = 1e-6

_ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": nn.gelu,  # tanh approximation, as flax's default and T5X's T5 1.1.
    "gelu_exact": functools.partial(nn.gelu, approximate=False),
    "silu": nn.silu,
    "swish": nn.silu,
    "linear": lambda x: x,
}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# T5Config's integer fields and their least values; T5 1.1 small's values, for the messages.
_MINIMUM_INTS = {
    "vocab_size": 1,
    "emb_dim": 1,
    "num_heads": 1,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "head_dim": 1,
    "mlp_dim": 1,
    "relative_attention_num_buckets": 4,
    "relative_attention_max_distance": 1,
}
_WHY_MINIMUM = {
    "relative_attention_num_buckets": (
        "the encoder splits the buckets between the two directions, and each direction "
        "needs at least one bucket for exact and one for log-spaced distances. "
    ),
}
_T5_1_1_SMALL = {
    "vocab_size": 32128,
    "emb_dim": 512,
    "num_heads": 6,
    "num_encoder_layers": 8,
    "num_decoder_layers": 8,
    "head_dim": 64,
    "mlp_dim": 1024,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 encoder-decoder, with T5X's field names and defaults.

  `dtype` is the activation dtype ('float32' or 'bfloat16'); parameters are always stored in
  float32 and logits are always float32.
  """

  vocab_size: int
  dtype: str = "float32"
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128

  def __post_init__(self):
    """Checks the type and range of every field, before any model is built: one ValueError
    naming the field, its value and the fix. Normalizes numpy integers, floats and bools to
    Python ones, `mlp_activations` to a tuple and `dtype` to its name."""
    for name, minimum in _MINIMUM_INTS.items():
      value = getattr(self, name)
      if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"T5Config.{name} must be an int, got {value!r} ({type(value).__name__}): give a "
            f"whole number >= {minimum} (T5 1.1 small: {name}={_T5_1_1_SMALL[name]})."
        )
      object.__setattr__(self, name, int(value))
      if value < minimum:
        raise ValueError(
            f"T5Config.{name} must be >= {minimum}, got {value}: {_WHY_MINIMUM.get(name, '')}"
            f"T5 1.1 small has {name}={_T5_1_1_SMALL[name]}."
        )
    max_exact = self.relative_attention_num_buckets // 2  # The decoder's exact buckets.
    if self.relative_attention_max_distance <= max_exact:
      raise ValueError(
          f"T5Config.relative_attention_max_distance must be > relative_attention_num_buckets "
          f"// 2 = {max_exact}, got {self.relative_attention_max_distance}: distances below "
          f"{max_exact} have a bucket each and the rest share log-spaced buckets up to "
          "max_distance (T5 uses 32 buckets and max_distance 128)."
      )
    for name in ("logits_via_embedding", "float32_attention_logits"):
      value = getattr(self, name)
      if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"T5Config.{name} must be True or False, got {value!r} ({type(value).__name__})."
        )
      object.__setattr__(self, name, bool(value))
    rate = self.dropout_rate
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, float, np.number)):
      raise ValueError(
          f"T5Config.dropout_rate must be a number in [0, 1), got {rate!r} "
          f"({type(rate).__name__}): 0.0 for inference, 0.1 is T5's training default."
      )
    object.__setattr__(self, "dropout_rate", float(rate))
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(
          f"T5Config.dropout_rate must be in [0, 1), got {rate!r}: 0.0 for inference, 0.1 is "
          "T5's training default."
      )
    try:
      dtype = self.dtype if isinstance(self.dtype, str) else jnp.dtype(self.dtype).name
    except TypeError as e:
      raise ValueError(
          f"T5Config.dtype {self.dtype!r} is not a dtype: use one of {sorted(_DTYPES)}."
      ) from e
    object.__setattr__(self, "dtype", dtype)
    if dtype not in _DTYPES:
      raise ValueError(
          f"T5Config.dtype {self.dtype!r} is not supported: use one of {sorted(_DTYPES)}."
      )
    activations = self.mlp_activations
    if isinstance(activations, str) or not isinstance(activations, Sequence) or not activations:
      raise ValueError(
          f"T5Config.mlp_activations must be a non-empty tuple of activation names, got "
          f"{activations!r}: "
          "e.g. ('gelu', 'linear') (T5 1.1) or ('relu',) (T5 1.0)."
      )
    object.__setattr__(self, "mlp_activations", tuple(activations))
    unknown = [a for a in self.mlp_activations if not isinstance(a, str) or a not in _ACTIVATIONS]
    if unknown:
      raise ValueError(
          f"T5Config.mlp_activations {self.mlp_activations} has unknown activation(s) "
          f"{unknown}: use names from {sorted(_ACTIVATIONS)} (T5 1.1 uses ('gelu', 'linear'))."
      )

  @property
  def activation_dtype(self):
    return _DTYPES[self.dtype]

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------------------------
# Relative position buckets (T5): computed in numpy, as compile-time constants.
# ----------------------------------------------------------------------------------------------
def relative_position_bucket(
    relative_position: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
  """T5's bucket of `memory_position - query_position` (int array in, int32 array out)."""
  n = -np.asarray(relative_position, np.int32)
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
      / math.log(max_distance / max_exact)
      * (num_buckets - max_exact)
  ).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  return (ret + np.where(is_small, n, val_if_large)).astype(np.int32)


class RelativePositionBiases(nn.Module):
  """One `rel_embedding [H, num_buckets]` table per stack, shared by its layers."""

  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool
  dtype: Any

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array) -> Array:
    """query_positions [B or 1, q], key_positions [B or 1, Lk] int32 -> bias [B or 1, H, q, Lk].

    The bucket of every relative distance in [-(n-1), n-1] is a numpy constant, n = q + Lk (so
    positions must lie in [0, n), as cache slots do); the per-row distances index into it.
    """
    rel_embedding = self.param(
        "rel_embedding",
        nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("heads", "relpos_buckets")
        ),
        (self.num_heads, self.num_buckets),
        jnp.float32,
    )
    span = key_positions.shape[-1] + query_positions.shape[-1]
    distances = np.arange(-span + 1, span)
    buckets = relative_position_bucket(
        distances, self.bidirectional, self.num_buckets, self.max_distance
    )
    bias_by_distance = jnp.asarray(rel_embedding, self.dtype)[:, buckets]  # [H, 2*span-1]
    relative = key_positions[:, None, :] - query_positions[:, :, None]  # [B, q, Lk]
    bias = jnp.take(bias_by_distance, relative + span - 1, axis=1, mode="clip")  # [H, B, q, Lk]
    return jnp.transpose(bias, (1, 0, 2, 3))


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------
class Dense(nn.Module):
  """x [..., in] @ kernel [in, features] with a 2-D float32 kernel, computed in `dtype`."""

  features: int
  dtype: Any
  kernel_axes: tuple[str, str]
  kernel_init: Any = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param(
        "kernel",
        nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
        (x.shape[-1], self.features),
        jnp.float32,
    )
    return jnp.dot(x.astype(self.dtype), jnp.asarray(kernel, self.dtype))


class RMSNorm(nn.Module):
  """T5's LayerNorm: x * rsqrt(mean(x^2) + 1e-6) in float32, then `scale` in `dtype`."""

  dtype: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale",
        nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        (x.shape[-1],),
        jnp.float32,
    )
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + RMS_EPSILON)
    return y.astype(self.dtype) * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """The shared token embedding `embedding [V, E]`; lookup by gather, `attend` for tied logits."""

  num_embeddings: int
  features: int
  dtype: Any

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
        (self.num_embeddings, self.features),
        jnp.float32,
    )

  def __call__(self, tokens: Array) -> Array:
    """tokens [B, l] int -> [B, l, E] in dtype."""
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, x: Array) -> Array:
    """x [B, l, E] -> [B, l, V] float32 (x @ embedding^T)."""
    return jnp.dot(x.astype(jnp.float32), self.embedding.T)


class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x @ wi_i) -> dropout -> @ wo (a single activation names it `wi`)."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = cfg.activation_dtype
    acts = cfg.mlp_activations
    h = None
    for i, name in enumerate(acts):
      dense_name = "wi" if len(acts) == 1 else f"wi_{i}"
      y = _ACTIVATIONS[name](Dense(cfg.mlp_dim, dtype, ("embed", "mlp"), name=dense_name)(x))
      h = y if h is None else h * y
    h = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(h, deterministic=deterministic)
    return Dense(cfg.emb_dim, dtype, ("mlp", "embed"), name="wo")(h)


class MultiHeadAttention(nn.Module):
  """Projections `query, key, value [E, H*D]`, `out [H*D, E]`; no 1/sqrt(D) at run time.

  As in T5X, the 1/sqrt(D) scaling is folded into the query kernel's initializer.
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    inner = cfg.num_heads * cfg.head_dim
    base_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

    def query_init(*args):
      return base_init(*args) / jnp.sqrt(cfg.head_dim).astype(args[-1])

    self.query = Dense(inner, dtype, ("embed", "joined_kv"), query_init)
    self.key = Dense(inner, dtype, ("embed", "joined_kv"), base_init)
    self.value = Dense(inner, dtype, ("embed", "joined_kv"), base_init)
    self.out = Dense(cfg.emb_dim, dtype, ("joined_kv", "embed"), base_init)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def _split(self, x: Array) -> Array:
    return x.reshape(x.shape[:-1] + (self.config.num_heads, self.config.head_dim))

  def project_query(self, x: Array) -> Array:
    """x [B, q, E] -> [B, q, H, D]."""
    return self._split(self.query(x))

  def project_key_value(self, x: Array) -> tuple[Array, Array]:
    """x [B, l, E] -> keys, values [B, l, H, D]."""
    return self._split(self.key(x)), self._split(self.value(x))

  def attend(
      self,
      query: Array,
      key: Array,
      value: Array,
      mask: Array,
      bias: Array | None,
      deterministic: bool,
  ) -> Array:
    """query [B, q, H, D], key/value [B, l, H, D], mask bool [B, 1, q, l], bias [B|1, H, q, l]
    -> [B, q, E]."""
    cfg = self.config
    logits_dtype = jnp.float32 if cfg.float32_attention_logits else cfg.activation_dtype
    logits = jnp.einsum("bqhd,bkhd->bhqk", query.astype(logits_dtype), key.astype(logits_dtype))
    logits = logits + jnp.where(mask, 0.0, MASK_VALUE).astype(logits_dtype)
    if bias is not None:
      logits = logits + bias.astype(logits_dtype)
    weights = jax.nn.softmax(logits).astype(cfg.activation_dtype)
    weights = self.dropout(weights, deterministic=deterministic)
    y = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
    return self.out(y.reshape(y.shape[:2] + (-1,)))

  def __call__(
      self, inputs_q: Array, inputs_kv: Array, mask: Array, bias: Array | None, deterministic: bool
  ) -> Array:
    key, value = self.project_key_value(inputs_kv)
    return self.attend(self.project_query(inputs_q), key, value, mask, bias, deterministic)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, mask: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    dtype = cfg.activation_dtype
    h = RMSNorm(dtype, name="pre_attention_layer_norm")(x)
    h = MultiHeadAttention(cfg, name="attention")(h, h, mask, bias, deterministic)
    x = x + dropout(h, deterministic=deterministic)
    h = RMSNorm(dtype, name="pre_mlp_layer_norm")(x)
    h = MlpBlock(cfg, name="mlp")(h, deterministic)
    return x + dropout(h, deterministic=deterministic)


class DecoderLayer(nn.Module):
  """Self-attention, cross-attention and MLP blocks, each pre-normed with a residual."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.pre_self_attention_layer_norm = RMSNorm(dtype)
    self.self_attention = MultiHeadAttention(cfg)
    self.pre_cross_attention_layer_norm = RMSNorm(dtype)
    self.encoder_decoder_attention = MultiHeadAttention(cfg)
    self.pre_mlp_layer_norm = RMSNorm(dtype)
    self.mlp = MlpBlock(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def _cross_and_mlp(self, x, cross_key, cross_value, cross_mask, deterministic):
    h = self.pre_cross_attention_layer_norm(x)
    h = self.encoder_decoder_attention.attend(
        self.encoder_decoder_attention.project_query(h),
        cross_key,
        cross_value,
        cross_mask,
        None,
        deterministic,
    )
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(h, deterministic=deterministic)

  def __call__(self, x, encoded, self_mask, self_bias, cross_mask, deterministic):
    """Teacher-forced: x [B, l, E], encoded [B, Le, E] -> [B, l, E]."""
    h = self.pre_self_attention_layer_norm(x)
    h = self.self_attention(h, h, self_mask, self_bias, deterministic)
    x = x + self.dropout(h, deterministic=deterministic)
    cross_key, cross_value = self.encoder_decoder_attention.project_key_value(encoded)
    return self._cross_and_mlp(x, cross_key, cross_value, cross_mask, deterministic)

  def cross_key_value(self, encoded: Array) -> tuple[Array, Array]:
    """encoded [B, Le, E] -> cross-attention keys, values [B, Le, H, D]."""
    return self.encoder_decoder_attention.project_key_value(encoded)

  def decode(self, x, layer_cache, write_index, self_mask, self_bias, cross_mask):
    """x [B, k, E], written at cache slots write_index[b] + (0..k-1) -> ([B, k, E], updated layer
    cache); self_mask [B, 1, k, L] and self_bias [B, H, k, L] place the queries."""
    h = self.pre_self_attention_layer_norm(x)
    query = self.self_attention.project_query(h)
    key, value = self.self_attention.project_key_value(h)
    write = jax.vmap(lambda buf, new, i: jax.lax.dynamic_update_slice_in_dim(buf, new, i, axis=0))
    cached_key = write(
        layer_cache["self_key"], key.astype(layer_cache["self_key"].dtype), write_index
    )
    cached_value = write(
        layer_cache["self_value"], value.astype(layer_cache["self_value"].dtype), write_index
    )
    h = self.self_attention.attend(query, cached_key, cached_value, self_mask, self_bias, True)
    x = x + h
    x = self._cross_and_mlp(
        x, layer_cache["cross_key"], layer_cache["cross_value"], cross_mask, True
    )
    new_cache = dict(layer_cache, self_key=cached_key, self_value=cached_value)
    return x, new_cache


def attention_mask(query_valid: Array, key_valid: Array) -> Array:
  """[B, q] bool, [B, l] bool -> [B, 1, q, l] bool."""
  return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def _segment_mask(query_segments: Array | None, key_segments: Array | None) -> Array | bool:
  if query_segments is None:
    return True
  return (query_segments[:, :, None] == key_segments[:, None, :])[:, None]


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, segment_ids: Array | None, deterministic: bool) -> Array:
    """tokens [B, Le] (0 = padding) -> encoded [B, Le, E]."""
    cfg = self.config
    dtype = cfg.activation_dtype
    relpos = RelativePositionBiases(
        cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance,
        cfg.num_heads,
        bidirectional=True,
        dtype=dtype,
        name="relpos_bias",
    )
    positions = jnp.arange(tokens.shape[1])[None]
    bias = relpos(positions, positions)
    valid = tokens > 0
    mask = attention_mask(valid, valid) & _segment_mask(segment_ids, segment_ids)
    dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    x = dropout(self.shared_embedding(tokens), deterministic=deterministic).astype(dtype)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, mask, bias, deterministic)
    x = RMSNorm(dtype, name="encoder_norm")(x)
    return dropout(x, deterministic=deterministic)


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.relpos_bias = RelativePositionBiases(
        cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance,
        cfg.num_heads,
        bidirectional=False,
        dtype=dtype,
    )
    self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_decoder_layers)]
    self.decoder_norm = RMSNorm(dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(cfg.vocab_size, jnp.float32, ("embed", "vocab"))

  def _logits(self, x: Array, deterministic: bool) -> Array:
    return self._logits_of_features(self.dropout(self.decoder_norm(x), deterministic=deterministic))

  def _logits_of_features(self, features: Array) -> Array:
    """The logits layer: final-normed hidden states [..., E] -> logits [..., V] float32."""
    if self.config.logits_via_embedding:
      return self.shared_embedding.attend(features) / jnp.sqrt(features.shape[-1])
    return self.logits_dense(features)

  def __call__(
      self,
      encoded,
      encoder_tokens,
      decoder_input_tokens,
      decoder_target_tokens,
      encoder_segment_ids,
      decoder_segment_ids,
      deterministic,
      return_features=False,
  ):
    """Teacher-forced decoder: -> logits [B, l, V] float32; with return_features, (logits,
    features [B, l, E]), the final-normed hidden states the logits layer reads."""
    length = decoder_input_tokens.shape[1]
    target_valid = decoder_target_tokens > 0
    causal = jnp.tril(jnp.ones((length, length), bool))[None, None]
    self_mask = (
        attention_mask(target_valid, target_valid)
        & causal
        & _segment_mask(decoder_segment_ids, decoder_segment_ids)
    )
    cross_mask = attention_mask(target_valid, encoder_tokens > 0) & _segment_mask(
        decoder_segment_ids, encoder_segment_ids
    )
    positions = jnp.arange(length)[None]
    bias = self.relpos_bias(positions, positions)
    x = self.dropout(self.shared_embedding(decoder_input_tokens), deterministic=deterministic)
    x = x.astype(self.config.activation_dtype)
    for layer in self.layers:
      x = layer(x, encoded, self_mask, bias, cross_mask, deterministic)
    if return_features:
      features = self.dropout(self.decoder_norm(x), deterministic=deterministic)
      return self._logits_of_features(features), features
    return self._logits(x, deterministic)

  def init_cache(self, encoded: Array, encoder_tokens: Array, cache_length: int) -> dict:
    return init_layer_caches(self.config, self.layers, encoded, encoder_tokens, cache_length)

  def decode(
      self,
      tokens: Array,
      cache: dict,
      cache_index: Array,
      tree: trees.DraftTree | None = None,
      slots: tuple[int, int] | None = None,
      return_features: bool = False,
  ) -> tuple[Array, dict] | tuple[Array, Array, dict]:
    """tokens [B, k] -> (logits [B, k, V], cache): a chain at cache_index + (0..k-1), or the
    block slots slots[0]..slots[1]-1 of `tree` (inputs checked by `Transformer.decode`). With
    return_features, (logits, features [B, k, E], cache): features are the final-normed hidden
    states that the logits layer reads (what a feature-level drafter consumes)."""
    cache_length = cache["layers_0"]["self_key"].shape[1]
    positions, key_positions, self_mask, write_index = decode_placement(
        cache_length, cache_index, tokens.shape[1], tree, slots
    )
    query_valid = jnp.ones(tokens.shape, bool)
    cross_mask = attention_mask(query_valid, cache["encoder_valid"])
    bias = self.relpos_bias(positions, key_positions)
    x = self.shared_embedding(tokens).astype(self.config.activation_dtype)
    new_cache = {"encoder_valid": cache["encoder_valid"]}
    for i, layer in enumerate(self.layers):
      x, new_cache[f"layers_{i}"] = layer.decode(
          x, cache[f"layers_{i}"], write_index, self_mask, bias, cross_mask
      )
    if return_features:
      features = self.decoder_norm(x)
      return self._logits_of_features(features), features, new_cache
    return self._logits(x, True), new_cache


def init_layer_caches(
    config: T5Config,
    layers: Sequence[DecoderLayer],
    encoded: Array,
    encoder_tokens: Array,
    cache_length: int,
) -> dict:
  """The decode cache of a stack of `DecoderLayer`s: zero self-attention keys and values
  [B, cache_length, H, D] and cross-attention keys and values [B, Le, H, D] computed once from
  `encoded` [B, Le, E_enc] -> {'encoder_valid': [B, Le] bool, 'layers_i': {...}}."""
  batch = encoded.shape[0]
  cache = {"encoder_valid": encoder_tokens > 0}
  for i, layer in enumerate(layers):
    cross_key, cross_value = layer.cross_key_value(encoded)
    zeros = jnp.zeros(
        (batch, cache_length, config.num_heads, config.head_dim), config.activation_dtype
    )
    cache[f"layers_{i}"] = {
        "self_key": zeros,
        "self_value": zeros,
        "cross_key": cross_key,
        "cross_value": cross_value,
    }
  return cache


def decode_placement(
    cache_length: int,
    cache_index: Array,
    k: int,
    tree: trees.DraftTree | None = None,
    slots: tuple[int, int] | None = None,
) -> tuple[Array, Array, Array, Array]:
  """Where a cached decode of k tokens sits: a chain at cache_index [B] + (0..k-1), or the block
  slots slots[0]..slots[1]-1 of `tree` (see `Transformer.decode`).

  Returns:
    positions [B, k] (the queries' relative positions), key_positions [B, L] (each cache slot's),
    self_mask [B, 1, k, L] (which slots each query sees) and write_index [B] (the cache slot the
    first token is written at).
  """
  cache_slots = jnp.arange(cache_length)
  if tree is None:
    positions = cache_index[:, None] + jnp.arange(k)[None]  # [B, k]
    self_mask = (cache_slots[None, None, :] <= positions[:, :, None])[:, None]
    return positions, cache_slots[None], self_mask, cache_index
  start, stop = slots
  depths = jnp.asarray(tree.depths)
  positions = cache_index[:, None] + depths[start:stop][None]  # [B, k]
  block_slot = cache_slots[None] - cache_index[:, None]  # [B, L]: the block slot held there
  in_block = (block_slot >= 0) & (block_slot < tree.width)
  block_slot = jnp.clip(block_slot, 0, tree.width - 1)
  key_positions = jnp.where(in_block, cache_index[:, None] + depths[block_slot], cache_slots)
  visible = jnp.take(jnp.asarray(tree.visible[start:stop]), block_slot, axis=1)  # [k, B, L]
  sees_block = in_block[:, None, :] & jnp.transpose(visible, (1, 0, 2))
  self_mask = ((cache_slots[None, None, :] < cache_index[:, None, None]) | sees_block)[:, None]
  return positions, key_positions, self_mask, cache_index + start


def _check_tokens(name: str, tokens: Any) -> None:
  shape = np.shape(tokens)
  if len(shape) != 2:
    raise ValueError(
        f"{name} must be a rank-2 [batch, length] array of token ids, got shape {shape}: "
        "add a batch dimension (tokens[None]) or flatten extra axes."
    )
  dtype = np.dtype(tokens.dtype if hasattr(tokens, "dtype") else np.asarray(tokens).dtype)
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(
        f"{name} must hold integer token ids, got dtype {dtype}: cast with " ".astype(np.int32)."
    )


def _check_encoded(encoded: Any, encoder_input_tokens: Any) -> None:
  """An encoder output must be [B, Le, E], with the B and Le of encoder_input_tokens [B, Le]."""
  shape, tokens_shape = np.shape(encoded), np.shape(encoder_input_tokens)
  if len(shape) != 3 or shape[:2] != tokens_shape:
    raise ValueError(
        f"encoded must be the encoder output [batch, length, emb_dim] of encoder_input_tokens "
        f"{tokens_shape}, got shape {shape}: pass the output of the encoder that read those "
        "tokens (for a SharedEncoderDecoder, the target's `Transformer.encode`)."
    )


class _CachedDecoderModel(nn.Module):
  """What decoding runs per token, T5X's `token_embedder` and `decoder` subtrees: teacher-forced
  from an encoder output (`teacher_forced`), or k tokens at a time from a cache
  (`init_decode_cache`, `decode`). `Transformer` adds an encoder of its own;
  `SharedEncoderDecoder` reads another model's encoder output."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype)
    self.decoder = Decoder(cfg, self.token_embedder)

  def teacher_forced(
      self,
      encoded: Array,
      encoder_input_tokens: Array,
      decoder_input_tokens: Array,
      decoder_target_tokens: Array,
      encoder_segment_ids: Array | None = None,
      decoder_segment_ids: Array | None = None,
      *,
      enable_dropout: bool = False,
      return_features: bool = False,
  ) -> Array | tuple[Array, Array]:
    """encoded [B, Le, E_enc] of encoder_input_tokens [B, Le], decoder_input_tokens and
    decoder_target_tokens [B, l] -> logits [B, l, V] float32 (token 0 is padding; the decoder
    mask comes from decoder_target_tokens, as in T5X); with return_features, (logits, features
    [B, l, E]): the final-normed hidden states the logits layer reads."""
    for name, tokens in (
        ("encoder_input_tokens", encoder_input_tokens),
        ("decoder_input_tokens", decoder_input_tokens),
        ("decoder_target_tokens", decoder_target_tokens),
    ):
      _check_tokens(name, tokens)
    if np.shape(decoder_input_tokens) != np.shape(decoder_target_tokens):
      raise ValueError(
          f"decoder_input_tokens {np.shape(decoder_input_tokens)} and "
          f"decoder_target_tokens {np.shape(decoder_target_tokens)} must have one shape: "
          "the inputs are the targets shifted right by one."
      )
    _check_encoded(encoded, encoder_input_tokens)
    return self.decoder(
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens,
        encoder_segment_ids,
        decoder_segment_ids,
        not enable_dropout,
        return_features,
    )

  def init_decode_cache(
      self, encoded: Array, encoder_input_tokens: Array, cache_length: int
  ) -> dict:
    """Zero self-attention caches [B, cache_length, H, D] and cross-attention keys/values
    [B, Le, H, D] computed once from `encoded` [B, Le, E_enc]."""
    _check_tokens("encoder_input_tokens", encoder_input_tokens)
    _check_encoded(encoded, encoder_input_tokens)
    if int(cache_length) < 1:
      raise ValueError(f"cache_length must be >= 1, got {cache_length}.")
    return self.decoder.init_cache(encoded, encoder_input_tokens, int(cache_length))

  def decode(
      self,
      decoder_tokens: Array,
      cache: dict,
      cache_index: Array,
      tree: trees.DraftTree | None = None,
      slots: tuple[int, int] | None = None,
      return_features: bool = False,
  ) -> tuple[Array, dict] | tuple[Array, Array, dict]:
    """Scores decoder_tokens [B, k] at positions cache_index[b] + (0..k-1), or as draft-tree slots.

    Writes their keys/values into the cache by overwrite; each query sees cached positions
    0..its own position. Returns logits [B, k, V] (float32) and the updated cache. The caller
    advances (or rolls back) `cache_index`; positions must stay below the cache length.

    With `tree` (a `trees.DraftTree`), decoder_tokens are the tree's block slots start..stop-1,
    `slots = (start, stop)` static ints (default (0, tree.width): the root and every node), so
    k = stop - start. Block slot b is written at cache slot cache_index + b, sits at position
    cache_index + tree.depths[b], and sees the cache below cache_index and the block slots
    `tree.visible[b]` (its ancestors and itself); those below `start` are read from the cache, as
    an earlier call at the same cache_index wrote them (feeding a tree one depth at a time, e.g.
    slots=tree.levels[d], gives the logits of one whole-tree call). The block needs cache slots up
    to cache_index + stop - 1. After accepting a path, see `move_cache_slots`.

    With return_features, returns (logits, features [B, k, E], cache): the final-normed hidden
    states the logits layer reads, which a feature-level drafter consumes.
    """
    _check_tokens("decoder_tokens", decoder_tokens)
    cache_length = cache["layers_0"]["self_key"].shape[1]
    k = decoder_tokens.shape[1]
    if np.shape(cache_index) != (decoder_tokens.shape[0],):
      raise ValueError(
          f"cache_index must have shape [batch] = ({decoder_tokens.shape[0]},), got "
          f"{np.shape(cache_index)}: give one write position per row."
      )
    if tree is None:
      if slots is not None:
        raise ValueError(
            f"slots={slots!r} picks block slots of a draft tree, but tree is None: pass "
            "tree=trees.DraftTree(...) with it, or drop slots for a chain of k tokens."
        )
      stop, block, what, spare = k, f"a block of {k} tokens", f"{k} tokens", "gamma + 1"
    else:
      slots = _check_tree_slots(tree, slots, k)
      stop = slots[1]
      block = f"a tree block up to slot {stop - 1}"
      what = f"tree block slots {slots[0]}..{stop - 1}"
      spare = f"{tree.width} (the tree's width)"
    if stop > cache_length:
      raise ValueError(
          f"{block} does not fit a cache of length {cache_length}: "
          f"make the cache at least max_decode_len + {spare} long."
      )
    if not isinstance(cache_index, jax.core.Tracer):
      end = int(np.max(np.asarray(cache_index))) + stop
      if end > cache_length:
        raise ValueError(
            f"writing {what} at cache_index {int(end - stop)} needs {end} cache slots "
            f"but the cache holds {cache_length}: make the cache longer "
            f"(max_decode_len + {spare}) or roll cache_index back."
        )
    return self.decoder.decode(
        decoder_tokens, cache, jnp.asarray(cache_index, jnp.int32), tree, slots, return_features
    )


class Transformer(_CachedDecoderModel):
  """T5 1.1 encoder-decoder with T5X's parameter tree and a k-token cached `decode`.

  Methods (call through `apply(..., method=...)`):
    __call__(encoder_input_tokens [B, Le], decoder_input_tokens [B, l], decoder_target_tokens
      [B, l]) -> teacher-forced logits [B, l, V] float32 (token 0 is padding; the decoder mask
      comes from decoder_target_tokens, as in T5X).
    encode(encoder_input_tokens) -> encoded [B, Le, E].
    teacher_forced(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens)
      -> the logits of __call__ from an encoder output computed already.
    init_decode_cache(encoded, encoder_input_tokens, cache_length) -> cache.
    prefill(encoder_input_tokens, cache_length) -> (encoded, cache): `encode` and
      `init_decode_cache` in one call.
    decode(tokens [B, k], cache, cache_index [B], tree=None, slots=None) -> (logits [B, k, V]
      float32, cache): k tokens of a chain, or block slots slots[0]..slots[1]-1 of a draft tree.

  The module-level `move_cache_slots(cache, destination, sources)` (a pure function, no `apply`)
  makes an accepted tree path's cache slots contiguous after a tree `decode`.
  """

  def setup(self):
    super().setup()
    self.encoder = Encoder(self.config, self.token_embedder)

  def encode(
      self,
      encoder_input_tokens: Array,
      encoder_segment_ids: Array | None = None,
      *,
      enable_dropout: bool = False,
  ) -> Array:
    _check_tokens("encoder_input_tokens", encoder_input_tokens)
    return self.encoder(encoder_input_tokens, encoder_segment_ids, not enable_dropout)

  def __call__(
      self,
      encoder_input_tokens: Array,
      decoder_input_tokens: Array,
      decoder_target_tokens: Array,
      encoder_segment_ids: Array | None = None,
      decoder_segment_ids: Array | None = None,
      *,
      enable_dropout: bool = False,
  ) -> Array:
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout=enable_dropout)
    return self.teacher_forced(
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens,
        encoder_segment_ids,
        decoder_segment_ids,
        enable_dropout=enable_dropout,
    )

  def prefill(self, encoder_input_tokens: Array, cache_length: int) -> tuple[Array, dict]:
    """What decoding does once per sequence: `encode`, then `init_decode_cache`
    -> (encoded [B, Le, E], cache)."""
    encoded = self.encode(encoder_input_tokens)
    return encoded, self.init_decode_cache(encoded, encoder_input_tokens, cache_length)


class SharedEncoderDecoder(_CachedDecoderModel):
  """A T5 1.1 decoder without an encoder of its own: it cross-attends to another model's encoder
  output (a speculative drafter reading the target's, as Distil-Whisper's assistant model does).

  Its parameter tree is a `Transformer`'s without 'encoder': {'token_embedder': {'embedding'
  [V, E]}, 'decoder': the `Decoder`'s tree}. Its own width E = config.emb_dim may differ from
  the encoder output's E_enc: the cross-attention key and value kernels are [E_enc, H*D] (query
  [E, H*D], out [H*D, E]). config.num_encoder_layers is not used (any valid value will do); the
  relative-position settings are the decoder's.

  Methods (call through `apply(..., method=...)`), as `Transformer`'s with `encoded` [B, Le, E_enc]
  given instead of computed:
    __call__(encoded, encoder_input_tokens [B, Le], decoder_input_tokens [B, l],
      decoder_target_tokens [B, l]) -> teacher-forced logits [B, l, V] float32.
    init_decode_cache(encoded, encoder_input_tokens, cache_length) -> cache.
    decode(tokens [B, k], cache, cache_index [B], tree=None, slots=None) -> (logits [B, k, V]
      float32, cache), with `Transformer.decode`'s checks and semantics.
  """

  __call__ = _CachedDecoderModel.teacher_forced  # its forward pass: the decoder, teacher-forced.


def _check_tree_slots(tree: Any, slots: Any, k: int) -> tuple[int, int]:
  """Checks `Transformer.decode`'s tree, slots and block width -> (start, stop) as ints."""
  if not isinstance(tree, trees.DraftTree):
    raise ValueError(
        f"tree must be a trees.DraftTree or None, got {tree!r} ({type(tree).__name__}): build "
        "one with trees.DraftTree.from_branching((k_1, ..., k_D)) or trees.as_tree(branching)."
    )
  if slots is None:
    slots = (0, tree.width)
  if (
      not isinstance(slots, (tuple, list))
      or len(slots) != 2
      or any(isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) for s in slots)
  ):
    raise ValueError(
        f"slots must be a (start, stop) pair of static ints, got {slots!r}: e.g. tree.levels[d] "
        f"for the block slots at depth d, or None for the whole tree (0, {tree.width})."
    )
  start, stop = int(slots[0]), int(slots[1])
  if not 0 <= start < stop <= tree.width:
    raise ValueError(
        f"slots ({start}, {stop}) must satisfy 0 <= start < stop <= tree.width = {tree.width}: "
        f"the tree's block slots are 0 (the root) to {tree.width - 1}; e.g. tree.levels[d] "
        "for depth d."
    )
  if k != stop - start:
    raise ValueError(
        f"decoder_tokens holds {k} tokens per row but slots ({start}, {stop}) name "
        f"{stop - start} block slots: give one token per block slot {start}..{stop - 1}."
    )
  return start, stop


def move_cache_slots(cache: dict, destination: Array, sources: Array) -> dict:
  """Copies decoder self-attention cache slots: per row b, slots destination[b] + j take the old
  contents of slots sources[b, j], j = 0..n-1 (every read comes before any write).

  After a tree `Transformer.decode` at cache_index `length` accepts the path to block slot
  `node`, `move_cache_slots(cache, length + 1, length + tree.paths[node])` puts the path's keys
  and values right after the root's, so the cache holds a chain again and rolling back stays
  setting the index (`tree.paths` pads past the node's depth with slots that stay in place).

  Args:
    cache: a `Transformer` decode cache; each `layers_i`'s `self_key` and `self_value`
      [B, L, H, D] are moved, cross-attention keys/values and `encoder_valid` are kept.
    destination: [B] int32, the first slot written per row; destination[b] + n <= L.
    sources: [B, n] int32 (n static), the slots read, in [0, L).
  Returns:
    The moved cache (a new dict; a pure function of fixed-size gathers and
    `dynamic_update_slice`s, fine under jit).
  """
  keys = cache["layers_0"]["self_key"]
  batch, cache_length = keys.shape[:2]
  if np.shape(destination) != (batch,) or len(np.shape(sources)) != 2:
    raise ValueError(
        f"move_cache_slots needs destination [batch] = ({batch},) and sources [batch, n], got "
        f"{np.shape(destination)} and {np.shape(sources)}: give one start slot and n source "
        "slots per row."
    )
  n = np.shape(sources)[1]
  if np.shape(sources)[0] != batch or not 1 <= n <= cache_length:
    raise ValueError(
        f"move_cache_slots' sources must be [batch, n] = ({batch}, 1..{cache_length}), got "
        f"{np.shape(sources)}: n slots per row, at most the cache length."
    )
  if not isinstance(destination, jax.core.Tracer) and not isinstance(sources, jax.core.Tracer):
    last = int(np.max(np.asarray(destination))) + n
    low, high = int(np.min(np.asarray(sources))), int(np.max(np.asarray(sources)))
    if last > cache_length or low < 0 or high >= cache_length:
      raise ValueError(
          f"move_cache_slots reads slots {low}..{high} and writes up to slot {last - 1}, but "
          f"the cache has slots 0..{cache_length - 1}: keep destination + n and sources within "
          "the cache (make it max_decode_len + M + 1 long)."
      )
  destination = jnp.asarray(destination, jnp.int32)
  sources = jnp.asarray(sources, jnp.int32)
  gather = jax.vmap(lambda buf, rows: jnp.take(buf, rows, axis=0, mode="clip"))
  write = jax.vmap(lambda buf, new, i: jax.lax.dynamic_update_slice_in_dim(buf, new, i, axis=0))
  moved = dict(cache)
  for name, entry in cache.items():
    if name.startswith("layers_"):
      moved[name] = dict(
          entry,
          **{
              field: write(entry[field], gather(entry[field], sources), destination)
              for field in ("self_key", "self_value")
          },
      )
  return moved


def _boxed_params(
    config: T5Config,
    rng: Array,
    encoder_length: int,
    decoder_length: int,
    encoder_emb_dim: int | None = None,
) -> Any:
  """`init` of a `Transformer` (encoder_emb_dim None) or of a `SharedEncoderDecoder` reading an
  encoder output [1, encoder_length, encoder_emb_dim] -> params boxed with their logical axes."""
  tokens = jnp.ones((1, encoder_length), jnp.int32)
  dec = jnp.ones((1, decoder_length), jnp.int32)
  if encoder_emb_dim is None:
    return Transformer(config).init(rng, tokens, dec, dec)["params"]
  if isinstance(encoder_emb_dim, bool) or not isinstance(encoder_emb_dim, (int, np.integer)):
    raise ValueError(f"encoder_emb_dim must be an int, got {encoder_emb_dim!r}.")
  if encoder_emb_dim < 1:
    raise ValueError(
        f"encoder_emb_dim must be >= 1 (the width of the encoder output read), got "
        f"{encoder_emb_dim}."
    )
  encoded = jnp.zeros((1, encoder_length, int(encoder_emb_dim)), jnp.float32)
  return SharedEncoderDecoder(config).init(rng, encoded, tokens, dec, dec)["params"]


def _axes(boxed: Any) -> dict:
  return jax.tree.map(
      lambda x: x.names, boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )


def _shapes(unboxed: Any) -> dict:
  return jax.tree.map(lambda x: tuple(x.shape), unboxed)


def init_params(
    config: T5Config, rng: Array, encoder_length: int = 4, decoder_length: int = 4
) -> dict:
  """Randomly initialised float32 parameters (a plain nested dict, T5X's tree)."""
  return nn.meta.unbox(_boxed_params(config, rng, encoder_length, decoder_length))


def teacher_forced_logits(
    config: T5Config, params: Any, encoder_input_tokens: Array, decoder_input_tokens: Array
) -> Array:
  """Logits [B, L, V] at every position of decoder_input_tokens [B, L] (BOS, then a sequence
  shifted right). The decoder mask comes from all-ones targets, so a 0 after position 0 is a token,
  as in decoding, not padding."""
  return Transformer(config).apply(
      {"params": params},
      encoder_input_tokens,
      decoder_input_tokens,
      jnp.ones_like(decoder_input_tokens),
  )


def param_axes(config: T5Config) -> dict:
  """Logical axis names of every parameter (a tree of `nn.LogicallyPartitioned.names`)."""
  return _axes(jax.eval_shape(lambda: _boxed_params(config, jax.random.PRNGKey(0), 1, 1)))


def param_shapes(config: T5Config) -> dict:
  """Expected shape of every parameter, as a nested dict of tuples (no allocation)."""
  return _shapes(jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), 1, 1)))


def shared_encoder_init_params(
    config: T5Config,
    encoder_emb_dim: int,
    rng: Array,
    encoder_length: int = 4,
    decoder_length: int = 4,
) -> dict:
  """Randomly initialised float32 parameters of a `SharedEncoderDecoder(config)` reading an
  encoder output of width encoder_emb_dim (E_enc) -> {'token_embedder', 'decoder'}."""
  return nn.meta.unbox(_boxed_params(config, rng, encoder_length, decoder_length, encoder_emb_dim))


def shared_encoder_teacher_forced_logits(
    config: T5Config,
    params: Any,
    encoded: Array,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
) -> Array:
  """`teacher_forced_logits` of a `SharedEncoderDecoder(config)`: logits [B, L, V] at every
  position of decoder_input_tokens [B, L], cross-attending to encoded [B, Le, E_enc] (the encoder
  output of encoder_input_tokens [B, Le])."""
  return SharedEncoderDecoder(config).apply(
      {"params": params},
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      jnp.ones_like(decoder_input_tokens),
  )


def shared_encoder_param_axes(config: T5Config, encoder_emb_dim: int) -> dict:
  """Logical axis names of every parameter of a `SharedEncoderDecoder(config)`."""
  return _axes(
      jax.eval_shape(lambda: _boxed_params(config, jax.random.PRNGKey(0), 1, 1, encoder_emb_dim))
  )


def shared_encoder_param_shapes(config: T5Config, encoder_emb_dim: int) -> dict:
  """Expected shape of every parameter of a `SharedEncoderDecoder(config)` reading an encoder
  output of width encoder_emb_dim, as a nested dict of tuples (no allocation)."""
  return _shapes(
      jax.eval_shape(
          lambda: shared_encoder_init_params(config, encoder_emb_dim, jax.random.PRNGKey(0), 1, 1)
      )
  )
