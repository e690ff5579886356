"""Decoding loops, each one `lax.while_loop`: the T5X baseline and speculative sampling.

`temperature_sample` has T5X's signature and semantics (t5x/decoding.py): it is the baseline of
every speedup we report. `speculative_sample` runs Algorithm 1 for all rows at once: draft gamma
tokens, verify them with one target call on gamma+1 tokens, accept per row, write, roll back.

Rows are B*N ("flat"): the N decodes of one batch item sit next to each other, as in T5X.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import draft_length
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import theory
from speculative_t5x import trees
from speculative_t5x import validation

STAT_NAMES = (
    "target_calls",
    "drafter_calls",
    "drafted_tokens",
    "accepted_tokens",
    "beta_sum",
    "beta_count",
)


@flax.struct.dataclass
class SpeculativeStats:
  """Per-row counts of a speculative decode, every field of one shape ([rows], [B] or [B, N]).

  target_calls: target calls (loop iterations while the row was active); drafter_calls: drafter
  model steps the batch ran while the row was active (0 for table and lookup drafters);
  drafted_tokens: the row's drafts (gamma per target call, fewer under a draft-length rule);
  accepted_tokens: drafts accepted and kept; beta_sum, beta_count: the sum of beta_i =
  sum_x min(p_i(x), q_i(x)) over the verified positions (the accepted drafts and the first
  rejected one) and their number. `alpha`, `tokens_per_call` and `acceptance_rate` pool the rows
  (host-side, on concrete arrays) through `theory`.
  """

  target_calls: jax.Array
  drafter_calls: jax.Array
  drafted_tokens: jax.Array
  accepted_tokens: jax.Array
  beta_sum: jax.Array
  beta_count: jax.Array

  @classmethod
  def zeros(cls, rows: int) -> "SpeculativeStats":
    return cls(
        **{
            name: jnp.zeros((rows,), jnp.float32 if name == "beta_sum" else jnp.int32)
            for name in STAT_NAMES
        }
    )

  @classmethod
  def from_dict(cls, stats: Mapping[str, Any]) -> "SpeculativeStats":
    """From aux['speculative_stats'] (names STAT_NAMES -> arrays of one shape)."""
    missing = [name for name in STAT_NAMES if name not in stats]
    if missing:
      raise ValueError(
          f"speculative stats lack {missing}: pass aux['speculative_stats'] of a "
          "speculative decode."
      )
    return cls(**{name: stats[name] for name in STAT_NAMES})

  @classmethod
  def concatenate(cls, stats: Sequence["SpeculativeStats"]) -> "SpeculativeStats":
    """The rows of several decodes, flattened into one [rows] set (host-side)."""
    if not stats:
      raise ValueError("no speculative stats to concatenate.")
    return cls(
        **{
            name: np.concatenate([np.ravel(np.asarray(getattr(s, name))) for s in stats])
            for name in STAT_NAMES
        }
    )

  def as_dict(self) -> dict[str, jax.Array]:
    """STAT_NAMES -> arrays: what `predict_batch_with_aux` puts in aux['speculative_stats']."""
    return {name: getattr(self, name) for name in STAT_NAMES}

  def totals(self) -> dict[str, float]:
    """Every count summed over the rows (host-side)."""
    return {name: float(np.sum(np.asarray(getattr(self, name)))) for name in STAT_NAMES}

  @property
  def alpha(self) -> float:
    """Mean beta over the verified positions of all rows (`theory.alpha_from_stats`)."""
    return theory.alpha_from_stats(np.asarray(self.beta_sum), np.asarray(self.beta_count))

  @property
  def tokens_per_call(self) -> float:
    """(accepted drafts + target calls) / target calls, pooled (`theory.tokens_per_call`)."""
    return theory.tokens_per_call(np.asarray(self.accepted_tokens), np.asarray(self.target_calls))

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts over drafted tokens, pooled."""
    totals = self.totals()
    if totals["drafted_tokens"] <= 0:
      raise ValueError("no drafted tokens: nothing was verified, so there is no acceptance rate.")
    return totals["accepted_tokens"] / totals["drafted_tokens"]

  def summary(self) -> dict[str, float]:
    """alpha, acceptance rate, tokens per target call and the totals, pooled over the rows."""
    return {
        "alpha": self.alpha,
        "acceptance_rate": self.acceptance_rate,
        "tokens_per_target_call": self.tokens_per_call,
        **self.totals(),
    }


