"""Decode-step costs: the paper's cost coefficient c (Definition 3.7) and the verification cost
(the target on gamma + 1 tokens over one token, which Theorem 3.8 takes as 1).

Steps are timed as the loops run them: cached decode steps in one jitted `lax.fori_loop`, the
cache written in place, each step's logits feeding the next step's tokens, at advancing positions
of a realistic cache. A step's time is marginal, a call of many steps less a call of fewer over
the difference, so what a call pays once (dispatch, copying the cache in) cancels, as it does in
a real decode's `lax.while_loop`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import workloads
from speculative_t5x.text import input_data

DEFAULT_STEPS_PER_CALL = 8
EXTRA_PASSES = 4  # step times: calls of 1 + EXTRA_PASSES passes minus calls of 1 pass.


@dataclasses.dataclass(frozen=True)
class DecodeGeometry:
  """Where timed steps run: encoder length Le, cache length L, the first timed position; it
  admits blocks of k where position + steps_per_call - 1 + k <= L."""

  encoder_length: int
  cache_length: int
  position: int
  steps_per_call: int

  @classmethod
  def for_decoding(
      cls,
      encoder_length: int,
      decode_length: int,
      max_k: int,
      steps_per_call: int = DEFAULT_STEPS_PER_CALL,
  ) -> "DecodeGeometry":
    """A decode of `decode_length` tokens in blocks of up to max_k, timed from mid-decode."""
    if min(encoder_length, decode_length, max_k, steps_per_call) < 1:
      raise ValueError(
          f"encoder_length, decode_length, max_k and steps_per_call must be >= 1, got "
          f"{encoder_length}, {decode_length}, {max_k}, {steps_per_call}."
      )
    cache_length = decode_length + max_k
    position = max(0, min(decode_length // 2, cache_length - steps_per_call - max_k + 1))
    geometry = cls(encoder_length, cache_length, position, steps_per_call)
    geometry.check(max_k)
    return geometry

  def check(self, k: int) -> None:
    end = self.position + self.steps_per_call - 1 + k
    if end > self.cache_length:
      raise ValueError(
          f"{self.steps_per_call} steps of {k} tokens from position {self.position} "
          f"need {end} cache slots but the cache holds {self.cache_length}: lower "
          "steps_per_call or lengthen the decode."
      )


def _verification_tokens(
    standardize: sampling.Standardizer, u: jax.Array, logits: jax.Array
) -> jax.Array:
  """A sampling verification's work on logits [B, k, V]: every position's distribution read at
  one token, and one draw -> next input tokens [B, k]."""
  probs = standardize(logits)
  token = standardize.draw(u, probs[:, -1])
  read = jnp.take_along_axis(
      probs, jnp.broadcast_to(token[:, None, None], probs.shape[:2] + (1,)), axis=-1
  )[..., 0]
  return jnp.where(read > 1.0, 0, token[:, None]).astype(jnp.int32)  # read <= 1: token everywhere


def _feedback_tokens(logits: jax.Array) -> jax.Array:
  """logits [B, k, V] -> tokens [B, k]: reads every logit, so nothing is dead, at next to no
  cost, so the network alone is timed."""
  return jnp.where(
      jnp.sum(logits, axis=-1) > 0,
      input_data.FIRST_NON_SPECIAL_ID + 1,
      input_data.FIRST_NON_SPECIAL_ID,
  ).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Stage:
  """`repeats` cached decode steps of one network on k tokens, at consecutive positions.
  encoder_emb_dim: None for a `network.Transformer`; E_target for a
  `network.SharedEncoderDecoder`, its cache made from a random encoder output [B, Le, E]."""

  config: network.T5Config
  params: dict
  k: int = 1
  repeats: int = 1
  encoder_emb_dim: int | None = None

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def span(self) -> int:
    """Cache positions past the step's first that its steps write."""
    return self.k + self.repeats - 1

  @property
  def init_key(self) -> Hashable:
    """What its cache depends on."""
    return type(self).__name__, self.config, self.encoder_emb_dim

  @property
  def module(self) -> network.Transformer | network.SharedEncoderDecoder:
    if self.encoder_emb_dim is None:
      return network.Transformer(self.config)
    return network.SharedEncoderDecoder(self.config)

  def init_cache(
      self, params: dict, encoder_tokens: jax.Array, cache_length: int, rng: jax.Array
  ) -> dict:
    """The decode cache after encoder_tokens [B, Le]."""
    module = self.module
    variables = {"params": params}
    if self.encoder_emb_dim is None:
      return module.apply(variables, encoder_tokens, cache_length, method=module.prefill)[1]
    encoded = jax.random.normal(rng, encoder_tokens.shape + (self.encoder_emb_dim,), jnp.float32)
    return module.apply(
        variables, encoded, encoder_tokens, cache_length, method=module.init_decode_cache
    )

  def run(self, params, cache, tokens, position, u, standardize, temperature):
    """Its steps from `position` [B] on the first k of tokens [B, width] -> (tokens, the first
    k replaced by the draws, cache)."""
    module = self.module
    for r in range(self.repeats):
      logits, cache = module.apply(
          {"params": params}, tokens[:, : self.k], cache, position + r, method=module.decode
      )
      if temperature is None:
        drawn = _feedback_tokens(logits)
      elif self.k == 1 or standardize.greedy:
        drawn = standardize.draw_from_logits(u[:, : self.k], logits)[0]
      else:
        drawn = _verification_tokens(standardize, u[:, 0], logits)
      tokens = tokens.at[:, : self.k].set(drawn)
    return tokens, cache


