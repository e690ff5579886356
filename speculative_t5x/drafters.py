"""Where drafts come from: the `Drafter` protocol, the helpers that draw chains and trees of drafts,
and the network drafters, a T5 drafter and a T5 decoder reading the target's encoder output.
The drafters that cost no model call (n-gram tables, prompt lookup) are in `table_drafters`, the
feature-level drafter in `feature_drafter`.

Every drafter proposes gamma tokens per row and returns the distributions q it sampled them from.
A drafter that samples standardizes its logits with the same `standardize` function the target
uses (docs/design.md, contract 3); one that proposes deterministically returns a one-hot q, which
keeps speculative sampling exact.

The decoding loop tells a drafter where each row stands with `sequences` [B, S] (the tokens decoded
so far, y_0 y_1 ..., zero beyond) and `length` [B] (how many are decoded). The decoder input at
position t is x_t = 0 (BOS) for t = 0 and y_{t-1} after, so the token to continue from is
x_length. Rolling back is the loop setting `length` back; a drafter's state may remember how far it
has read (`T5DrafterState.written`), never where the decode stands.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Mapping

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import draft_length
from speculative_t5x import network
from speculative_t5x import param_checks
from speculative_t5x import sampling
from speculative_t5x import trees
from speculative_t5x import validation

# An empty draft slot: the row stopped drafting before it (`draft_length`); verifiers reject it.
EMPTY = -1
# The kind `SharedEncoderDrafter.checkpoint_layout` records in its config.json's 'drafter' entry.
SHARED_ENCODER_KIND = "shared_encoder"
# The feature shapes `init_params` gets where no batch is at hand (`param_shapes`, untrained
# parameters in `pairs`): one row of one token each. A drafter's parameters do not depend on them.
INIT_FEATURE_SHAPES = {"encoder_input_tokens": (1, 1), "decoder_input_tokens": (1, 1)}


def _check_int(owner: str, name: str, value: Any, minimum: int) -> int:
  """`value`, an integer >= minimum (Python, NumPy or a concrete 0-d jax array) -> a Python int;
  else a ValueError naming `owner.name`."""
  value = validation.scalar(value, f"{owner}.{name}")
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}.")
  return int(value)


def set_checked_fields(drafter: Any, integers: Mapping[str, int] = (), numbers=()) -> None:
  """Checks fields of a frozen drafter dataclass in its `__post_init__` and stores them as
  Python values: each of `integers` (name -> least value) by `_check_int`, each of `numbers`
  (names) a finite number (`validation.check_number`), and its `eos_id`, None or an integer
  >= 1 (0 is padding)."""
  owner = type(drafter).__name__
  for name, minimum in dict(integers).items():
    object.__setattr__(drafter, name, _check_int(owner, name, getattr(drafter, name), minimum))
  for name in numbers:
    try:
      value = validation.check_number(getattr(drafter, name), f"{owner}.{name}")
    except validation.InvalidInputError as e:
      raise ValueError(str(e)) from e
    object.__setattr__(drafter, name, value)
  if getattr(drafter, "eos_id", None) is not None:
    object.__setattr__(drafter, "eos_id", _check_int(owner, "eos_id", drafter.eos_id, 1))


def check_reads_target(
    drafter: "Drafter",
    target_config: network.T5Config,
    width_field: str,
    width: int,
    reads: str,
) -> None:
  """`Drafter.check_target` of a drafter that reads the target's activations of width `width`
  (its field `width_field`; `reads` says which, e.g. "cross-attends to the target's encoder
  output") and shares its vocabulary: raises ValueError naming every mismatch and the fix."""
  problems = []
  if target_config.emb_dim != width:
    problems.append(
        f"its {width_field} {width} != the target's emb_dim {target_config.emb_dim}: it {reads}, "
        f"so set {width_field} = {target_config.emb_dim} (with weights "
        "trained against this target)"
    )
  if target_config.vocab_size != drafter.vocab_size:
    problems.append(
        f"its vocab_size {drafter.vocab_size} != the target's vocab_size "
        f"{target_config.vocab_size}: speculative decoding needs one vocabulary, so give the "
        "drafter's config the target's vocab_size"
    )
  if problems:
    raise ValueError(
        f"{type(drafter).__name__} cannot serve this target: " + "; and ".join(problems) + "."
    )


def decoder_inputs(sequences: jax.Array, positions: jax.Array) -> jax.Array:
  """x at `positions` [B, k]: 0 (BOS) at position 0, else y_{position-1} -> [B, k] int32."""
  previous = jnp.take_along_axis(sequences, jnp.maximum(positions - 1, 0), axis=1)
  return jnp.where(positions > 0, previous, 0).astype(jnp.int32)


def _draw(standardize: sampling.Standardizer, u: jax.Array, logits: jax.Array):
  """One draft per row: logits [B, 1, V], u [B] -> (draft [B], q [B, V] or None when greedy).
  The block axis stays while standardizing: a per-row temperature is [B, 1]."""
  draft, q = standardize.draw_from_logits(u[:, None], logits)
  return draft[:, 0], None if q is None else q[:, 0]


def draft_chain(
    first_logits: jax.Array,
    step: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]],
    carry: Any,
    gamma: int,
    u: jax.Array,
    standardize: sampling.Standardizer,
    stop: draft_length.DraftStop | None = None,
) -> tuple[jax.Array, jax.Array | None, Any, jax.Array]:
  """Drafts x_1..x_gamma one drafter step at a time; under `stop`, rows stop early.

  The loop runs while some row is still drafting (at most gamma steps); a row that stopped keeps
  computing with the batch, but its later slots are EMPTY with zero q rows.

  Args:
    first_logits: [B, 1, V], the drafter's logits for x_1.
    step: (carry, x_i [B], i) -> (logits of x_{i+1} [B, 1, V], carry), for i = 1..gamma-1.
    carry: the drafter's state threaded through `step` (e.g. its cache).
    u: [B, gamma] U[0, 1) draws, u[:, i-1] for x_i.
    stop: (logits [B, V], x_i [B]) -> [B] bool, stop after x_i; None: always gamma drafts.

  Returns:
    drafts [B, gamma] int32 (EMPTY after each row's last draft), q [B, gamma, V] float32 (zero
    at empty slots; None when greedy), the carry, and the drafter steps taken (scalar int32).
  """
  batch = first_logits.shape[0]
  first, q_first = _draw(standardize, u[:, 0], first_logits)
  drafting = jnp.ones((batch,), bool)
  if stop is not None:
    drafting = ~stop(first_logits[:, 0], first)
  drafts = jnp.full((batch, gamma), EMPTY, jnp.int32).at[:, 0].set(first)
  q = None
  if q_first is not None:
    q = jnp.zeros((batch, gamma) + q_first.shape[1:], jnp.float32).at[:, 0].set(q_first)

  def body(loop):
    i, drafting, token, drafts, q, carry = loop
    logits, carry = step(carry, token, i)
    draft, q_i = _draw(standardize, jax.lax.dynamic_index_in_dim(u, i, 1, False), logits)
    drafts = drafts.at[:, i].set(jnp.where(drafting, draft, EMPTY))
    if q is not None:
      q = q.at[:, i].set(jnp.where(drafting[:, None], q_i, 0.0))
    if stop is not None:
      drafting = drafting & ~stop(logits[:, 0], draft)
    return i + 1, drafting, draft, drafts, q, carry

  steps, _, _, drafts, q, carry = jax.lax.while_loop(
      lambda loop: (loop[0] < gamma) & jnp.any(loop[1]),
      body,
      (jnp.int32(1), drafting, first, drafts, q, carry),
  )
  return drafts, q, carry, steps


