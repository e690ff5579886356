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
  level distillation, `training.train`'s `distill_from`). DistillSpec found no single best
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
from speculative_t5x import checkpoints
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import validation

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
    temperature: the divergence temperature tau (> 0).
  Returns:
    [B, L] float32.
  """
  log_q = log_probs(drafter_logits, temperature)
  if name == "cross_entropy":
    if targets is None:
      raise ValueError("the 'cross_entropy' divergence needs the targets y_t: pass targets.")
    return -jnp.take_along_axis(log_q, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  if name not in _DIVERGENCE_FNS:
    raise ValueError(f"unknown divergence {name!r}: use one of {DIVERGENCES}.")
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

  Every field is checked on construction (gin_utils.ConfigError naming the field and the fix);
  the target directory is read only by `target_config` and `restore_target`.
  """

  target_dir: str = gin.REQUIRED
  divergence: str = "tvd"
  data: str = "drafter"
  data_temperature: float = 1.0
  divergence_temperature: float = 1.0
  mix_fraction: float = 0.5

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
) -> jax.Array:
  """`network.teacher_forced_logits` from the encoder output `encoded` [B, Le, E] (not run
  again): encoder_input_tokens [B, Le], decoder_input_tokens [B, L] -> logits [B, L, V]. The
  decoder mask comes from all-ones targets: a 0 after position 0 is a token."""
  module = network.Transformer(config)
  return module.apply(
      {"params": params},
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      jnp.ones_like(decoder_input_tokens),
      method=module.teacher_forced,
  )


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
  export what it learns (`Drafter.save_params`), and its parameters at `input_shapes` (seqio's
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
  if type(drafter).save_params is drafters_lib.Drafter.save_params:
    raise gin_utils.ConfigError(
        f"{type(drafter).__name__} has no checkpoint format (Drafter.save_params), so distilled "
        "parameters could not be exported: distil a drafter with one (T5Drafter, "
        "SharedEncoderDrafter)."
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
    p_logits = jax.lax.stop_gradient(
        target_logits(self.target_config, target_params, encoded, encoder_tokens, inputs)
    )
    q_logits = self.drafter.teacher_forced_logits(
        params, encoder_tokens, inputs, target_encoded=encoded
    )
    divergence = token_divergence(
        self.settings.divergence,
        p_logits,
        q_logits,
        targets,
        self.settings.divergence_temperature,
    )
    tokens = jnp.sum(weights)
    mean = lambda x: jnp.sum(x * weights) / jnp.maximum(tokens, 1.0)
    z = self.z_loss * jnp.square(jax.nn.logsumexp(q_logits.astype(jnp.float32), axis=-1))
    loss = mean(divergence + z)
    p, q = jax.nn.softmax(p_logits), jax.lax.stop_gradient(jax.nn.softmax(q_logits))
    agreement = sampling.argmax(p_logits) == sampling.argmax(q_logits)
    metrics.update(
        loss=loss,
        z_loss=mean(z),
        beta=mean(jnp.sum(jnp.minimum(p, q), axis=-1)),
        agreement=mean(agreement.astype(jnp.float32)),
        tokens=tokens,
    )
    return loss, metrics

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
