"""draft_shapes: the shapes the loop and the models select, their default verifiers, a tree's
traced path, a new shape as one class plus a gin line, and the settings refused.

The loops here run on a counting target (next token = the previous one + 1, a margin of 100 in
the logits) and table drafters, so nothing compiles a network.
"""

import dataclasses

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import decoding, draft_length, draft_shapes, models, network
from speculative_t5x import speculative, table_drafters, trees
from speculative_t5x.measuring import visualize
from speculative_t5x.measuring.visualize import Step
from speculative_t5x.validation import InvalidInputError

VOCAB, LENGTH = 16, 8
EOS = VOCAB - 1  # never reached: the decodes count 1 .. LENGTH from BOS.
COUNTING = list(range(1, LENGTH + 1))
TARGET = tiny_config(VOCAB)


def _counting_target(tokens, cache, index, tree=None):
  """The target's cached decode: at every block slot, the next token is the slot's token + 1
  (with a tree too, the path to a slot ending in its token)."""
  del index, tree
  return 100.0 * jax.nn.one_hot((tokens + 1) % VOCAB, VOCAB), cache


def _decode(drafter, params, **settings):
  """speculative_sample of 2 rows from BOS on the counting target (no cache to move) -> output."""
  return decoding.speculative_sample(
      jnp.zeros((2, LENGTH), jnp.int32),
      (),
      _counting_target,
      drafter,
      params,
      (),
      EOS,
      move_target_cache=lambda cache, destination, sources: cache,
      **settings,
  )


def _skipping_bigram():
  """A bigram drafter whose top successor of t is t + 2 and second t + 1 (the target's)."""
  successors = np.arange(VOCAB)[:, None] + np.array([[2, 1]])
  params = {
      "unigram": np.full(VOCAB, -np.log(VOCAB), np.float32),
      "next_ids": (successors % VOCAB).astype(np.int32),
      "next_logp": np.log(np.full((VOCAB, 2), [0.6, 0.3])).astype(np.float32),
      "backoff": np.full(VOCAB, np.log(0.1), np.float32),
  }
  return table_drafters.BigramDrafter(vocab_size=VOCAB, top=2), params


def test_a_tree_alone_takes_the_tree_verifier_and_traces_the_walked_path():
  """Tree (2, 1) at temperature 0: the root's first child (t + 2) is rejected, its second (t + 1)
  accepted, and that node's child (t + 3) rejected, so every call emits t + 1 and the target's
  t + 2; the trace's path is block slots 2 (accepted) then 4 (its child, rejected)."""
  drafter, params = _skipping_bigram()
  output = jax.jit(
      lambda params: _decode(drafter, params, draft_tree=(2, 1), temperature=0.0, return_trace=True)
  )(params)
  np.testing.assert_array_equal(output.decodes[:, 0], [COUNTING] * 2)
  trace = jax.tree.map(lambda x: x[:, 0], output.trace)
  np.testing.assert_array_equal(trace.path[:, : LENGTH // 2], np.full((2, LENGTH // 2, 2), [2, 4]))
  expected = [Step((t,), t + 2, t + 1) for t in range(1, LENGTH, 2)]
  assert visualize.trace_steps(trace, 0) == visualize.trace_steps(trace, 1) == expected


def test_the_models_take_the_shapes_default_verifier():
  vocabulary = seqio.PassThroughVocabulary(VOCAB, eos_id=EOS)

  def model(**settings):
    return models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET),
        table_drafters.UnigramDrafter(),
        vocabulary,
        vocabulary,
        **settings,
    )

  tree = model(draft_tree=(4, 1, 1, 1))
  assert tree.draft_shape == draft_shapes.Tree(trees.DraftTree.from_branching((4, 1, 1, 1)))
  assert tree.verifier == speculative.TreeVerifier() and tree.gamma == 4
  chain = model()
  assert chain.draft_shape == draft_shapes.Chain(models.DEFAULT_GAMMA)
  assert chain.verifier is speculative.ALGORITHM_1
  block = speculative.BlockVerifier()
  assert model(gamma=3, verifier=block).verifier is block


class _AcceptsEverything(speculative.TokenVerifier):
  """Wrong on purpose: keeps all gamma drafts, then the target's next token."""

  def verify_greedy(self, target_tokens, drafts):
    gamma = drafts.shape[1]
    _, _, beta = super().verify_greedy(target_tokens, drafts)
    return jnp.full(drafts.shape[:1], gamma, jnp.int32), target_tokens[:, gamma], beta


