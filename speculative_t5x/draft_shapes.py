"""Draft shapes: where one target call's drafts sit, and everything in the loop that depends on it.

A shape owns, for each iteration of `decoding.speculative_sample`: its block (D, the most drafts
one call accepts, gamma for a chain; M, the drafts it proposes; M + 1, the tokens the target
scores), its uniforms, its proposal (`Drafter.propose`, `Drafter.propose_tree`), the verifier it
takes by default, its cache compaction after acceptance, the target features it hands a drafter
that `reads_target_features` (`Drafter.observe_features`), and what the trace records of it; for
the reports (`report.SpeedupRow`, `sweep.SweepSetting`), its label, the fields results files
record, the tokens per call and the speedup the paper's model predicts, and which timed iteration
is its own. The loop and the reports call the shape and hold no branch on it, so a new shape is
one subclass plus a gin line (`SpeculativeEncoderDecoderModel.draft_shape = @draft_shapes.MyShape()`).

- `Chain(gamma, draft_stop)`: Algorithm 1's chain of gamma drafts (D = M = gamma), with an
  optional `draft_length` rule (adaptive draft length: static width, fewer drafter steps).
- `Tree(tree)`: a static `trees.DraftTree` of M drafts and depth D, scored in one target call
  under the tree's attention mask, verified by `speculative.TreeVerifier` by default, its accepted
  path compacted into contiguous cache slots.

Shapes: rows = B*N, V the vocabulary, E the target's width.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import draft_length
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x import validation

# (tokens [rows, k], cache, cache_index [rows], **options) -> (logits [rows, k, V], cache), or
# (logits, features [rows, k, F], cache) with return_features=True (F = E (1 + the number of the
# drafter's `target_feature_layers`), passed as feature_layers): the target's cached decode.
TargetLogitsFn = Callable[..., tuple]
# (cache, destination [rows], sources [rows, D]) -> cache: slots destination + j take the
# contents of slots sources[:, j] (`network.move_cache_slots`).
MoveCache = Callable[[Any, jax.Array, jax.Array], Any]

# The named scopes that label an iteration's stages in the compiled program's metadata (op_name),
# so a profile can attribute XLA's thunks to them (benchmarks/profile_loop.py): the drafter's
# proposal and the features it observes, the target's call, and the verification (the target's
# distributions, acceptance, the token's draw). Whatever lies outside them is the loop's own work.
STAGE_SCOPES = ("drafter", "target", "verifier")
DRAFTER_SCOPE, TARGET_SCOPE, VERIFIER_SCOPE = STAGE_SCOPES


class Parts(NamedTuple):
  """What every iteration of one decode calls.

  drafter, drafter_params: the `drafters.Drafter` and its parameters (their
  `Drafter.decode_params` form); target_logits_fn: the target's k-token cached decode
  (`TargetLogitsFn`); verifier: the `speculative.Verifier`; standardize: logits -> the
  distributions sampled from; move_target_cache: `MoveCache`, for a shape that compacts the
  cache (None otherwise).
  """

  drafter: drafters_lib.Drafter
  drafter_params: Any
  target_logits_fn: TargetLogitsFn
  verifier: speculative.Verifier
  standardize: sampling.Standardizer
  move_target_cache: MoveCache | None = None


class Position(NamedTuple):
  """Where the rows stand at the start of an iteration (the loop's carry).

  sequences [rows, L + D + 1] the decoded tokens y_0, y_1, ... (no BOS slot); length [rows] the
  decoded count, also the target cache's index; ended [rows] bool; target_cache, drafter_state.
  """

  sequences: jax.Array
  length: jax.Array
  ended: jax.Array
  target_cache: Any
  drafter_state: Any


class Iteration(NamedTuple):
  """One iteration of a shape, up to the block the loop writes, seen as a chain.

  drafts [rows, D]: the drafts along the accepted path, x_1..x_D (entries past n are not kept);
  n [rows] int32: how many were accepted; token [rows] int32: the target's token after them;
  beta [rows, D] float32: the verifier's beta_d (sum_x min(p, q) at the path's depth d);
  logits [rows, D + 1, V] and p [rows, D + 1, V] (None when greedy): the target's at the
  pending token and along the path, the distributions of the emitted tokens;
  target_cache: compacted, so the accepted path sits at length + 1 .. length + n;
  drafter_state: after the proposal (and the features it observed);
  drafter_steps: the batch's drafting rounds (a scalar: gamma, the longest row's drafts under a
  rule, a tree's depth), each `Drafter.steps_per_draft` drafter calls;
  drafted: the drafts each row proposed ([rows] or a scalar for all);
  traced_drafts [rows, M] and traced_path [rows, D]: what `SpeculativeTrace` records (see
  `DraftShape.iterate`).
  """

  drafts: jax.Array
  n: jax.Array
  token: jax.Array
  beta: jax.Array
  logits: jax.Array
  p: jax.Array | None
  target_cache: Any
  drafter_state: Any
  drafter_steps: Any
  drafted: Any
  traced_drafts: jax.Array
  traced_path: jax.Array


def _score_block(
    parts: Parts, tokens: jax.Array, cache: Any, index: jax.Array, **tree
) -> tuple[jax.Array, jax.Array | None, Any]:
  """One target call on the block tokens [rows, k] -> (logits [rows, k, V], the decoder features
  [rows, k, E] when the drafter reads them, else None, cache). Features are asked for only then,
  so other drafters compile to the program they always did."""
  with jax.named_scope(TARGET_SCOPE):
    if not parts.drafter.reads_target_features:
      logits, cache = parts.target_logits_fn(tokens, cache, index, **tree)
      return logits, None, cache
    return parts.target_logits_fn(
        tokens,
        cache,
        index,
        return_features=True,
        feature_layers=parts.drafter.target_feature_layers,
        **tree,
    )


def _block_tokens(parts: Parts, position: Position, drafts: jax.Array) -> jax.Array:
  """The pending token x_length, then the drafts [rows, M] -> [rows, M + 1]. An out-of-vocabulary
  draft (a broken drafter) never reaches the target's embedding: it is scored as 0 and the
  verifier rejects it."""
  pending = drafters_lib.decoder_inputs(position.sequences, position.length[:, None])
  vocab = parts.drafter.vocab_size
  return jnp.concatenate([pending, jnp.where((drafts >= 0) & (drafts < vocab), drafts, 0)], axis=1)


class DraftShape(abc.ABC):
  """The strategy of where a target call's drafts sit (see the module docstring).

  A shape is a frozen, hashable dataclass (the loop is traced once per shape); its sizes are
  static. Contract of `iterate`: given the iteration's uniforms u [rows, `num_uniforms`] (each
  used at most once), propose M drafts, score the pending token and them in one target call,
  verify with `parts.verifier`, leave the target cache with the accepted path at slots
  length + 1 .. length + n, hand a drafter that `reads_target_features` the target's features at
  positions length .. length + n (and possibly later ones, which it must not keep), and return
  the accepted path as a chain (`Iteration`). The emitted tokens must be distributed as the
  target's (the verifier's contract, on the shape's proposals).
  """

  @property
  @abc.abstractmethod
  def depth(self) -> int:
    """D, the most drafts one call accepts (gamma of a chain): the loop emits up to D + 1 tokens."""

  @property
  @abc.abstractmethod
  def num_drafts(self) -> int:
    """M, the drafts proposed per call (the drafted_tokens statistic counts them)."""

  @property
  def width(self) -> int:
    """M + 1, the tokens the target scores per call: the room a cache needs past the decode."""
    return self.num_drafts + 1

  @property
  def num_uniforms(self) -> int:
    """Uniforms per row and iteration: M for the drafts, M + 1 for the verifier."""
    return 2 * self.num_drafts + 1

  @property
  @abc.abstractmethod
  def default_verifier(self) -> speculative.Verifier:
    """The verifier used when none is given."""

  @property
  @abc.abstractmethod
  def label(self) -> str:
    """How reports name the shape, e.g. 'gamma 3' or '4 drafts in a tree of depth 2' (a results
    file records a tree's parents, `describe`)."""

  @abc.abstractmethod
  def describe(self) -> dict[str, Any]:
    """What results files record of the shape, and what reports ask of it: 'gamma' (D) and
    'draft_tree' (a tree's parents, None for a chain of gamma drafts, which the paper's model
    covers)."""

  def check(
      self,
      verifier: speculative.Verifier,
      drafter: drafters_lib.Drafter,
      move_target_cache: MoveCache | None,
  ) -> None:
    """Raises `validation.InvalidInputError` for a verifier, drafter or cache move this shape
    cannot decode with, before tracing. The default accepts all."""
    del verifier, drafter, move_target_cache

  @abc.abstractmethod
  def iterate(self, parts: Parts, position: Position, u: jax.Array) -> Iteration:
    """One iteration up to the block the loop writes (the class docstring's contract).

    Args:
      parts: what the decode calls; position: where the rows stand; u: [rows, num_uniforms].
    Returns:
      An `Iteration`; its traced_drafts [rows, M] are the proposals, traced_path [rows, D] the
      block indices (1..M) of the drafts the verification walked, in order: entries < n the
      accepted path, entry n (when n < D) the first draft it rejected after it (0: none).
    """


@gin.configurable(module="draft_shapes")
@dataclasses.dataclass(frozen=True)
class Chain(DraftShape):
  """Algorithm 1's chain: gamma drafts x_1..x_gamma, each after the one before.

  gamma: drafts per call (static), the most under `draft_stop`.
  draft_stop: a `draft_length` rule that ends a row's drafting early (adaptive draft length), or
    None: gamma drafts per call. The verification width stays gamma + 1; empty slots
    (`drafters.EMPTY`) are rejected, and the drafter steps run only while some active row still
    drafts.
  """

  gamma: int
  draft_stop: draft_length.DraftStop | None = None

  def __post_init__(self):
    validation.check_gamma(self.gamma)
    if self.draft_stop is not None and not callable(self.draft_stop):
      raise validation.InvalidInputError(
          f"draft_stop must be a draft_length rule (e.g. draft_length.ConfidenceStop(0.4)) or "
          f"None, got {self.draft_stop!r}."
      )
    object.__setattr__(self, "gamma", int(self.gamma))

  @property
  def depth(self) -> int:
    return self.gamma

  @property
  def num_drafts(self) -> int:
    return self.gamma

  def check(self, verifier, drafter, move_target_cache) -> None:
    """A draft_stop rule must return bool [rows] (`draft_length.check_rule`)."""
    del verifier, move_target_cache
    if self.draft_stop is not None:
      draft_length.check_rule(self.draft_stop, drafter.vocab_size)

  @property
  def default_verifier(self) -> speculative.Verifier:
    return speculative.ALGORITHM_1

  @property
  def label(self) -> str:
    return f"gamma {self.gamma}"

  def describe(self) -> dict[str, Any]:
    return {"gamma": self.gamma, "draft_tree": None}

  def iterate(self, parts: Parts, position: Position, u: jax.Array) -> Iteration:
    """Drafts the chain (`Drafter.propose`), scores it, hands its features over (the whole block:
    a drafter keeps only the accepted positions') and verifies it (`Verifier.verify`); the cache
    needs no compaction, the accepted drafts being where they were scored."""
    gamma, drafter, standardize = self.gamma, parts.drafter, parts.standardize
    # A rule reaches the drafter only when given, so a drafter written without `stop` still
    # decodes at a static gamma. Rows that ended stop after their first draft.
    stop = {}
    if self.draft_stop is not None:
      stop["stop"] = lambda logits, drafts: self.draft_stop(logits, drafts) | position.ended
    with jax.named_scope(DRAFTER_SCOPE):
      drafts, q, drafter_state = drafter.propose(
          parts.drafter_params,
          position.drafter_state,
          position.sequences,
          position.length,
          gamma,
          u[:, :gamma],
          standardize,
          **stop,
      )
    # Drafts before the first EMPTY slot; the batch's drafter steps are the longest row's.
    drafted = jnp.sum(jnp.cumprod((drafts != drafters_lib.EMPTY).astype(jnp.int32), axis=1), axis=1)
    steps = gamma if self.draft_stop is None else jnp.max(drafted)
    drafted = gamma if self.draft_stop is None else drafted
    logits, features, target_cache = _score_block(
        parts, _block_tokens(parts, position, drafts), position.target_cache, position.length
    )
    if features is not None:  # positions length .. length + gamma; past the accepted, unused.
      with jax.named_scope(DRAFTER_SCOPE):
        drafter_state = drafter.observe_features(drafter_state, features, position.length)
    with jax.named_scope(VERIFIER_SCOPE):
      if standardize.greedy:
        p = None
        n, token, beta = parts.verifier.verify_greedy(sampling.argmax(logits), drafts)
      else:
        p = standardize(logits)
        n, token, beta = parts.verifier.verify(p, q, drafts, u[:, gamma:], standardize.draw)
    path = jnp.broadcast_to(jnp.arange(1, gamma + 1, dtype=jnp.int32), drafts.shape)
    return Iteration(
        drafts, n, token, beta, logits, p, target_cache, drafter_state, steps, drafted, drafts, path
    )


@gin.configurable(module="draft_shapes")
@dataclasses.dataclass(frozen=True)
class Tree(DraftShape):
  """A static draft tree of M drafts and depth D (`trees.DraftTree`, or its branching
  (k_1, ..., k_D), e.g. (4, 1, 1, 1): 4 chains of 4 sharing their root).

  The drafter proposes the tree (`Drafter.propose_tree`), the target scores the root and every
  node in one call under the tree's attention mask (`target_logits_fn(..., tree=tree)`), the
  verifier walks it (`Verifier.verify_tree`; by default `speculative.TreeVerifier`), and
  `move_target_cache` (`network.move_cache_slots`) makes the accepted path's cache slots
  contiguous. The target cache needs L + M + 1 slots.
  """

  tree: trees.DraftTree | Sequence[int]

  def __post_init__(self):
    if not isinstance(self.tree, trees.DraftTree):
      object.__setattr__(self, "tree", trees.DraftTree.from_branching(self.tree))

  @property
  def depth(self) -> int:
    return self.tree.depth

  @property
  def num_drafts(self) -> int:
    return self.tree.num_nodes

  @property
  def default_verifier(self) -> speculative.Verifier:
    return speculative.TreeVerifier()

  @property
  def label(self) -> str:
    return f"{self.tree.num_nodes} drafts in a tree of depth {self.tree.depth}"

  def describe(self) -> dict[str, Any]:
    """Its depth as 'gamma' and its parents (a report predicts a tree from its realized tokens per
    call: they have no closed form in alpha)."""
    return {"gamma": self.depth, "draft_tree": self.tree.parents}

  def check(self, verifier, drafter, move_target_cache) -> None:
    """A tree needs a verifier of trees, a drafter that proposes them and a cache move."""
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
    if not callable(move_target_cache):
      raise validation.InvalidInputError(
          "a draft tree needs move_target_cache (network.move_cache_slots), which makes the "
          "accepted path's cache slots contiguous."
      )
    siblings = int(np.bincount(np.asarray(self.tree.parents)).max())
    if drafter.vocab_size and siblings > drafter.vocab_size:
      raise validation.InvalidInputError(
          f"the draft tree {self.tree.parents} gives a node {siblings} children, but the "
          f"vocabulary has {drafter.vocab_size} tokens and siblings are distinct drafts: give "
          f"at most {drafter.vocab_size} children per node."
      )

  def iterate(self, parts: Parts, position: Position, u: jax.Array) -> Iteration:
    """Drafts the tree (`Drafter.propose_tree`), scores it under its mask, verifies it
    (`Verifier.verify_tree`), moves the accepted path's cache slots after the root's and hands
    the drafter the features at the root and along the path."""
    tree, drafter, standardize = self.tree, parts.drafter, parts.standardize
    m = tree.num_nodes
    with jax.named_scope(DRAFTER_SCOPE):
      drafts, q, drafter_state = drafter.propose_tree(
          parts.drafter_params,
          position.drafter_state,
          position.sequences,
          position.length,
          tree,
          u[:, :m],
          standardize,
      )
    tokens = _block_tokens(parts, position, drafts)  # [rows, M+1]
    logits, features, target_cache = _score_block(
        parts, tokens, position.target_cache, position.length, tree=tree
    )
    with jax.named_scope(VERIFIER_SCOPE):
      if standardize.greedy:
        p = None
        path, n, token, beta = parts.verifier.verify_tree_greedy(
            sampling.argmax(logits), drafts, tree
        )
      else:
        p = standardize(logits)
        path, n, token, beta = parts.verifier.verify_tree(
            p, q, drafts, u[:, m:], standardize.draw, tree
        )
    length = position.length
    target_cache = parts.move_target_cache(target_cache, length + 1, length[:, None] + path)
    # The distributions of the emitted tokens: at the root, then at the path's slots.
    along = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)[..., None]
    logits = jnp.take_along_axis(logits, along, axis=1)
    p = None if p is None else jnp.take_along_axis(p, along, axis=1)
    if features is not None:  # the path's features, at positions length .. length + D.
      features = jnp.take_along_axis(features, along, axis=1)
      with jax.named_scope(DRAFTER_SCOPE):
        drafter_state = drafter.observe_features(drafter_state, features, length)
    path_drafts = jnp.take_along_axis(tokens, path, axis=1)
    return Iteration(
        path_drafts,
        n,
        token,
        beta,
        logits,
        p,
        target_cache,
        drafter_state,
        tree.depth,
        m,
        drafts,
        self._walked(path, n),
    )

  def _walked(self, path: jax.Array, n: jax.Array) -> jax.Array:
    """The trace's path [rows, D]: the accepted path [rows, D] (entries < n), then at entry n the
    first child of its last slot, the first draft tested and rejected there (0 for a leaf)."""
    first_child = jnp.asarray(np.maximum(self.tree.children[:, 0], 0))  # [M+1]
    last = jnp.take_along_axis(jnp.pad(path, ((0, 0), (1, 0))), n[:, None], axis=1)
    rejected = jnp.arange(self.tree.depth)[None] == n[:, None]
    return jnp.where(rejected, first_child[last], path)


