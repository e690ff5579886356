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


def valid_drafts(q: jax.Array, drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Which drafts a verifier may accept, and q with the others' rows zeroed.

  A draft x_i is valid when 0 <= x_i < V, its row q_i is a distribution as far as it can tell
  (every entry finite and >= 0) and q_i(x_i) > 0: a sampler only draws such tokens. An invalid
  draft (a broken drafter: NaN weights, an out-of-vocabulary id) is treated as not drafted: its q
  row becomes 0, so it is rejected and the token at its position is drawn from p_i itself, which
  keeps the output exactly the target's; a broken drafter can only cost speed.

  Args:
    q: [batch, gamma, V]; drafts: [batch, gamma] int32.
  Returns:
    (q with invalid drafts' rows zeroed [batch, gamma, V], valid [batch, gamma] bool).
  """
  vocab = q.shape[-1]
  in_range = (drafts >= 0) & (drafts < vocab)
  q_x = jnp.take_along_axis(q, jnp.where(in_range, drafts, 0)[..., None], axis=-1)[..., 0]
  valid = in_range & (q_x > 0) & jnp.all(jnp.isfinite(q) & (q >= 0), axis=-1)
  return jnp.where(valid[..., None], q, 0.0), valid


def acceptance_probability(p: jax.Array, q: jax.Array, drafts: jax.Array) -> jax.Array:
  """min(1, p_i(x_i) / q_i(x_i)) for valid drafts, 0 for the others (`valid_drafts`)
  -> [batch, gamma]; p [batch, gamma(+1), V], q [batch, gamma, V]."""
  gamma = drafts.shape[1]
  q, valid = valid_drafts(q, drafts)
  index = jnp.where(valid, drafts, 0)[..., None]
  p_x = jnp.take_along_axis(p[:, :gamma], index, axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, index, axis=-1)[..., 0]
  ratio = jnp.where(q_x > p_x, p_x / jnp.where(q_x > 0, q_x, 1.0), 1.0)
  return jnp.where(valid, ratio, 0.0)


def adjusted_distribution(
    p: jax.Array, q: jax.Array, n: jax.Array, weight: jax.Array | None = None
) -> jax.Array:
  """p' = norm(max(0, w p_{n+1} - q_{n+1})) for n < gamma, p_{gamma+1} for n = gamma -> [batch, V].

  w [batch] is 1 (None) for Algorithm 1, the prefix weight w_n for block verification.
  q_{gamma+1} := 0 makes one formula cover both cases (taken as a row of q zeroed, so q is not
  copied into a padded array). The residual has zero mass only when w p_{n+1} <= q_{n+1}
  everywhere, which a rejection at n then has probability 0 of reaching (p == q up to rounding
  for Algorithm 1); p_{n+1} itself is then returned.
  """
  gamma = q.shape[1]
  p_next = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
  q_next = jnp.take_along_axis(q, jnp.minimum(n, gamma - 1)[:, None, None], axis=1)[:, 0]
  q_next = jnp.where((n < gamma)[:, None], q_next, 0.0)
  scaled = p_next if weight is None else weight[:, None] * p_next
  residual = jnp.maximum(scaled - q_next, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_next)


def accept(
    p: jax.Array,
    q: jax.Array,
    drafts: jax.Array,
    u: jax.Array,
    draw: Callable[[jax.Array, jax.Array], jax.Array] = sampling.sample,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One speculative step per row.

  Args:
    p: target probabilities [batch, gamma+1, vocab] (float32, standardized).
    q: drafter probabilities [batch, gamma, vocab], the distributions the drafts were sampled from.
    drafts: [batch, gamma] int32, x_i ~ q_i (invalid drafts are rejected, see `valid_drafts`).
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
    raise ValueError(
        f"need uniforms of shape {(batch, gamma + 1)} (r_1..r_gamma and one for the "
        f"token), got {u.shape}."
    )
  accepted = u[:, :gamma] < acceptance_probability(p, q, drafts)
  n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  q, _ = valid_drafts(q, drafts)
  token = draw(u[:, gamma], adjusted_distribution(p, q, n))
  beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return n, token, beta


def accept_greedy(
    target_tokens: jax.Array, drafts: jax.Array
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


def prefix_weights(p: jax.Array, q: jax.Array, drafts: jax.Array) -> jax.Array:
  """Block verification's prefix weights w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1), w_0 = 1
  -> [batch, gamma] (w_1..w_gamma). An invalid draft (`valid_drafts`) has ratio 0: its prefix
  and every longer one get weight 0."""
  gamma = drafts.shape[1]
  q, valid = valid_drafts(q, drafts)
  index = jnp.where(valid, drafts, 0)[..., None]
  p_x = jnp.take_along_axis(p[:, :gamma], index, axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, index, axis=-1)[..., 0]
  ratio = p_x / jnp.where(valid, q_x, 1.0)
  ratio = jnp.where(valid & jnp.isfinite(ratio), ratio, 0.0)

  def step(w, r):
    w = jnp.minimum(w * r, 1.0)
    return w, w

  _, weights = jax.lax.scan(step, jnp.ones(drafts.shape[:1], p.dtype), ratio.T)
  return weights.T


def block_thresholds(p: jax.Array, q: jax.Array, weights: jax.Array) -> jax.Array:
  """Block verification's acceptance thresholds h_1..h_gamma -> [batch, gamma].

  h_i = Z_i / (Z_i + 1 - w_i) for i < gamma, with the residual mass
  Z_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0) (1 where Z_i + 1 - w_i = 0, its limit as
  w_i -> 1); h_gamma = w_gamma.
  """
  gamma = q.shape[1]
  w = weights[:, : gamma - 1, None]
  mass = jnp.sum(jnp.maximum(w * p[:, 1:gamma] - q[:, 1:gamma], 0.0), axis=-1)
  denominator = mass + 1.0 - weights[:, : gamma - 1]
  h = jnp.where(denominator > 0, mass / jnp.where(denominator > 0, denominator, 1.0), 1.0)
  return jnp.concatenate([h, weights[:, gamma - 1 :]], axis=1)


def accept_block(
    p: jax.Array,
    q: jax.Array,
    drafts: jax.Array,
    u: jax.Array,
    draw: Callable[[jax.Array, jax.Array], jax.Array] = sampling.sample,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block
  Verification Accelerates Speculative Decoding", ICLR 2025): the drafts are verified jointly.

  With the prefix weights w_i (`prefix_weights`) and thresholds h_i (`block_thresholds`), the
  accepted length is the longest prefix whose uniform falls under its threshold,
  n = max{i in 1..gamma : eta_i < h_i} (0 if none), and the next token is drawn from that prefix's
  weighted residual norm(max(0, w_n p_{n+1} - q_{n+1})) (w_0 = 1), or from p_{gamma+1} when
  n = gamma. The emitted block is distributed exactly as sampling from p (the paper's Theorem 1),
  its expected length is never below Algorithm 1's and is the largest any valid verifier of one
  draft block achieves (Theorem 2); on one-hot p and q it is Algorithm 1.

  Args, returns: as `accept` (u: eta_1..eta_gamma, then the uniform of the token's draw; beta is
  Algorithm 1's sum_x min(p_i, q_i), so alpha means the same under both verifiers).
  """
  batch, gamma = drafts.shape
  if u.shape != (batch, gamma + 1):
    raise ValueError(
        f"need uniforms of shape {(batch, gamma + 1)} (eta_1..eta_gamma and one for "
        f"the token), got {u.shape}."
    )
  weights = prefix_weights(p, q, drafts)
  q, _ = valid_drafts(q, drafts)
  passed = u[:, :gamma] < block_thresholds(p, q, weights)
  n = jnp.max(jnp.where(passed, jnp.arange(1, gamma + 1)[None], 0), axis=1).astype(jnp.int32)
  weight = jnp.take_along_axis(
      jnp.pad(weights, ((0, 0), (1, 0)), constant_values=1.0), n[:, None], axis=1
  )[:, 0]
  token = draw(u[:, gamma], adjusted_distribution(p, q, n, weight))
  beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return n, token, beta


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
  def verify(
      self,
      p: jax.Array,
      q: jax.Array,
      drafts: jax.Array,
      u: jax.Array,
      draw: Callable[[jax.Array, jax.Array], jax.Array] = sampling.sample,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(p [B, gamma+1, V], q [B, gamma, V], drafts [B, gamma], u [B, gamma+1]) -> (n, token, beta)."""

  @abc.abstractmethod
  def verify_greedy(
      self, target_tokens: jax.Array, drafts: jax.Array
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


# The default verifier of the loop and the models: Algorithm 1.
ALGORITHM_1 = TokenVerifier()


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class BlockVerifier(Verifier):
  """Block verification (`accept_block`): the gamma drafts are verified jointly, which accepts
  at least as many tokens as Algorithm 1 in expectation, still exactly; at temperature 0 it is
  Algorithm 1 (`accept_greedy`)."""

  def verify(self, p, q, drafts, u, draw=sampling.sample):
    return accept_block(p, q, drafts, u, draw)

  def verify_greedy(self, target_tokens, drafts):
    return accept_greedy(target_tokens, drafts)