@dataclasses.dataclass(frozen=True)
class ProposalStage:
  """One `Drafter.propose` of `gamma` drafts, its state carried, for a drafter whose proposal is
  not single steps of one T5 network (`drafters.stepped_network` None).

  params: (parameters, their `decode_params` form), made once as the loop makes them;
  target_emb_dim: E of the random encoder output [B, Le, E] its state is made from.
  """

  drafter: drafters_lib.Drafter
  params: tuple[Any, Any]
  gamma: int
  target_emb_dim: int

  @classmethod
  def of(
      cls, drafter: drafters_lib.Drafter, params: Any, gamma: int, target_emb_dim: int
  ) -> "ProposalStage":
    return cls(drafter, (params, drafter.decode_params(params)), gamma, target_emb_dim)

  @property
  def vocab_size(self) -> int:
    return self.drafter.vocab_size

  @property
  def k(self) -> int:
    return self.gamma

  @property
  def init_key(self) -> Hashable:
    return type(self).__name__, self.drafter, self.target_emb_dim

  @property
  def span(self) -> int:
    return self.gamma + 1

  def init_cache(self, params, encoder_tokens, cache_length, rng):
    """-> (the drafter's state, random decoded tokens [B, cache_length])."""
    rng_encoded, rng_tokens = jax.random.split(rng)
    encoded = jax.random.normal(
        rng_encoded, encoder_tokens.shape + (self.target_emb_dim,), jnp.float32
    )
    state = self.drafter.init_state(params[0], encoder_tokens, cache_length, target_encoded=encoded)
    sequences = input_data.random_tokens(
        rng_tokens, self.vocab_size, (encoder_tokens.shape[0], cache_length)
    )
    return state, sequences

  def run(self, params, carry, tokens, position, u, standardize, temperature):
    """Writes tokens[:, 0] at `position`, then proposes gamma drafts into tokens."""
    del temperature
    state, sequences = carry
    sequences = jax.lax.dynamic_update_slice(sequences, tokens[:, :1], (0, position[0]))
    drafts, _, state = self.drafter.propose(
        params[1],
        state,
        sequences,
        position + self.gamma,
        self.gamma,
        u[:, : self.gamma],
        standardize,
    )
    return tokens.at[:, : self.gamma].set(drafts), (state, sequences)


def decode_step_call(
    stages: Sequence[Stage | ProposalStage],
    geometry: DecodeGeometry,
    *,
    temperature: float | None = None,
    batch: int = 1,
    passes: int = 1,
    seed: int = 0,
) -> tuple[Callable[..., Any], tuple]:
  """A jitted call of passes x steps_per_call loop steps, each running the stages in order on
  caches after encoder inputs [batch, Le] -> (fn, args) for `stopwatch.time_calls`.

  Each step feeds the next the tokens drawn from its logits. With `temperature` None only the
  networks are timed; with one, each step also standardizes and draws as the loops do (k > 1: a
  verification's reads and draw; greedy: argmax). [Stage(target, k)] is a baseline step or a
  verification; [Stage(drafter, 1, gamma), Stage(target, gamma + 1)] one iteration's network
  work. `passes` is traced, so calls that differ only in it share one program and its caches.
  """
  fn, args = _stage_loop(stages, geometry, temperature, batch, seed)
  return fn, (*args, jnp.int32(passes))


