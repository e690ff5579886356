"""Table 3's alpha: the mean over target-generated tokens of beta = sum_x min(p(x), q(x)).

The target generates sequences (any decoding loop); then the target and the drafter are both
teacher-forced on them, and beta is taken at every generated position up to and including EOS,
with p and q standardized by the same function (temperature, top-k or top-p) that sampling uses.

`measure` also splits alpha by the target's confidence at each position, max_x p(x) at
temperature 1 (bins at `CONFIDENCE_EDGES`): where the target is unsure, its argmax is fragile,
and this shows where a drafter's acceptance is lost.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative

# The upper edges of the bins of the target's top probability that `measure` splits alpha by.
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.9)


def shift_right(sequences: jax.Array) -> jax.Array:
  """[B, L] -> decoder inputs [B, L]: BOS (0), then the sequence without its last token."""
  return jnp.pad(sequences, ((0, 0), (1, 0)))[:, :-1]


def generated_positions(sequences: jax.Array, eos_id: int) -> jax.Array:
  """[B, L] -> bool [B, L]: positions up to and including the first EOS (all, if none)."""
  lengths = decoding.decoded_lengths(jnp.asarray(sequences), eos_id)
  return jnp.arange(sequences.shape[1])[None] < lengths[:, None]


def teacher_forced_betas(
    target_config: network.T5Config,
    target_params,
    drafter: drafters_lib.Drafter,
    drafter_params,
    encoder_input_tokens: jax.Array,
    sequences: jax.Array,
    temperature,
    topk: int = 0,
    topp: float = 0.0,
    return_confidence: bool = False,
) -> tuple[jax.Array, ...]:
  """Both models teacher-forced on target-generated `sequences` [B, L] -> (beta [B, L] at every
  position, the drafter's logits [B, L, V]), then with return_confidence the target's top
  probability max_x p(x) at temperature 1 [B, L]; the drafter scored through
  `Drafter.teacher_forced_logits`, given the target's encoder output [B, Le, E_target] (computed
  once, for both)."""
  decoder_inputs = shift_right(sequences)
  target = network.Transformer(target_config)
  encoded = target.apply({"params": target_params}, encoder_input_tokens, method=target.encode)
  reads_features = drafter.reads_target_features
  target_out = target.apply(
      {"params": target_params},
      encoded,
      encoder_input_tokens,
      decoder_inputs,
      jnp.ones_like(decoder_inputs),  # as `network.teacher_forced_logits`: 0 is a token here.
      return_features=reads_features,
      feature_layers=drafter.target_feature_layers,
      method=target.teacher_forced,
  )
  # A drafter reading the target's features gets them at the same positions (its first draft).
  target_logits, features = target_out if reads_features else (target_out, None)
  drafter_logits = drafter.teacher_forced_logits(
      drafter_params,
      encoder_input_tokens,
      decoder_inputs,
      target_encoded=encoded,
      **({"target_features": features} if reads_features else {}),
  )
  p = sampling.distribution(target_logits, temperature, topk, topp)
  q = sampling.distribution(drafter_logits, temperature, topk, topp)
  beta = speculative.beta(p, q)
  if return_confidence:
    return beta, drafter_logits, jnp.max(jax.nn.softmax(target_logits.astype(jnp.float32)), -1)
  return beta, drafter_logits


def beta_totals(*args, **kwargs) -> tuple[jax.Array, jax.Array]:
  """`binned_beta_totals`' arguments but the edges -> (sum of beta [B], number of generated
  positions [B]) over target-generated `sequences` [B, L], unsplit."""
  sums, counts = binned_beta_totals(*args, **kwargs, edges=())
  return sums[:, 0], counts[:, 0]


def binned_beta_totals(
    target_config: network.T5Config,
    target_params,
    drafter: drafters_lib.Drafter,
    drafter_params,
    encoder_input_tokens: jax.Array,
    sequences: jax.Array,
    eos_id: int,
    temperature,
    topk: int = 0,
    topp: float = 0.0,
    edges: tuple[float, ...] = CONFIDENCE_EDGES,
) -> tuple[jax.Array, jax.Array]:
  """`beta_totals` split by the target's top probability at temperature 1: bin k holds the
  positions with edges[k - 1] <= max_x p(x) < edges[k] (from 0, to 1 inclusive) -> (sums of beta
  [B, K], numbers of generated positions [B, K]), K = len(edges) + 1."""
  beta, _, confidence = teacher_forced_betas(
      target_config,
      target_params,
      drafter,
      drafter_params,
      encoder_input_tokens,
      sequences,
      temperature,
      topk,
      topp,
      return_confidence=True,
  )
  valid = generated_positions(sequences, eos_id)
  bins = jnp.searchsorted(jnp.asarray(edges, jnp.float32), confidence, side="right")
  in_bin = (bins[..., None] == jnp.arange(len(edges) + 1)) & valid[..., None]  # [B, L, K]
  return jnp.sum(jnp.where(in_bin, beta[..., None], 0.0), axis=1), jnp.sum(in_bin, axis=1)


def target_sampler(
    target_config: network.T5Config,
    decode_length: int,
    eos_id: int,
    temperature: float,
    topk: int = 0,
    topp: float = 0.0,
):
  """A jitted `generate(params, encoder_tokens [B, Le], rng) -> sequences [B, decode_length]`: the
  target's own samples (the baseline loop), on which alpha is measured."""
  module = network.Transformer(target_config)

  @jax.jit
  def generate(params, encoder_tokens, rng):
    _, cache = module.apply(
        {"params": params}, encoder_tokens, decode_length, method=module.prefill
    )

    def tokens_to_logits(state):
      logits, new_cache = module.apply(
          {"params": params}, state.cur_token, state.cache, state.cur_index, method=module.decode
      )
      return logits[:, 0], new_cache

    decodes, _ = decoding.temperature_sample(
        jnp.zeros((encoder_tokens.shape[0], decode_length), jnp.int32),
        cache,
        tokens_to_logits,
        eos_id,
        decode_rng=rng,
        temperature=temperature,
        topk=topk,
        topp=topp,
    )
    return decodes[:, -1]

  return generate


