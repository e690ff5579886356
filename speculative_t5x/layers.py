"""The building blocks of the T5 1.1 network in flax linen, parameter for parameter T5X's.

As in `t5x/examples/t5/layers.py`, every parameter is float32 (kernels 2-D), boxed with its logical
axes (`nn.with_logical_partitioning`) and cast to the activation dtype where it is used; logits
are float32. The blocks:

  - `Dense` (x @ kernel [in, features]), `RMSNorm` (T5's LayerNorm, a `scale` [E], no bias or
    mean), `Embed` (the token embedding [V, E], shared by the stacks and, with tied logits, the
    logits layer), `MlpBlock` (gated MLP, `wi` or `wi_i` [E, F] and `wo` [F, E]) and
    `MultiHeadAttention` (`query`, `key`, `value` [E, H*D] and `out` [H*D, E], the 1/sqrt(D)
    scaling folded into the query kernel's initializer);
  - `RelativePositionBiases`: one `rel_embedding` [H, num_buckets] table per stack, indexed by
    T5's buckets of the key-minus-query distance (`relative_position_bucket`, numpy constants);
  - `EncoderLayer` and `DecoderLayer` (pre-norm blocks with residuals), and the stacks `Encoder`
    and `Decoder` (their `relpos_bias`, `layers_i`, final norm and, untied, `logits_dense`
    [E, V]);
  - the attention masks (`attention_mask`, True where a query may see a key) and the decode
    cache of a stack of `DecoderLayer`s: `init_layer_caches` builds it, `decode_placement` says
    where a chain of k tokens or a draft tree's block slots sit in it (positions, mask, write
    slot), and `Decoder.decode` / `DecoderLayer.decode` write k tokens' keys and values into it
    by overwrite and attend (what `network.Transformer.decode` and the feature drafter run).

The models that put them together and their checks are in `network.py`, `T5Config` in `config.py`.

Shapes: B batch, Le encoder length, l decoder length, q queries, k new decoder tokens, L cache
length, H heads, D head_dim, E emb_dim (E_enc the width of an encoder output read), F mlp_dim,
V vocab_size. Masks are bool [B, 1, q, Lk] (broadcast over heads), biases [B or 1, H, q, Lk].
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import trees
from speculative_t5x.config import ACTIVATIONS  # noqa: F401  (layers.ACTIVATIONS)
from speculative_t5x.config import T5Config

Array = jax.Array

# Attention-mask value used by T5X (`layers.combine_biases` path): masked logits get -1e10.
MASK_VALUE = -1e10
RMS_EPSILON = 1e-6


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
      y = ACTIVATIONS[name](Dense(cfg.mlp_dim, dtype, ("embed", "mlp"), name=dense_name)(x))
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
      feature_layers=(),
  ):
    """Teacher-forced decoder: -> logits [B, l, V] float32; with return_features, (logits,
    features [B, l, E (1 + len(feature_layers))]) (`_features`)."""
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
    outputs = []
    for layer in self.layers:
      x = layer(x, encoded, self_mask, bias, cross_mask, deterministic)
      outputs.append(x)
    if return_features:
      final = self.dropout(self.decoder_norm(x), deterministic=deterministic)
      return self._logits_of_features(final), self._features(final, outputs, feature_layers)
    return self._logits(x, deterministic)

  def _features(self, final: Array, outputs: list[Array], feature_layers: tuple[int, ...]) -> Array:
    """What a feature-level drafter reads: the final-normed hidden states [..., E] the logits
    layer reads, then for each index i in feature_layers the output of decoder layer i under the
    same final norm (EAGLE-3's lower-layer features) -> [..., E (1 + len(feature_layers))]."""
    if not feature_layers:  # the loop's usual case: no concatenation in the traced step.
      return final
    return jnp.concatenate([final] + [self.decoder_norm(outputs[i]) for i in feature_layers], -1)

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
      feature_layers: tuple[int, ...] = (),
  ) -> tuple[Array, dict] | tuple[Array, Array, dict]:
    """tokens [B, k] -> (logits [B, k, V], cache): a chain at cache_index + (0..k-1), or the
    block slots slots[0]..slots[1]-1 of `tree` (inputs checked by `Transformer.decode`). With
    return_features, (logits, features [B, k, E (1 + len(feature_layers))], cache): what a
    feature-level drafter consumes (`_features`)."""
    cache_length = cache["layers_0"]["self_key"].shape[1]
    positions, key_positions, self_mask, write_index = decode_placement(
        cache_length, cache_index, tokens.shape[1], tree, slots
    )
    query_valid = jnp.ones(tokens.shape, bool)
    cross_mask = attention_mask(query_valid, cache["encoder_valid"])
    bias = self.relpos_bias(positions, key_positions)
    x = self.shared_embedding(tokens).astype(self.config.activation_dtype)
    new_cache = {"encoder_valid": cache["encoder_valid"]}
    outputs = []
    for i, layer in enumerate(self.layers):
      x, new_cache[f"layers_{i}"] = layer.decode(
          x, cache[f"layers_{i}"], write_index, self_mask, bias, cross_mask
      )
      outputs.append(x)
    if return_features:
      final = self.decoder_norm(x)
      features = self._features(final, outputs, feature_layers)
      return self._logits_of_features(final), features, new_cache
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