def _stage_loop(
    stages: Sequence[Stage | ProposalStage],
    geometry: DecodeGeometry,
    temperature: float | None,
    batch: int,
    seed: int,
) -> tuple[Callable[..., Any], tuple]:
  """`decode_step_call` less its last argument, passes."""
  width = max(stage.k for stage in stages)
  for stage in stages:
    geometry.check(stage.span)
  vocab = stages[0].vocab_size
  if any(stage.vocab_size != vocab for stage in stages):
    raise ValueError(
        "the stages' networks must share one vocabulary (they feed each other "
        f"tokens), got sizes {[stage.vocab_size for stage in stages]}."
    )
  # The inputs are drawn on the host: eager jax.random calls would compile a program per shape.
  draws = np.random.default_rng(seed)
  encoder_tokens = workloads.host_tokens(draws, vocab, (batch, geometry.encoder_length))
  tokens = workloads.host_tokens(draws, vocab, (batch, width))
  # The stages without their parameters (passed as arguments): the programs' static structure.
  templates = tuple(dataclasses.replace(stage, params=None) for stage in stages)
  steps = geometry.steps_per_call
  # One pass's uniforms [steps, batch, width], drawn again by every later pass.
  u = jnp.asarray(draws.random((steps, batch, width), np.float32))
  # As in the loops: a greedy temperature is static (argmax only), any other one is traced.
  greedy = temperature is None or sampling.is_greedy(temperature)

  def make_prepare():
    def prepare(params, encoder_tokens, rng):
      return [
          stage.init_cache(p, encoder_tokens, geometry.cache_length, rng)
          for stage, p in zip(templates, params)
      ]

    return jax.jit(prepare)

  def make_run():
    def run(params, caches, tokens, u, temp, passes):
      standardize = sampling.Standardizer(0.0 if greedy else temp)

      def step(i, carry):
        caches, tokens = list(carry[0]), carry[1]
        position = jnp.full((batch,), geometry.position, jnp.int32) + i % steps
        for s, stage in enumerate(templates):
          tokens, caches[s] = stage.run(
              params[s], caches[s], tokens, position, u[i % steps], standardize, temperature
          )
        return caches, tokens

      return jax.lax.fori_loop(0, passes * steps, step, (caches, tokens))[1]

    return jax.jit(run)

  # A target timed on 1, 2, ... tokens prepares one kind of cache: one program for all.
  prepare = shared(
      ("prepare", tuple(t.init_key for t in templates), geometry.cache_length), make_prepare
  )
  mode = None if temperature is None else greedy
  run = shared(("run", templates, geometry, batch, mode), make_run)
  params = [stage.params for stage in stages]
  caches = prepare(params, encoder_tokens, jax.random.PRNGKey(seed))
  return run, (params, caches, tokens, u, jnp.float32(temperature or 0.0))


# Compiled functions kept per process, the least recently used dropped beyond MAX_PROGRAMS, so a
# notebook building drafter after drafter does not grow forever.
MAX_PROGRAMS = 64
_PROGRAMS: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()


def shared(key: Hashable, make: Callable[[], Any]) -> Any:
  """The jitted function(s) kept under `key`, made by `make` the first time, so a program timed
  by `auto_shape` and then by a sweep compiles once. The key holds what the program depends on
  but not the parameters; an unhashable key gets a fresh function."""
  try:
    hash(key)
  except TypeError:
    return make()
  if key not in _PROGRAMS:
    _PROGRAMS[key] = make()
    while len(_PROGRAMS) > MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]


def decode_step_calls(
    steps: Mapping[Hashable, Sequence[Stage]],
    geometry: DecodeGeometry,
    *,
    temperature: float | None = None,
    batch: int = 1,
    seed: int = 0,
) -> dict[Hashable, tuple[Callable[..., Any], tuple]]:
  """(name, passes) -> (fn, args) for 1 and 1 + EXTRA_PASSES passes of each name's stages,
  one program and caches per name, for `marginal_step_timings`."""
  calls = {}
  for name, stages in steps.items():
    fn, args = _stage_loop(stages, geometry, temperature, batch, seed)
    for passes in (1, 1 + EXTRA_PASSES):
      calls[name, passes] = fn, (*args, jnp.int32(passes))
  return calls


