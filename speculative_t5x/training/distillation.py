"""DistillSpec (Zhou et al., ICLR 2024): distilling a drafter q against a frozen target p.

Speculative sampling accepts a draft with probability beta = sum_x min(p(x), q(x)) = 1 - TVD(p, q),
and Table 3's alpha is the mean of beta over the target's own tokens, so a drafter is worth how
closely its q follows the target's p on the prefixes it is verified on. DistillSpec trains q toward
p and makes two choices explicit:

* the data: the prefixes y_{<t} the two are compared on. 'references' (the task's targets),
  'target' (the frozen target's own decodes of the inputs), 'drafter' (on-policy: the drafter's
  own samples, drawn again at every step with the current parameters) or 'mixed' (each batch
  on-policy with probability `mix_fraction`, else the target's), sampled at `data_temperature`
  (0: greedy). DistillSpec found on-policy data helps consistently: the drafter learns on the
  prefixes it will itself propose.
* the token-level divergence D(p_t, q_t) at every position t: 'forward_kl' KL(p || q)
  (mean-seeking), 'reverse_kl' KL(q || p) (mode-seeking), 'jsd' (the generalized JSD at beta 0.5,
  between the two), 'tvd' (1 - beta, what alpha rewards) or 'cross_entropy' (hard labels:
  -log q(y_t) of the sequence's own next token; on the target's greedy decodes this is sequence-
  level distillation, `training.train`'s `distill_from`; for a head on a draft vocabulary, over
  the positions whose y_t it holds, `draft_vocab_targets`). DistillSpec found no single best
  divergence: which wins depends on the task and on the decoding (greedy or sampling), so it is a
  setting to compare (configs/demo/distill_drafter.gin).

Notation: x_t is the decoder input at position t (BOS, then y shifted right), z^p_t and z^q_t the
target's and the drafter's logits there, p_t = softmax(z^p_t / tau) and q_t = softmax(z^q_t / tau)
at the divergence temperature tau. The loss is the mean of D(p_t, q_t) over the non-padding
positions (up to and including EOS); the target is frozen (its logits under stop_gradient).

Data is generated through the `drafters.Drafter` protocol itself, one `propose` of gamma = L tokens
from an empty prefix (`generate`), so generating asks nothing of a drafter's kind, and the target
generates as `drafters.T5Drafter(target_config)`. The target's encoder output is computed once per
batch and given to the target's teacher-forced logits and to the drafter (`target_encoded`), for a
drafter that reads it instead of running an encoder of its own. Training needs a drafter with
floating-point parameters and a checkpoint format (`checked_drafter`): T5Drafter,
SharedEncoderDrafter.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import alpha as alpha_lib
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import layers
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import validation
from speculative_t5x.weights import checkpoints

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd", "tvd", "cross_entropy")
DATA_SOURCES = ("references", "target", "drafter", "mixed")
# The temperatures `Distiller.evaluate` measures Table 3's alpha at: greedy and sampling.
EVAL_TEMPERATURES = (0.0, 1.0)
# Log-probabilities are floored here, far below where exp() underflows to 0 in float32 (about
# -104): then a term 0 * (log 0 - log q) is 0 * finite, and neither the value nor its gradient is
# NaN where p or q is 0 (logits of -inf included).
LOG_FLOOR = -1e9


# ----------------------------------------------------------------------------------------------
# Token-level divergences
# ----------------------------------------------------------------------------------------------
def log_probs(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / temperature), floored at LOG_FLOOR: [..., V] -> [..., V] float32."""
  scaled = logits.astype(jnp.float32) / temperature
  return jnp.maximum(jax.nn.log_softmax(scaled, axis=-1), LOG_FLOOR)


