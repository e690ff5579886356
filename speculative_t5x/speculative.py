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
calls, and `TokenVerifier`, Algorithm 1 itself, is its default. `accept_block` verifies a chain
jointly (`BlockVerifier`); `accept_tree` verifies a draft tree by recursive rejection sampling over
each node's children (`TreeVerifier`, docs/tree_verification.md).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import sampling
from speculative_t5x import trees
from speculative_t5x import validation


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


def beta(p: jax.Array, q: jax.Array) -> jax.Array:
  """beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q) (Theorem 3.5), the probability that a draft
  x ~ q is accepted against p: p, q [..., V] -> [...]. Its mean over positions is alpha
  (Corollary 3.6); the loop, `alpha.teacher_forced_betas` and distillation's metrics all use this.
  """
  return jnp.sum(jnp.minimum(p, q), axis=-1)


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
  return _residual(scaled, q_next, p_next)


def _residual(r: jax.Array, q: jax.Array, fallback: jax.Array) -> jax.Array:
  """norm(max(0, r - q)) [..., V], or `fallback` [..., V] where that has zero mass."""
  residual = jnp.maximum(r - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), fallback)


def _check_chain(p: Any, q: Any, drafts: Any, target_tokens: Any = None) -> tuple[int, int]:
  """A chain verifier's arrays: drafts [B, gamma] of integer ids, with p [B, gamma+1, V] and q
  [B, gamma, V] (or, at temperature 0, target_tokens [B, gamma+1]) -> (B, gamma); else a
  ValueError naming the shapes a verifier needs (shapes only: it runs once, while tracing)."""
  if np.ndim(drafts) != 2 or not jnp.issubdtype(getattr(drafts, "dtype", np.float32), jnp.integer):
    raise ValueError(
        f"drafts must be [batch, gamma] integer token ids, got shape {np.shape(drafts)} and dtype "
        f"{getattr(drafts, 'dtype', type(drafts).__name__)}."
    )
  batch, gamma = np.shape(drafts)
  if target_tokens is not None:
    if tuple(np.shape(target_tokens)) != (batch, gamma + 1):
      raise ValueError(
          f"target_tokens must be [batch, gamma + 1] = {[batch, gamma + 1]} (the target's argmax "
          f"after each of the {gamma} drafts and after the last), got {np.shape(target_tokens)}."
      )
    return batch, gamma
  vocab = np.shape(p)[-1] if np.ndim(p) == 3 else None
  if vocab is None or tuple(np.shape(p)) != (batch, gamma + 1, vocab):
    raise ValueError(
        f"p must be [batch, gamma + 1, V] = [{batch}, {gamma + 1}, V] (the target's distribution "
        f"at each draft and after the last), got {np.shape(p)}."
    )
  if tuple(np.shape(q)) != (batch, gamma, vocab):
    raise ValueError(
        f"q must be [batch, gamma, V] = {[batch, gamma, vocab]} (the distribution each draft was "
        f"drawn from), got {np.shape(q)}."
    )
  return batch, gamma


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
  batch, gamma = _check_chain(p, q, drafts)
  if u.shape != (batch, gamma + 1):
    raise ValueError(
        f"need uniforms of shape {(batch, gamma + 1)} (r_1..r_gamma and one for the "
        f"token), got {u.shape}."
    )
  accepted = u[:, :gamma] < acceptance_probability(p, q, drafts)
  n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  q, _ = valid_drafts(q, drafts)
  token = draw(u[:, gamma], adjusted_distribution(p, q, n))
  return n, token, beta(p[:, :gamma], q)


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
  _, gamma = _check_chain(None, None, drafts, target_tokens)
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
  batch, gamma = _check_chain(p, q, drafts)
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
  return n, token, beta(p[:, :gamma], q)