def marginal_step_timings(
    seconds: Mapping[Hashable, np.ndarray], geometry: DecodeGeometry
) -> dict[Hashable, stopwatch.Timing]:
  """`decode_step_calls`' seconds [rounds] -> name -> Timing of one step: per round, the
  extra passes' time over their steps. Raises ValueError where that is within the noise."""
  extra_steps = EXTRA_PASSES * geometry.steps_per_call
  names = [name for name, passes in seconds if passes == 1]
  timings = {
      name: stopwatch.Timing.from_seconds(
          (seconds[name, 1 + EXTRA_PASSES] - seconds[name, 1]) / extra_steps
      )
      for name in names
  }
  for name, timing in timings.items():
    if timing.median_ms <= 0:
      raise ValueError(
          f"could not resolve the step time of {name}: {extra_steps} extra steps took "
          f"a median of {timing.median_ms * extra_steps:.4f} ms, within the noise; "
          "raise the repeats or steps_per_call."
      )
  return timings


def time_decode_steps(
    steps: Mapping[Hashable, Sequence[Stage]],
    geometry: DecodeGeometry,
    *,
    temperature: float | None = None,
    batch: int = 1,
    repeats: int = stopwatch.DEFAULT_REPEATS,
    warmup: int = stopwatch.DEFAULT_WARMUP,
    seed: int = 0,
) -> dict[Hashable, stopwatch.Timing]:
  """name -> marginal step Timing of `name -> stages`, all timed side by side."""
  calls = decode_step_calls(steps, geometry, temperature=temperature, batch=batch, seed=seed)
  return marginal_step_timings(
      stopwatch.time_rounds(calls, repeats=repeats, warmup=warmup), geometry
  )


@dataclasses.dataclass(frozen=True)
class DecodeCosts:
  """Step timings of a (target, drafter) pair and the ratios Theorem 3.8 needs. verify: gamma ->
  the target on gamma + 1 tokens; iteration: gamma -> gamma drafter steps and that verification
  timed together, where the networks evict each other's weights from the caches."""

  geometry: DecodeGeometry
  target_step: stopwatch.Timing
  drafter_step: stopwatch.Timing
  verify: dict[int, stopwatch.Timing]
  iteration: dict[int, stopwatch.Timing]

  @property
  def c(self) -> float:
    """The cost coefficient (Definition 3.7): drafter step time over target step time."""
    return self.drafter_step.median_ms / self.target_step.median_ms

  def verify_cost(self, gamma: int) -> float:
    """Target time on gamma + 1 tokens over target time on 1 token (Theorem 3.8 assumes 1)."""
    return self._get(self.verify, gamma).median_ms / self.target_step.median_ms

  def iteration_cost(self, gamma: int) -> float:
    """An iteration over the target's step: gamma c + verify_cost, with the interference."""
    return self._get(self.iteration, gamma).median_ms / self.target_step.median_ms

  def c_in_loop(self, gamma: int) -> float:
    """A draft inside the loop in target steps: (iteration - verification) / gamma."""
    iteration = self._get(self.iteration, gamma).median_ms
    return (
        (iteration - self._get(self.verify, gamma).median_ms) / gamma / self.target_step.median_ms
    )

  def interference_ms(self, gamma: int) -> float:
    """How much longer the iteration takes than its parts apart."""
    apart = gamma * self.drafter_step.median_ms + self._get(self.verify, gamma).median_ms
    return self._get(self.iteration, gamma).median_ms - apart

  @staticmethod
  def _get(timings: dict[int, stopwatch.Timing], gamma: int) -> stopwatch.Timing:
    if gamma not in timings:
      raise ValueError(f"no timing for gamma={gamma}: measured {sorted(timings)}.")
    return timings[gamma]

  def as_dict(self) -> dict:
    gammas = sorted(self.verify)
    return {
        "geometry": dataclasses.asdict(self.geometry),
        "c": self.c,
        "verify_cost": {str(g): self.verify_cost(g) for g in gammas},
        "iteration_cost": {str(g): self.iteration_cost(g) for g in gammas},
        "c_in_loop": {str(g): self.c_in_loop(g) for g in gammas},
        "interference_ms": {str(g): self.interference_ms(g) for g in gammas},
        "target_step_ms": self.target_step.as_dict(),
        "drafter_step_ms": self.drafter_step.as_dict(),
        "verify_ms": {str(g): t.as_dict() for g, t in sorted(self.verify.items())},
        "iteration_ms": {str(g): t.as_dict() for g, t in sorted(self.iteration.items())},
    }