@flax.struct.dataclass
class SpeculativeTrace:
  """What happened at each iteration of each row (`speculative_sample(return_trace=True)`).

  drafts [..., L, gamma]: the drafts; accepted [..., L]: how many were accepted; token [..., L]:
  the target's correction (or bonus) token; emitted [..., L]: the tokens kept (0 once ended).
  Iteration i of a row is at index i; iterations after all rows ended are zero.
  """

  drafts: jax.Array
  accepted: jax.Array
  token: jax.Array
  emitted: jax.Array

  @classmethod
  def zeros(cls, rows: int, length: int, gamma: int) -> "SpeculativeTrace":
    zeros = jnp.zeros((rows, length), jnp.int32)
    return cls(jnp.zeros((rows, length, gamma), jnp.int32), zeros, zeros, zeros)

  def record(
      self,
      iteration: jax.Array,
      drafts: jax.Array,
      accepted: jax.Array,
      token: jax.Array,
      emitted: jax.Array,
  ) -> "SpeculativeTrace":
    """Writes one iteration's values ([rows, gamma] and [rows]) at index `iteration`."""
    return SpeculativeTrace(
        *(
            old.at[:, iteration].set(new)
            for old, new in (
                (self.drafts, drafts),
                (self.accepted, accepted),
                (self.token, token),
                (self.emitted, emitted),
            )
        )
    )


@flax.struct.dataclass
class SpeculativeOutput:
  """What `speculative_sample` returns: decodes [B, N, L] int32 (0 after EOS), log_probs [B, N]
  (sorted ascending, best last), stats (fields [B, N]) and trace (fields [B, N, L(, gamma)], or
  None when not asked for)."""

  decodes: jax.Array
  log_probs: jax.Array
  stats: SpeculativeStats
  trace: SpeculativeTrace | None = None


@flax.struct.dataclass
class DecodingState:
  """What `tokens_to_logits` receives (T5X's fields).

  cur_index: [B*N] int32, each row's position; sequences: [B*N, L]; cur_token: [B*N, 1];
  cache: the cache pytree.
  """

  cur_index: jax.Array
  sequences: jax.Array
  cur_token: jax.Array
  cache: Any


@flax.struct.dataclass
class SamplingLoopState:
  """The baseline's loop carry: T5X's fields but `rng` (the uniforms are drawn before the loop,
  see `sampling.uniforms`)."""

  step: jax.Array
  cur_index: jax.Array
  sequences: jax.Array  # [B*N, L+2]: a BOS slot, L decoded slots, a spare slot.
  cache: Any
  cur_token: jax.Array  # [B*N, 1]
  ended: jax.Array  # [B*N, 1] bool
  log_prob: jax.Array  # [B*N]


def expand_rows(tree: Any, num_decodes: int, axis: int = 0) -> Any:
  """Repeats every array's batch axis num_decodes times in place: [B, ...] -> [B*N, ...], the N
  copies of one row next to each other (T5X's flat_batch_beam_expand)."""
  if num_decodes == 1:
    return tree
  return jax.tree.map(lambda x: jnp.repeat(x, num_decodes, axis=axis), tree)


def _unflatten_sorted(
    sequences: jax.Array, log_prob: jax.Array, num_decodes: int, *extras: jax.Array
):
  """[B*N, ...] -> [B, N, ...], each item's decodes sorted by ascending log_prob (best last)."""

  def unflat(x):
    return x.reshape((-1, num_decodes) + x.shape[1:])

  log_prob = unflat(log_prob)
  order = jnp.argsort(log_prob, axis=1)
  take = lambda x: jnp.take_along_axis(  # noqa: E731
      unflat(x), order.reshape(order.shape + (1,) * (x.ndim - 1)), axis=1
  )
  return (take(sequences), jnp.take_along_axis(log_prob, order, axis=1), *[take(x) for x in extras])