def accept_tree(
    p: jax.Array,
    q: jax.Array,
    drafts: jax.Array,
    u: jax.Array,
    draw: Callable[[jax.Array, jax.Array], jax.Array],
    tree: trees.DraftTree,
    adjust_siblings: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """One speculative step per row over a draft tree: recursive rejection sampling.

  Starting at the root with the residual r = p_root, the children c of the current slot are
  tested in sibling order: c is accepted when u_c < min(1, r(x_c) / q_c(x_c)), and the walk moves
  to c (r = p_c) and goes on there; else r = norm(max(0, r - q_c)) (kept where that has zero mass,
  as `adjusted_distribution` does) and the next sibling is tested. When no child is accepted (or
  the slot is a leaf) the token is drawn from r. This is SpecInfer's multi-step speculative
  sampling when the children are i.i.d., recursive speculative decoding (Jeon et al.) when they
  are drawn without replacement, and covers deterministic candidates (one-hot q): the verifier
  only needs q_c to be the law child c was drawn from given its earlier siblings. On a chain it
  is Algorithm 1 (`accept`). The emitted path and token are distributed exactly as sampling from
  p (docs/tree_verification.md).

  The walk is one pass over the nodes in block order: the children of a slot are contiguous and
  come after every slot of its depth, so node i is tested exactly when its parent is the row's
  current slot, and a row whose walk stopped is at a slot no later node has as parent. The pass is
  a `lax.fori_loop` of M steps (unrolled, XLA:CPU takes minutes to compile trees of tens of
  nodes).

  Args:
    p: [B, M+1, V] the target's standardized distribution at every block slot (slot 0 the root):
      the next-token distribution after the path to the slot.
    q: [B, M, V] q[:, i] is the distribution node i's draft (block slot i+1) was drawn from, given
      the path to its parent and its earlier siblings' drafts.
    drafts: [B, M] int32. An invalid draft (`valid_drafts`: EMPTY, out of the vocabulary, a row
      of q that is not a distribution, q(x) = 0) is not drafted: it is rejected and leaves the
      residual unchanged.
    u: [B, M+1] independent U[0, 1) draws: u[:, 0] for the token's draw, u[:, i+1] node i's test.
    draw: (uniforms [B], probabilities [B, V]) -> tokens [B] (`sampling.sample`).
    tree: the static `trees.DraftTree` of the M nodes.
    adjust_siblings: False tests every child against the parent's p instead of the residual r
      its rejected siblings left: a deliberately wrong variant, for tests.

  Returns:
    path: [B, D] int32 `tree.paths` of the last accepted slot (block indices; entries past n are
      its padding).
    n: [B] int32 the accepted depth (0..D).
    token: [B] int32 the token after the accepted path.
    beta: [B, D] float32, beta[:, d] = sum_x min(p_s, q_c) at the path's slot s of depth d and
      its first child c: Algorithm 1's acceptance probability there (0 where s has no child or
      d > n).
  """
  batch, num_nodes = drafts.shape
  if num_nodes != tree.num_nodes or p.shape[1] != tree.width or q.shape[1] != num_nodes:
    raise ValueError(
        f"a draft tree of {tree.num_nodes} nodes needs p [B, {tree.width}, V], q and drafts "
        f"[B, {tree.num_nodes}(, V)], got p {p.shape}, q {q.shape}, drafts {drafts.shape}."
    )
  if u.shape != (batch, tree.width):
    raise ValueError(
        f"need uniforms of shape {(batch, tree.width)} (one for the token, then one per "
        f"node), got {u.shape}."
    )
  q, valid = valid_drafts(q, drafts)
  index = jnp.where(valid, drafts, 0)[..., None]
  q_x = jnp.take_along_axis(q, index, axis=-1)[..., 0]  # [B, M]
  parents, first_children, parent_depths = map(jnp.asarray, _node_tables(tree))

  def test(i, carry):
    """Node i (block slot i + 1) is tested when the walk is at its parent."""
    slot, r, beta = carry
    child = i + 1
    q_c, x = q[:, i], index[:, i]
    at_parent = slot == parents[i]
    beta_i = jnp.where(at_parent & first_children[i], jnp.sum(jnp.minimum(r, q_c), -1), 0.0)
    beta = beta.at[:, parent_depths[i]].add(beta_i)
    reference = r if adjust_siblings else _at_slot(p, slot)
    r_x = jnp.take_along_axis(reference, x, axis=-1)[:, 0]
    ratio = jnp.where(q_x[:, i] > r_x, r_x / jnp.where(q_x[:, i] > 0, q_x[:, i], 1.0), 1.0)
    tested = at_parent & valid[:, i]
    accepted = tested & (u[:, child] < ratio)
    r = jnp.where((tested & ~accepted)[:, None], _residual(r, q_c, r), r)
    r = jnp.where(accepted[:, None], p[:, child], r)
    return jnp.where(accepted, child, slot), r, beta

  slot, r, beta = jax.lax.fori_loop(
      0,
      tree.num_nodes,
      test,
      (jnp.zeros((batch,), jnp.int32), p[:, 0], jnp.zeros((batch, tree.depth), jnp.float32)),
  )
  token = draw(u[:, 0], r)
  return _path(tree, slot) + (token, beta)


def accept_tree_greedy(
    target_tokens: jax.Array, drafts: jax.Array, tree: trees.DraftTree
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """`accept_tree` at temperature 0, where every p and q is one-hot, without building them.

  A child's ratio r(x_c) / q_c(x_c) is then 1 when its draft is the target's argmax at the
  current slot and 0 otherwise, and a rejected child leaves the one-hot residual unchanged, so the
  walk accepts the first child that matches, and the token is the target's argmax at the last
  accepted slot. With distinct siblings (a deterministic drafter's top k) the accepted path is the
  longest one matching the target: the baseline's greedy decode continued as far as the tree
  drafted it.

  Args:
    target_tokens: [B, M+1] int32, the argmax of p at every block slot.
    drafts: [B, M] int32, the argmax of q at every node (EMPTY never matches).
    tree: the static `trees.DraftTree`.
  Returns:
    path [B, D], n [B], token [B], beta [B, D] as `accept_tree` (beta[:, d] is 1 where the first
    child of the path's slot of depth d matched, else 0).
  """
  parents, first_children, parent_depths = map(jnp.asarray, _node_tables(tree))

  def test(i, carry):
    """Node i (block slot i + 1) is accepted when the walk is at its parent and it matches."""
    slot, beta = carry
    at_parent = slot == parents[i]
    accepted = at_parent & (drafts[:, i] == target_tokens[:, parents[i]])
    beta = beta.at[:, parent_depths[i]].add((first_children[i] & accepted).astype(jnp.float32))
    return jnp.where(accepted, i + 1, slot), beta

  batch = drafts.shape[0]
  slot, beta = jax.lax.fori_loop(
      0,
      tree.num_nodes,
      test,
      (jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, tree.depth), jnp.float32)),
  )
  token = jnp.take_along_axis(target_tokens, slot[:, None], axis=1)[:, 0]
  return _path(tree, slot) + (token, beta)