def target_samples(
    target_config: network.T5Config,
    target_params,
    encoder_batches: Iterable,
    decode_length: int,
    eos_id: int,
    temperature: float,
    topk: int = 0,
    topp: float = 0.0,
    seed: int = 0,
) -> Iterator[tuple[jax.Array, jax.Array]]:
  """For each encoder input array [B, Le] of `encoder_batches`: (those inputs as int32, the
  target's own samples [B, decode_length] from `target_sampler`), batch i drawn with the i-th
  split of PRNGKey(seed). Alpha (`measure`) and the calibration's positions
  (`calibration.measure_positions`) are measured on these."""
  generate = target_sampler(target_config, decode_length, eos_id, temperature, topk, topp)
  rng = jax.random.PRNGKey(seed)
  for encoder_tokens in encoder_batches:
    rng, step_rng = jax.random.split(rng)
    encoder_tokens = jnp.asarray(encoder_tokens, jnp.int32)
    yield encoder_tokens, generate(target_params, encoder_tokens, step_rng)


def measure(
    target_config: network.T5Config,
    target_params,
    drafters: dict,
    encoder_batches,
    decode_length: int,
    temperature: float,
    eos_id: int,
    num_tokens: int,
    topk: int = 0,
    topp: float = 0.0,
    seed: int = 0,
) -> dict:
  """Table 3's alpha of each drafter over about `num_tokens` target-generated tokens.

  Args:
    drafters: name -> (drafters.Drafter, params).
    encoder_batches: an iterable of encoder input arrays [B, Le]; consumed until `num_tokens`
      generated positions are counted (or it runs out).
  Returns:
    {name: {'alpha': ..., 'tokens': ..., 'by_confidence': [{'top_p': [low, high], 'share': ...,
    'alpha': ... (None where no position fell)} per bin of `CONFIDENCE_EDGES`]}}.
  """
  scorers = {
      name: jax.jit(
          lambda tp, dp, enc, seq, d=drafter: binned_beta_totals(
              target_config, tp, d, dp, enc, seq, eos_id, temperature, topk, topp
          )
      )
      for name, (drafter, _) in drafters.items()
  }
  bins = len(CONFIDENCE_EDGES) + 1
  totals = {name: [np.zeros(bins), np.zeros(bins, np.int64)] for name in drafters}
  samples = target_samples(
      target_config,
      target_params,
      encoder_batches,
      decode_length,
      eos_id,
      temperature,
      topk,
      topp,
      seed,
  )
  for encoder_tokens, sequences in samples:
    for name, (_, drafter_params) in drafters.items():
      beta_sum, count = scorers[name](target_params, drafter_params, encoder_tokens, sequences)
      totals[name][0] += np.sum(np.asarray(beta_sum, np.float64), axis=0)
      totals[name][1] += np.sum(np.asarray(count), axis=0)
    if max(int(n.sum()) for _, n in totals.values()) >= num_tokens:
      break
  edges = (0.0, *CONFIDENCE_EDGES, 1.0)
  return {
      name: {
          "alpha": float(s.sum()) / max(int(n.sum()), 1),
          "tokens": int(n.sum()),
          "by_confidence": [
              {
                  "top_p": [edges[k], edges[k + 1]],
                  "share": int(n[k]) / max(int(n.sum()), 1),
                  "alpha": float(s[k]) / int(n[k]) if n[k] else None,
              }
              for k in range(bins)
          ],
      }
      for name, (s, n) in totals.items()
  }