def _max_lengths(
    max_decode_steps, prompt_lengths: jax.Array, length: int, hard_limit: int | None = None
) -> jax.Array:
  """Per-row last position: min(L, prompt length + max_decode_steps) -> [rows] int32
  (max_decode_steps, None or in [1, L], is checked at the top of the decoding functions)."""
  if max_decode_steps is None:
    return jnp.full(prompt_lengths.shape, length, jnp.int32)
  steps = jnp.asarray(max_decode_steps, jnp.int32)
  if hard_limit:
    steps = jnp.minimum(steps, hard_limit)
  return jnp.minimum(length, prompt_lengths + steps).astype(jnp.int32)


def decoded_lengths(decodes: jax.Array | np.ndarray, eos_id: int) -> jax.Array | np.ndarray:
  """Tokens of each decode up to and including its first EOS (all L if it has none):
  decodes [..., L] -> [...] (numpy in, numpy out; jax in, jax out)."""
  xp = jnp if isinstance(decodes, jax.Array) else np
  is_eos = xp.asarray(decodes) == eos_id
  return xp.where(is_eos.any(axis=-1), is_eos.argmax(axis=-1) + 1, is_eos.shape[-1])


def _write_rows(buffer: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
  """Writes block [rows, k] into buffer [rows, S] at per-row offsets start [rows]."""
  return jax.vmap(lambda b, x, i: jax.lax.dynamic_update_slice(b, x, (i,)))(buffer, block, start)


def _log_probs(
    logits: jax.Array, probs: jax.Array | None, tokens: jax.Array, rescale: bool
) -> jax.Array:
  """log-probabilities of tokens [...] under the standardized distribution probs [..., V] (rescale)
  or under softmax(logits) -> [...]; probs None means greedy, where the kept tokens are the
  argmaxes of one-hot distributions: log 1 = 0."""
  if rescale and probs is None:
    return jnp.zeros(tokens.shape, jnp.float32)
  token_probs = probs if rescale else jax.nn.softmax(logits.astype(jnp.float32))
  return jnp.log(jnp.take_along_axis(token_probs, tokens[..., None], axis=-1)[..., 0])


def temperature_sample(
    inputs: jax.Array,
    cache: Any,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, Any]],
    eos_id: int,
    decode_rng: jax.Array | None = None,
    num_decodes: int = 1,
    temperature: float | jax.Array = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: jax.Array | None = None,
    max_decode_steps: int | jax.Array | None = None,
    max_decode_steps_hard_limit: int | None = None,
    rescale_log_probs: bool = True,
    state_callback_fn=None,
    logit_callback_fn=None,
) -> tuple[jax.Array, jax.Array]:
  """Temperature sampling, one token per loop step, with T5X's signature and semantics.

  Args:
    inputs: [B, L] int32, shifted right: position 0 is the BOS slot; nonzero entries are forced
      prompt tokens (all zeros for encoder-decoder prediction).
    cache: the cache pytree at batch B (batch on axis `cache_offset`).
    tokens_to_logits: DecodingState -> (logits [B*N, V], new cache).
    eos_id: a row ends when it produces an EOS beyond those in its prompt.
    decode_rng: PRNG key (default PRNGKey(0)); step i draws with the uniforms [B*N] at row i of
      `sampling.uniforms(decode_rng, (L, B*N))`.
    num_decodes: N independent samples per item.
    temperature: scalar or [B]; at or below 1e-4 greedy (argmax).
    topk: T5X's default 1 is greedy; 0 means no cutoff.
    topp: nucleus mass, 0 means no cutoff; at most one of topk, topp may be non-zero.
    cache_offset: the batch axis of cache arrays.
    initial_index: [B] int32 loop start per row (prefilled caches); default 0.
    max_decode_steps: decode at most this many tokens after the prompt.
    max_decode_steps_hard_limit: static upper bound on max_decode_steps.
    rescale_log_probs: log-probs from the standardized (tempered, truncated) distribution when
      True, from log_softmax(logits) when False.
    state_callback_fn, logit_callback_fn: T5X's hooks.

  Returns:
    decodes [B, N, L] and log_probs [B, N], sorted by ascending log-prob (best last).
  """
  validation.check_decode_call(
      inputs, eos_id, num_decodes, temperature, topk, topp, max_decode_steps, decode_rng
  )
  batch, length = inputs.shape
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  inputs = expand_rows(inputs, num_decodes)
  cache = expand_rows(cache, num_decodes, axis=cache_offset)
  if not sampling.is_greedy(temperature):  # a greedy temperature stays static (see sampling).
    temperature = jnp.asarray(temperature, jnp.float32)
    if temperature.ndim == 1:
      temperature = jnp.repeat(temperature, num_decodes)
  if initial_index is not None:
    initial_index = expand_rows(jnp.asarray(initial_index, jnp.int32), num_decodes)
  rows = batch * num_decodes
  standardize = sampling.Standardizer(temperature, topk, topp)
  max_len = _max_lengths(
      max_decode_steps, jnp.count_nonzero(inputs, axis=1), length, max_decode_steps_hard_limit
  )
  sequences0 = jnp.pad(inputs, ((0, 0), (0, 2)))
  index0 = jnp.zeros((rows,), jnp.int32) if initial_index is None else initial_index
  token0 = jnp.take_along_axis(sequences0, index0[:, None], axis=1)
  if initial_index is None:
    token0 = jnp.zeros((rows, 1), jnp.int32)

  def cond(state: SamplingLoopState):
    return ~jnp.all(state.ended)

  u = sampling.uniforms(rng, (length, rows))  # every step reads its row; steps < length.

  def body(state: SamplingLoopState):
    if state_callback_fn is not None:
      state = state_callback_fn(state)
    decoding_state = DecodingState(
        cur_index=state.cur_index,
        sequences=state.sequences[:, :-2],
        cur_token=state.cur_token,
        cache=state.cache,
    )
    logits, new_cache = tokens_to_logits(decoding_state)
    if logit_callback_fn is not None:
      logits = logit_callback_fn(logits, state)
    sampled, probs = standardize.draw_from_logits(u[jnp.minimum(state.step, length - 1)], logits)
    i = jnp.minimum(state.cur_index, length)
    forced_token = jnp.take_along_axis(state.sequences, (i + 1)[:, None], axis=1)[:, 0]
    forced = forced_token != 0
    token = jnp.where(forced, forced_token, sampled)
    ended = state.ended[:, 0]
    token_log_prob = _log_probs(logits, probs, token, rescale_log_probs)
    log_prob = state.log_prob + jnp.where(forced | ended, 0.0, token_log_prob)
    token = jnp.where(ended, 0, token)
    sequences = _write_rows(state.sequences, token[:, None], i + 1)
    ended = ended | ((token == eos_id) & ~forced) | (i >= max_len - 1)
    return SamplingLoopState(
        step=state.step + 1,
        cur_index=i + 1,
        sequences=sequences,
        cache=new_cache,
        cur_token=token[:, None],
        ended=ended[:, None],
        log_prob=log_prob,
    )

  init = SamplingLoopState(
      step=jnp.int32(0),
      cur_index=index0,
      sequences=sequences0,
      cache=cache,
      cur_token=token0.astype(jnp.int32),
      ended=jnp.zeros((rows, 1), bool),
      log_prob=jnp.zeros((rows,), jnp.float32),
  )
  final = jax.lax.while_loop(cond, body, init)
  if state_callback_fn is not None:
    final = state_callback_fn(final)
  return _unflatten_sorted(final.sequences[:, 1:-1], final.log_prob, num_decodes)


