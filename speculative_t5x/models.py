"""T5X-style model classes: the baseline `EncoderDecoderModel` and `SpeculativeEncoderDecoderModel`.

They follow T5X's model interface (t5x/models.py): `get_initial_variables`, `loss_fn`,
`score_batch`, `predict_batch_with_aux(params, batch, rng, decoder_params, return_all_decodes,
num_decodes)`, with batches in seqio's `EncDecFeatureConverter` layout (`encoder_input_tokens`,
`decoder_input_tokens`, `decoder_target_tokens`, optional `decoder_loss_weights`).

Unlike T5X, where `temperature_sample` defaults to topk=1 (greedy), both models here pass
`topk=0` unless `decoder_params` says otherwise, so a baseline and a speculative run with the same
`decoder_params` sample from the same distribution.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import draft_length
from speculative_t5x import draft_shapes
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import param_checks
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x import validation

if TYPE_CHECKING:  # seqio imports TensorFlow: decoding needs neither
  import seqio

Batch = Mapping[str, jax.Array]
# Drafts per target call when neither gamma nor a draft tree is given.
DEFAULT_GAMMA = 4
_DECODER_PARAM_DEFAULTS = {"temperature": 0.0, "topk": 0, "topp": 0.0}
# The token features that scoring and the loss read ([B, Le], [B, Ld], [B, Ld]).
_SCORED_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")


def _cross_entropy(
    logits: jax.Array, targets: jax.Array, z_loss: float, label_smoothing: float
) -> tuple[jax.Array, jax.Array]:
  """logits [B, l, V], targets [B, l] -> (per-token loss incl. z-loss, per-token z-loss)."""
  vocab = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  soft = jax.nn.one_hot(targets, vocab) * (confidence - low) + low
  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_probs = logits - log_z[..., None]
  loss = -jnp.sum(soft * log_probs, axis=-1)
  if label_smoothing:
    loss -= -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
  z = z_loss * jnp.square(log_z)
  return loss + z, z


def _weights(batch: Batch) -> jax.Array:
  weights = batch.get("decoder_loss_weights")
  return (batch["decoder_target_tokens"] > 0).astype(jnp.float32) if weights is None else weights


class _SeqioFeatureConverter:
  """`seqio.EncDecFeatureConverter`, imported when read: seqio loads TensorFlow, which only the
  data pipeline needs, not decoding."""

  def __get__(self, instance, owner):
    import seqio  # pylint: disable=g-import-not-at-top

    return seqio.EncDecFeatureConverter


@gin.configurable
class EncoderDecoderModel:
  """The baseline: T5 1.1 decoded with `decode_fn` (default `decoding.temperature_sample`)."""

  FEATURE_CONVERTER_CLS = _SeqioFeatureConverter()
  # The decode function's arguments that the model passes itself (the rest are decoder_params).
  MODEL_DECODE_ARGS = ("inputs", "cache", "tokens_to_logits", "eos_id", "num_decodes")

  def __init__(
      self,
      module: network.Transformer,
      input_vocabulary: seqio.Vocabulary,
      output_vocabulary: seqio.Vocabulary,
      optimizer_def: Any = None,
      decode_fn: Callable = decoding.temperature_sample,
      label_smoothing: float = 0.0,
      z_loss: float = 0.0,
      loss_normalizing_factor: float | None = None,
  ):
    if not isinstance(module, network.Transformer):
      raise validation.InvalidInputError(
          f"module must be a network.Transformer (network.Transformer(config)), got "
          f"{type(module).__name__}: the models decode and score T5 1.1's network."
      )
    for name, vocabulary in (("input", input_vocabulary), ("output", output_vocabulary)):
      validation.check_vocabulary(vocabulary, module.config.vocab_size, f"{name}_vocabulary")
    if not callable(decode_fn):
      raise validation.InvalidInputError(
          f"decode_fn must be a decoding loop (a function, e.g. decoding.temperature_sample), got "
          f"{decode_fn!r}."
      )
    self.module = module
    self._input_vocabulary = input_vocabulary
    self._output_vocabulary = output_vocabulary
    self.optimizer_def = optimizer_def
    self._decode_fn = decode_fn
    self._label_smoothing = validation.check_number(
        label_smoothing, "label_smoothing", 0, meaning="the mass spread over the other tokens"
    )
    if self._label_smoothing >= 1:
      raise validation.InvalidInputError(
          f"label_smoothing must be < 1 (1 leaves the target token no mass), got "
          f"{self._label_smoothing}."
      )
    self._z_loss = validation.check_number(z_loss, "z_loss", 0, meaning="the z-loss coefficient")
    self._loss_normalizing_factor = (
        None
        if loss_normalizing_factor is None
        else validation.check_number(
            loss_normalizing_factor,
            "loss_normalizing_factor",
            meaning="None: the number of target tokens, else the loss's divisor",
        )
    )
    if self._loss_normalizing_factor is not None and self._loss_normalizing_factor <= 0:
      raise validation.InvalidInputError(
          f"loss_normalizing_factor must be None or a number > 0 (the loss's divisor), got "
          f"{loss_normalizing_factor!r}."
      )
    # Traced here, once per config: each call compares the params with them, tracing nothing.
    param_checks.target_param_shapes(module.config)

  @property
  def input_vocabulary(self):
    return self._input_vocabulary

  @property
  def output_vocabulary(self):
    return self._output_vocabulary

  @property
  def decode_fn(self):
    return self._decode_fn

  @property
  def eos_id(self) -> int:
    """The output vocabulary's EOS id, an id >= 1 of the model (0 is padding: a vocabulary whose
    eos_id is 0 or None is an error, see `validation.check_eos_id`)."""
    return validation.check_eos_id(self._output_vocabulary.eos_id, self.module.config.vocab_size)

  def get_initial_variables(
      self,
      rng: jax.Array,
      input_shapes: Mapping[str, tuple],
      input_types: Mapping[str, Any] | None = None,
  ) -> dict:
    """{'params': ...} at the given feature shapes (float32, unboxed)."""
    del input_types
    enc = jnp.ones(input_shapes["encoder_input_tokens"], jnp.int32)
    dec = jnp.ones(input_shapes["decoder_input_tokens"], jnp.int32)
    variables = self.module.init(rng, enc, dec, dec)
    return {"params": nn.meta.unbox(variables["params"])}

  def checked_params(self, params: Any) -> Any:
    """`params` unboxed (`param_checks.unbox`: boxed leaves, as `init` returns them, are
    accepted) and checked against the config, paths, shapes and dtypes, before anything is
    traced (`param_checks.check_target_params`, an InvalidInputError naming the first problems
    and the likely cause). Tracers are checked alike (shapes and dtypes only)."""
    params = param_checks.unbox(params)
    param_checks.check_target_params(params, self.module.config)
    return params

  def _compute_logits(self, params, batch: Batch, dropout_rng: jax.Array | None = None):
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.module.apply(
        {"params": params},
        batch["encoder_input_tokens"],
        batch["decoder_input_tokens"],
        batch["decoder_target_tokens"],
        batch.get("encoder_segment_ids"),
        batch.get("decoder_segment_ids"),
        enable_dropout=dropout_rng is not None,
        rngs=rngs,
    )

  def loss_fn(self, params, batch: Batch, dropout_rng: jax.Array | None):
    """Weighted cross-entropy plus z-loss -> (loss, metrics)."""
    params = self.checked_params(params)
    validation.check_batch(batch, self.module.config.vocab_size, _SCORED_FEATURES)
    validation.check_prng_key(dropout_rng, "dropout_rng")
    logits = self._compute_logits(params, batch, dropout_rng)
    weights = _weights(batch)
    loss, z = _cross_entropy(
        logits, batch["decoder_target_tokens"], self._z_loss, self._label_smoothing
    )
    normalizer = (
        jnp.sum(weights) if self._loss_normalizing_factor is None else self._loss_normalizing_factor
    )
    total = jnp.sum(loss * weights) / normalizer
    correct = (jnp.argmax(logits, -1) == batch["decoder_target_tokens"]) * weights
    metrics = {
        "loss": total,
        "z_loss": jnp.sum(z * weights) / normalizer,
        "accuracy": jnp.sum(correct) / jnp.sum(weights),
        "tokens": jnp.sum(weights),
    }
    return total, metrics

  def eval_fn(self, params, batch: Batch):
    return self.loss_fn(params, batch, dropout_rng=None)

  def score_batch(self, params, batch: Batch, return_intermediates: bool = False):
    """Sum over the targets of log p(target token) -> [B]."""
    if validation.check_boolean(return_intermediates, "return_intermediates"):
      raise ValueError("return_intermediates=True is not supported: call _compute_logits instead.")
    params = self.checked_params(params)
    validation.check_batch(batch, self.module.config.vocab_size, _SCORED_FEATURES)
    logits = self._compute_logits(params, batch)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    token = jnp.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)[..., 0]
    return jnp.sum(token * _weights(batch), axis=-1)

  def _decoder_param_names(self) -> list[str] | None:
    """The keys decoder_params may hold: the decode function's arguments other than those the
    model passes (None: any, where it takes **kwargs or has no signature)."""
    try:
      parameters = inspect.signature(self._decode_fn).parameters.values()
    except (TypeError, ValueError):
      return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
      return None
    return [p.name for p in parameters if p.name not in self.MODEL_DECODE_ARGS]

  def _settings(
      self, params, batch: Batch, decoder_params: Mapping[str, Any] | None, rng, num_decodes: int
  ) -> dict:
    """The decode function's settings, `decoder_params` over the defaults with `rng` as its
    decode_rng, checked with the batch (token ids within the vocab_size where they are concrete)
    and the output vocabulary before anything is traced (see `validation`); top-k and top-p, which
    shape the computation, as Python numbers (a concrete NumPy or jax scalar is taken for its
    value). `params` were checked by `checked_params`; the speculative model checks the lengths
    against its drafter (`Drafter.check_lengths`)."""
    del params
    validation.check_decoder_params(decoder_params, self._decoder_param_names())
    settings = dict(_DECODER_PARAM_DEFAULTS, **(decoder_params or {}))
    if rng is not None:
      if "decode_rng" in settings:
        raise ValueError("Got both `rng` and `decoder_params['decode_rng']`: give only one.")
      settings["decode_rng"] = rng
    vocab_size = self.module.config.vocab_size
    validation.check_batch(batch, vocab_size)
    validation.check_vocabulary(self._output_vocabulary, vocab_size, "output_vocabulary")
    validation.check_decode_call(
        batch["decoder_input_tokens"],
        self.eos_id,
        num_decodes,
        settings["temperature"],
        settings["topk"],
        settings["topp"],
        settings.get("max_decode_steps"),
        settings.get("decode_rng"),
        vocab_size,
        name="decoder_input_tokens",
    )
    settings["topk"], settings["topp"] = validation.check_sampling(
        None, settings["topk"], settings["topp"], vocab_size=vocab_size
    )
    return settings

  def _prefill_target(self, params, encoder_tokens, cache_length):
    """-> (the target's encoder output [B, Le, E], its decoder cache)."""
    return self.module.apply(
        {"params": params}, encoder_tokens, cache_length, method=self.module.prefill
    )

  def _target_decode(
      self, params, tokens, cache, index, tree=None, return_features=False, feature_layers=()
  ):
    return self.module.apply(
        {"params": params},
        tokens,
        cache,
        index,
        tree=tree,
        return_features=return_features,
        feature_layers=feature_layers,
        method=self.module.decode,
    )

  def prefill(self, params, batch: Batch) -> Any:
    """What prediction does before its decoding loop: the encoder and the decoder cache at the
    decode length (cross-attention keys and values computed) -> the cache pytree."""
    return self._prefill_target(
        params, batch["encoder_input_tokens"], batch["decoder_input_tokens"].shape[1]
    )[1]

  def predict_batch_with_aux(
      self,
      params,
      batch: Batch,
      rng: jax.Array | None = None,
      decoder_params: Mapping[str, Any] | None = None,
      return_all_decodes: bool = False,
      num_decodes: int = 1,
      prompt_with_targets: bool = False,
      prefilled: Any = None,
  ):
    """-> (decodes [B, L] or [B, N, L], {'scores': [B] or [B, N]}).

    prefilled: `prefill(params, batch)`, where the caller computed it (`jit_predict` runs it as
    a program of its own); None: computed here."""
    params = self.checked_params(params)
    validation.check_boolean(return_all_decodes, "return_all_decodes")
    validation.check_boolean(prompt_with_targets, "prompt_with_targets")
    settings = self._settings(params, batch, decoder_params, rng, num_decodes)
    decoder_inputs = batch["decoder_input_tokens"]
    if prompt_with_targets:
      inputs = jnp.where(decoder_inputs == self.eos_id, 0, decoder_inputs)
    else:
      inputs = jnp.zeros_like(decoder_inputs)
    cache = self.prefill(params, batch) if prefilled is None else prefilled

    def tokens_to_logits(state: decoding.DecodingState):
      logits, cache = self._target_decode(params, state.cur_token, state.cache, state.cur_index)
      return logits[:, 0], cache

    decodes, scores = self._decode_fn(
        inputs=inputs,
        cache=cache,
        tokens_to_logits=tokens_to_logits,
        eos_id=self.eos_id,
        num_decodes=num_decodes,
        **settings,
    )
    if return_all_decodes:
      return decodes, {"scores": scores}
    return decodes[:, -1], {"scores": scores[:, -1]}

  def predict_batch(self, params, batch: Batch, rng: jax.Array | None = None, **kwargs):
    return self.predict_batch_with_aux(params, batch, rng, **kwargs)[0]

  def jit_predict(
      self,
      num_decodes: int = 1,
      return_all_decodes: bool = False,
      topk: int = 0,
      topp: float = 0.0,
      max_decode_steps: int | None = None,
  ) -> Callable:
    """`fn(params, batch, rng, temperature) -> (decodes, aux)`, jitted with the temperature traced,
    so changing it does not recompile; a concrete temperature is validated before the call.

    A concrete greedy temperature (at or below `sampling.MIN_TEMPERATURE`) runs a second compiled
    function, the greedy specialization of the loop (argmaxes of the logits, no distributions;
    compiled on first use), whose outputs are those of the traced one at that temperature. Both
    start from the prefill, a program of its own (`jit_prefill`): the two programs of a call are
    those of `predict_batch_with_aux`, which is one, split where its loop starts. Under an outer
    `jax.jit` (`partitioning.Partitioner.partition_predict`, `aot`) they trace into one.

    The settings are checked here (NumPy and concrete jax scalars are taken for their values, so
    `topp=jnp.asarray(0.9)` is `topp=0.9` and shares its compiled function), and each call's
    params (`checked_params`), batch (token ids included), rng and temperature before the
    compiled function runs, so a bad value never reaches tracing or compilation.
    """
    vocab_size = self.module.config.vocab_size
    topk, topp = validation.check_sampling(None, topk, topp, vocab_size=vocab_size)
    steps = validation.check_max_decode_steps(max_decode_steps)
    return self._jit_predict(
        validation.check_num_decodes(num_decodes),
        validation.check_boolean(return_all_decodes, "return_all_decodes"),
        topk,
        topp,
        steps,
    )

  @functools.cache  # noqa: B019  (compiled functions live as long as the model)
  def _jit_predict(
      self,
      num_decodes: int,
      return_all_decodes: bool,
      topk: int,
      topp: float,
      max_decode_steps: int | None,
  ) -> Callable:
    """`jit_predict` of checked settings (Python values, hashable)."""

    def decoder_params(temperature):
      return {
          "temperature": temperature,
          "topk": topk,
          "topp": topp,
          "max_decode_steps": max_decode_steps,
      }

    def fn(params, batch, prefilled, rng, temperature):
      return self.predict_batch_with_aux(
          params,
          batch,
          rng,
          decoder_params=decoder_params(temperature),
          return_all_decodes=return_all_decodes,
          num_decodes=num_decodes,
          prefilled=prefilled,
      )

    # The prefill a program of its own (`jit_prefill`), shared by the traced and the greedy
    # loops, which then do not each compile the encoder.
    prefill = self.jit_prefill()
    compiled = jax.jit(fn)
    compiled_greedy = jax.jit(
        lambda params, batch, prefilled, rng: fn(params, batch, prefilled, rng, 0.0)
    )

    def predict(params, batch, rng, temperature):
      if isinstance(temperature, (list, tuple)):
        raise validation.InvalidInputError(
            f"temperature {temperature!r} is a Python {type(temperature).__name__}: give a "
            "number, or per-row temperatures as an array (np.asarray(...), shape [B])."
        )
      # Unboxed here, so boxed and plain trees share one compiled function.
      params = self.checked_params(params)
      self._settings(params, batch, decoder_params(temperature), rng, num_decodes)
      prefilled = prefill(params, batch)
      if sampling.is_greedy(temperature) and np.ndim(temperature) == 0:
        return compiled_greedy(params, batch, prefilled, rng)
      return compiled(params, batch, prefilled, rng, temperature)

    return predict

  @functools.cache  # noqa: B019  (compiled functions live as long as the model)
  def jit_prefill(self) -> Callable:
    """`prefill` jitted, one function per model: the program `jit_predict`'s decodes run before
    their loop, so timing it (`sweep`) compiles nothing more."""
    return jax.jit(self.prefill)


@gin.configurable
class SpeculativeEncoderDecoderModel(EncoderDecoderModel):
  """Speculative decoding: a target `module` verifies `gamma` drafts per call from a drafter.

  Args:
    module: the target.
    drafter: a `drafters.Drafter` (a `network.Transformer` or a `network.T5Config` is taken as
      the `drafters.T5Drafter` of its config); its vocab_size and eos_id, where unset, are the
      target's, and it must serve the target (`Drafter.check_target`, a ValueError here). Its
      parameters sit beside the target's: params = {'target': ..., 'drafter': ...}, the drafter's
      checked against its `param_shapes()` at every call, before tracing (`Drafter.check_params`).
    gamma: drafts per target call (the most, under `draft_stop`); default 4, or the depth of
      `draft_tree` or `draft_shape`.
    verifier: a `speculative.Verifier`, or None: the draft shape's default (Algorithm 1,
      `speculative.TokenVerifier`, for a chain; `speculative.TreeVerifier` for a tree).
    draft_stop: a `draft_length` rule for adaptive draft length (e.g.
      `draft_length.ConfidenceStop(threshold)`), or None: always gamma drafts.
    draft_tree: a static draft tree, `trees.DraftTree` or its branching (k_1, ..., k_D) (e.g.
      (4, 1, 1, 1): 4 chains of 4 sharing their root), verified in one target call; None: a
      chain of gamma drafts.
    draft_shape: a `draft_shapes.DraftShape`, in place of draft_stop and draft_tree (which make
      a `draft_shapes.Chain` or `draft_shapes.Tree`): a new shape is a subclass and a gin line.
    decode_fn: the decoding loop, T5X's extension point: called as `decoding.speculative_sample`
      (its default) is, and returning a `decoding.SpeculativeOutput`.
  """

  MODEL_DECODE_ARGS = (
      "inputs",
      "target_cache",
      "target_logits_fn",
      "drafter",
      "drafter_params",
      "drafter_state",
      "eos_id",
      "gamma",
      "verifier",
      "draft_stop",
      "draft_tree",
      "draft_shape",
      "move_target_cache",
      "num_decodes",
  )

  def __init__(
      self,
      module: network.Transformer,
      drafter: drafters_lib.Drafter | network.Transformer | network.T5Config,
      input_vocabulary: seqio.Vocabulary,
      output_vocabulary: seqio.Vocabulary,
      gamma: int | None = None,
      verifier: speculative.Verifier | None = None,
      draft_stop: draft_length.DraftStop | None = None,
      draft_tree: trees.DraftTree | tuple[int, ...] | None = None,
      draft_shape: draft_shapes.DraftShape | None = None,
      decode_fn: Callable[..., decoding.SpeculativeOutput] = decoding.speculative_sample,
      optimizer_def: Any = None,
      label_smoothing: float = 0.0,
      z_loss: float = 0.0,
      loss_normalizing_factor: float | None = None,
  ):
    super().__init__(
        module,
        input_vocabulary,
        output_vocabulary,
        optimizer_def,
        decode_fn=decode_fn,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        loss_normalizing_factor=loss_normalizing_factor,
    )
    if decode_fn is decoding.temperature_sample:
      raise ValueError(
          "decode_fn=decoding.temperature_sample is the baseline's loop, which takes no drafter: "
          "SpeculativeEncoderDecoderModel needs a speculative loop (decoding.speculative_sample, "
          "the default); for the baseline use EncoderDecoderModel."
      )
    if gamma is None and draft_tree is None and draft_shape is None:
      gamma = DEFAULT_GAMMA
    if verifier is not None and not isinstance(verifier, speculative.Verifier):
      raise ValueError(
          f"verifier must be a speculative.Verifier (e.g. "
          f"speculative.TokenVerifier()), got {type(verifier).__name__}."
      )
    self.draft_shape = draft_shapes.make_shape(gamma, draft_stop, draft_tree, draft_shape)
    self.gamma = self.draft_shape.depth
    self.verifier = self.draft_shape.default_verifier if verifier is None else verifier
    self.drafter = drafters_lib.as_drafter(drafter).for_target(
        module.config.vocab_size, self.eos_id
    )
    self.drafter.check_target(module.config)
    self.draft_shape.check(self.verifier, self.drafter, network.move_cache_slots)
    # Traced here, once: each call compares params['drafter'] with them, tracing nothing.
    self._drafter_param_shapes = self.drafter.param_shapes()
    self._drafter_floating = self.drafter.floating_params()

  def get_initial_variables(self, rng, input_shapes, input_types=None) -> dict:
    """{'params': {'target': ..., 'drafter': ...}} (the drafter's from `Drafter.init_params`:
    random for a T5 drafter, uniform tables for n-gram drafters until fitted)."""
    rng_target, rng_drafter = jax.random.split(rng)
    target = super().get_initial_variables(rng_target, input_shapes, input_types)["params"]
    return {
        "params": {"target": target, "drafter": self.drafter.init_params(rng_drafter, input_shapes)}
    }

  def _compute_logits(self, params, batch, dropout_rng=None):
    return super()._compute_logits(params["target"], batch, dropout_rng)

  def checked_params(self, params):
    """`params` unboxed and checked: {'target': ..., 'drafter': ...}, the target's against its
    config (the baseline's `checked_params`), the drafter's against its `param_shapes()` and
    `floating_params()` (`Drafter.check_params`), before anything is traced."""
    params = param_checks.unbox(params)
    param_checks.check_pair_params(
        params,
        self.module.config,
        lambda drafter_params: self.drafter.check_params(
            drafter_params, "params['drafter']", self._drafter_param_shapes, self._drafter_floating
        ),
    )
    return params

  def _settings(self, params, batch, decoder_params, rng, num_decodes):
    """The baseline's settings, with the batch's lengths checked against the drafter
    (`Drafter.check_lengths`)."""
    settings = super()._settings(params, batch, decoder_params, rng, num_decodes)
    self.drafter.check_lengths(
        np.shape(batch["encoder_input_tokens"])[1], np.shape(batch["decoder_input_tokens"])[1]
    )
    return settings

  def prefill(self, params, batch: Batch) -> tuple[Any, Any]:
    """The target's encoder and cache, then the drafter's state (which may read the target's
    encoder output), at the decode length + M + 1 (room for a block of the draft shape's M
    drafts: gamma for a chain) -> (target cache, drafter state)."""
    encoder_tokens = batch["encoder_input_tokens"]
    cache_length = batch["decoder_input_tokens"].shape[1] + self.draft_shape.width
    encoded, cache = self._prefill_target(params["target"], encoder_tokens, cache_length)
    return cache, self.drafter.init_state(
        params["drafter"], encoder_tokens, cache_length, target_encoded=encoded
    )

  def predict_batch_with_aux(
      self,
      params,
      batch: Batch,
      rng: jax.Array | None = None,
      decoder_params: Mapping[str, Any] | None = None,
      return_all_decodes: bool = False,
      num_decodes: int = 1,
      prompt_with_targets: bool = False,
      prefilled: Any = None,
  ):
    """-> (decodes, {'scores': ..., 'speculative_stats': {name: [B] or [B, N]}}), the stats named
    `decoding.STAT_NAMES` (`decoding.SpeculativeStats.from_dict` gives alpha and tokens per call).

    With decoder_params['return_trace'] = True, aux also has 'speculative_trace', a
    `decoding.SpeculativeTrace`. prefilled: as the baseline's.
    """
    if validation.check_boolean(prompt_with_targets, "prompt_with_targets"):
      raise ValueError(
          "prompt_with_targets=True is not supported by speculative decoding: decode "
          "from BOS (the encoder-decoder default)."
      )
    params = self.checked_params(params)
    validation.check_boolean(return_all_decodes, "return_all_decodes")
    settings = self._settings(params, batch, decoder_params, rng, num_decodes)
    decoder_inputs = batch["decoder_input_tokens"]
    target_cache, drafter_state = self.prefill(params, batch) if prefilled is None else prefilled
    output = self._decode_fn(
        inputs=jnp.zeros_like(decoder_inputs),
        target_cache=target_cache,
        target_logits_fn=functools.partial(self._target_decode, params["target"]),
        drafter=self.drafter,
        drafter_params=params["drafter"],
        drafter_state=drafter_state,
        eos_id=self.eos_id,
        gamma=self.gamma,
        verifier=self.verifier,
        draft_shape=self.draft_shape,
        move_target_cache=network.move_cache_slots,
        num_decodes=num_decodes,
        **settings,
    )
    aux = {"scores": output.log_probs, "speculative_stats": output.stats.as_dict()}
    if output.trace is not None:
      aux["speculative_trace"] = output.trace
    if return_all_decodes:
      return output.decodes, aux
    return output.decodes[:, -1], jax.tree.map(lambda x: x[:, -1], aux)