def forward_kl(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  """KL(p || q) = sum_x p(x) (log p(x) - log q(x)): log_p, log_q [..., V] -> [...]."""
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def reverse_kl(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  """KL(q || p) = sum_x q(x) (log q(x) - log p(x)): [..., V] -> [...]."""
  return forward_kl(log_q, log_p)


def jsd(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  """The generalized JSD at beta 0.5: (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2, log m
  taken with logaddexp (so m = 0 is never divided by): [..., V] -> [...], in [0, log 2]."""
  log_m = jnp.logaddexp(log_p, log_q) - jnp.log(2.0)
  return 0.5 * (forward_kl(log_p, log_m) + forward_kl(log_q, log_m))


def tvd(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  """TVD(p, q) = sum_x |p(x) - q(x)| / 2 = 1 - beta: [..., V] -> [...], in [0, 1]."""
  return 0.5 * jnp.sum(jnp.abs(jnp.exp(log_p) - jnp.exp(log_q)), axis=-1)


_DIVERGENCE_FNS = {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "jsd": jsd, "tvd": tvd}


def _check_divergence_temperature(temperature: Any) -> None:
  """A ValueError unless a concrete `temperature` is a finite number > 0 (a scalar)."""
  if not validation.is_concrete(temperature):
    return
  value = np.asarray(temperature)
  numeric = np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
  if value.ndim or not numeric or not np.isfinite(value) or value <= 0:
    raise ValueError(
        f"the divergence temperature tau is {temperature!r}: give a finite number > 0 (p and q "
        "are softmax(logits / tau), NaN at tau = 0; 1 compares the distributions sampling at "
        "temperature 1 uses). For agreement of the greedy choices, measure alpha at temperature "
        "0 (speculative_t5x.alpha)."
    )


def token_divergence(
    name: str,
    target_logits: jax.Array,
    drafter_logits: jax.Array,
    targets: jax.Array | None = None,
    temperature: float = 1.0,
) -> jax.Array:
  """D(p_t, q_t) at every position, p = softmax(target_logits / temperature) and likewise q.

  Args:
    name: one of DIVERGENCES.
    target_logits, drafter_logits: [B, L, V].
    targets: [B, L] the sequence's own next tokens y_t, for 'cross_entropy' (-log q_t(y_t)).
    temperature: the divergence temperature tau: a finite number > 0, for every divergence
      alike (as `Distillation.divergence_temperature`). At tau = 0, logits / tau is infinite
      (NaN where a logit is 0) and every divergence would be NaN; its limit, between one-hot
      argmax distributions, has no gradient to train on. So a concrete tau <= 0 or not finite
      is a ValueError (a traced tau is not checked). Agreement of the greedy choices is Table
      3's alpha at temperature 0 (`speculative_t5x.alpha`).
  Returns:
    [B, L] float32.
  """
  _check_divergence_temperature(temperature)
  if name != "cross_entropy" and name not in _DIVERGENCE_FNS:
    raise ValueError(f"unknown divergence {name!r}: use one of {DIVERGENCES}.")
  if name != "cross_entropy" and np.shape(target_logits) != np.shape(drafter_logits):
    raise ValueError(
        f"target_logits {np.shape(target_logits)} and drafter_logits "
        f"{np.shape(drafter_logits)} must have one shape [B, L, V]: the two models' logits at "
        "the same positions over one vocabulary."
    )
  log_q = log_probs(drafter_logits, temperature)
  if name == "cross_entropy":
    if targets is None:
      raise ValueError("the 'cross_entropy' divergence needs the targets y_t: pass targets.")
    return -jnp.take_along_axis(log_q, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return _DIVERGENCE_FNS[name](log_probs(target_logits, temperature), log_q)


# ----------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
      value, (bool, np.bool_)
  )


@gin.configurable(module="distillation")
@dataclasses.dataclass(frozen=True)
class Distillation:
  """How a drafter is distilled against a frozen target (`training.train(distillation=...)`).

  target_dir: a `checkpoints.save_model` directory of the target, e.g. a trained target's
    MODEL_DIR/model (a path-like becomes a string; relative paths resolve as gin configs do,
    `gin_utils.resolve_path`).
  divergence: one of DIVERGENCES (module docstring).
  data: one of DATA_SOURCES (module docstring).
  data_temperature: the temperature generated data is sampled at (0: greedy); generated data
    only.
  divergence_temperature: tau > 0 in p = softmax(z^p / tau), q = softmax(z^q / tau).
  mix_fraction: with data='mixed', the probability that a batch is on-policy (else the target's).
  unroll_steps: for a drafter that reads the target's features (`Drafter.reads_target_features`),
    how many draft steps each position unrolls on the drafter's own predicted features
    (training-time test, EAGLE-3 / HASS); 1 trains the first draft only.
  step_decay: step j's loss weighs step_decay^(j-1) (EAGLE-3's 0.8).
  feature_loss_weight: the weight of the SmoothL1 regression of the predicted features on the
    target's (EAGLE's feature loss), per step; 0: off.
  feature_noise: uniform noise U(-a, a) added to the true features the first step reads (EAGLE's
    0.2-scale noise); 0: off.

  Every field is checked on construction (gin_utils.ConfigError naming the field and the fix);
  the target directory is read only by `target_config` and `restore_target`.
  """

  target_dir: str = gin.REQUIRED
  divergence: str = "tvd"
  data: str = "drafter"
  data_temperature: float = 1.0
  divergence_temperature: float = 1.0
  mix_fraction: float = 0.5
  unroll_steps: int = 1
  step_decay: float = 0.8
  feature_loss_weight: float = 0.0
  feature_noise: float = 0.0

  @property
  def uses_features(self) -> bool:
    """Whether a setting only a drafter reading the target's features can use is on."""
    return self.unroll_steps != 1 or self.feature_loss_weight != 0 or self.feature_noise != 0

  def __post_init__(self):
    def fail(problem: str) -> None:
      raise gin_utils.ConfigError(f"Distillation.{problem}")

    if isinstance(self.target_dir, os.PathLike):
      object.__setattr__(self, "target_dir", os.fspath(self.target_dir))
    if not isinstance(self.target_dir, str) or not self.target_dir:
      fail(
          f"target_dir is {self.target_dir!r}: give the frozen target's checkpoints.save_model "
          "directory (e.g. a trained target's MODEL_DIR/model) as a string."
      )
    if self.divergence not in DIVERGENCES:
      fail(f"divergence is {self.divergence!r}: use one of {DIVERGENCES}.")
    if self.data not in DATA_SOURCES:
      fail(f"data is {self.data!r}: use one of {DATA_SOURCES}.")
    for name in ("data_temperature", "divergence_temperature", "mix_fraction"):
      value = getattr(self, name)
      if not _is_number(value) or not np.isfinite(value):
        fail(f"{name} is {value!r}: give a finite number.")
    if self.data_temperature < 0:
      fail(f"data_temperature is {self.data_temperature}: give a temperature >= 0 (0: greedy).")
    if self.divergence_temperature <= 0:
      fail(
          f"divergence_temperature is {self.divergence_temperature}: give tau > 0 (p and q are "
          "softmax(logits / tau); 1 compares the distributions sampling at temperature 1 uses)."
      )
    steps = self.unroll_steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
      fail(f"unroll_steps is {steps!r}: give an integer >= 1 (1: the first draft only).")
    for name in ("step_decay", "feature_loss_weight", "feature_noise"):
      value = getattr(self, name)
      if not _is_number(value) or not np.isfinite(value) or value < 0:
        fail(f"{name} is {value!r}: give a finite number >= 0.")
    if not 0 < self.step_decay <= 1:
      fail(f"step_decay is {self.step_decay}: give a weight in (0, 1] (EAGLE-3 uses 0.8).")
    if not 0 <= self.mix_fraction <= 1:
      fail(f"mix_fraction is {self.mix_fraction}: give a probability in [0, 1].")
    default = {f.name: f.default for f in dataclasses.fields(self)}
    if self.data != "mixed" and self.mix_fraction != default["mix_fraction"]:
      fail(
          f"mix_fraction is {self.mix_fraction} but data is {self.data!r}: the fraction of on-"
          "policy batches applies to data='mixed' only; set data='mixed' or drop mix_fraction."
      )
    if self.data == "references" and self.data_temperature != default["data_temperature"]:
      fail(
          f"data_temperature is {self.data_temperature} but data is 'references': nothing is "
          "sampled from the task's own targets; use data='target', 'drafter' or 'mixed', or drop "
          "data_temperature."
      )
    if self.divergence == "cross_entropy" and self.data in ("drafter", "mixed"):
      fail(
          f"divergence is 'cross_entropy' with data={self.data!r}: the hard-label loss on the "
          "drafter's own samples has zero expected gradient (E_q[grad log q] = 0) and never "
          "sees the target; use data='target' or 'references', or a divergence against p "
          "('tvd', 'forward_kl', 'reverse_kl', 'jsd')."
      )

  @property
  def path(self) -> str:
    """target_dir resolved as gin configs resolve paths (`gin_utils.resolve_path`)."""
    return gin_utils.resolve_path(self.target_dir)

  def target_config(self) -> network.T5Config:
    """The target's T5Config from target_dir/config.json; reads nothing else (a cheap check
    before any model is built)."""
    try:
      return checkpoints.read_config(self.path)
    except FileNotFoundError as e:
      raise gin_utils.ConfigError(
          f"Distillation.target_dir {self.target_dir!r}: {e}. Give the frozen target's "
          "checkpoints.save_model directory, e.g. a trained target's MODEL_DIR/model."
      ) from e

  def restore_target(self) -> tuple[dict, network.T5Config]:
    """(params, config) of the frozen target (`checkpoints.restore_model`), the parameters in the
    compute dtype its config records, whatever they are stored in (demo_models/target is stored
    in bfloat16 and computes in float32)."""
    config = self.target_config()
    return checkpoints.restore_model(self.path, dtype=config.dtype)

  def as_dict(self) -> dict:
    """The settings, for a run's summary."""
    return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------
def cut_after_eos(sequences: jax.Array, eos_id: int) -> jax.Array:
  """Zeros after each row's first EOS: [B, L] -> [B, L]."""
  return jnp.where(alpha_lib.generated_positions(sequences, eos_id), sequences, 0)


def generate(
    drafter: drafters_lib.Drafter,
    params: Any,
    encoder_input_tokens: jax.Array,
    length: int,
    temperature: float,
    rng: jax.Array,
    eos_id: int,
    target_encoded: jax.Array | None = None,
) -> jax.Array:
  """y_1..y_length drawn left to right from `drafter` at `temperature` (0: greedy): one
  `Drafter.propose` of gamma = length from the empty prefix (cache_length length + 1), each row
  cut after its first EOS.

  Args:
    encoder_input_tokens: [B, Le].
    target_encoded: [B, Le, E_target], the target's encoder output, for `Drafter.init_state`.
  Returns:
    sequences [B, length] int32, 0 after the first EOS.
  """
  batch = encoder_input_tokens.shape[0]
  state = drafter.init_state(
      params, encoder_input_tokens, length + 1, target_encoded=target_encoded
  )
  drafts, _, _ = drafter.propose(
      params,
      state,
      jnp.zeros((batch, length), jnp.int32),
      jnp.zeros((batch,), jnp.int32),
      length,
      sampling.uniforms(rng, (batch, length)),
      sampling.Standardizer(temperature),
  )
  return cut_after_eos(drafts, eos_id)


def decoder_features(sequences: jax.Array, eos_id: int) -> dict[str, jax.Array]:
  """Generated sequences [B, L] (0 after EOS) as decoder features [B, L] each: the inputs (BOS,
  then shifted right), the targets, and loss weights 1 up to and including the first EOS."""
  return {
      "decoder_input_tokens": alpha_lib.shift_right(sequences),
      "decoder_target_tokens": sequences,
      "decoder_loss_weights": alpha_lib.generated_positions(sequences, eos_id).astype(jnp.float32),
  }


def picks_on_policy(rng: jax.Array, mix_fraction: float) -> jax.Array:
  """Whether a 'mixed' batch is on-policy: True with probability mix_fraction, fixed by `rng`
  (the training step folds the seed and the step into it) -> bool []."""
  return jax.random.bernoulli(rng, mix_fraction)


# ----------------------------------------------------------------------------------------------
# The frozen target
# ----------------------------------------------------------------------------------------------
def target_encode(
    config: network.T5Config, params: Any, encoder_input_tokens: jax.Array
) -> jax.Array:
  """The target's encoder output: [B, Le] -> [B, Le, E]."""
  module = network.Transformer(config)
  return module.apply({"params": params}, encoder_input_tokens, method=module.encode)


def target_logits(
    config: network.T5Config,
    params: Any,
    encoded: jax.Array,
    encoder_input_tokens: jax.Array,
    decoder_input_tokens: jax.Array,
    return_features: bool = False,
    feature_layers: tuple[int, ...] = (),
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """`network.teacher_forced_logits` from the encoder output `encoded` [B, Le, E] (not run
  again): encoder_input_tokens [B, Le], decoder_input_tokens [B, L] -> logits [B, L, V], and
  with return_features the decoder features [B, L, E (1 + len(feature_layers))] too. The decoder mask comes from all-ones
  targets: a 0 after position 0 is a token."""
  module = network.Transformer(config)
  return module.apply(
      {"params": params},
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      jnp.ones_like(decoder_input_tokens),
      return_features=return_features,
      feature_layers=feature_layers,
      method=module.teacher_forced,
  )


def draft_vocab_targets(
    targets: jax.Array, draft_vocab: tuple[int, ...], vocab_size: int
) -> tuple[jax.Array, jax.Array]:
  """The targets y_t [B, L] as indices into a draft vocabulary of N ids -> (indices [B, L], int32,
  0 where y_t lies outside it; in_vocab [B, L], float32, 1 where y_t lies inside). With no draft
  vocabulary (`draft_vocab` ()), the targets themselves and all ones.

  The head puts q = 0 on tokens outside its vocabulary, so -log q_t(y_t) is infinite there and no
  training moves it: the 'cross_entropy' loss of such a head is the mean over the positions whose
  y_t it can draft, and the share of them is reported (`targets_in_draft_vocab`)."""
  if not draft_vocab:
    return targets, jnp.ones(targets.shape, jnp.float32)
  index = np.full(vocab_size, -1, np.int32)
  index[np.asarray(draft_vocab)] = np.arange(len(draft_vocab), dtype=np.int32)
  mapped = jnp.asarray(index)[targets]
  return jnp.maximum(mapped, 0), (mapped >= 0).astype(jnp.float32)


def smooth_l1(predicted: jax.Array, target: jax.Array) -> jax.Array:
  """EAGLE's feature loss: SmoothL1 (Huber, delta 1) averaged over the feature axis
  [..., E] -> [...]."""
  error = jnp.abs(predicted.astype(jnp.float32) - target.astype(jnp.float32))
  return jnp.mean(jnp.where(error < 1.0, 0.5 * jnp.square(error), error - 0.5), axis=-1)


# ----------------------------------------------------------------------------------------------
# The loss and the evaluation
# ----------------------------------------------------------------------------------------------
def check_trainable(drafter: drafters_lib.Drafter, params: Any) -> None:
  """Refuses parameters (arrays or their shapes) gradient descent cannot train: none at all, or
  integer arrays."""
  leaves = jax.tree.leaves(params)
  name = type(drafter).__name__
  if not leaves:
    raise gin_utils.ConfigError(
        f"{name} has no parameters to distil: distil a drafter with weights (T5Drafter, "
        "SharedEncoderDrafter)."
    )
  integer = [leaf.dtype for leaf in leaves if not jnp.issubdtype(leaf.dtype, jnp.inexact)]
  if integer:
    raise gin_utils.ConfigError(
        f"{name}'s parameters include {len(integer)} non-floating array(s) ({integer[0]}), which "
        "gradients cannot train: distil a drafter whose parameters are all floating-point "
        "(T5Drafter, SharedEncoderDrafter)."
    )


def checked_drafter(
    settings: Distillation,
    drafter: drafters_lib.Drafter,
    vocabulary_size: int,
    eos_id: Any,
    input_shapes: Mapping[str, tuple],
) -> tuple[drafters_lib.Drafter, int]:
  """Checks a distillation before anything is built, reading only the target's config.json:
  the task's output vocabulary (`vocabulary_size` pieces, `eos_id`) fits the target, the drafter
  serves the target (`Drafter.for_target`: one vocabulary and EOS; `Drafter.check_target`), can
  export what it learns (`checkpoints.Checkpointed`), and its parameters at `input_shapes` (seqio's
  feature shapes) are trainable (`check_trainable`, on their shapes).

  Returns:
    (the drafter for the target, the EOS id).
  """
  target_config = settings.target_config()
  if target_config.vocab_size < vocabulary_size:
    raise gin_utils.ConfigError(
        f"the target {settings.target_dir} has vocab_size {target_config.vocab_size} < the task "
        f"vocabulary's {vocabulary_size} pieces: distil against a target of the task's "
        "vocabulary."
    )
  eos_id = validation.check_eos_id(eos_id, target_config.vocab_size)
  try:
    drafter = drafter.for_target(target_config.vocab_size, eos_id)
    drafter.check_target(target_config)
  except ValueError as e:
    raise gin_utils.ConfigError(f"{e} (the target is {settings.target_dir})") from e
  if not checkpoints.needs_checkpoint(drafter):
    raise gin_utils.ConfigError(
        f"{type(drafter).__name__} has no checkpoint format (checkpoints.Checkpointed), so distilled "
        "parameters could not be exported: distil a drafter with one (T5Drafter, "
        "SharedEncoderDrafter)."
    )
  if settings.uses_features and not drafter.reads_target_features:
    raise gin_utils.ConfigError(
        f"Distillation.unroll_steps, feature_loss_weight and feature_noise train a drafter that "
        f"reads the target's features, but {type(drafter).__name__} does not: leave them at "
        "1, 0 and 0, or distil a feature_drafter.FeatureDrafter."
    )
  abstract = jax.eval_shape(lambda: drafter.init_params(jax.random.PRNGKey(0), input_shapes))
  check_trainable(drafter, abstract)
  return drafter, eos_id


@dataclasses.dataclass(frozen=True, eq=False)
class Distiller:
  """A drafter distilled against a frozen target: the training loss and the evaluation.

  settings: the `Distillation`; drafter: the drafter being trained (for the target's vocabulary);
  target_config: the target's architecture (its parameters are an argument of every call, so
  jitted functions never hold them as constants); eos_id: the output vocabulary's EOS;
  z_loss: T5X's z-loss coefficient on the drafter's log-normalizer log sum exp z^q (0: off).
  """

  settings: Distillation
  drafter: drafters_lib.Drafter
  target_config: network.T5Config
  eos_id: int
  z_loss: float = 0.0

  def sample_data(
      self,
      params: Any,
      target_params: Any,
      encoder_input_tokens: jax.Array,
      encoded: jax.Array,
      length: int,
      rng: jax.Array,
  ) -> tuple[jax.Array, jax.Array]:
    """Generated data for one batch -> (sequences [B, length], on-policy: bool []).

    encoder_input_tokens [B, Le]; encoded [B, Le, E_target] the target's encoder output. With
    data='mixed', `picks_on_policy` decides with the first half of `rng`; the sequences are drawn
    with the second half whatever the source, so a mixed batch equals the pure source's batch.
    """
    choice_rng, data_rng = jax.random.split(rng)
    temperature = self.settings.data_temperature

    def on_policy():
      return generate(
          self.drafter,
          jax.lax.stop_gradient(params),
          encoder_input_tokens,
          length,
          temperature,
          data_rng,
          self.eos_id,
          target_encoded=encoded,
      )

    def off_policy():
      target = drafters_lib.T5Drafter(self.target_config)
      return generate(
          target, target_params, encoder_input_tokens, length, temperature, data_rng, self.eos_id
      )

    if self.settings.data == "drafter":
      return on_policy(), jnp.asarray(True)
    if self.settings.data == "target":
      return off_policy(), jnp.asarray(False)
    pick = picks_on_policy(choice_rng, self.settings.mix_fraction)
    return jax.lax.cond(pick, on_policy, off_policy), pick

  def loss_fn(
      self, params: Any, target_params: Any, batch: Mapping[str, jax.Array], rng: jax.Array
  ) -> tuple[jax.Array, dict]:
    """The distillation loss of one unpacked batch -> (loss, metrics).

    batch: encoder_input_tokens [B, Le] and decoder_target_tokens [B, L] (the references, used
    as the data with data='references', else only for L), optionally decoder_input_tokens and
    decoder_loss_weights [B, L]. Rows whose input is all padding (an eval set's filler) weigh 0.
    rng: this step's key (the generated data, the 'mixed' choice).

    Metrics: loss (the weighted mean of D(p_t, q_t), plus the z-loss), z_loss, beta (the mean of
    sum_x min(p_t, q_t) at temperature 1: the acceptance probability of speculative sampling at
    T = 1), agreement (argmax p_t = argmax q_t: the greedy acceptance), tokens (the weight), and
    with generated data on_policy (1 if this batch was the drafter's own).
    """
    encoder_tokens = batch["encoder_input_tokens"]
    encoded = jax.lax.stop_gradient(
        target_encode(self.target_config, target_params, encoder_tokens)
    )
    metrics = {}
    if self.settings.data == "references":
      targets = batch["decoder_target_tokens"]
      inputs = batch.get("decoder_input_tokens", alpha_lib.shift_right(targets))
      weights = batch.get("decoder_loss_weights", targets > 0).astype(jnp.float32)
    else:
      length = batch["decoder_target_tokens"].shape[1]
      sequences, on_policy = self.sample_data(
          params, target_params, encoder_tokens, encoded, length, rng
      )
      features = decoder_features(sequences, self.eos_id)
      targets = features["decoder_target_tokens"]
      inputs = features["decoder_input_tokens"]
      weights = features["decoder_loss_weights"]
      metrics["on_policy"] = on_policy.astype(jnp.float32)
    weights = weights * jnp.any(encoder_tokens > 0, axis=1, keepdims=True)
    tokens = jnp.sum(weights)
    mean = lambda x: jnp.sum(x * weights) / jnp.maximum(tokens, 1.0)
    if self.drafter.reads_target_features:
      loss, q_logits, p_logits, feature_metrics = self._feature_loss(
          params, target_params, encoder_tokens, encoded, inputs, targets, weights, rng
      )
      metrics.update(feature_metrics)
    else:
      p_logits = jax.lax.stop_gradient(
          target_logits(self.target_config, target_params, encoded, encoder_tokens, inputs)
      )
      q_logits = self.drafter.teacher_forced_logits(
          params, encoder_tokens, inputs, target_encoded=encoded
      )
      loss = mean(self._divergence(p_logits, q_logits, targets))
    z = self.z_loss * jnp.square(jax.nn.logsumexp(q_logits.astype(jnp.float32), axis=-1))
    loss = loss + mean(z)
    p, q = jax.nn.softmax(p_logits), jax.lax.stop_gradient(jax.nn.softmax(q_logits))
    agreement = sampling.argmax(p_logits) == sampling.argmax(q_logits)
    metrics.update(
        loss=loss,
        z_loss=mean(z),
        beta=mean(speculative.beta(p, q)),
        agreement=mean(agreement.astype(jnp.float32)),
        tokens=tokens,
    )
    return loss, metrics

  def _divergence(self, p_logits, q_logits, targets):
    return token_divergence(
        self.settings.divergence, p_logits, q_logits, targets, self.settings.divergence_temperature
    )

  def _feature_loss(
      self, params, target_params, encoder_tokens, encoded, inputs, targets, weights, rng
  ) -> tuple[jax.Array, jax.Array, jax.Array, dict]:
    """The loss of a drafter reading the target's features, unrolled `unroll_steps` steps on its
    own predictions -> (loss, the first step's logits [B, L, V], the target's [B, L, V],
    metrics).

    Position t is supervised at step j when t >= j - 1 (a chain started at t - j + 1 >= 0) and
    y_t is a target token (weights [B, L]): the drafter's output at position t, read from
    f_{t-1} and x_t, predicts y_t = x_{t+1} against p_t and f_t of the same index t. Step j
    weighs step_decay^(j-1); each step's divergence and SmoothL1 feature loss are means over
    its supervised positions."""
    settings = self.settings
    p_logits, features = jax.lax.stop_gradient(
        target_logits(
            self.target_config,
            target_params,
            encoded,
            encoder_tokens,
            inputs,
            return_features=True,
            feature_layers=self.drafter.target_feature_layers,
        )
    )
    noise = None
    if settings.feature_noise:
      a = settings.feature_noise
      noise = jax.random.uniform(jax.random.fold_in(rng, 1), features.shape, minval=-a, maxval=a)
    predicted, q_steps = self.drafter.unrolled(
        params, encoder_tokens, inputs, encoded, features, settings.unroll_steps, noise
    )
    # A draft vocabulary: q lives on its N ids, so the divergence compares q with p restricted
    # to them and renormalized (the q that maximizes sum_x min(p, q) there); beta and agreement
    # below use the whole p. With copy_source each row's ids are the draft vocabulary and its own
    # source ids: q over V (MASK_VALUE off them, as at run time) and p likewise restricted.
    drafter = self.drafter
    draft_vocab = drafter.draft_vocab
    if drafter.copy_source:
      drafted = drafter.drafted_ids(encoder_tokens)
      q_steps = jnp.stack(
          [
              drafter.vocabulary_logits(params, encoder_tokens, f, q)
              for f, q in zip(predicted, q_steps)
          ]
      )
      p_draft = jnp.where(drafted[:, None], p_logits, layers.MASK_VALUE)
    else:
      p_draft = p_logits[..., np.asarray(draft_vocab)] if draft_vocab else p_logits
    # Only the hard-label loss reads y_t; it scores the positions whose y_t the head can draft.
    draft_targets, scored, metrics = None, 1.0, {}
    if settings.divergence == "cross_entropy":
      if drafter.copy_source:
        draft_targets = targets
        scored = jnp.take_along_axis(drafted, targets.astype(jnp.int32), axis=1)
        scored = scored.astype(jnp.float32)
      else:
        draft_targets, scored = draft_vocab_targets(targets, draft_vocab, p_logits.shape[-1])
      if draft_vocab:
        metrics["targets_in_draft_vocab"] = jnp.sum(scored * weights) / jnp.maximum(
            jnp.sum(weights), 1.0
        )
    positions = jnp.arange(inputs.shape[1])[None]
    total, norm = 0.0, 0.0
    for j in range(settings.unroll_steps):
      supervised = weights * (positions >= j)
      count = jnp.maximum(jnp.sum(supervised), 1.0)
      divergence = self._divergence(p_draft, q_steps[j], draft_targets)
      divergence = jnp.sum(divergence * supervised * scored) / jnp.maximum(
          jnp.sum(supervised * scored), 1.0
      )
      regression = jnp.sum(smooth_l1(predicted[j], features) * supervised) / count
      weight = settings.step_decay**j
      total = total + weight * (divergence + settings.feature_loss_weight * regression)
      norm += weight
      metrics[f"step{j + 1}_divergence"] = divergence
      metrics[f"step{j + 1}_feature_loss"] = regression
    first = q_steps[0]
    if draft_vocab and not drafter.copy_source:
      first = feature_drafter.scatter_draft_logits(first, draft_vocab, p_logits.shape[-1])
    return total / norm, first, p_logits, metrics

  def make_evaluate(self, decode_length: int, seed: int = 0, temperatures=EVAL_TEMPERATURES):
    """A function `evaluate(params, target_params, batches, rows) -> metrics` over fixed
    evaluation batches (each [B, ...] unpacked, its first `rows` real): the loss metrics
    (eval_loss, eval_beta, eval_agreement, token-weighted) and Table 3's alpha at each
    temperature T (alpha_t0, alpha_t1: the target samples `decode_length` tokens at T with the
    baseline loop, `alpha.target_sampler`, then both are teacher-forced, `alpha.beta_totals`).
    Every draw comes from `seed`, so evaluations at different steps see the same target samples.
    One jitted function per batch, built here once."""
    samplers = {
        t: alpha_lib.target_sampler(self.target_config, decode_length, self.eos_id, t)
        for t in temperatures
    }

    @jax.jit
    def totals(params, target_params, batch, rows, key):
      """-> {name: (sum, count)} over one batch's real rows."""
      _, metrics = self.loss_fn(params, target_params, batch, key)
      sums = {
          f"eval_{name}": (metrics[name] * metrics["tokens"], metrics["tokens"])
          for name in ("loss", "beta", "agreement")
      }
      encoder_tokens = batch["encoder_input_tokens"]
      real = jnp.arange(encoder_tokens.shape[0]) < rows
      for t in temperatures:
        sequences = samplers[t](target_params, encoder_tokens, key)
        beta_sum, positions = alpha_lib.beta_totals(
            self.target_config,
            target_params,
            self.drafter,
            params,
            encoder_tokens,
            sequences,
            self.eos_id,
            t,
        )
        sums[f"alpha_t{t:g}"] = (jnp.sum(beta_sum * real), jnp.sum(positions * real))
      return sums

    def evaluate(params, target_params, batches: Iterable[Mapping], rows: Iterable[int]) -> dict:
      key = jax.random.PRNGKey(seed)
      results = {}
      for index, (batch, n) in enumerate(zip(batches, rows)):
        for name, (total, count) in jax.device_get(
            totals(params, target_params, batch, n, jax.random.fold_in(key, index))
        ).items():
          previous = results.get(name, (0.0, 0.0))
          results[name] = (previous[0] + float(total), previous[1] + float(count))
      return {name: total / max(count, 1.0) for name, (total, count) in results.items()}

    return evaluate