def check_drafter(drafter: Any, name: str = "the drafter") -> None:
  """Raises ValueError, naming the fix, unless `drafter` is a `drafters.Drafter`."""
  if not isinstance(drafter, drafters_lib.Drafter):
    fix = (
        f"wrap it: drafters.T5Drafter({type(drafter).__name__}(...))"
        if isinstance(drafter, (network.T5Config, network.Transformer))
        else "e.g. drafters.T5Drafter(config), or a pair's drafter (pairs.load_pair)"
    )
    raise ValueError(f"{name} must be a drafters.Drafter, got a {type(drafter).__name__}: {fix}.")


def drafter_network(drafter: drafters_lib.Drafter) -> tuple[network.T5Config, int | None] | None:
  """`drafters.stepped_network` of a checked drafter."""
  check_drafter(drafter)
  return drafters_lib.stepped_network(drafter)


def drafter_record(drafter: drafters_lib.Drafter) -> dict:
  """A drafter for a results file: its network's config (and encoder_emb_dim), or its kind and
  fields."""
  stepped = drafter_network(drafter)
  if stepped is None:
    fields = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)}
    return {
        "kind": type(drafter).__name__,
        **{
            name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            for name, value in fields.items()
        },
    }
  config, encoder_emb_dim = stepped
  record = dataclasses.asdict(config)
  return record if encoder_emb_dim is None else {**record, "encoder_emb_dim": encoder_emb_dim}


def cost_steps(
    target_config: network.T5Config,
    target_params: dict,
    drafters: Mapping[str, tuple[drafters_lib.Drafter, dict]],
    gammas: Sequence[int],
) -> dict[Hashable, list[Stage | ProposalStage]]:
  """name -> stages of the steps Theorem 3.8's costs need: the target on 1 and gamma + 1
  tokens; each drafter's step (none for the target itself: c = 1) and its iteration at each
  gamma, by `ProposalStage` where its proposal is not single network steps. drafters: name ->
  (a `drafters.Drafter`, params)."""
  if not gammas or min(gammas) < 1:
    raise ValueError(f"gammas must be a non-empty list of integers >= 1, got {gammas}.")
  gammas = sorted({int(g) for g in gammas})
  steps = {("target", 1): [Stage(target_config, target_params, 1)]}
  steps.update({("target", g + 1): [Stage(target_config, target_params, g + 1)] for g in gammas})
  for name, (drafter, params) in drafters.items():
    stepped = drafter_network(drafter)
    if stepped is None:
      steps[("drafter", name)] = [ProposalStage.of(drafter, params, 1, target_config.emb_dim)]
      for g in gammas:
        steps[("iteration", name, g)] = [
            ProposalStage.of(drafter, params, g, target_config.emb_dim),
            Stage(target_config, target_params, g + 1),
        ]
      continue
    config, encoder_emb_dim = stepped
    if not (config == target_config and encoder_emb_dim is None and params is target_params):
      steps[("drafter", name)] = [Stage(config, params, 1, encoder_emb_dim=encoder_emb_dim)]
    for g in gammas:
      steps[("iteration", name, g)] = [
          Stage(config, params, 1, g, encoder_emb_dim),
          Stage(target_config, target_params, g + 1),
      ]
  return steps


def costs_from_timings(
    timings: Mapping[Hashable, stopwatch.Timing],
    drafters: Sequence[str],
    gammas: Sequence[int],
    geometry: DecodeGeometry,
) -> dict[str, DecodeCosts]:
  """`cost_steps`' timings -> drafter name -> DecodeCosts."""
  gammas = sorted({int(g) for g in gammas})
  target_step = timings["target", 1]
  verify = {g: timings["target", g + 1] for g in gammas}
  return {
      name: DecodeCosts(
          geometry,
          target_step,
          timings.get(("drafter", name), target_step),
          verify,
          {g: timings["iteration", name, g] for g in gammas},
      )
      for name in drafters
  }


def measure_costs(
    target_config: network.T5Config,
    target_params: dict,
    drafters: Mapping[str, tuple[network.T5Config, dict]],
    gammas: Sequence[int],
    geometry: DecodeGeometry,
    *,
    temperature: float | None = None,
    repeats: int = stopwatch.DEFAULT_REPEATS,
    warmup: int = stopwatch.DEFAULT_WARMUP,
) -> dict[str, DecodeCosts]:
  """name -> DecodeCosts of the target against each drafter (name -> (drafter, params)), timed
  side by side at `geometry`; a `temperature` adds the loops' standardizing and draws."""
  timings = time_decode_steps(
      cost_steps(target_config, target_params, drafters, gammas),
      geometry,
      temperature=temperature,
      repeats=repeats,
      warmup=warmup,
  )
  return costs_from_timings(timings, list(drafters), gammas, geometry)