@flax.struct.dataclass
class SpeculativeLoopState:
  """The speculative loop's carry. sequences [rows, L+gamma+1] holds y_0, y_1, ... (no BOS
  slot); length [rows] counts the decoded tokens, which is also the target cache's index."""

  sequences: jax.Array
  length: jax.Array
  ended: jax.Array  # [rows] bool
  target_cache: Any
  drafter_state: Any
  log_prob: jax.Array  # [rows]
  stats: SpeculativeStats  # fields [rows]
  iteration: jax.Array  # scalar int32
  trace: SpeculativeTrace | None  # fields [rows, L(, gamma)], or None when not traced


def _score_block(
    target_logits_fn: Callable, drafter: drafters_lib.Drafter, tokens, cache, index, **tree
) -> tuple[jax.Array, jax.Array | None, Any]:
  """One target call on the block tokens [rows, k] -> (logits [rows, k, V], the decoder features
  [rows, k, E] when the drafter reads them, else None, cache). Features are asked for only
  then, so other drafters compile to the program they always did."""
  if not drafter.reads_target_features:
    logits, cache = target_logits_fn(tokens, cache, index, **tree)
    return logits, None, cache
  return target_logits_fn(tokens, cache, index, return_features=True, **tree)


def validate_speculative(
    gamma,
    temperature,
    topk,
    topp,
    *,
    inputs=None,
    eos_id=None,
    num_decodes=1,
    max_decode_steps=None,
    decode_rng=None,
) -> None:
  """Raises `validation.InvalidInputError` (a ValueError) for bad arguments of
  `speculative_sample`, before tracing: gamma and the sampling settings, and with `inputs` [B, L]
  everything `validation.check_decode_call` checks."""
  validation.check_gamma(gamma)
  if inputs is None:
    validation.check_sampling(temperature, topk, topp)
  else:
    validation.check_decode_call(
        inputs, eos_id, num_decodes, temperature, topk, topp, max_decode_steps, decode_rng
    )