def _node_tables(tree: trees.DraftTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """For every node: its parent's block index, whether it is its parent's first child, and its
  parent's depth -> three [M] arrays."""
  parents = np.asarray(tree.parents, np.int32)
  first = np.concatenate([[True], parents[1:] != parents[:-1]])
  return parents, first, tree.depths[parents]


def _at_slot(p: jax.Array, slot: jax.Array) -> jax.Array:
  """p [B, M+1, V] at one block slot per row, slot [B] -> [B, V]."""
  return jnp.take_along_axis(p, slot[:, None, None], axis=1)[:, 0]


def _path(tree: trees.DraftTree, slot: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The path [B, D] (`tree.paths`) and depth n [B] of the last accepted slot [B]."""
  return jnp.asarray(tree.paths)[slot], jnp.asarray(tree.depths)[slot]


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

  Contract (a static draft tree, `trees.DraftTree`: block slot 0 the root, 1..M the nodes in
  breadth-first order; only verifiers that override these methods, e.g. `TreeVerifier`, take a
  tree; the defaults raise ValueError):
    `verify_tree(p, q, drafts, u, draw, tree) -> (path, n, token, beta)`:
      p [B, M+1, V] the target's standardized distribution at every block slot (the next-token
      distribution after the path root -> slot; one target call over all slots under the tree's
      attention mask); q [B, M, V]: q[:, i] the distribution node i's draft (block slot i+1) was
      drawn from, given the path to its parent and its earlier siblings' drafts (so i.i.d.
      children, children drawn without replacement and deterministic candidates with one-hot q
      are all described); drafts [B, M] int32 (invalid ones, `valid_drafts`, count as not
      drafted); u [B, M+1] independent U[0, 1) draws, each used at most once; draw as above.
      path [B, D] int32: `tree.paths` of the last accepted slot, the block indices the loop
      compacts into contiguous cache slots (entries past n are padding); n [B] int32 in 0..D the
      accepted depth; token [B] int32 the next token after the path; beta [B, D] float32:
      beta[:, d] = sum_x min(p_s, q_c) at the path's slot s of depth d and its first child c (0
      where s has none or d > n), which the loop averages over the verified depths 1..min(n+1, D)
      as alpha. Exactness: the accepted path's drafts and the token, continued by sampling from
      the target, are distributed as sampling from the target one token at a time.
    `verify_tree_greedy(target_tokens, drafts, tree) -> (path, n, token, beta)`: the same at
      temperature 0: target_tokens [B, M+1] the argmax of p at every slot, drafts [B, M] the
      nodes' drafts; it must accept the path of children matching the target's argmax at their
      parent (the first matching sibling at each slot), as `verify_tree` does on one-hot p and q.
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

  def verify_tree(
      self,
      p: jax.Array,
      q: jax.Array,
      drafts: jax.Array,
      u: jax.Array,
      draw: Callable[[jax.Array, jax.Array], jax.Array],
      tree: trees.DraftTree,
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(p [B, M+1, V], q [B, M, V], drafts [B, M], u [B, M+1], draw, tree) -> (path, n, token,
    beta); a verifier of chains only raises ValueError."""
    del p, q, drafts, u, draw, tree
    raise self._chains_only()

  def verify_tree_greedy(
      self, target_tokens: jax.Array, drafts: jax.Array, tree: trees.DraftTree
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(target_tokens [B, M+1], drafts [B, M], tree) -> (path, n, token, beta) at temperature 0;
    a verifier of chains only raises ValueError."""
    del target_tokens, drafts, tree
    raise self._chains_only()

  def _chains_only(self) -> ValueError:
    return ValueError(
        f"{type(self).__name__} verifies chains of drafts only, not a draft tree: use "
        "speculative.TreeVerifier() with a draft tree."
    )


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


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class TreeVerifier(Verifier):
  """Multi-draft verification over a draft tree by recursive rejection sampling (`accept_tree`,
  `accept_tree_greedy`): SpecInfer's multi-step speculative sampling for i.i.d. children,
  recursive speculative decoding for children drawn without replacement, deterministic candidates
  with one-hot q. On a chain that is Algorithm 1 (`accept`, `accept_greedy`)."""

  def verify(self, p, q, drafts, u, draw=sampling.sample):
    return accept(p, q, drafts, u, draw)

  def verify_greedy(self, target_tokens, drafts):
    return accept_greedy(target_tokens, drafts)

  def verify_tree(self, p, q, drafts, u, draw, tree):
    return accept_tree(p, q, drafts, u, draw, tree)

  def verify_tree_greedy(self, target_tokens, drafts, tree):
    return accept_tree_greedy(target_tokens, drafts, tree)


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class LenientVerifier(Verifier):
  """Lenience (the paper's Appendix A.5), opt-in and NOT exact: Algorithm 1 with q scaled by
  l in (0, 1] before it is compared with p. Draft x_i is accepted when r_i < p_i(x_i) /
  (l q_i(x_i)), and the first rejection is corrected from norm(max(0, p_{n+1} - l q_{n+1})).

  - At l = 1 it is Algorithm 1, token for token (`accept` on the same arrays).
  - At l < 1 more drafts are accepted: the acceptance probability at position i is
    alpha_l = sum_x min(p_i(x) / l, q_i(x)) (the paper's formula), which `beta` reports, so the
    loop's alpha and Theorem 3.8 read it. The emitted tokens then follow the drafter more than
    the target: no token is emitted with probability above p(x) / l (the paper's guarantee), but
    there is no lower bound, so diversity may suffer. Measure what it costs (BLEU, ROUGE) before
    using it.
  - At temperature 0 the loop passes argmaxes only (`verify_greedy`), so greedy decoding stays
    exact: Algorithm 1's `accept_greedy`. Chains only (a draft tree raises, as for any chain
    verifier).

  lenience: l, a number in (0, 1].
  """

  lenience: float = 1.0

  def __post_init__(self):
    value = validation.scalar(self.lenience, "LenientVerifier.lenience")  # np / jax scalars too
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
      raise ValueError(
          f"LenientVerifier.lenience must be a number in (0, 1], got {value!r} "
          f"({type(value).__name__})."
      )
    if not 0.0 < float(value) <= 1.0:  # NaN fails too
      raise ValueError(
          f"LenientVerifier.lenience must be in (0, 1], got {value}: 1 is Algorithm 1, 0.1 lets "
          "a token be emitted at up to 10x its probability under the target."
      )
    object.__setattr__(self, "lenience", float(value))

  def verify(self, p, q, drafts, u, draw=sampling.sample):
    # accept's beta on l q is sum_x min(p, l q) = l alpha_l.
    n, token, beta = accept(p, self.lenience * q, drafts, u, draw)
    return n, token, beta / self.lenience

  def verify_greedy(self, target_tokens, drafts):
    return accept_greedy(target_tokens, drafts)