def draw_children(
    standardize: sampling.Standardizer, logits: jax.Array, k: int, u: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
  """k children per slot, drawn without replacement from the slot's standardized distribution.

  Child j is drawn from q_j, the distribution with children 1..j-1 removed and renormalized: the
  conditional law a tree verifier needs (`speculative.TreeVerifier`). When nothing is left (a
  top-k or top-p cutoff kept fewer than j tokens) q_j is 0 and the child EMPTY. Greedy: the top k
  tokens of the logits, in order (the one-hot q's are implied).

  Args:
    logits: [B, n, V], one row per slot; u: [B, n, k] U[0, 1) draws.
  Returns:
    children [B, n, k] int32, q [B, n, k, V] float32 (None when greedy).
  """
  if standardize.greedy:
    return jax.lax.top_k(logits, k)[1].astype(jnp.int32), None
  probs = standardize(logits)
  children, qs = [], []
  for j in range(k):
    mass = jnp.sum(probs, axis=-1)
    left = mass > 0
    probs = jnp.where(left[..., None], probs / jnp.where(left, mass, 1.0)[..., None], 0.0)
    child = jnp.where(left, standardize.draw(u[..., j], probs), EMPTY)
    children.append(child)
    qs.append(probs)
    drawn = jax.nn.one_hot(child, probs.shape[-1], dtype=bool)  # all False for EMPTY
    probs = jnp.where(drawn, 0.0, probs)
  return jnp.stack(children, axis=-1), jnp.stack(qs, axis=-2)


def draft_tree(
    first_logits: jax.Array,
    level_logits: Callable[[Any, jax.Array, tuple[int, int]], tuple[jax.Array, Any]],
    carry: Any,
    tree: trees.DraftTree,
    u: jax.Array,
    standardize: sampling.Standardizer,
) -> tuple[jax.Array, jax.Array | None, Any]:
  """Drafts a static tree level by level: the children of every slot at depth d are drawn
  (`draw_children`) from the drafter's logits at that slot, one drafter call per depth.

  Args:
    first_logits: [B, 1, V], the drafter's logits at the root (x_length).
    level_logits: (carry, tokens [B, n], slots (start, stop)) -> (logits [B, n, V], carry): the
      drafter's logits at block slots start..stop-1 (one depth of the tree), given their drafts.
    carry: the drafter's state threaded through `level_logits`.
    tree: the `trees.DraftTree`; u: [B, M] U[0, 1) draws, u[:, i] for node i.
  Returns:
    drafts [B, M] int32 (node i at block slot i + 1), q [B, M, V] float32 (q[:, i]: the law node
    i was drawn from given its earlier siblings; None when greedy), the carry.
  """
  batch = first_logits.shape[0]
  drafts = jnp.full((batch, tree.num_nodes), EMPTY, jnp.int32)
  q = None
  logits = first_logits
  for depth, (start, stop) in enumerate(tree.levels[:-1]):
    if depth:
      # An EMPTY or out-of-vocabulary draft is fed as 0: the verifier never reaches its children.
      tokens = drafts[:, start - 1 : stop - 1]
      tokens = jnp.where((tokens >= 0) & (tokens < first_logits.shape[-1]), tokens, 0)
      logits, carry = level_logits(carry, tokens, (start, stop))
    children = tree.children[start:stop]  # [n, K] block slots, -1 padded
    k = int(np.max(np.sum(children >= 0, axis=1)))
    children = children[:, :k]
    real = children >= 0
    nodes = children[real] - 1  # node indices, in order: the next level, contiguous
    tokens, q_level = draw_children(standardize, logits, k, u[:, np.where(real, children - 1, 0)])
    drafts = drafts.at[:, nodes].set(tokens[:, real])
    if q_level is not None:
      if q is None:
        q = jnp.zeros((batch, tree.num_nodes, q_level.shape[-1]), jnp.float32)
      q = q.at[:, nodes].set(q_level[:, real])
  return drafts, q, carry


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
  """What a drafter's checkpoint holds. The weights layer reads and writes it; the drafter only
  describes it, so decoding never loads the checkpoint libraries.

  config: the network config its config.json records.
  entry: its config.json 'drafter' entry ({"kind": ..., ...}, what `register_kind`'s reader
    reads back); None for a bare T5, restored against `config` (T5X's layout too).
  description: the drafter, as errors about its checkpoint name it.
  """

  config: network.T5Config
  entry: Mapping[str, Any] | None = None
  description: str = ""


class Drafter(abc.ABC):
  """A source of drafts: the protocol the decoding loop, the models, alpha measurement and the
  partitioner call, and nothing else.

  A new kind is one subclass (plus a gin file binding `DRAFTER = @drafters.MyDrafter()`):
  `init_state`, `propose` and `teacher_forced_logits` are required; the rest have defaults for a
  drafter without trained weights. What other layers need of some kinds is a protocol of their
  own, which a kind meets with one more method: a checkpoint format
  (`checkpoint_layout`, `weights.checkpoints.Checkpointed`), parameters fitted on target
  sequences (`fit_params`, `weights.pairs.FittedFromTargets`), parameters shared with the target
  (`init_from_target`, `training.training.SharesTarget`). A drafter is a frozen dataclass compared by identity (the loop is traced once per
  drafter). Its parameters are a pytree kept beside the target's: params['drafter'].

  vocab_size: the target's vocabulary (0: take the target's, see `for_target`).
  eos_id: the target's EOS id (None: take the target's).
  """

  vocab_size: int
  eos_id: int | None

  # Whether it reads the target's decoder features (`observe_features`, and `target_features` in
  # `teacher_forced_logits`). The loop asks the target for them only then, so a drafter that
  # does not compiles to the program it compiled to before features existed.
  reads_target_features = False
  # For such a drafter: the target's decoder layers whose outputs it reads beside the final
  # feature (`network.check_feature_layers`), so the features are [..., E (1 + their number)].
  target_feature_layers: tuple[int, ...] = ()
  # The token ids it may draft (ascending), or () for the whole vocabulary: q is 0 elsewhere, so
  # distillation compares q with p restricted to them (`distillation.Distiller`).
  draft_vocab: tuple[int, ...] = ()

  # ---- parameters
  def init_params(self, rng: jax.Array, input_shapes: Mapping[str, tuple]) -> Any:
    """Untrained parameters at the given feature shapes (seqio's `encoder_input_tokens`,
    `decoder_input_tokens`); {} for a drafter without parameters."""
    del rng, input_shapes
    return {}

  def param_shapes(self) -> Any:
    """The shape of every parameter: the tree of `init_params` with a shape tuple at each leaf
    ({} for a drafter without parameters), traced (`jax.eval_shape`), nothing allocated. A size
    None is free: parameters of any size there are the drafter's
    (`table_drafters.BigramDrafter`'s successors per token)."""
    shapes = jax.eval_shape(lambda: self.init_params(jax.random.PRNGKey(0), INIT_FEATURE_SHAPES))
    return jax.tree.map(lambda x: tuple(x.shape), shapes)

  def floating_params(self) -> frozenset[str]:
    """The paths ('a/b') of its parameters that hold floating-point weights (`init_params`'
    dtypes, traced, nothing allocated): `check_params` refuses an integer or bool leaf there."""
    return param_checks.floating_paths(
        jax.eval_shape(lambda: self.init_params(jax.random.PRNGKey(0), INIT_FEATURE_SHAPES))
    )

  def check_params(
      self, params: Any, name: str = "drafter params", shapes: Any = None, floating: Any = None
  ) -> None:
    """Raises `validation.InvalidInputError` unless `params` are this drafter's parameters: a leaf
    at every path of `shapes`, of that shape, floating where `floating` says, and no other leaf.
    A drafter without parameters takes any tree without leaves ({} or None).

    Only paths, shapes and dtypes are compared (no value is read, nothing moves between devices),
    so it takes arrays, tracers and `jax.ShapeDtypeStruct`s alike and runs before anything is
    traced (`param_checks.tree_problems`, the target's check too).

    Args:
      params: the parameter tree to check (unboxed: `param_checks.unbox`).
      name: what `params` are, for the message (e.g. "params['drafter']").
      shapes: the shapes `param_shapes()` gives (None: computed here, which traces `init_params`;
        a caller checking at every call computes them once and passes them).
      floating: the paths `floating_params()` gives (None: computed here, as `shapes` are).
    """
    expected = param_checks.shapes_by_path(
        self.param_shapes() if shapes is None else shapes, leaves_are_shapes=True
    )
    kind = type(self).__name__
    problems = param_checks.tree_problems(
        params, expected, kind, self.floating_params() if floating is None else floating
    )
    cast = (
        f" Weights that must be floating-point are not: {param_checks.CAST_FIX}."
        if any(k == param_checks.NOT_FLOATING for k, _ in problems)
        else ""
    )
    param_checks.raise_problems(
        problems,
        name,
        kind,
        "they are another drafter's, of another kind or other sizes (emb_dim, layers, heads, the "
        "target width it reads). Restore them with the drafter they were saved with "
        "(pairs.PairConfig.from_pair_dir, or checkpoints.read_drafter on their directory), or build "
        f"the drafter with the sizes they have.{cast}",
    )

  def param_axes(self) -> Any:
    """Logical axis names of every parameter (T5X's, for `partitioning`), or None: replicated."""
    return None

  def check_lengths(self, encoder_length: int, decode_length: int) -> None:
    """Raises `validation.InvalidInputError`, naming the problem and the fix, if this drafter
    cannot draft for inputs of `encoder_length` tokens decoded to `decode_length` (called with
    the batch's shapes, before tracing); the default takes any lengths."""
    del encoder_length, decode_length

  def check_target(self, target_config: network.T5Config) -> None:
    """Raises ValueError, naming the problem and the fix, if this drafter cannot serve a target
    of `target_config` (called before any model is built); the default accepts every target."""
    del target_config

  def for_target(self, vocab_size: int, eos_id: int) -> "Drafter":
    """This drafter for a target with `vocab_size` and `eos_id`: unset fields take the target's;
    set ones must agree (speculative decoding needs one vocabulary and one EOS)."""
    mine = self.vocab_size or vocab_size
    if mine != vocab_size:
      raise ValueError(
          f"drafter vocab_size {mine} != target vocab_size {vocab_size}: speculative "
          "decoding needs one vocabulary (configure the drafter with the target's "
          "vocab_size)."
      )
    if self.eos_id is not None and self.eos_id != eos_id:
      raise ValueError(
          f"drafter eos_id {self.eos_id} != the output vocabulary's eos_id {eos_id}: "
          "give the drafter the target's EOS id (or leave it unset)."
      )
    changes = {
        name: value
        for name, value, unset in (
            ("vocab_size", vocab_size, not self.vocab_size),
            ("eos_id", eos_id, self.eos_id is None),
        )
        if unset and name in {f.name for f in dataclasses.fields(self)}
    }
    return dataclasses.replace(self, **changes) if changes else self

  # ---- decoding
  @abc.abstractmethod
  def init_state(
      self,
      params: Any,
      encoder_input_tokens: jax.Array,
      cache_length: int,
      target_encoded: jax.Array | None = None,
  ) -> Any:
    """Per-sequence state at batch B, made once before the loop. encoder_input_tokens [B, Le];
    cache_length: room for the decode plus a block; target_encoded [B, Le, E_target]: the
    target's encoder output (computed anyway), for a drafter that reads it instead of running an
    encoder of its own. Every leaf has batch first, so the loop can repeat rows for num_decodes."""

  def decode_params(self, params: Any) -> Any:
    """`params` in the form `propose` and `propose_tree` read inside the loop, where a drafter
    can precompute what every draft would otherwise read or compute again (e.g. fold two matrices
    into one). The loop makes it before it starts (`decoding.speculative_sample`); a caller that
    decodes many batches with the same parameters may make it once and pass it as the drafter's
    params, so it is idempotent, and `check_params`, `init_state`, `propose` and `propose_tree`
    take either form. The default: `params`."""
    return params

  @abc.abstractmethod
  def propose(
      self,
      params: Any,
      state: Any,
      sequences: jax.Array,
      length: jax.Array,
      gamma: int,
      u: jax.Array,
      standardize: sampling.Standardizer,
      stop: draft_length.DraftStop | None = None,
  ) -> tuple[jax.Array, jax.Array, Any]:
    """u [B, gamma]: U[0, 1) draws, u[:, i] for draft i (`Standardizer.draw`)
    -> drafts [B, gamma] int32, q [B, gamma, V] float32 (drafts[:, i] ~ q[:, i]), new state.
    When `standardize.greedy`, q may be None: the drafts are then argmaxes and q their one-hot.

    stop: a `draft_length.DraftStop` rule, or None (gamma drafts). A drafter that takes model
    steps honours it (`draft_chain`): a row stops after the draft the rule flags, its later slots
    EMPTY (q rows 0), and the steps run only while some row drafts. A drafter whose drafts cost no
    step may ignore it."""

  def propose_tree(
      self,
      params: Any,
      state: Any,
      sequences: jax.Array,
      length: jax.Array,
      tree: trees.DraftTree,
      u: jax.Array,
      standardize: sampling.Standardizer,
  ) -> tuple[jax.Array, jax.Array | None, Any]:
    """Drafts a static tree (`trees.DraftTree`, M nodes, depth D): u [B, M] U[0, 1) draws, one
    per node -> drafts [B, M] int32 (node i at block slot i + 1), q [B, M, V] float32 (q[:, i]:
    the law node i was drawn from given the path to its parent and its earlier siblings, which
    `speculative.TreeVerifier` needs; None when greedy), new state. One drafter call per depth
    (`steps_per_draft` per depth in the stats). A drafter that proposes only chains keeps this
    default, which refuses before tracing."""
    del params, state, sequences, length, u, standardize
    raise ValueError(
        f"{type(self).__name__} proposes chains only, not the draft tree {tree.parents}: use "
        "draft_tree=None, or a T5, unigram or bigram drafter for trees."
    )

  def observe_features(self, state: Any, features: jax.Array, start: jax.Array) -> Any:
    """For a drafter that `reads_target_features`: the state after the target scored positions
    start[b] .. start[b] + W - 1 with decoder features [B, W, E] (the loop calls it after each
    verification with the accepted block's features; those past the accepted positions are
    the target's at rejected drafts, which the drafter must not keep)."""
    del state, features, start
    raise ValueError(f"{type(self).__name__} does not read the target's features.")

  @property
  def steps_per_draft(self) -> int:
    """How many drafter calls one proposal of gamma tokens makes, per drafted token (1 or 0);
    for a tree, per depth."""
    return 1

  # ---- measurement
  @abc.abstractmethod
  def teacher_forced_logits(
      self,
      params: Any,
      encoder_input_tokens: jax.Array,
      decoder_input_tokens: jax.Array,
      target_encoded: jax.Array | None = None,
  ) -> jax.Array:
    """Logits [B, L, V] of the drafter's next-token distribution at every position of
    decoder_input_tokens [B, L] (BOS then the sequence shifted right; a 0 after position 0 is a
    token, not padding), standardized by the caller as in decoding (Table 3's alpha).
    encoder_input_tokens [B, Le]; target_encoded [B, Le, E_target]: the target's encoder output,
    as `init_state` gets it; a drafter that does not read it ignores it."""


def as_drafter(drafter: "Drafter | network.Transformer | network.T5Config") -> Drafter:
  """A `Drafter` as it is; a `network.Transformer` or a `network.T5Config` as the `T5Drafter` of
  its config."""
  if isinstance(drafter, Drafter):
    return drafter
  if isinstance(drafter, network.Transformer):
    return T5Drafter(drafter.config)
  if isinstance(drafter, network.T5Config):
    return T5Drafter(drafter)
  raise ValueError(
      f"a drafter must be a drafters.Drafter or a network.Transformer, got "
      f"{type(drafter).__name__} (a network.T5Config is taken as the T5 drafter of that config)."
  )


# Readers of saved drafters by the 'kind' of their config.json entry (`CheckpointLayout.entry`):
# (the network's T5Config, the entry) -> the Drafter. A drafter class in another module adds its
# own (`register_kind`).
_KIND_READERS: dict[str, Callable[[network.T5Config, dict], "Drafter"]] = {}


def register_kind(kind: str, reader: Callable[[network.T5Config, dict], "Drafter"]) -> None:
  """Lets `checkpoints.read_drafter` read directories whose config.json entry has this kind."""
  _KIND_READERS[kind] = reader


def kind_reader(kind: str) -> Callable[[network.T5Config, dict], "Drafter"] | None:
  """The reader `register_kind` registered for `kind`, or None."""
  return _KIND_READERS.get(kind)


def known_kinds() -> list[str]:
  """The kinds `register_kind` registered, sorted."""
  return sorted(_KIND_READERS)


@flax.struct.dataclass
class T5DrafterState:
  """cache: the drafter's decoder cache; written [B] int32: one past the last cache slot written.
  Slots below length - 1 always hold the right inputs; slot length - 1 does iff written >= length
  (a rejection leaves the accepted drafts in place, gamma acceptances leave the last one unfed)."""

  cache: Any
  written: jax.Array


class _CachedDecoderDrafter(Drafter):
  """A drafter whose step is a T5 1.1 decoder with its own cache (`module.decode`), made once per
  sequence by `_init_cache`; the subclasses differ in what its decoder cross-attends to.

  A proposal feeds x_length at position length and reads its logits, then gamma-1 single-token
  steps feed its own drafts. Only after all gamma drafts were accepted has the drafter not seen its
  last draft x_{length-1}; then (and for the whole batch if any row needs it) one more
  single-token step feeds it first. Each draft thus costs one single-token step, as
  Theorem 3.8 counts it, plus one after a full acceptance. Every step of a chain is a
  single-token step, so the compiled loop has one layout for the cache and the kernels.
  """

  config: network.T5Config

  def __post_init__(self):
    if not isinstance(self.config, network.T5Config):
      raise ValueError(
          f"{type(self).__name__} needs a network.T5Config (in gin, DRAFTER_CONFIG = "
          f"%T5_1_1_SMALL after including configs/models/t5_1_1_small.gin), got "
          f"{self.config!r}."
      )
    set_checked_fields(self)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  @abc.abstractmethod
  def module(self) -> network.Transformer | network.SharedEncoderDecoder:
    """The flax module whose `decode` one drafter step runs."""

  @abc.abstractmethod
  def _init_cache(
      self,
      params: Any,
      encoder_input_tokens: jax.Array,
      cache_length: int,
      target_encoded: jax.Array | None,
  ) -> Any:
    """The decoder cache of `init_state` (its arguments)."""

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    cache = self._init_cache(params, encoder_input_tokens, cache_length, target_encoded)
    return T5DrafterState(cache, jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32))

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    module = self.module
    decode = lambda tokens, cache, index: module.apply(  # noqa: E731
        {"params": params}, tokens, cache, index, method=module.decode
    )

    def feed_previous(_, cache):
      """Feeds x_{length-1} at position length - 1 (what a full acceptance left unfed)."""
      previous = jnp.maximum(length - 1, 0)
      return decode(decoder_inputs(sequences, previous[:, None]), cache, previous)[1]

    # The catch-up is a loop of 0 or 1 single-token steps, not a `lax.cond`: every step of a
    # chain is then a single-token step (one layout of the cache and the kernels for XLA:TPU),
    # and the cache is loop state, updated in place; under a cond XLA:TPU copied whole caches
    # in one mesh or another (docs/tpu.md).
    catch_up = jnp.where(jnp.all(state.written >= length), 0, 1)
    cache = jax.lax.fori_loop(0, catch_up, feed_previous, state.cache)
    logits, cache = decode(decoder_inputs(sequences, length[:, None]), cache, length)
    drafts, q, cache, steps = draft_chain(
        logits,
        lambda cache, token, i: decode(token[:, None], cache, length + i),
        cache,
        gamma,
        u,
        standardize,
        stop,
    )
    return drafts, q, T5DrafterState(cache, length + steps)

  def propose_tree(self, params, state, sequences, length, tree, u, standardize):
    """The root's logits come from one call on x_{length-D..length} (at most D + 1 tokens: what
    the last tree's accepted path left unfed), each further depth from one call on that depth's
    drafts under the tree's attention mask (`network.Transformer.decode(tree=, slots=)`).
    Afterwards only slots up to `length` hold chain inputs: `written` = length + 1."""
    module = self.module
    width = tree.depth + 1
    start = jnp.maximum(length - tree.depth, 0)
    block = decoder_inputs(sequences, start[:, None] + jnp.arange(width)[None])
    logits, cache = module.apply(
        {"params": params}, block, state.cache, start, method=module.decode
    )
    first = jnp.take_along_axis(logits, (length - start)[:, None, None], axis=1)

    def level_logits(cache, tokens, slots):
      return module.apply(
          {"params": params}, tokens, cache, length, tree=tree, slots=slots, method=module.decode
      )

    drafts, q, cache = draft_tree(first, level_logits, cache, tree, u, standardize)
    return drafts, q, T5DrafterState(cache, length + 1)


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class T5Drafter(_CachedDecoderDrafter):
  """A smaller T5 1.1 (`network.Transformer`) with its own encoder, run once per sequence, and
  its own cache; the proposals are `_CachedDecoderDrafter`'s."""

  config: network.T5Config = gin.REQUIRED
  eos_id: int | None = None

  @property
  def module(self) -> network.Transformer:
    return network.Transformer(self.config)

  def init_params(self, rng, input_shapes):
    del input_shapes  # a T5's parameter shapes do not depend on them.
    return network.init_params(self.config, rng)

  def checkpoint_layout(self):
    return CheckpointLayout(self.config)  # a bare T5: T5X's checkpoints and the project's alike

  def param_axes(self):
    return network.param_axes(self.config)

  def _init_cache(self, params, encoder_input_tokens, cache_length, target_encoded):
    del target_encoded  # it runs its own encoder.
    module = self.module
    return module.apply(
        {"params": params}, encoder_input_tokens, cache_length, method=module.prefill
    )[1]

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    del target_encoded  # it runs its own encoder.
    return network.teacher_forced_logits(
        self.config, params, encoder_input_tokens, decoder_input_tokens
    )


