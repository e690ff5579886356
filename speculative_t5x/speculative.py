"""Algorithm 1 of Leviathan, Kalman, Matias (ICML 2023), on arrays, one row per sequence.

Given the target's distributions p_1..p_{gamma+1} (each conditioned on the prefix and the drafts
before it), the drafter's q_1..q_gamma and its drafts x_1..x_gamma:

  r_i ~ U(0, 1);  draft i is accepted while r_i < p_i(x_i) / q_i(x_i)
  n = number of leading accepted drafts (0..gamma)
  p' = norm(max(0, p_{n+1} - q_{n+1}))  if n < gamma,  else p_{gamma+1}
  t ~ p'
  beta_i = sum_x min(p_i(x), q_i(x))   (the acceptance probability at position i; E[beta] = alpha)

The output x_1..x_n, t is distributed exactly as sampling from p one token at a time (Appendix A.1).

`accept` and `accept_greedy` are those formulas; `Verifier` is the strategy the decoding loop
calls, and `TokenVerifier`, Algorithm 1 itself, is its default.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Callable

import gin
import jax
import jax.numpy as jnp

from speculative_t5x import sampling


def acceptance_probability(p: jax.Array, q: jax.Array, drafts: jax.Array) -> jax.Array:
  """min(1, p_i(x_i) / q_i(x_i)) -> [batch, gamma]; p [batch, gamma(+1), V], q [batch, gamma, V]."""
  gamma = drafts.shape[1]
  p_x = jnp.take_along_axis(p[:, :gamma], drafts[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
  return jnp.where(q_x > p_x, p_x / jnp.where(q_x > 0, q_x, 1.0), 1.0)


def adjusted_distribution(p: jax.Array, q: jax.Array, n: jax.Array) -> jax.Array:
  """p' = norm(max(0, p_{n+1} - q_{n+1})) for n < gamma, p_{gamma+1} for n = gamma -> [batch, V].

  q_{gamma+1} := 0 makes one formula cover both cases (taken as a row of q zeroed, so q is not
  copied into a padded array). The residual has zero mass only when p_{n+1} <= q_{n+1}
  everywhere, i.e. p == q up to rounding, where a rejection has probability 0; p_{n+1} itself is
  then returned.
  """
  gamma = q.shape[1]
  p_next = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
  q_next = jnp.take_along_axis(q, jnp.minimum(n, gamma - 1)[:, None, None], axis=1)[:, 0]
  q_next = jnp.where((n < gamma)[:, None], q_next, 0.0)
  residual = jnp.maximum(p_next - q_next, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_next)


def accept(p: jax.Array, q: jax.Array, drafts: jax.Array, u: jax.Array,
           draw: Callable[[jax.Array, jax.Array], jax.Array] = sampling.sample
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One speculative step per row.

  Args:
    p: target probabilities [batch, gamma+1, vocab] (float32, standardized).
    q: drafter probabilities [batch, gamma, vocab], the distributions the drafts were sampled from.
    drafts: [batch, gamma] int32, x_i ~ q_i.
    u: [batch, gamma+1] independent U[0, 1) draws: r_1..r_gamma, then the uniform of the draw of t.
    draw: (uniforms [batch], probabilities [batch, vocab]) -> tokens [batch] (`sampling.sample`);
      a faster exact draw may be given (e.g. `Standardizer.draw`, an argmax when every distribution
      is one-hot).

  Returns:
    n: [batch] int32, the number of accepted drafts.
    token: [batch] int32, t ~ norm(max(0, p_{n+1} - q_{n+1})), or ~ p_{gamma+1} when n = gamma.
    beta: [batch, gamma] float32, sum_x min(p_i, q_i).
  """
  batch, gamma = drafts.shape
  if u.shape != (batch, gamma + 1):
    raise ValueError(f"need uniforms of shape {(batch, gamma + 1)} (r_1..r_gamma and one for the "
                     f"token), got {u.shape}.")
  accepted = u[:, :gamma] < acceptance_probability(p, q, drafts)
  n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  token = draw(u[:, gamma], adjusted_distribution(p, q, n))
  beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return n, token, beta


