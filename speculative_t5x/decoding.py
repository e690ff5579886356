"""Decoding loops, each one `lax.while_loop`: the T5X baseline and speculative sampling.

`temperature_sample` has T5X's signature and semantics (t5x/decoding.py): it is the baseline of
every speedup we report. `speculative_sample` runs Algorithm 1 for all rows at once: draft gamma
tokens, verify them with one target call on gamma+1 tokens, accept per row, write, roll back.
Where the drafts sit (a chain, a static tree) is a `draft_shapes.DraftShape`, which the loop calls
without asking which shape it holds.

Rows are B*N ("flat"): the N decodes of one batch item sit next to each other, as in T5X.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import draft_length
from speculative_t5x import draft_shapes
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
  drafted_tokens: the row's drafts (the shape's M per target call: gamma for a chain, fewer
  under a draft-length rule, a tree's nodes);
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

  drafts [..., L, M]: the drafts of each call (M = gamma for a chain, a tree's nodes in block
  order); accepted [..., L]: how many were accepted (n); token [..., L]: the target's correction
  (or bonus) token; emitted [..., L]: the tokens kept (0 once ended); path [..., L, D]: the
  block indices (1..M) of the drafts the verifier walked, in order: entries < n the accepted
  path, entry n (when n < D) the first draft it rejected after it (0: none; for a tree the first
  child of the path's last node), later entries not read. A chain's path is 1..gamma; None (a
  trace built by hand) means that. Iteration i of a row is at index i; iterations after all rows
  ended are zero.
  """

  drafts: jax.Array
  accepted: jax.Array
  token: jax.Array
  emitted: jax.Array
  path: jax.Array | None = None

  @classmethod
  def zeros(
      cls, rows: int, length: int, num_drafts: int, depth: int | None = None
  ) -> "SpeculativeTrace":
    """All zeros: drafts [rows, length, num_drafts], path [rows, length, depth] (depth None: a
    chain, num_drafts)."""
    zeros = jnp.zeros((rows, length), jnp.int32)
    depth = num_drafts if depth is None else depth
    return cls(
        jnp.zeros((rows, length, num_drafts), jnp.int32),
        zeros,
        zeros,
        zeros,
        jnp.zeros((rows, length, depth), jnp.int32),
    )

  def record(
      self,
      iteration: jax.Array,
      drafts: jax.Array,
      accepted: jax.Array,
      token: jax.Array,
      emitted: jax.Array,
      path: jax.Array,
  ) -> "SpeculativeTrace":
    """Writes one iteration's values (drafts [rows, M], path [rows, D], the others [rows]) at
    index `iteration`."""
    return SpeculativeTrace(
        *(
            old.at[:, iteration].set(new)
            for old, new in (
                (self.drafts, drafts),
                (self.accepted, accepted),
                (self.token, token),
                (self.emitted, emitted),
                (self.path, path),
            )
        )
    )


