"""Timing harness shared by the scripts: wall time of jitted calls, and the cost ratios of Thm 3.8.

Every measurement follows DESIGN.md's standards of evidence: the first call (compilation) is
excluded, then `warmup` untimed calls, then `repeats` timed calls, each ended by
`jax.block_until_ready`; results are the median, minimum, maximum and interquartile range.

Decode steps are timed the way the decoding loops run them: `steps_per_call` cached decode steps
inside one jitted `lax.fori_loop`, the cache carried (and written in place) from step to step, each
step's logits feeding the next step's input tokens, at advancing positions of a cache of realistic
length, after an encoder of realistic length. The per-step time is the call time over
`steps_per_call`, so the per-call dispatch overhead, which the `lax.while_loop` of a real decode
never pays, is spread thin; `steps_per_call=1` times literally one compiled call.

From these come the paper's cost coefficient c (Definition 3.7: one drafter step over one target
step, both on a single token) and the verification cost (the target on gamma + 1 tokens over the
target on one token), which Theorem 3.8 assumes to be 1.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import network
from speculative_t5x import sampling

DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 1
DEFAULT_STEPS_PER_CALL = 8
# Random drafters for random-weight runs. 'independent': its own random weights (alpha is whatever
# two unrelated random models share); 'copy': the target's own weights (alpha ~ 1, c ~ 1). Both
# exercise the mechanics only: the alpha of random models says nothing about real drafters.
RANDOM_DRAFTER_KINDS = ("independent", "copy")
_FIRST_NON_SPECIAL_ID = 3  # T5 vocabularies: 0 = PAD, 1 = EOS, 2 = UNK.


@dataclasses.dataclass(frozen=True)
class Timing:
  """Statistics of `repeats` wall-clock times, in milliseconds (IQR = 75th - 25th percentile)."""
  median_ms: float
  min_ms: float
  max_ms: float
  iqr_ms: float
  repeats: int

  @classmethod
  def from_seconds(cls, seconds: Sequence[float]) -> "Timing":
    """Times in seconds [repeats] -> Timing in milliseconds."""
    ms = np.asarray(seconds, np.float64) * 1e3
    if ms.ndim != 1 or ms.size == 0:
      raise ValueError(f"need a non-empty 1-D sequence of times, got shape {ms.shape}.")
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return cls(median_ms=float(q50), min_ms=float(ms.min()), max_ms=float(ms.max()),
               iqr_ms=float(q75 - q25), repeats=int(ms.size))

  def per_step(self, steps: int) -> "Timing":
    """The same statistics divided by `steps` (a call that ran `steps` identical steps)."""
    return Timing(self.median_ms / steps, self.min_ms / steps, self.max_ms / steps,
                  self.iqr_ms / steps, self.repeats)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def time_call(fn: Callable[..., Any], *args, repeats: int = DEFAULT_REPEATS,
              warmup: int = DEFAULT_WARMUP) -> Timing:
  """Wall time of `fn(*args)` (a jitted callable), compilation excluded.

  Calls fn once and blocks (compilation), `warmup` more times untimed, then `repeats` timed calls,
  each ended by `jax.block_until_ready` on the whole output pytree.
  """
  if int(repeats) < 1 or int(warmup) < 0:
    raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}.")
  for _ in range(1 + int(warmup)):
    jax.block_until_ready(fn(*args))
  seconds = []
  for _ in range(int(repeats)):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    seconds.append(time.perf_counter() - start)
  return Timing.from_seconds(seconds)


# ----------------------------------------------------------------------------------------------
# Random weights and inputs
# ----------------------------------------------------------------------------------------------
def random_params(config: network.T5Config, seed: int) -> dict:
  """float32 parameters from `network.init_params` (activations follow `config.dtype`).

  Run eagerly: compiling the initialiser of a T5-small costs more than running it op by op.
  """
  return network.init_params(config, jax.random.PRNGKey(seed))


def random_drafter(kind: str, target_config: network.T5Config, target_params: dict,
                   drafter_config: network.T5Config, seed: int) -> tuple[network.T5Config, dict]:
  """A random-weight drafter of one of RANDOM_DRAFTER_KINDS -> (config, params).

  'independent' initialises `drafter_config` from `seed`; 'copy' returns the target's config and
  its very parameters (alpha ~ 1: the drafter proposes what the target would sample).
  """
  if kind == "independent":
    return drafter_config, random_params(drafter_config, seed)
  if kind == "copy":
    return target_config, target_params
  raise ValueError(f"unknown random drafter kind {kind!r}: use one of {RANDOM_DRAFTER_KINDS}.")


def random_tokens(rng: jax.Array, vocab_size: int, shape: Sequence[int]) -> jax.Array:
  """Random non-special token ids (none is PAD, EOS or UNK) -> int32 array of `shape`."""
  if vocab_size <= _FIRST_NON_SPECIAL_ID:
    raise ValueError(f"vocab_size {vocab_size} leaves no ordinary tokens after PAD, EOS and UNK.")
  return jax.random.randint(rng, tuple(shape), _FIRST_NON_SPECIAL_ID, vocab_size, jnp.int32)


# ----------------------------------------------------------------------------------------------
# Decode steps and the cost ratios
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecodeGeometry:
  """Where timed decode steps run: encoder length Le, cache length L, first position of the
  timed steps, and the block sizes k it admits (position + steps_per_call - 1 + k <= L)."""
  encoder_length: int
  cache_length: int
  position: int
  steps_per_call: int

  @classmethod
  def for_decoding(cls, encoder_length: int, decode_length: int, max_k: int,
                   steps_per_call: int = DEFAULT_STEPS_PER_CALL) -> "DecodeGeometry":
    """The cache of a speculative decode of `decode_length` tokens with blocks of up to `max_k`
    (= gamma + 1) tokens, L = decode_length + max_k, timed from mid-decode (as far as it fits)."""
    if min(encoder_length, decode_length, max_k, steps_per_call) < 1:
      raise ValueError(f"encoder_length, decode_length, max_k and steps_per_call must be >= 1, got "
                       f"{encoder_length}, {decode_length}, {max_k}, {steps_per_call}.")
    cache_length = decode_length + max_k
    position = max(0, min(decode_length // 2, cache_length - steps_per_call - max_k + 1))
    geometry = cls(encoder_length, cache_length, position, steps_per_call)
    geometry.check(max_k)
    return geometry

  def check(self, k: int) -> None:
    end = self.position + self.steps_per_call - 1 + k
    if end > self.cache_length:
      raise ValueError(f"{self.steps_per_call} steps of {k} tokens from position {self.position} "
                       f"need {end} cache slots but the cache holds {self.cache_length}: lower "
                       "steps_per_call or lengthen the decode.")


def _feedback_tokens(logits: jax.Array) -> jax.Array:
  """logits [B, k, V] -> next input tokens [B, k]: a function of every logit (so nothing is dead
  code or loop-invariant) that costs next to nothing: the network alone is timed."""
  return jnp.where(jnp.sum(logits, axis=-1) > 0, _FIRST_NON_SPECIAL_ID + 1,
                   _FIRST_NON_SPECIAL_ID).astype(jnp.int32)


def decode_step_timing(config: network.T5Config, params: dict, k: int, geometry: DecodeGeometry,
                       *, temperature: float | None = None, batch: int = 1,
                       repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                       seed: int = 0) -> Timing:
  """Per-step time of `Transformer.decode` on k tokens [batch, k] against a cache of
  `geometry.cache_length` after an encoder input [batch, geometry.encoder_length].

  Step i of each call decodes at cache_index = position + i, writes the cache in place and feeds
  back tokens computed from its logits; the call's time is divided by `geometry.steps_per_call`.
  With `temperature` None only the network is timed; with a temperature the step is what the
  decoding loops run per call: the network, the standardized distribution of all k positions
  (`sampling.Standardizer`) and a draw from each, the drawn tokens being fed back.
  """
  geometry.check(k)
  module = network.Transformer(config)
  rng_encoder, rng_tokens = jax.random.split(jax.random.PRNGKey(seed))
  encoder_tokens = random_tokens(rng_encoder, config.vocab_size, (batch, geometry.encoder_length))
  tokens = random_tokens(rng_tokens, config.vocab_size, (batch, k))

  @jax.jit
  def prepare(params, encoder_tokens):
    encoded = module.apply({"params": params}, encoder_tokens, method=module.encode)
    return module.apply({"params": params}, encoded, encoder_tokens, geometry.cache_length,
                        method=module.init_decode_cache)

  rng, temp = jax.random.PRNGKey(seed), jnp.float32(temperature or 0.0)

  @jax.jit
  def run(params, cache, tokens):
    def step(i, carry):
      cache, tokens = carry
      index = jnp.full((batch,), geometry.position, jnp.int32) + i
      logits, cache = module.apply({"params": params}, tokens, cache, index, method=module.decode)
      if temperature is None:
        return cache, _feedback_tokens(logits)
      standardize = sampling.Standardizer(temp)
      return cache, standardize.draw(jax.random.fold_in(rng, i), standardize(logits))
    return jax.lax.fori_loop(0, geometry.steps_per_call, step, (cache, tokens))[1]

  cache = prepare(params, encoder_tokens)
  timing = time_call(run, params, cache, tokens, repeats=repeats, warmup=warmup)
  return timing.per_step(geometry.steps_per_call)


@dataclasses.dataclass(frozen=True)
class DecodeCosts:
  """Single-step timings of a (target, drafter) pair and the ratios Theorem 3.8 needs.

  target_step, drafter_step: one token each; verify: gamma -> the target on gamma + 1 tokens.
  """
  geometry: DecodeGeometry
  target_step: Timing
  drafter_step: Timing
  verify: dict[int, Timing]

  @property
  def c(self) -> float:
    """The cost coefficient (Definition 3.7): drafter step time over target step time."""
    return self.drafter_step.median_ms / self.target_step.median_ms

  def verify_cost(self, gamma: int) -> float:
    """Target time on gamma + 1 tokens over target time on 1 token (Theorem 3.8 assumes 1)."""
    if gamma not in self.verify:
      raise ValueError(f"no verification timing for gamma={gamma}: measured {sorted(self.verify)}.")
    return self.verify[gamma].median_ms / self.target_step.median_ms

  def as_dict(self) -> dict:
    return {"geometry": dataclasses.asdict(self.geometry), "c": self.c,
            "verify_cost": {str(g): self.verify_cost(g) for g in sorted(self.verify)},
            "target_step_ms": self.target_step.as_dict(),
            "drafter_step_ms": self.drafter_step.as_dict(),
            "verify_ms": {str(g): t.as_dict() for g, t in sorted(self.verify.items())}}


def measure_costs(target_config: network.T5Config, target_params: dict,
                  drafters: Mapping[str, tuple[network.T5Config, dict]], gammas: Sequence[int],
                  geometry: DecodeGeometry, *, temperature: float | None = None,
                  repeats: int = DEFAULT_REPEATS,
                  warmup: int = DEFAULT_WARMUP) -> dict[str, DecodeCosts]:
  """Costs of the target against each drafter, all timed in `geometry`
  (see `DecodeGeometry.for_decoding`); with a `temperature`, every step includes standardizing
  and drawing from its logits, as the decoding loops do (see `decode_step_timing`).

  The target's single-token step and its steps on gamma + 1 tokens (every gamma) are timed once
  and shared; each drafter's single-token step is timed, except for a drafter that is the target
  itself (same config, same parameter objects), whose step is the target's (c = 1).

  Args:
    drafters: name -> (config, params).
  Returns:
    name -> DecodeCosts.
  """
  if not gammas or min(gammas) < 1:
    raise ValueError(f"gammas must be a non-empty list of integers >= 1, got {gammas}.")
  timing = lambda config, params, k: decode_step_timing(  # noqa: E731
      config, params, k, geometry, temperature=temperature, repeats=repeats, warmup=warmup)
  target_step = timing(target_config, target_params, 1)
  verify = {int(g): timing(target_config, target_params, int(g) + 1) for g in sorted(set(gammas))}
  costs = {}
  for name, (config, params) in drafters.items():
    is_target = config == target_config and params is target_params
    drafter_step = target_step if is_target else timing(config, params, 1)
    costs[name] = DecodeCosts(geometry, target_step, drafter_step, verify)
  return costs