@gin.configurable(module="drafters")
@dataclasses.dataclass(frozen=True, eq=False)
class SharedEncoderDrafter(_CachedDecoderDrafter):
  """A small T5 1.1 decoder without an encoder (`network.SharedEncoderDecoder`): its own token
  embedding, decoder layers and output projection, cross-attending to the target's encoder output
  target_encoded [B, Le, E_target], which decoding computes anyway (Distil-Whisper's assistant
  model, for T5). Its cache is made from that output once per sequence; the proposals are
  `_CachedDecoderDrafter`'s.

  config: the decoder's T5Config; its emb_dim E may differ from the target's (the cross-attention
    key and value kernels are [E_target, H*D]); num_encoder_layers is not used.
  encoder_emb_dim: E_target, the target's emb_dim (`check_target` refuses another target).
  """

  config: network.T5Config = gin.REQUIRED
  encoder_emb_dim: int = gin.REQUIRED
  eos_id: int | None = None

  def __post_init__(self):
    super().__post_init__()
    set_checked_fields(self, {"encoder_emb_dim": 1})

  @property
  def module(self) -> network.SharedEncoderDecoder:
    return network.SharedEncoderDecoder(self.config)

  def init_params(self, rng, input_shapes):
    del input_shapes  # its parameter shapes do not depend on them.
    return network.shared_encoder_init_params(self.config, self.encoder_emb_dim, rng)

  def checkpoint_layout(self):
    return CheckpointLayout(
        self.config,
        {"kind": SHARED_ENCODER_KIND, "encoder_emb_dim": self.encoder_emb_dim},
        "a shared-encoder drafter reading encoder outputs of width "
        f"encoder_emb_dim={self.encoder_emb_dim}",
    )

  def param_axes(self):
    return network.shared_encoder_param_axes(self.config, self.encoder_emb_dim)

  def check_target(self, target_config):
    check_reads_target(
        self,
        target_config,
        "encoder_emb_dim",
        self.encoder_emb_dim,
        "cross-attends to the target's encoder output",
    )

  def _checked_encoded(self, target_encoded: jax.Array | None, method: str) -> jax.Array:
    """target_encoded [B, Le, E_target] as given, refused where None or of another width."""
    if target_encoded is None:
      raise ValueError(
          f"SharedEncoderDrafter.{method} needs target_encoded [B, Le, {self.encoder_emb_dim}], "
          "the target's encoder output (it has no encoder of its own): pass the target's "
          "`network.Transformer.encode` of the same encoder_input_tokens."
      )
    shape = np.shape(target_encoded)
    if len(shape) != 3 or shape[-1] != self.encoder_emb_dim:
      raise ValueError(
          f"SharedEncoderDrafter.{method} got target_encoded of shape {shape}, but it reads "
          f"encoder outputs [B, Le, encoder_emb_dim = {self.encoder_emb_dim}]: pass the encoder "
          "output of the target it was configured (and trained) for."
      )
    return target_encoded

  def _init_cache(self, params, encoder_input_tokens, cache_length, target_encoded):
    module = self.module
    return module.apply(
        {"params": params},
        self._checked_encoded(target_encoded, "init_state"),
        encoder_input_tokens,
        cache_length,
        method=module.init_decode_cache,
    )

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    return network.shared_encoder_teacher_forced_logits(
        self.config,
        params,
        self._checked_encoded(target_encoded, "teacher_forced_logits"),
        encoder_input_tokens,
        decoder_input_tokens,
    )


def stepped_network(drafter: Drafter) -> tuple[network.T5Config, int | None] | None:
  """The T5 network one draft step of `drafter` runs -> (its config, E_target where it reads the
  target's encoder output [B, Le, E_target] instead of running an encoder, else None); None
  where a draft is not one step of one T5 network (tables, prompt lookup, a feature head)."""
  if isinstance(drafter, SharedEncoderDrafter):
    return drafter.config, drafter.encoder_emb_dim
  if isinstance(drafter, T5Drafter):
    return drafter.config, None
  return None


register_kind(
    SHARED_ENCODER_KIND,
    lambda config, entry: SharedEncoderDrafter(config, entry["encoder_emb_dim"]),
)
