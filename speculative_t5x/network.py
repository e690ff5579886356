"""T5 1.1 encoder-decoder in flax linen, parameter for parameter T5X's minimal network.

As T5X splits its T5, this module holds the models, `Transformer` and `SharedEncoderDecoder`
(configured by `config.T5Config`, re-exported here as `network.T5Config`), with their checks,
`move_cache_slots` and the parameter helpers (`init_params`, `param_axes`, `param_shapes`,
`teacher_forced_logits`); the blocks they are built from (attention, MLP, norms, the encoder and
decoder stacks, the decode cache's layout) are in `layers.py`. The parameter tree equals
`t5x/examples/t5/network.py`'s, so T5X checkpoints load unchanged.

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

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import layers
from speculative_t5x import trees
from speculative_t5x.config import T5Config  # network.T5Config: re-exported (see config.py)

Array = jax.Array


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


def check_feature_layers(config: T5Config, feature_layers: Any) -> tuple[int, ...]:
  """Decoder layer indices whose outputs join the features (`layers.Decoder._features`): distinct
  ints in [0, num_decoder_layers - 1) (the last layer's output is the final feature already)."""
  layers_ = tuple(feature_layers)
  last = config.num_decoder_layers - 1
  if any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) for i in layers_) or (
      len(set(layers_)) != len(layers_) or any(not 0 <= i < last for i in layers_)
  ):
    raise ValueError(
        f"feature_layers {feature_layers!r} must be distinct decoder layer indices in [0, {last}) "
        f"for a decoder of {config.num_decoder_layers} layers (layer {last}'s output is the final "
        "feature, always included): give e.g. (0,) or ()."
    )
  return tuple(int(i) for i in layers_)


class _CachedDecoderModel(nn.Module):
  """What decoding runs per token, T5X's `token_embedder` and `decoder` subtrees: teacher-forced
  from an encoder output (`teacher_forced`), or k tokens at a time from a cache
  (`init_decode_cache`, `decode`). `Transformer` adds an encoder of its own;
  `SharedEncoderDecoder` reads another model's encoder output."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype)
    self.decoder = layers.Decoder(cfg, self.token_embedder)

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
      feature_layers: tuple[int, ...] = (),
  ) -> Array | tuple[Array, Array]:
    """encoded [B, Le, E_enc] of encoder_input_tokens [B, Le], decoder_input_tokens and
    decoder_target_tokens [B, l] -> logits [B, l, V] float32 (token 0 is padding; the decoder
    mask comes from decoder_target_tokens, as in T5X); with return_features, (logits, features
    [B, l, E (1 + len(feature_layers))]): the final-normed hidden states the logits layer reads,
    then those of the decoder layers feature_layers under the same norm."""
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
        check_feature_layers(self.config, feature_layers),
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
      feature_layers: tuple[int, ...] = (),
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

    With return_features, returns (logits, features [B, k, E (1 + len(feature_layers))], cache):
    the final-normed hidden states the logits layer reads, then those of the decoder layers
    feature_layers under the same norm, which a feature-level drafter consumes.
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
        decoder_tokens,
        cache,
        jnp.asarray(cache_index, jnp.int32),
        tree,
        slots,
        return_features,
        check_feature_layers(self.config, feature_layers),
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
    self.encoder = layers.Encoder(self.config, self.token_embedder)

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


def without_decoder_layers(
    config: T5Config, params: Any, dropped: tuple[int, ...]
) -> tuple[T5Config, dict]:
  """A model with the decoder layers `dropped` skipped and the rest renumbered in order: the
  self-speculative drafter of layer skipping (Zhang et al. 2023, Draft & Verify), untrained for
  it -> (config, params). Its other parameters are the model's own."""
  layers = config.num_decoder_layers
  if not dropped or len(set(dropped)) != len(dropped) or not set(dropped) < set(range(layers)):
    raise ValueError(
        f"dropped must name distinct decoder layers in 0..{layers - 1} and keep at least one, "
        f"got {dropped}."
    )
  kept = [i for i in range(layers) if i not in dropped]
  decoder = {k: v for k, v in params["decoder"].items() if not k.startswith("layers_")}
  decoder.update({f"layers_{j}": params["decoder"][f"layers_{i}"] for j, i in enumerate(kept)})
  return config.replace(num_decoder_layers=len(kept)), {**params, "decoder": decoder}


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