def validate_tree(
    tree: Any,
    gamma: int,
    verifier: speculative.Verifier,
    drafter: drafters_lib.Drafter,
    draft_stop: Any = None,
    move_target_cache: Any = None,
    needs_cache_move: bool = True,
) -> None:
  """Raises `validation.InvalidInputError` for a draft tree that `speculative_sample` cannot
  decode with these settings, before tracing."""
  if not isinstance(tree, trees.DraftTree):
    raise validation.InvalidInputError(
        f"draft_tree must be a trees.DraftTree, got {tree!r}: use "
        "trees.DraftTree.from_branching((k_1, ..., k_D))."
    )
  if gamma != tree.depth:
    raise validation.InvalidInputError(
        f"gamma {gamma} != the draft tree's depth {tree.depth}: with a tree, gamma is its depth "
        "(the most tokens one call accepts)."
    )
  if draft_stop is not None:
    raise validation.InvalidInputError(
        "draft_stop (adaptive draft length) works on chains only: give draft_tree or "
        "draft_stop, not both."
    )
  if type(verifier).verify_tree is speculative.Verifier.verify_tree:
    raise validation.InvalidInputError(
        f"{type(verifier).__name__} verifies chains only: use speculative.TreeVerifier() "
        "with a draft tree."
    )
  if type(drafter).propose_tree is drafters_lib.Drafter.propose_tree:
    raise validation.InvalidInputError(
        f"{type(drafter).__name__} proposes chains only, not a draft tree: use draft_tree=None, "
        "or a T5, unigram or bigram drafter for trees."
    )
  if needs_cache_move and not callable(move_target_cache):
    raise validation.InvalidInputError(
        "a draft tree needs move_target_cache (network.move_cache_slots), which makes the "
        "accepted path's cache slots contiguous."
    )