def accept_greedy(target_tokens: jax.Array, drafts: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`accept` at temperature 0, where every p_i and q_i is one-hot, without building them.

  p_i(x_i) / q_i(x_i) is 1 when x_i is the target's argmax and 0 otherwise, so draft i is accepted
  (whatever r_i) exactly when it matches; after a rejection max(0, p_{n+1} - q_{n+1}) is the
  one-hot of the target's argmax, which is also p_{gamma+1} after gamma acceptances; and
  beta_i = sum_x min(p_i, q_i) is 1 on a match, else 0.

  Args:
    target_tokens: [batch, gamma+1] int32, the argmax of p_1..p_{gamma+1}.
    drafts: [batch, gamma] int32, the argmax of q_1..q_gamma.
  Returns:
    n [batch], token [batch], beta [batch, gamma] as `accept`.
  """
  gamma = drafts.shape[1]
  matches = drafts == target_tokens[:, :gamma]
  n = jnp.sum(jnp.cumprod(matches.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  token = jnp.take_along_axis(target_tokens, n[:, None], axis=1)[:, 0]
  return n, token, matches.astype(jnp.float32)


class Verifier(abc.ABC):
  """How a block of drafts is verified: the strategy `decoding.speculative_sample` calls once per
  iteration, after the target scored the pending token and the gamma drafts in one call.

  Contract (a chain of gamma drafts per row):
    `verify(p, q, drafts, u, draw) -> (n, token, beta)`:
      p [B, gamma+1, V] the target's standardized distributions (p_{i} conditioned on the prefix
      and drafts x_1..x_{i-1}); q [B, gamma, V] the drafter's, the very distributions the drafts
      were sampled from; drafts [B, gamma] int32; u [B, gamma+1] independent U[0, 1) draws (the
      verifier may use them as it likes, each at most once); draw `(u [B], probs [B, V]) ->
      tokens [B]`, an exact inverse-CDF draw.
      n [B] int32 in 0..gamma: the accepted drafts are x_1..x_n; token [B] int32: the next token
      after them; beta [B, gamma] float32: sum_x min(p_i, q_i), the acceptance probability of
      Algorithm 1 at position i (the loop averages it over the verified positions as alpha).
      Exactness: for every q (and whatever the drafts), the emitted block x_1..x_n, token,
      continued by sampling from the target, must be distributed as sampling from the target one
      token at a time; tests enumerate this law for small vocabularies.
    `verify_greedy(target_tokens, drafts) -> (n, token, beta)`: the same at temperature 0, where
      every p_i and q_i is one-hot: target_tokens [B, gamma+1] are the argmaxes of p, drafts the
      argmaxes of q; it must accept exactly the longest prefix of drafts matching target_tokens.

  A verifier is stateless and hashable (the loop is traced once per verifier); shapes are static.

  What a multi-draft (tree) verifier needs beyond this contract: drafts and q per node of a static
  tree ([B, nodes] and [B, nodes, V]) with the tree's parent indices, p at every node (one target
  call over all nodes under a tree attention mask), uniforms per node, and an output that names
  the accepted path (node indices [B, depth]) so the loop can compact the accepted keys and values
  into contiguous cache slots; n and token then refer to that path.
  """

  @abc.abstractmethod
  def verify(self, p: jax.Array, q: jax.Array, drafts: jax.Array, u: jax.Array,
             draw: Callable[[jax.Array, jax.Array], jax.Array] = sampling.sample
             ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(p [B, gamma+1, V], q [B, gamma, V], drafts [B, gamma], u [B, gamma+1]) -> (n, token, beta)."""

  @abc.abstractmethod
  def verify_greedy(self, target_tokens: jax.Array, drafts: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(target_tokens [B, gamma+1], drafts [B, gamma]) -> (n, token, beta) at temperature 0."""


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class TokenVerifier(Verifier):
  """Algorithm 1: each draft is tested on its own, r_i < p_i(x_i) / q_i(x_i), and the first
  rejection is corrected from norm(max(0, p_{n+1} - q_{n+1})) (`accept`, `accept_greedy`)."""

  def verify(self, p, q, drafts, u, draw=sampling.sample):
    return accept(p, q, drafts, u, draw)

  def verify_greedy(self, target_tokens, drafts):
    return accept_greedy(target_tokens, drafts)