@gin.configurable(module="test_draft_shapes")
@dataclasses.dataclass(frozen=True)
class _TrustingChain(draft_shapes.Chain):
  """A new shape, wrong on purpose so its effect shows: a chain whose verifier keeps every
  draft unless one is given."""

  @property
  def default_verifier(self):
    return _AcceptsEverything()


def test_a_new_shape_is_one_class_and_a_gin_line():
  """The loop uses the new shape's default verifier: a drafter of 5s keeps 5 5 5 and the target's
  6 after them; the model built from gin holds the shape and its verifier."""
  drafter = table_drafters.UnigramDrafter(vocab_size=VOCAB, smoothing=1e-6)
  params = drafter.fit_params([np.full(9, 5)])
  output = jax.jit(
      lambda params: _decode(drafter, params, draft_shape=_TrustingChain(3), temperature=0.0)
  )(params)
  np.testing.assert_array_equal(output.decodes[:, 0], [[5, 5, 5, 6, 5, 5, 5, 6]] * 2)
  gin.clear_config()
  try:
    gin.parse_config(
        "SpeculativeEncoderDecoderModel.draft_shape = @test_draft_shapes._TrustingChain()\n"
        "test_draft_shapes._TrustingChain.gamma = 3"
    )
    vocabulary = seqio.PassThroughVocabulary(VOCAB, eos_id=EOS)
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TARGET), drafter, vocabulary, vocabulary
    )
  finally:
    gin.clear_config()
  assert model.draft_shape == _TrustingChain(3) and model.gamma == 3
  assert isinstance(model.verifier, _AcceptsEverything)


def test_the_shapes_sizes():
  chain, tree = draft_shapes.Chain(3), draft_shapes.Tree((2, 2))
  assert (chain.depth, chain.num_drafts, chain.width, chain.num_uniforms) == (3, 3, 4, 7)
  assert (tree.depth, tree.num_drafts, tree.width, tree.num_uniforms) == (2, 6, 7, 13)
  assert draft_shapes.make_shape(3) == chain
  assert draft_shapes.make_shape(2, draft_tree=(2, 2)) == tree
  assert draft_shapes.make_shape(draft_shape=tree) is tree


def test_what_the_reports_ask_a_shape():
  chain, tree = draft_shapes.Chain(3), draft_shapes.Tree((2, 1))
  assert (chain.label, tree.label) == ("gamma 3", "4 drafts in a tree of depth 2")
  assert chain.describe() == {"gamma": 3, "draft_tree": None}
  assert tree.describe() == {"gamma": 2, "draft_tree": (0, 0, 1, 2)}


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(), "give gamma"),
        (dict(gamma=0), "gamma must be an integer >= 1"),
        (dict(gamma=3, draft_tree=(2, 2)), "gamma 3 != the draft tree's depth 2"),
        (dict(gamma=2, draft_shape=draft_shapes.Chain(3)), "gamma 2 != the draft shape's depth 3"),
        (dict(draft_shape=(2, 2)), "draft_shape must be a draft_shapes.DraftShape"),
        (dict(draft_shape=draft_shapes.Chain(3), draft_tree=(2,)), "give draft_shape alone"),
        (
            dict(draft_tree=(2,), draft_stop=draft_length.ConfidenceStop(0.5)),
            "works on chains only",
        ),
        (dict(gamma=2, draft_stop="confident"), "draft_stop must be a draft_length rule"),
        (dict(draft_tree="4111"), "branching must be a tuple"),
    ],
)
def test_settings_that_name_no_shape_are_refused(settings, message):
  with pytest.raises(ValueError, match=message):
    draft_shapes.make_shape(**settings)


def test_a_tree_refuses_a_chain_verifier_and_a_missing_cache_move():
  drafter, params = _skipping_bigram()
  with pytest.raises(InvalidInputError, match="TokenVerifier verifies chains only"):
    _decode(drafter, params, draft_tree=(2,), verifier=speculative.TokenVerifier())
  with pytest.raises(InvalidInputError, match="needs move_target_cache"):
    draft_shapes.Tree((2,)).check(speculative.TreeVerifier(), drafter, None)