def speculative_sample(
    inputs: jax.Array,
    target_cache: Any,
    target_logits_fn: Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]],
    drafter: drafters_lib.Drafter,
    drafter_params: Any,
    drafter_state: Any,
    eos_id: int,
    *,
    gamma: int,
    verifier: speculative.Verifier = speculative.ALGORITHM_1,
    draft_stop: draft_length.DraftStop | None = None,
    draft_tree: trees.DraftTree | None = None,
    move_target_cache: Callable[[Any, jax.Array, jax.Array], Any] | None = None,
    decode_rng: jax.Array | None = None,
    num_decodes: int = 1,
    temperature: float | jax.Array = 1.0,
    topk: int = 0,
    topp: float = 0.0,
    max_decode_steps: int | jax.Array | None = None,
    rescale_log_probs: bool = True,
    return_trace: bool = False,
) -> SpeculativeOutput:
  """Speculative sampling (Algorithm 1) for all rows in one `lax.while_loop`.

  Each iteration: the drafter proposes gamma drafts (`drafter.propose`), the target scores the
  pending token and the drafts in one call, the verifier accepts n of them and gives the next
  token (`verifier.verify`, or `verify_greedy` at temperature 0), and each row writes its n + 1
  new tokens (cut at EOS and at max_decode_steps) and rolls its length forward.

  Args:
    inputs: [B, L] int32, only its shape is used (decoding starts from BOS; prompts are not
      supported here).
    target_cache: the target's cache at batch B, length at least L + gamma + 1.
    target_logits_fn: (tokens [rows, k], cache, cache_index [rows]) -> (logits [rows, k, V], cache),
      the target's k-token cached decode; with return_features=True (asked for only when the
      drafter `reads_target_features`) -> (logits, decoder features [rows, k, E], cache), whose
      accepted positions the loop hands the drafter (`Drafter.observe_features`).
    drafter: a `drafters.Drafter`; drafter_params its parameters; drafter_state its state at
      batch B (from `drafter.init_state`).
    eos_id: end-of-sequence id; tokens accepted after it are dropped.
    gamma: drafts per target call (static), the most under `draft_stop`.
    verifier: a `speculative.Verifier` (default Algorithm 1, `speculative.TokenVerifier`).
    draft_stop: a `draft_length` rule that ends a row's drafting early (adaptive draft length),
      or None: gamma drafts per call. The verification width stays gamma + 1; empty slots are
      rejected, and the drafter steps run only while some active row still drafts.
    draft_tree: a static `trees.DraftTree` of M drafts (depth D = gamma), or None: a chain. The
      drafter proposes the tree (`drafter.propose_tree`), the target scores the root and every
      node in one call under the tree's attention mask (`target_logits_fn(..., tree=tree)`), the
      verifier walks it (`verifier.verify_tree`, e.g. `speculative.TreeVerifier`), and
      `move_target_cache` (`network.move_cache_slots`) makes the accepted path's cache slots
      contiguous. The target cache then needs L + M + 1 slots.
    move_target_cache: (cache, destination [rows], sources [rows, D]) -> cache, needed with a
      tree: slots destination + j take the contents of slots sources[:, j].
    decode_rng, num_decodes, temperature, topk, topp, max_decode_steps: as in temperature_sample
      (topk defaults to 0 here: no cutoff). Iteration i uses the uniforms [B*N, 2 gamma + 1] at
      row i of `sampling.uniforms(decode_rng, (L, B*N, 2 gamma + 1))`: gamma for the drafts, gamma
      + 1 for the verifier.
    rescale_log_probs: log-probs from the standardized target distribution (True) or from the
      target's raw softmax (False).
    return_trace: also record what happened at each iteration (for inspection; costs memory);
      with a tree, `trace.drafts` holds all M nodes.

  Returns:
    A `SpeculativeOutput`: decodes [B, N, L], log_probs [B, N], stats (`SpeculativeStats`, fields
    [B, N]) and, with return_trace, the trace (`SpeculativeTrace`, fields [B, N, L(, gamma)]).
  """
  validate_speculative(
      gamma,
      temperature,
      topk,
      topp,
      inputs=inputs,
      eos_id=eos_id,
      num_decodes=num_decodes,
      max_decode_steps=max_decode_steps,
      decode_rng=decode_rng,
  )
  if drafter.vocab_size <= 0:
    raise ValueError(f"the drafter's vocab_size is {drafter.vocab_size}: give it the target's.")
  if draft_tree is not None:
    validate_tree(draft_tree, gamma, verifier, drafter, draft_stop, move_target_cache)
  batch, length = inputs.shape
  rows = batch * num_decodes
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  if not sampling.is_greedy(temperature):  # a greedy temperature stays static (see sampling).
    temperature = jnp.asarray(temperature, jnp.float32)
    if temperature.ndim == 1:
      temperature = jnp.repeat(temperature, num_decodes)[:, None]  # [rows, 1] vs [rows, k, V]

  standardize = sampling.Standardizer(temperature, topk, topp)

  max_len = _max_lengths(max_decode_steps, jnp.zeros((rows,), jnp.int32), length)
  block = jnp.arange(gamma + 1)[None]  # [1, gamma+1]
  drafts_per_call = gamma if draft_tree is None else draft_tree.num_nodes

  # Every active row emits at least one token per iteration: at most L iterations.
  uniforms = sampling.uniforms(rng, (length, rows, 2 * drafts_per_call + 1))

  def verify_tree(state: SpeculativeLoopState, u: jax.Array):
    """The tree's iteration up to the accepted path -> (path drafts [rows, D], n, token, beta
    [rows, D], logits and p along the path [rows, D+1, V] (p None when greedy), target cache,
    drafter state, drafts [rows, M])."""
    m = draft_tree.num_nodes
    drafts, q, drafter_state = drafter.propose_tree(
        drafter_params,
        state.drafter_state,
        state.sequences,
        state.length,
        draft_tree,
        u[:, :m],
        standardize,
    )
    pending = drafters_lib.decoder_inputs(state.sequences, state.length[:, None])
    in_vocabulary = jnp.where((drafts >= 0) & (drafts < drafter.vocab_size), drafts, 0)
    tokens = jnp.concatenate([pending, in_vocabulary], axis=1)  # [rows, M+1]
    logits, features, target_cache = _score_block(
        target_logits_fn, drafter, tokens, state.target_cache, state.length, tree=draft_tree
    )
    if standardize.greedy:
      p = None
      path, n, token, beta = verifier.verify_tree_greedy(
          sampling.argmax(logits), drafts, draft_tree
      )
    else:
      p = standardize(logits)
      path, n, token, beta = verifier.verify_tree(
          p, q, drafts, u[:, m:], standardize.draw, draft_tree
      )
    target_cache = move_target_cache(target_cache, state.length + 1, state.length[:, None] + path)
    # The distributions of the emitted tokens: at the root, then at the path's slots.
    along = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)[..., None]
    logits = jnp.take_along_axis(logits, along, axis=1)
    p = None if p is None else jnp.take_along_axis(p, along, axis=1)
    if features is not None:  # the path's features, at positions length .. length + D.
      features = jnp.take_along_axis(features, along, axis=1)
      drafter_state = drafter.observe_features(drafter_state, features, state.length)
    path_drafts = jnp.take_along_axis(tokens, path, axis=1)
    return path_drafts, n, token, beta, logits, p, target_cache, drafter_state, drafts

  def verify_chain(state: SpeculativeLoopState, u: jax.Array):
    """The chain's iteration up to the verifier -> (drafts [rows, gamma], n, token, beta,
    logits [rows, gamma+1, V], p (None when greedy), target cache, drafter state, drafter steps,
    drafts per row)."""
    # A rule reaches the drafter only when given, so a drafter written without `stop` still
    # decodes at a static gamma. Rows that ended stop after their first draft.
    stop = {}
    if draft_stop is not None:
      stop["stop"] = lambda logits, drafts: draft_stop(logits, drafts) | state.ended
    drafts, q, drafter_state = drafter.propose(
        drafter_params,
        state.drafter_state,
        state.sequences,
        state.length,
        gamma,
        u[:, :gamma],
        standardize,
        **stop,
    )
    # Drafts before the first EMPTY slot; the batch's drafter steps are the longest row's.
    drafted = jnp.sum(jnp.cumprod((drafts != drafters_lib.EMPTY).astype(jnp.int32), axis=1), axis=1)
    steps = gamma if draft_stop is None else jnp.max(drafted)
    drafted = gamma if draft_stop is None else drafted
    pending = drafters_lib.decoder_inputs(state.sequences, state.length[:, None])
    # An out-of-vocabulary draft (a broken drafter) never reaches the target's embedding: it is
    # scored as 0 and rejected by the verifier.
    in_vocabulary = jnp.where((drafts >= 0) & (drafts < drafter.vocab_size), drafts, 0)
    logits, features, target_cache = _score_block(
        target_logits_fn,
        drafter,
        jnp.concatenate([pending, in_vocabulary], axis=1),
        state.target_cache,
        state.length,
    )
    if features is not None:  # positions length .. length + gamma; past the accepted, unused.
      drafter_state = drafter.observe_features(drafter_state, features, state.length)
    if standardize.greedy:
      p = None
      n, token, beta = verifier.verify_greedy(sampling.argmax(logits), drafts)
    else:
      p = standardize(logits)
      n, token, beta = verifier.verify(p, q, drafts, u[:, gamma:], standardize.draw)
    return drafts, n, token, beta, logits, p, target_cache, drafter_state, steps, drafted

  def body(state: SpeculativeLoopState) -> SpeculativeLoopState:
    u = uniforms[jnp.minimum(state.iteration, length - 1)]
    if draft_tree is None:
      drafts, n, token, beta, logits, p, target_cache, drafter_state, steps, drafted = verify_chain(
          state, u
      )
      traced = drafts
    else:
      drafts, n, token, beta, logits, p, target_cache, drafter_state, traced = verify_tree(state, u)
      steps, drafted = draft_tree.depth, drafts_per_call

    # New tokens: the n accepted drafts, then the correction (or bonus) token.
    out = jnp.where(block < n[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), token[:, None])
    emitted = n + 1
    is_eos = (out == eos_id) & (block < emitted[:, None])
    emitted = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, emitted)
    emitted = jnp.minimum(emitted, max_len - state.length)
    emitted = jnp.where(state.ended, 0, emitted)
    kept = block < emitted[:, None]
    out = jnp.where(kept, out, 0)
    sequences = _write_rows(state.sequences, out, state.length)

    out_log_prob = _log_probs(logits, p, out, rescale_log_probs)
    log_prob = state.log_prob + jnp.sum(jnp.where(kept, out_log_prob, 0.0), axis=1)

    active = (~state.ended).astype(jnp.int32)
    verified = kept[:, :gamma]  # beta at the accepted drafts and at the first rejection.
    stats = state.stats
    stats = stats.replace(
        target_calls=stats.target_calls + active,
        drafter_calls=stats.drafter_calls + active * steps * drafter.steps_per_draft,
        drafted_tokens=stats.drafted_tokens + active * drafted,
        accepted_tokens=stats.accepted_tokens + jnp.minimum(n, emitted),
        beta_sum=stats.beta_sum + jnp.sum(jnp.where(verified, beta, 0.0), axis=1),
        beta_count=stats.beta_count + jnp.sum(verified, axis=1).astype(jnp.int32),
    )

    trace = state.trace
    if return_trace:
      trace = trace.record(state.iteration, traced, n, token, emitted)
    new_length = state.length + emitted
    ended = state.ended | jnp.any(is_eos & kept, axis=1) | (new_length >= max_len)
    return SpeculativeLoopState(
        sequences=sequences,
        length=new_length,
        ended=ended,
        target_cache=target_cache,
        drafter_state=drafter_state,
        log_prob=log_prob,
        stats=stats,
        iteration=state.iteration + 1,
        trace=trace,
    )

  init = SpeculativeLoopState(
      sequences=jnp.zeros((rows, length + gamma + 1), jnp.int32),
      length=jnp.zeros((rows,), jnp.int32),
      ended=max_len <= 0,
      target_cache=expand_rows(target_cache, num_decodes),
      drafter_state=expand_rows(drafter_state, num_decodes),
      log_prob=jnp.zeros((rows,), jnp.float32),
      stats=SpeculativeStats.zeros(rows),
      iteration=jnp.int32(0),
      trace=SpeculativeTrace.zeros(rows, length, drafts_per_call) if return_trace else None,
  )
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.ended), body, init)
  leaves, treedef = jax.tree.flatten((final.stats, final.trace))
  decodes, log_prob, *leaves = _unflatten_sorted(
      final.sequences[:, :length], final.log_prob, num_decodes, *leaves
  )
  stats, trace = jax.tree.unflatten(treedef, leaves)
  return SpeculativeOutput(decodes, log_prob, stats, trace)
