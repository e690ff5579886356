"""A feature-level drafter for T5 encoder-decoders (EAGLE, Li et al. 2024, with cross-attention).

The target's decoder feature f_t is its final-normed hidden state at position t: the input of its
logits layer, from which p(y_t | x_0..x_t) comes. With decoder inputs x_0 = BOS, x_t = y_{t-1},
the drafter's input at position t fuses the feature of the position before with the token there,

    g_t = W_fuse [f_{t-1}; e(x_t)] + b      (f_{-1} = 0; e the target's token embedding, frozen)

then runs T5 1.1 decoder layers of its own width d (self-attention over its own cache,
cross-attention to the target's encoder output [B, Le, E]) and predicts the feature

    f^_t = W_out n_t,  n_t = RMSNorm(h_t),   q(. | x_0..x_t) = softmax(f^_t W_head)

with W_head the target's logits kernel [E, V], frozen, restricted to a draft vocabulary of N
tokens where one is given: the other tokens get MASK_VALUE logits, so q = 0 there and a verifier
stays exact (they are never drafted). With `copy_source`, each row also scores the ids of its own
encoder input (names, numbers, identifiers a translation copies) through the same frozen kernel's
columns: row b's vocabulary is the draft vocabulary plus the Le ids of its source, its
W_head[:, ids_b] folded once per decode into [d, Le] (`FeatureDrafterState.source_kernel`).

A draft reads f^ only through W_head and, for the next draft, through W_fuse's feature half, so
decoding folds them (`fold`, once per decode call: `FeatureDrafter.decode_params`):

    logits_t = n_t (W_out W_head),   g_{t+1} = n_t (W_out W_fuse[:E]) + e(x_{t+1}) W_fuse[E:] + b

which streams [d, N] + [d, d] per draft instead of [d, E] + [E, N] + [E, d] (E = 512, d = 128,
N = 2,000 in the demo: 0.27M parameters instead of 1.15M). Inside the loop a draft's cost grows
with the bytes it reads, because the target's step evicts them from the cache.

In decoding, the verification pass yields the target's features of the block it scored; the loop
hands the drafter those of the accepted positions (`FeatureDrafter.observe_features`). A proposal
at length L (x_0..x_L known, f_0..f_{L-1} true) first rebuilds the drafter's cache at positions
L - gamma .. L from true features in one call (every entry written since the previous proposal
from a predicted feature lies in that window), which gives the logits of the first draft; later
drafts feed on the drafter's own predicted features. So after a rollback no predicted feature
survives in the entries a query can see.

With `target_feature_layers` (EAGLE-3's multi-layer features, Li et al. 2025), f_t is wider:
the final feature, then the outputs of those target decoder layers under the target's final norm,
[f_t; RMSNorm(h^i_t) ...], F = E (1 + their number) wide (`layers.Decoder._features`). The head
then predicts all of it, f^ = W_out n with W_out [d, F]; the logits read its first E columns and
the next draft all F, so `fold` keeps a draft's bytes: [d, N] + [d, d].

Training (`distillation.Distiller`) unrolls the head for several steps on its own predictions,
as at run time (`FeatureHead.unrolled`, EAGLE-3's and HASS's training-time test).

Shapes: B batch, L decoder length (cache length S), k new tokens, E the target's emb_dim, F the
feature width (E, or E (1 + len(target_feature_layers))), d the drafter's emb_dim, V the target's
vocabulary, N the draft vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters
from speculative_t5x import layers
from speculative_t5x import network
from speculative_t5x import trees

FEATURE_KIND = "feature"
_FUSE_AXES = ("embed", "mlp")
_OUT_AXES = ("mlp", "embed")


def shift_features(features: jax.Array) -> jax.Array:
  """f_{t-1} at every position t: [B, L, F] -> [B, L, F], zeros at t = 0 (no feature before BOS)."""
  return jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def mixed_step_sources(length: int, step: int) -> np.ndarray:
  """Which unrolled step's keys a query reads, in training-time test: [L, L] int, -1 where masked.

  At unrolled step j (1-based), the query at position t stands for the j-th draft of a chain that
  started at position t - j + 1 (from true features). The key at position s <= t was then
  computed at step max(j - (t - s), 1): the drafts between s and t in that chain at their own
  steps, everything at or before the chain's start from true features (step 1). Entries are
  0-based step indices."""
  t = np.arange(length)[:, None]
  s = np.arange(length)[None, :]
  return np.where(s <= t, np.maximum(step - (t - s), 1) - 1, -1)


def scatter_draft_logits(logits: jax.Array, draft_vocab: tuple[int, ...], vocab_size: int):
  """Logits over the draft vocabulary [..., N] -> [..., V], MASK_VALUE at the other ids."""
  full = jnp.full(logits.shape[:-1] + (vocab_size,), layers.MASK_VALUE)
  return full.at[..., np.asarray(draft_vocab)].set(logits)


def source_ids(
    encoder_input_tokens: jax.Array, draft_vocab: tuple[int, ...], vocab_size: int
) -> jax.Array:
  """The ids each row's source adds to the draft vocabulary: encoder_input_tokens [B, Le] ->
  [B, Le] int32, vocab_size (out of range: `scatter_source_logits` drops it) where the token is
  padding (0) or in the draft vocabulary already."""
  kept = np.ones(vocab_size, bool)
  kept[0] = False
  kept[np.asarray(draft_vocab, np.int64)] = False
  tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  return jnp.where(jnp.asarray(kept)[tokens], tokens, vocab_size)


def scatter_source_logits(logits: jax.Array, ids: jax.Array, source: jax.Array) -> jax.Array:
  """Row b's logits [B, ..., V] with source[b, ..., j] [B, ..., Le] written at id ids[b, j]
  [B, Le] (`source_ids`; an id of V is dropped). A row's repeated id has one column, so
  every copy writes the same value."""
  return jax.vmap(lambda full, i, x: full.at[..., i].set(x, mode="drop"))(logits, ids, source)


class FeatureHead(nn.Module):
  """The drafter's network. Parameters: 'embedding' [V, E] and 'head' [E, N] (copies of the
  target's, frozen: gradients stop at them; with copy_source also 'source_head', the whole
  logits kernel [E, V]), 'fuse' {'kernel' [F + E, d]}, 'fuse_bias' [d],
  'relpos_bias', 'layers_i' (T5 1.1 `DecoderLayer`s of width d whose cross-attention reads
  [B, Le, E]), 'feature_norm', 'feature_out' {'kernel' [d, F]}.

  config: the body (emb_dim d, heads, mlp, num_decoder_layers; vocab_size V, the target's).
  feature_dim: E. draft_vocab: the N token ids the head scores, or () for all V.
  num_features: F / E, how many E-wide features f_t holds (1 + len(target_feature_layers)).
  copy_source: whether it holds 'source_head' (`FeatureDrafter.copy_source`). Its own outputs
  are over the draft vocabulary: the source's columns are added by the FeatureDrafter.
  """

  config: network.T5Config
  feature_dim: int
  draft_vocab: tuple[int, ...] = ()
  num_features: int = 1
  copy_source: bool = False

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    width = len(self.draft_vocab) or cfg.vocab_size
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
        (cfg.vocab_size, self.feature_dim),
        jnp.float32,
    )
    self.head = self.param(
        "head",
        nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), ("embed", "vocab")
        ),
        (self.feature_dim, width),
        jnp.float32,
    )
    if self.copy_source:
      self.source_head = self.param(
          "source_head",
          nn.with_logical_partitioning(
              nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
              ("embed", "vocab"),
          ),
          (self.feature_dim, cfg.vocab_size),
          jnp.float32,
      )
    self.fuse = layers.Dense(cfg.emb_dim, dtype, _FUSE_AXES)
    self.fuse_bias = self.param(
        "fuse_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)), (cfg.emb_dim,)
    )
    self.relpos_bias = layers.RelativePositionBiases(
        cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance,
        cfg.num_heads,
        bidirectional=False,
        dtype=dtype,
    )
    self.layers = [
        layers.DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_decoder_layers)
    ]
    self.feature_norm = layers.RMSNorm(dtype)
    self.feature_out = layers.Dense(self.feature_dim * self.num_features, dtype, _OUT_AXES)

  def fused_inputs(self, previous_features: jax.Array, tokens: jax.Array) -> jax.Array:
    """g = W_fuse [f_prev; e(x)] + b: [B, k, F] and [B, k] -> [B, k, d]."""
    dtype = self.config.activation_dtype
    embedded = jnp.take(jax.lax.stop_gradient(self.embedding), tokens, axis=0)
    x = jnp.concatenate([previous_features.astype(dtype), embedded.astype(dtype)], axis=-1)
    return self.fuse(x) + jnp.asarray(self.fuse_bias, dtype)

  def _outputs(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Hidden states [..., d] -> (predicted features [..., F], logits [..., N] float32 over the
    draft vocabulary, [..., V] without one, from the first E of them)."""
    predicted = self.feature_out(self.feature_norm(x))
    final = predicted[..., : self.feature_dim].astype(jnp.float32)
    logits = jnp.dot(final, jax.lax.stop_gradient(self.head))
    return predicted, logits

  def __call__(
      self,
      encoded: jax.Array,
      encoder_input_tokens: jax.Array,
      features: jax.Array,
      decoder_input_tokens: jax.Array,
  ) -> tuple[jax.Array, jax.Array]:
    """One teacher-forced step from true features: the first draft at every position ->
    (f^ [B, L, F], logits [B, L, V])."""
    predicted, logits = self.unrolled(
        encoded, encoder_input_tokens, features, decoder_input_tokens, 1
    )
    if self.draft_vocab:
      logits = scatter_draft_logits(logits, self.draft_vocab, self.config.vocab_size)
    return predicted[0], logits[0]

  def unrolled(
      self,
      encoded: jax.Array,
      encoder_input_tokens: jax.Array,
      features: jax.Array,
      decoder_input_tokens: jax.Array,
      steps: int,
      input_noise: jax.Array | None = None,
  ) -> tuple[jax.Array, jax.Array]:
    """Training-time test: `steps` unrolled steps at every position, each reading the previous
    step's predicted features, with the keys each query would see at run time
    (`mixed_step_sources`).

    Args:
      encoded: [B, Le, E], the target's encoder output of encoder_input_tokens [B, Le].
      features: [B, L, F], the target's features f_t at the positions of decoder_input_tokens
        [B, L] (BOS, then the sequence shifted right).
      input_noise: [B, L, F] added to the true features f_{t-1} the first step reads, or None.
    Returns:
      (f^ [steps, B, L, F], logits [steps, B, L, N] over the draft vocabulary (V without one)):
      step j's output at position t is the j-th draft of a chain started at t - j + 1
      (meaningful for t >= j - 1).
    """
    length = decoder_input_tokens.shape[1]
    query_valid = jnp.ones(decoder_input_tokens.shape, bool)
    cross_mask = layers.attention_mask(query_valid, encoder_input_tokens > 0)
    positions = jnp.arange(length)[None]
    bias = self.relpos_bias(positions, positions)
    cross = [layer.cross_key_value(encoded) for layer in self.layers]
    keys = [[] for _ in self.layers]
    previous = shift_features(features)
    if input_noise is not None:
      previous = previous + input_noise
    all_predicted, all_logits = [], []
    for step in range(1, steps + 1):
      sources = jnp.asarray(mixed_step_sources(length, step))
      x = self.fused_inputs(previous, decoder_input_tokens)
      for i, layer in enumerate(self.layers):
        h = layer.pre_self_attention_layer_norm(x)
        attention = layer.self_attention
        keys[i].append(attention.project_key_value(h))
        x = x + self._mixed_attention(attention, attention.project_query(h), keys[i], sources, bias)
        x = layer._cross_and_mlp(x, *cross[i], cross_mask, True)  # noqa: SLF001
      predicted, logits = self._outputs(x)
      all_predicted.append(predicted)
      all_logits.append(logits)
      previous = shift_features(predicted)
    return jnp.stack(all_predicted), jnp.stack(all_logits)

  def _mixed_attention(self, attention, query, keys_values, sources, bias) -> jax.Array:
    """Self-attention whose key at (t, s) comes from step sources[t, s]: query [B, L, H, D],
    keys_values [(key, value) [B, L, H, D] per step so far], sources [L, L] -> [B, L, d]."""
    cfg = self.config
    scores = jnp.zeros((query.shape[0], cfg.num_heads) + sources.shape, jnp.float32)
    for index, (key, _) in enumerate(keys_values):
      step_scores = jnp.einsum(
          "bqhd,bkhd->bhqk", query.astype(jnp.float32), key.astype(jnp.float32)
      )
      scores = jnp.where(sources == index, step_scores, scores)
    scores = jnp.where(sources >= 0, scores, layers.MASK_VALUE) + bias.astype(jnp.float32)
    weights = jax.nn.softmax(scores).astype(cfg.activation_dtype)
    y = sum(
        jnp.einsum("bhqk,bkhd->bqhd", jnp.where(sources == index, weights, 0.0), value)
        for index, (_, value) in enumerate(keys_values)
    )
    return attention.out(y.reshape(y.shape[:2] + (-1,)))

  def init_cache(
      self, encoded: jax.Array, encoder_input_tokens: jax.Array, cache_length: int
  ) -> dict:
    """The decode cache (`layers.init_layer_caches`) of the drafter's layers."""
    return layers.init_layer_caches(
        self.config, self.layers, encoded, encoder_input_tokens, cache_length
    )

  def decode(
      self,
      inputs: jax.Array,
      cache: dict,
      cache_index: jax.Array,
      tree: trees.DraftTree | None = None,
      slots: tuple[int, int] | None = None,
  ) -> tuple[jax.Array, dict]:
    """Cached decoding of k fused inputs g [B, k, d] (`fused_inputs` from features, or the
    drafter's own `FeatureDrafter._next_inputs`) placed as `network.Transformer.decode` places
    tokens (a chain at cache_index + 0..k-1, or tree block slots) -> (n = RMSNorm(h) [B, k, d],
    cache); f^ = W_out n, and the logits follow from n (`fold`)."""
    cache_length = cache["layers_0"]["self_key"].shape[1]
    positions, key_positions, self_mask, write_index = layers.decode_placement(
        cache_length, cache_index, inputs.shape[1], tree, slots
    )
    cross_mask = layers.attention_mask(jnp.ones(inputs.shape[:2], bool), cache["encoder_valid"])
    bias = self.relpos_bias(positions, key_positions)
    x = inputs
    new_cache = {"encoder_valid": cache["encoder_valid"]}
    for i, layer in enumerate(self.layers):
      x, new_cache[f"layers_{i}"] = layer.decode(
          x, cache[f"layers_{i}"], write_index, self_mask, bias, cross_mask
      )
    return self.feature_norm(x), new_cache


def fold(params: Any, feature_dim: int) -> dict:
  """The matrices a draft reads after the head's layers, folded (see the module docstring): with
  W_out = feature_out's kernel [d, F] and W_fuse = fuse's kernel [F + E, d] (E = feature_dim),
  {'logits': W_out[:, :E] W_head [d, N], 'feature_fuse': W_out W_fuse[:F] [d, d],
  'token_fuse': W_fuse[F:] [E, d]}, all float32."""
  out = jnp.asarray(params["feature_out"]["kernel"], jnp.float32)
  fuse = jnp.asarray(params["fuse"]["kernel"], jnp.float32)
  width = out.shape[1]
  return {
      "logits": out[:, :feature_dim] @ jnp.asarray(params["head"], jnp.float32),
      "feature_fuse": out @ fuse[:width],
      "token_fuse": fuse[width:],
  }


def widen_features(params: Any, feature_dim: int, num_features: int) -> Any:
  """A trained head's parameters, made to read num_features E-wide features (E = feature_dim)
  where it read fewer, computing the same function: zero rows for the new features in W_fuse
  (inserted before its token rows) and zero columns in W_out (their predictions start at 0).
  So a head trained on the final feature can go on training with lower layers' features
  (`FeatureDrafter.target_feature_layers`) from where it stands."""
  fuse = np.asarray(params["fuse"]["kernel"])
  out = np.asarray(params["feature_out"]["kernel"])
  width = out.shape[1]
  if width % feature_dim or fuse.shape[0] != width + feature_dim:
    raise ValueError(
        f"these are not a FeatureHead's parameters at feature_dim {feature_dim}: fuse kernel "
        f"{fuse.shape}, feature_out kernel {out.shape}."
    )
  if num_features * feature_dim < width:
    raise ValueError(
        f"the head reads {width // feature_dim} features already; it can only be widened to "
        f"more, not to {num_features}."
    )
  added = num_features * feature_dim - width
  new_fuse = np.concatenate(
      [fuse[:width], np.zeros((added, fuse.shape[1]), fuse.dtype), fuse[width:]]
  )
  new_out = np.concatenate([out, np.zeros((out.shape[0], added), out.dtype)], axis=1)
  return {
      **params,
      "fuse": {**params["fuse"], "kernel": jnp.asarray(new_fuse)},
      "feature_out": {**params["feature_out"], "kernel": jnp.asarray(new_out)},
  }


def _grown(matrix: np.ndarray, added: int, axis: int, rng: np.random.Generator, zero: bool):
  """matrix with `added` more slices along axis: zeros, or normal draws at the matrix's own
  standard deviation (its trained scale, so Adafactor's relative updates move them alike)."""
  shape = list(matrix.shape)
  shape[axis] = added
  new = np.zeros(shape, matrix.dtype) if zero else rng.normal(0.0, matrix.std(), shape)
  return jnp.asarray(np.concatenate([matrix, new.astype(matrix.dtype)], axis=axis))


def widen_body(
    params: Any, config: network.T5Config, num_heads: int, mlp_dim: int, seed: int = 0
) -> Any:
  """A trained head's parameters, given more attention heads and MLP units, computing the same
  function until trained: the new heads' query, key and value columns and the new units' wi
  columns are drawn at each matrix's scale, and the rows that read them (the attention's 'out',
  the MLP's 'wo') are zero, so the residual stream is unchanged. `config` is the head's body as
  trained; the widened one is `dataclasses.replace(config, num_heads=..., mlp_dim=...)`."""
  added_heads = num_heads - config.num_heads
  added_units = mlp_dim - config.mlp_dim
  if added_heads < 0 or added_units < 0 or (added_heads, added_units) == (0, 0):
    raise ValueError(
        f"widen_body adds heads or MLP units: the body has {config.num_heads} heads and "
        f"mlp_dim {config.mlp_dim}, asked for {num_heads} and {mlp_dim}."
    )
  if len(config.mlp_activations) != 2:
    raise ValueError(
        f"widen_body expects T5 1.1's gated MLP (two activations), got {config.mlp_activations}."
    )
  rng = np.random.default_rng(seed)
  columns = added_heads * config.head_dim

  def attention(p):
    p = {k: {"kernel": np.asarray(v["kernel"])} for k, v in p.items()}
    grown = {k: {"kernel": _grown(p[k]["kernel"], columns, 1, rng, False)} for k in p if k != "out"}
    return {**grown, "out": {"kernel": _grown(p["out"]["kernel"], columns, 0, rng, True)}}

  widened = dict(params)
  for i in range(config.num_decoder_layers):
    layer = dict(params[f"layers_{i}"])
    for name in ("self_attention", "encoder_decoder_attention"):
      layer[name] = attention(layer[name])
    mlp = {k: np.asarray(v["kernel"]) for k, v in layer["mlp"].items()}
    layer["mlp"] = {
        "wi_0": {"kernel": _grown(mlp["wi_0"], added_units, 1, rng, False)},
        "wi_1": {"kernel": _grown(mlp["wi_1"], added_units, 1, rng, False)},
        "wo": {"kernel": _grown(mlp["wo"], added_units, 0, rng, True)},
    }
    widened[f"layers_{i}"] = layer
  relpos = np.asarray(params["relpos_bias"]["rel_embedding"])
  widened["relpos_bias"] = {"rel_embedding": _grown(relpos, added_heads, 0, rng, False)}
  return widened


def without_layers(
    params: Any, config: network.T5Config, dropped: tuple[int, ...]
) -> tuple[network.T5Config, Any]:
  """A trained head with its layers `dropped` removed and the rest renumbered in order
  (`network.without_decoder_layers` on its body), to go on training a cheaper head from it: one
  layer of width 128 costs about half a two-layer head's price in the loop -> (the cut body's
  config, its parameters). `config` is the body as trained."""
  body = {k: v for k, v in params.items() if k.startswith("layers_")}
  cut_config, cut = network.without_decoder_layers(config, {"decoder": body}, dropped)
  return cut_config, {**{k: v for k, v in params.items() if k not in body}, **cut["decoder"]}


def can_copy_source(drafter: drafters.Drafter) -> bool:
  """Whether `copying_source` can add each sentence's source ids to what `drafter` drafts: a
  `FeatureDrafter` with a draft vocabulary smaller than the target's."""
  return isinstance(drafter, FeatureDrafter) and bool(drafter.draft_vocab)


def copying_source(
    drafter: "FeatureDrafter", params: Any, target_params: Any
) -> tuple["FeatureDrafter", Any]:
  """A trained drafter that drafts from its draft vocabulary -> the same drafter with
  `FeatureDrafter.copy_source`, and its parameters with 'source_head' added: the target's logits
  kernel, from target_params. Nothing else changes and nothing is trained: the draft
  vocabulary's logits stay those of the head it was trained with (a drafter trained on from an
  earlier version of its target holds that version's copies), and each source id outside it is
  scored by the target's own column."""
  params = _trained(params)
  source_head = _logits_kernel(target_params, drafter.feature_dim).astype(params["head"].dtype)
  return dataclasses.replace(drafter, copy_source=True), {**params, "source_head": source_head}


def _logits_kernel(target_params: Any, feature_dim: int) -> jax.Array:
  """A float32 copy of the target's logits kernel [E, V] (E = feature_dim). A copy, not a view:
  the target's arrays stay the target's (a training step donates the drafter's buffers while it
  reads the target's)."""
  decoder = target_params["decoder"]
  if "logits_dense" in decoder:
    return jnp.array(decoder["logits_dense"]["kernel"], jnp.float32, copy=True)
  # Tied: logits = x @ embedding^T / sqrt(E) (`layers.Decoder._logits_of_features`).
  embedding = jnp.asarray(target_params["token_embedder"]["embedding"], jnp.float32)
  return embedding.T / np.sqrt(feature_dim)


@flax.struct.dataclass
class DecodeParams:
  """A FeatureDrafter's parameters as its proposals read them (`FeatureDrafter.decode_params`):
  params, and `fold` of them."""

  params: Any
  folded: dict


def _saved_copying_source(entry: Mapping[str, Any] | None) -> bool:
  """Whether a checkpoint whose config.json drafter entry is `entry` holds 'source_head' (the
  entry has copy_source); True where it has no such entry to say (a bare checkpoint)."""
  return entry is None or entry.get("kind") != FEATURE_KIND or bool(entry.get("copy_source"))


def _trained(params: Any) -> Any:
  """The trained parameters: `params`, or those a `DecodeParams` holds."""
  return params.params if isinstance(params, DecodeParams) else params


@flax.struct.dataclass
class FeatureDrafterState:
  """cache: the head's decoder cache [B, S, ...]; features [B, S, F]: the target's features by
  position, true up to the decode's length - 1 (`FeatureDrafter.observe_features`). With
  copy_source, source_ids [B, Le] (`source_ids`) and source_kernel [B, d, Le], the folded
  W_out[:, :E] W_head[:, source_ids] (None without)."""

  cache: Any
  features: jax.Array
  source_ids: jax.Array | None = None
  source_kernel: jax.Array | None = None


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class FeatureDrafter(drafters.Drafter):
  """An EAGLE-style drafter: reads the target's decoder features and encoder output, scores with
  the target's logits layer (see the module docstring).

  config: the head's T5Config (emb_dim d, heads, head_dim, mlp_dim, num_decoder_layers; its
    vocab_size is the target's); num_encoder_layers is not used.
  feature_dim: E, the target's emb_dim.
  draft_vocab: the token ids it may draft (`speculative_t5x.text.draft_vocab.frequent_tokens`), or () for the whole vocabulary.
  target_feature_layers: the target's decoder layers whose outputs it reads beside the final
    feature (EAGLE-3's lower-layer features; `network.check_feature_layers`), or ().
  copy_source: each row may also draft the ids of its own encoder input, scored by the
    target's logits kernel (its parameter 'source_head' [E, V], a frozen copy: `init_from_target`).
    Needs a draft_vocab. Decoding, `teacher_forced_logits` and training's loss
    (`distillation.Distiller`, through `vocabulary_logits` and `drafted_ids`) add the source's
    columns; `FeatureHead.unrolled` scores the draft vocabulary alone.
  """

  config: network.T5Config = gin.REQUIRED
  feature_dim: int = gin.REQUIRED
  draft_vocab: tuple[int, ...] = ()
  eos_id: int | None = None
  target_feature_layers: tuple[int, ...] = ()
  copy_source: bool = False

  reads_target_features = True

  def __post_init__(self):
    if not isinstance(self.config, network.T5Config):
      raise ValueError(
          f"FeatureDrafter needs a network.T5Config for its head, got {self.config!r}."
      )
    drafters.set_checked_fields(self, {"feature_dim": 1})
    vocab = tuple(self.draft_vocab)
    ids = np.asarray(vocab, np.int64)
    if ids.size and (
        np.any(ids < 0) or np.any(ids >= self.config.vocab_size) or np.any(np.diff(ids) <= 0)
    ):
      raise ValueError(
          f"FeatureDrafter.draft_vocab must be distinct token ids in [0, "
          f"{self.config.vocab_size}) in ascending order ({len(vocab)} given): build it with "
          "speculative_t5x.text.draft_vocab.frequent_tokens."
      )
    object.__setattr__(self, "feature_dim", int(self.feature_dim))
    object.__setattr__(self, "draft_vocab", tuple(int(i) for i in vocab))
    layers_ = tuple(self.target_feature_layers)
    if any(
        not isinstance(i, (int, np.integer)) or isinstance(i, bool) or i < 0 for i in layers_
    ) or len(set(layers_)) != len(layers_):
      raise ValueError(
          f"FeatureDrafter.target_feature_layers must be distinct target decoder layer indices "
          f"(ints >= 0), got {self.target_feature_layers!r}: give e.g. (0, 1), or () for the "
          "final feature alone."
      )
    object.__setattr__(self, "target_feature_layers", tuple(int(i) for i in layers_))
    if not isinstance(self.copy_source, (bool, np.bool_)):
      raise ValueError(
          f"FeatureDrafter.copy_source must be True or False, got {self.copy_source!r}."
      )
    if self.copy_source and not vocab:
      raise ValueError(
          "FeatureDrafter.copy_source adds each source's ids to a draft vocabulary, but "
          "draft_vocab is () (the whole vocabulary, every id scored already): give a draft_vocab "
          "(speculative_t5x.text.draft_vocab.frequent_tokens), or copy_source=False."
      )
    object.__setattr__(self, "copy_source", bool(self.copy_source))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> FeatureHead:
    return FeatureHead(
        self.config,
        self.feature_dim,
        self.draft_vocab,
        1 + len(self.target_feature_layers),
        self.copy_source,
    )

  @property
  def feature_width(self) -> int:
    """F: the width of the target's features it reads, E (1 + len(target_feature_layers))."""
    return self.feature_dim * (1 + len(self.target_feature_layers))

  # ---- parameters
  def _boxed(self, rng: jax.Array) -> Any:
    module = self.module
    encoded = jnp.zeros((1, 2, self.feature_dim), jnp.float32)
    features = jnp.zeros((1, 2, self.feature_width), jnp.float32)
    tokens = jnp.ones((1, 2), jnp.int32)
    return module.init(rng, encoded, tokens, features, tokens)["params"]

  def init_params(self, rng, input_shapes):
    del input_shapes  # its parameter shapes do not depend on them.
    return nn.meta.unbox(self._boxed(rng))

  def init_from_target(self, params: Any, target_params: Any) -> Any:
    """`params` with the target's token embedding and logits kernel (its draft-vocabulary
    columns, and all of it as 'source_head' with copy_source) copied in: the parts the head
    shares with the target."""
    # Copies, not views (`_logits_kernel`).
    embedding = jnp.array(target_params["token_embedder"]["embedding"], jnp.float32, copy=True)
    kernel = _logits_kernel(target_params, self.feature_dim)
    shared = {"embedding": embedding, "head": kernel}
    if self.draft_vocab:
      shared["head"] = kernel[:, np.asarray(self.draft_vocab)]
    if self.copy_source:
      shared["source_head"] = kernel
    return {**params, **shared}

  def _entry(self) -> dict:
    return {
        "kind": FEATURE_KIND,
        "feature_dim": self.feature_dim,
        "draft_vocab": list(self.draft_vocab),
        "target_feature_layers": list(self.target_feature_layers),
        "copy_source": self.copy_source,
    }

  def checkpoint_layout(self):
    return drafters.CheckpointLayout(self.config, self._entry(), "a FeatureDrafter")

  def from_checkpoint(self, restore, saved_entry, target_params, path):
    """With copy_source, a checkpoint of the drafter saved without it (its config.json says so,
    e.g. a drafter trained without copying) restores as that drafter, then gains the target's
    logits kernel (`copying_source`)."""
    if not self.copy_source or _saved_copying_source(saved_entry):
      return restore(self)
    if target_params is None:
      raise ValueError(
          f"FeatureDrafter.copy_source: the checkpoint {path} was saved without copying the "
          "source, so its 'source_head' comes from the target's logits kernel: this restore "
          "needs the target's parameters (pairs.load_pair passes them)."
      )
    plain = dataclasses.replace(self, copy_source=False)
    return copying_source(plain, restore(plain), target_params)[1]

  @classmethod
  def from_entry(cls, config: network.T5Config, entry: Mapping[str, Any]) -> "FeatureDrafter":
    """The drafter a `checkpoints.save_drafter_params` directory's config.json describes (its 'drafter' entry)."""
    # Checkpoints written before target_feature_layers (copy_source) existed read the final
    # feature alone (draft from the draft vocabulary alone).
    layers_ = tuple(entry.get("target_feature_layers", ()))
    copy_source = entry.get("copy_source", False)
    vocab = tuple(entry["draft_vocab"])
    return cls(config, int(entry["feature_dim"]), vocab, None, layers_, copy_source)

  def check_target(self, target_config):
    drafters.check_reads_target(
        self,
        target_config,
        "feature_dim",
        self.feature_dim,
        "reads the target's features and encoder output",
    )
    try:
      network.check_feature_layers(target_config, self.target_feature_layers)
    except ValueError as e:
      raise ValueError(f"FeatureDrafter.target_feature_layers: {e}") from e

  # ---- decoding
  def _encoded(self, target_encoded: jax.Array | None, method: str) -> jax.Array:
    shape = np.shape(target_encoded) if target_encoded is not None else None
    if shape is None or len(shape) != 3 or shape[-1] != self.feature_dim:
      raise ValueError(
          f"FeatureDrafter.{method} needs target_encoded [B, Le, {self.feature_dim}], the "
          f"target's encoder output, got {shape}: pass the target's `Transformer.encode` of the "
          "same encoder_input_tokens."
      )
    return target_encoded

  def check_params(self, params, name="drafter params", shapes=None, floating=None):
    super().check_params(_trained(params), name, shapes, floating)

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    params = _trained(params)
    module = self.module
    encoded = self._encoded(target_encoded, "init_state")
    cache = module.apply(
        {"params": params}, encoded, encoder_input_tokens, cache_length, method=module.init_cache
    )
    batch = encoder_input_tokens.shape[0]
    features = jnp.zeros((batch, cache_length, self.feature_width), jnp.float32)
    if not self.copy_source:
      return FeatureDrafterState(cache, features)
    ids, columns = self._source_columns(params, encoder_input_tokens)
    out = jnp.asarray(params["feature_out"]["kernel"], jnp.float32)[:, : self.feature_dim]
    return FeatureDrafterState(cache, features, ids, jnp.einsum("de,ebl->bdl", out, columns))

  def _source_columns(self, params, encoder_input_tokens) -> tuple[jax.Array, jax.Array]:
    """-> (`source_ids` [B, Le], W_head's columns at them [E, B, Le] float32; frozen: gradients
    stop at them, as at 'head')."""
    ids = source_ids(encoder_input_tokens, self.draft_vocab, self.vocab_size)
    head = jax.lax.stop_gradient(jnp.asarray(params["source_head"], jnp.float32))
    return ids, jnp.take(head, ids, axis=1, mode="clip")

  def observe_features(self, state, features, start):
    """Writes the target's features [B, W, F] of positions start[b] .. start[b] + W - 1."""
    write = jax.vmap(lambda buf, new, i: jax.lax.dynamic_update_slice_in_dim(buf, new, i, 0))
    return state.replace(
        features=write(state.features, features.astype(state.features.dtype), start)
    )

  def decode_params(self, params):
    """DecodeParams(params, `fold` of them) (unchanged if they are already)."""
    if isinstance(params, DecodeParams):
      return params
    return DecodeParams(params, fold(params, self.feature_dim))

  def _unpacked(self, params) -> tuple[Any, dict]:
    """params or their `decode_params` -> (params, folded)."""
    params = self.decode_params(params)
    return params.params, params.folded

  def _logits(self, folded: dict, hidden: jax.Array, state: FeatureDrafterState) -> jax.Array:
    """n [B, k, d] -> logits [B, k, V] (MASK_VALUE off the draft vocabulary and, with
    copy_source, the row's source ids)."""
    hidden = hidden.astype(jnp.float32)
    logits = jnp.dot(hidden, folded["logits"])
    if self.draft_vocab:
      logits = scatter_draft_logits(logits, self.draft_vocab, self.vocab_size)
    if self.copy_source:
      source = jnp.einsum("bkd,bdl->bkl", hidden, state.source_kernel)
      logits = scatter_source_logits(logits, state.source_ids, source)
    return logits

  def _next_inputs(self, params, folded: dict, hidden: jax.Array, tokens: jax.Array):
    """g from the drafter's own output n [B, k, d] and the tokens drafted from it [B, k]:
    n W_out W_fuse[:F] + e(x) W_fuse[F:] + b -> [B, k, d]."""
    dtype = self.config.activation_dtype
    embedded = jnp.take(params["embedding"], tokens, axis=0)
    g = jnp.dot(hidden.astype(jnp.float32), folded["feature_fuse"]) + jnp.dot(
        embedded.astype(jnp.float32), folded["token_fuse"]
    )
    return g.astype(dtype) + jnp.asarray(params["fuse_bias"], dtype)

  def _rebuild(self, params, folded, state, sequences, length, width):
    """Feeds positions max(length - width + 1, 0) .. + width - 1 from true features ->
    (n [B, d] and logits [B, 1, V] at position `length`, cache)."""
    module = self.module
    start = jnp.maximum(length - width + 1, 0)
    positions = start[:, None] + jnp.arange(width)[None]
    tokens = drafters.decoder_inputs(sequences, positions)
    previous = jnp.take_along_axis(state.features, jnp.maximum(positions - 1, 0)[..., None], axis=1)
    previous = jnp.where((positions > 0)[..., None], previous, 0.0)
    variables = {"params": params}
    inputs = module.apply(variables, previous, tokens, method=module.fused_inputs)
    hidden, cache = module.apply(variables, inputs, state.cache, start, method=module.decode)
    hidden = jnp.take_along_axis(hidden, (length - start)[:, None, None], axis=1)
    return hidden[:, 0], self._logits(folded, hidden, state), cache

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    module = self.module
    params, folded = self._unpacked(params)
    hidden, first, cache = self._rebuild(params, folded, state, sequences, length, gamma + 1)

    def step(carry, token, i):
      cache, hidden = carry
      inputs = self._next_inputs(params, folded, hidden[:, None], token[:, None])
      hidden, cache = module.apply(
          {"params": params}, inputs, cache, length + i, method=module.decode
      )
      return self._logits(folded, hidden, state), (cache, hidden[:, 0])

    drafts, q, (cache, _), _ = drafters.draft_chain(
        first, step, (cache, hidden), gamma, u, standardize, stop
    )
    return drafts, q, state.replace(cache=cache)

  def propose_tree(self, params, state, sequences, length, tree, u, standardize):
    """The root from true features (as `propose`), then one call per depth under the tree's
    attention mask, each node reading its parent's output."""
    module = self.module
    params, folded = self._unpacked(params)
    hidden, first, cache = self._rebuild(params, folded, state, sequences, length, tree.depth + 1)
    parents = np.asarray((0,) + tree.parents)  # block slot -> its parent's block slot
    slot_hidden = jnp.zeros((length.shape[0], tree.width) + hidden.shape[1:], hidden.dtype)
    slot_hidden = slot_hidden.at[:, 0].set(hidden)

    def level_logits(carry, tokens, slots):
      cache, slot_hidden = carry
      start, stop = slots
      inputs = self._next_inputs(params, folded, slot_hidden[:, parents[start:stop]], tokens)
      hidden, cache = module.apply(
          {"params": params},
          inputs,
          cache,
          length,
          tree=tree,
          slots=slots,
          method=module.decode,
      )
      return self._logits(folded, hidden, state), (
          cache,
          slot_hidden.at[:, start:stop].set(hidden),
      )

    drafts, q, (cache, _) = drafters.draft_tree(
        first, level_logits, (cache, slot_hidden), tree, u, standardize
    )
    return drafts, q, state.replace(cache=cache)

  # ---- measurement and training
  def teacher_forced_logits(
      self,
      params,
      encoder_input_tokens,
      decoder_input_tokens,
      target_encoded=None,
      target_features=None,
  ):
    """The first draft's logits at every position, from the target's true features
    target_features [B, L, F] (required) -> [B, L, V]."""
    predicted, logits = self.unrolled(
        params, encoder_input_tokens, decoder_input_tokens, target_encoded, target_features, 1
    )
    return self.vocabulary_logits(params, encoder_input_tokens, predicted[0], logits[0])

  def vocabulary_logits(self, params, encoder_input_tokens, predicted, logits) -> jax.Array:
    """`unrolled`'s outputs at one step, f^ [B, L, F] and logits [B, L, N], -> logits [B, L, V]
    (MASK_VALUE off the draft vocabulary and, with copy_source, the row's source ids, scored
    f^[:E] W_head[:, ids])."""
    if self.draft_vocab:
      logits = scatter_draft_logits(logits, self.draft_vocab, self.vocab_size)
    if self.copy_source:
      ids, columns = self._source_columns(_trained(params), encoder_input_tokens)
      final = predicted[..., : self.feature_dim].astype(jnp.float32)
      source = jnp.einsum("ble,ebk->blk", final, columns)
      logits = scatter_source_logits(logits, ids, source)
    return logits

  def drafted_ids(self, encoder_input_tokens: jax.Array) -> jax.Array:
    """The ids each row may draft: encoder_input_tokens [B, Le] -> [B, V] bool, the draft
    vocabulary (every id without one) and, with copy_source, the row's own source ids
    (`source_ids`). q is 0 off them, so training compares q with p restricted to them."""
    batch = encoder_input_tokens.shape[0]
    vocabulary = np.zeros(self.vocab_size, bool)
    vocabulary[np.asarray(self.draft_vocab, np.int64) if self.draft_vocab else slice(None)] = True
    drafted = jnp.broadcast_to(jnp.asarray(vocabulary), (batch, self.vocab_size))
    if not self.copy_source:
      return drafted
    ids = source_ids(encoder_input_tokens, self.draft_vocab, self.vocab_size)
    return jax.vmap(lambda row, i: row.at[i].set(True, mode="drop"))(drafted, ids)

  def unrolled(
      self,
      params,
      encoder_input_tokens: jax.Array,
      decoder_input_tokens: jax.Array,
      target_encoded: jax.Array | None,
      target_features: jax.Array | None,
      steps: int,
      input_noise: jax.Array | None = None,
  ) -> tuple[jax.Array, jax.Array]:
    """`FeatureHead.unrolled` -> (f^ [steps, B, L, F], logits [steps, B, L, N] over
    `draft_vocab`, or [steps, B, L, V] without one)."""
    encoded = self._encoded(target_encoded, "teacher_forced_logits")
    shape = np.shape(target_features) if target_features is not None else None
    want = tuple(np.shape(decoder_input_tokens)) + (self.feature_width,)
    if shape != want:
      raise ValueError(
          f"FeatureDrafter needs target_features {want}, the target's decoder features at the "
          f"positions of decoder_input_tokens (network `teacher_forced(..., "
          f"return_features=True, feature_layers={self.target_feature_layers})`), got {shape}."
      )
    module = self.module
    return module.apply(
        {"params": params},
        encoded,
        encoder_input_tokens,
        target_features,
        decoder_input_tokens,
        steps,
        input_noise,
        method=module.unrolled,
    )


drafters.register_kind(FEATURE_KIND, FeatureDrafter.from_entry)