@flax.struct.dataclass
class SpeculativeOutput:
  """What `speculative_sample` returns: decodes [B, N, L] int32 (0 after EOS), log_probs [B, N]
  (sorted ascending, best last), stats (fields [B, N]) and trace (fields [B, N, L(, M or D)], or
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
) -> tuple[jax.Array, jax.Array]:
  """Each row's decode limit for max_decode_steps s (None: up to L) and prompt lengths [rows]
  -> (its last position min(L, prompt length + s) [rows] int32, whether it decodes nothing
  [rows] bool).

  Both loops give s one meaning: a row decodes at most s tokens after its prompt, and never past
  L. A concrete s is checked to be in [1, L] before tracing (`validation.check_max_decode_steps`);
  a traced one (an argument of the caller's `jax.jit`) cannot be, and is taken as it is: s > L
  decodes up to L, and s <= 0 decodes nothing (the row is its prompt, then padding, with log-prob
  0).
  """
  if max_decode_steps is None:
    return jnp.full(prompt_lengths.shape, length, jnp.int32), jnp.zeros(prompt_lengths.shape, bool)
  steps = jnp.asarray(max_decode_steps, jnp.int32)
  if hard_limit:
    steps = jnp.minimum(steps, hard_limit)
  max_len = jnp.minimum(length, prompt_lengths + steps).astype(jnp.int32)
  return max_len, jnp.broadcast_to(steps <= 0, prompt_lengths.shape)


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
    decode_rng: PRNG key (default PRNGKey(0)), or one per example ([B, 2]: each example's
      tokens then do not depend on the others in the batch); step i draws with the uniforms [B*N]
      at row i of `sampling.uniforms(decode_rng, (L, B*N))`.
    num_decodes: N independent samples per item.
    temperature: scalar or [B]; at or below 1e-4 greedy (argmax).
    topk: T5X's default 1 is greedy; 0 means no cutoff.
    topp: nucleus mass, 0 means no cutoff; at most one of topk, topp may be non-zero.
    cache_offset: the batch axis of cache arrays.
    initial_index: [B] int32 loop start per row (prefilled caches); default 0.
    max_decode_steps: decode at most this many tokens after the prompt (None: up to L); an integer
      in [1, L], or traced under the caller's `jax.jit`, where s <= 0 decodes nothing and s > L
      decodes up to L (`speculative_sample` gives it the same meaning).
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
  max_len, decodes_nothing = _max_lengths(
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
      ended=decodes_nothing[:, None],
      log_prob=jnp.zeros((rows,), jnp.float32),
  )
  final = jax.lax.while_loop(cond, body, init)
  if state_callback_fn is not None:
    final = state_callback_fn(final)
  return _unflatten_sorted(final.sequences[:, 1:-1], final.log_prob, num_decodes)


@flax.struct.dataclass
class SpeculativeLoopState:
  """The speculative loop's carry. sequences [rows, L+D+1] holds y_0, y_1, ... (no BOS slot;
  D the shape's depth); length [rows] counts the decoded tokens, which is also the target cache's
  index."""

  sequences: jax.Array
  length: jax.Array
  ended: jax.Array  # [rows] bool
  target_cache: Any
  drafter_state: Any
  log_prob: jax.Array  # [rows]
  stats: SpeculativeStats  # fields [rows]
  iteration: jax.Array  # scalar int32
  trace: SpeculativeTrace | None  # fields [rows, L(, M or D)], or None when not traced


def speculative_sample(
    inputs: jax.Array,
    target_cache: Any,
    target_logits_fn: Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]],
    drafter: drafters_lib.Drafter,
    drafter_params: Any,
    drafter_state: Any,
    eos_id: int,
    *,
    gamma: int | None = None,
    verifier: speculative.Verifier | None = None,
    draft_stop: draft_length.DraftStop | None = None,
    draft_tree: trees.DraftTree | Sequence[int] | None = None,
    draft_shape: draft_shapes.DraftShape | None = None,
    move_target_cache: draft_shapes.MoveCache | None = None,
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

  Each iteration the draft shape (`draft_shapes.DraftShape.iterate`) has the drafter propose its
  drafts, the target score the pending token and them in one call and the verifier accept n of
  them along a path and give the next token; each row then writes its n + 1 new tokens (cut at
  EOS and at max_decode_steps) and rolls its length forward.

  Args:
    inputs: [B, L] int32, only its shape is used (decoding starts from BOS; prompts are not
      supported here).
    target_cache: the target's cache at batch B, length at least L + M + 1 (M + 1 = the shape's
      `width`: gamma + 1 for a chain).
    target_logits_fn: (tokens [rows, k], cache, cache_index [rows]) -> (logits [rows, k, V], cache),
      the target's k-token cached decode; with return_features=True (asked for only when the
      drafter `reads_target_features`, with feature_layers=its `target_feature_layers`) ->
      (logits, decoder features [rows, k, E (1 + len(feature_layers))], cache), whose
      accepted positions the loop hands the drafter (`Drafter.observe_features`); with a tree,
      tree=the `trees.DraftTree` (scored under its attention mask).
    drafter: a `drafters.Drafter`; drafter_params its parameters; drafter_state its state at
      batch B (from `drafter.init_state`).
    eos_id: end-of-sequence id; tokens accepted after it are dropped.
    gamma: drafts per target call of a chain (static), the most under `draft_stop`; with a
      draft_tree or a draft_shape, None or its depth D.
    verifier: a `speculative.Verifier`; None: the shape's default (Algorithm 1,
      `speculative.TokenVerifier`, for a chain; `speculative.TreeVerifier` for a tree).
    draft_stop: a `draft_length` rule that ends a row's drafting early (adaptive draft length,
      `draft_shapes.Chain`), or None: gamma drafts per call.
    draft_tree: a static `trees.DraftTree` of M drafts and depth D (or its branching), or None: a
      chain (`draft_shapes.Tree`).
    draft_shape: a `draft_shapes.DraftShape`, in place of gamma, draft_stop and draft_tree.
    move_target_cache: (cache, destination [rows], sources [rows, D]) -> cache, needed by a shape
      that compacts the cache (a tree): slots destination + j take the contents of slots
      sources[:, j] (`network.move_cache_slots`).
    decode_rng, num_decodes, temperature, topk, topp, max_decode_steps: as in temperature_sample
      (topk defaults to 0 here: no cutoff). Iteration i uses the uniforms [B*N, 2 M + 1] at row i
      of `sampling.uniforms(decode_rng, (L, B*N, 2 M + 1))`: M for the drafts, M + 1 for the
      verifier.
    rescale_log_probs: log-probs from the standardized target distribution (True) or from the
      target's raw softmax (False).
    return_trace: also record what happened at each iteration (for inspection; costs memory):
      `trace.drafts` holds the M drafts of each call, `trace.path` the ones the verifier walked.

  Returns:
    A `SpeculativeOutput`: decodes [B, N, L], log_probs [B, N], stats (`SpeculativeStats`, fields
    [B, N]) and, with return_trace, the trace (`SpeculativeTrace`, fields [B, N, L(, M or D)]).
  """
  shape = draft_shapes.make_shape(gamma, draft_stop, draft_tree, draft_shape)
  validation.check_decode_call(
      inputs, eos_id, num_decodes, temperature, topk, topp, max_decode_steps, decode_rng
  )
  if drafter.vocab_size <= 0:
    raise ValueError(f"the drafter's vocab_size is {drafter.vocab_size}: give it the target's.")
  verifier = shape.default_verifier if verifier is None else verifier
  shape.check(verifier, drafter, move_target_cache)
  batch, length = inputs.shape
  rows = batch * num_decodes
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  if not sampling.is_greedy(temperature):  # a greedy temperature stays static (see sampling).
    temperature = jnp.asarray(temperature, jnp.float32)
    if temperature.ndim == 1:
      temperature = jnp.repeat(temperature, num_decodes)[:, None]  # [rows, 1] vs [rows, k, V]

  parts = draft_shapes.Parts(
      drafter,
      drafter.decode_params(drafter_params),
      target_logits_fn,
      verifier,
      sampling.Standardizer(temperature, topk, topp),
      move_target_cache,
  )
  max_len, decodes_nothing = _max_lengths(max_decode_steps, jnp.zeros((rows,), jnp.int32), length)
  depth = shape.depth
  block = jnp.arange(depth + 1)[None]  # [1, D+1]

  # Every active row emits at least one token per iteration: at most L iterations.
  uniforms = sampling.uniforms(rng, (length, rows, shape.num_uniforms))

  def body(state: SpeculativeLoopState) -> SpeculativeLoopState:
    u = uniforms[jnp.minimum(state.iteration, length - 1)]
    position = draft_shapes.Position(
        state.sequences, state.length, state.ended, state.target_cache, state.drafter_state
    )
    step = shape.iterate(parts, position, u)
    n = step.n

    # New tokens: the n accepted drafts, then the correction (or bonus) token.
    out = jnp.where(block < n[:, None], jnp.pad(step.drafts, ((0, 0), (0, 1))), step.token[:, None])
    emitted = n + 1
    is_eos = (out == eos_id) & (block < emitted[:, None])
    emitted = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, emitted)
    emitted = jnp.minimum(emitted, max_len - state.length)
    emitted = jnp.where(state.ended, 0, emitted)
    kept = block < emitted[:, None]
    out = jnp.where(kept, out, 0)
    sequences = _write_rows(state.sequences, out, state.length)

    out_log_prob = _log_probs(step.logits, step.p, out, rescale_log_probs)
    log_prob = state.log_prob + jnp.sum(jnp.where(kept, out_log_prob, 0.0), axis=1)

    active = (~state.ended).astype(jnp.int32)
    verified = kept[:, :depth]  # beta at the accepted drafts and at the first rejection.
    stats = state.stats
    stats = stats.replace(
        target_calls=stats.target_calls + active,
        drafter_calls=stats.drafter_calls + active * step.drafter_steps * drafter.steps_per_draft,
        drafted_tokens=stats.drafted_tokens + active * step.drafted,
        accepted_tokens=stats.accepted_tokens + jnp.minimum(n, emitted),
        beta_sum=stats.beta_sum + jnp.sum(jnp.where(verified, step.beta, 0.0), axis=1),
        beta_count=stats.beta_count + jnp.sum(verified, axis=1).astype(jnp.int32),
    )

    trace = state.trace
    if return_trace:
      trace = trace.record(
          state.iteration, step.traced_drafts, n, step.token, emitted, step.traced_path
      )
    new_length = state.length + emitted
    ended = state.ended | jnp.any(is_eos & kept, axis=1) | (new_length >= max_len)
    return SpeculativeLoopState(
        sequences=sequences,
        length=new_length,
        ended=ended,
        target_cache=step.target_cache,
        drafter_state=step.drafter_state,
        log_prob=log_prob,
        stats=stats,
        iteration=state.iteration + 1,
        trace=trace,
    )

  init = SpeculativeLoopState(
      sequences=jnp.zeros((rows, length + depth + 1), jnp.int32),
      length=jnp.zeros((rows,), jnp.int32),
      ended=decodes_nothing,
      target_cache=expand_rows(target_cache, num_decodes),
      drafter_state=expand_rows(drafter_state, num_decodes),
      log_prob=jnp.zeros((rows,), jnp.float32),
      stats=SpeculativeStats.zeros(rows),
      iteration=jnp.int32(0),
      trace=SpeculativeTrace.zeros(rows, length, shape.num_drafts, depth) if return_trace else None,
  )
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.ended), body, init)
  leaves, treedef = jax.tree.flatten((final.stats, final.trace))
  decodes, log_prob, *leaves = _unflatten_sorted(
      final.sequences[:, :length], final.log_prob, num_decodes, *leaves
  )
  stats, trace = jax.tree.unflatten(treedef, leaves)
  return SpeculativeOutput(decodes, log_prob, stats, trace)