def make_shape(
    gamma: int | None = None,
    draft_stop: draft_length.DraftStop | None = None,
    draft_tree: trees.DraftTree | Sequence[int] | None = None,
    draft_shape: DraftShape | None = None,
) -> DraftShape:
  """The shape that the loop's and the model's arguments name: `draft_shape` as it is (gamma, if
  given, must be its depth), else the `Tree` of `draft_tree` (gamma, if given, its depth), else
  the `Chain` of gamma drafts and `draft_stop`. Raises `validation.InvalidInputError` for
  settings that contradict each other."""
  if draft_shape is not None:
    if not isinstance(draft_shape, DraftShape):
      raise validation.InvalidInputError(
          f"draft_shape must be a draft_shapes.DraftShape (e.g. draft_shapes.Chain(4) or "
          f"draft_shapes.Tree((4, 1, 1, 1))), got {draft_shape!r}."
      )
    if draft_stop is not None or draft_tree is not None:
      raise validation.InvalidInputError(
          "give draft_shape alone, or draft_tree or draft_stop, not both: "
          "draft_shapes.Chain(gamma, draft_stop) and draft_shapes.Tree(tree) hold them."
      )
    shape, what = draft_shape, "draft shape"
  elif draft_tree is not None:
    if draft_stop is not None:
      raise validation.InvalidInputError(
          "draft_stop (adaptive draft length) works on chains only: give draft_tree or "
          "draft_stop, not both."
      )
    shape = Tree(draft_tree)
    what = "draft tree"
  else:
    if gamma is None:
      raise validation.InvalidInputError(
          "give gamma (drafts per target call), a draft_tree or a draft_shape."
      )
    return Chain(gamma, draft_stop)
  if gamma is not None and validation.check_gamma(gamma) != shape.depth:
    raise validation.InvalidInputError(
        f"gamma {gamma} != the {what}'s depth {shape.depth}: with a {what}, gamma is its depth "
        "(the most tokens one call accepts)."
    )
  return shape
