"""visualize: trace rows -> target calls (hand-made traces and a real decode), and their HTML."""

import pathlib

import jax
import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import decoding, draft_length, drafters, models, network
from speculative_t5x.measuring import visualize
from speculative_t5x.measuring.visualize import Step

EOS = 1
TARGET = tiny_config(37)
DRAFTER = TARGET.replace(emb_dim=8, num_decoder_layers=1, mlp_dim=16)
SENTENCEPIECE_MODEL = (
    pathlib.Path(__file__).resolve().parents[1] / "data" / "demo_ende" / "sentencepiece.model"
)


def _trace(*iterations, length=5):
  """iterations of (drafts, accepted, token, emitted) -> a one-row trace of `length` iterations."""
  gamma = len(iterations[0][0])
  trace = {
      "drafts": np.zeros((1, length, gamma), np.int32),
      **{name: np.zeros((1, length), np.int32) for name in ("accepted", "token", "emitted")},
  }
  for i, (drafts, accepted, token, emitted) in enumerate(iterations):
    trace["drafts"][0, i] = drafts
    trace["accepted"][0, i], trace["token"][0, i], trace["emitted"][0, i] = accepted, token, emitted
  return decoding.SpeculativeTrace(**trace)


def test_steps_of_rejection_bonus_and_eos():
  trace = _trace(
      ([5, 6, 7], 2, 9, 3),  # two accepted, 7 rejected, 9 sampled instead
      ([10, 11, 12], 3, 13, 4),  # all accepted, 13 is the bonus token
      ([EOS, 20, 21], 2, 4, 1),
  )  # EOS accepted: the rest is dropped
  assert visualize.trace_steps(trace, 0) == [
      Step((5, 6), 7, 9),
      Step((10, 11, 12), None, 13),
      Step((EOS,), None, None),
  ]


def test_length_limit_drops_the_correction_and_its_rejection():
  trace = _trace(([5, 6, 7], 1, 9, 2), ([8, 9, 10], 1, 4, 1))  # only one slot left at the end
  assert visualize.trace_steps(trace, 0) == [Step((5,), 6, 9), Step((8,), None, None)]


def test_empty_slots_of_adaptive_draft_length_are_not_rejected_drafts():
  """A row that stopped drafting leaves its later slots EMPTY (-1): after its drafts were all
  accepted the target's token fills the first empty slot, and nothing was rejected."""
  E = drafters.EMPTY
  trace = _trace(
      ([5, E, E], 1, 9, 2),  # one draft, accepted; 9 is drawn at the first empty slot
      ([6, 7, E], 1, 8, 2),  # two drafts, 7 rejected: a real rejection
      ([10, 11, 12], 3, 13, 4),  # a full block: not stopped
      ([EOS, E, E], 1, 4, 1),
  )
  steps = visualize.trace_steps(trace, 0)
  assert steps == [
      Step((5,), None, 9, stopped=True),
      Step((6,), 7, 8, stopped=True),
      Step((10, 11, 12), None, 13),
      Step((EOS,), None, None, stopped=True),
  ]
  page = visualize.steps_html(steps)
  assert "-1" not in page and page.count('class="spec-rejected"') == 1


def _replayed_decode(rows, seed, temperature, length=12, **settings):
  """A traced decode of `rows` random inputs by the model of `settings` -> (its steps per row,
  its trace), after checking that each row's steps rebuild its decode, count its target calls
  and its accepted drafts."""
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET),
      network.Transformer(DRAFTER),
      seqio.PassThroughVocabulary(TARGET.vocab_size, eos_id=EOS),
      seqio.PassThroughVocabulary(TARGET.vocab_size, eos_id=EOS),
      **settings,
  )
  params = {
      "target": network.init_params(TARGET, jax.random.PRNGKey(0)),
      "drafter": network.init_params(DRAFTER, jax.random.PRNGKey(1)),
  }
  inputs = np.random.default_rng(seed).integers(3, TARGET.vocab_size, (rows, 6)).astype(np.int32)
  batch = {
      "encoder_input_tokens": inputs,
      "decoder_input_tokens": np.zeros((rows, length), np.int32),
  }
  decodes, aux = jax.jit(
      lambda p, b, r: model.predict_batch_with_aux(
          p, b, r, decoder_params={"temperature": temperature, "return_trace": True}
      )
  )(params, batch, jax.random.PRNGKey(2))
  steps_per_row = []
  for row in range(rows):
    steps = visualize.trace_steps(aux["speculative_trace"], row)
    tokens = [t for step in steps for t in step.tokens]
    np.testing.assert_array_equal(tokens + [0] * (length - len(tokens)), np.asarray(decodes)[row])
    assert len(steps) == int(aux["speculative_stats"]["target_calls"][row])
    accepted = sum(len(step.accepted) for step in steps)
    assert accepted == int(aux["speculative_stats"]["accepted_tokens"][row])
    steps_per_row.append(steps)
  return steps_per_row, aux["speculative_trace"]


@pytest.mark.parametrize("draft_stop", [None, draft_length.ConfidenceStop(1.0)])
def test_steps_replay_a_real_decode(draft_stop):
  """Also with adaptive draft length: threshold 1 stops every row after its first draft."""
  steps_per_row, _ = _replayed_decode(3, 0, 1.0, gamma=3, draft_stop=draft_stop)
  for steps in steps_per_row:
    assert all(step.stopped == (draft_stop is not None) for step in steps)
    assert drafters.EMPTY not in [step.rejected for step in steps]


@pytest.mark.parametrize("tree, temperature", [((3, 1), 0.0), ((2, 2), 1.0)])
def test_steps_replay_a_draft_tree_decode(tree, temperature):
  """A draft tree's trace, read along the path the verifier walked, rebuilds every one of 16
  rows (fixed seeds), some of whose accepted paths are not the first n nodes in breadth-first
  order (which do not rebuild them)."""
  _, trace = _replayed_decode(16, 3, temperature, draft_tree=tree)
  path, accepted = np.asarray(trace.path), np.asarray(trace.accepted)
  assert any(
      not np.array_equal(path[b, i, : accepted[b, i]], np.arange(1, accepted[b, i] + 1))
      for b, i in zip(*np.nonzero(accepted))
  )


def test_html_colours_every_token_and_escapes_text():
  steps = [Step((5, 6), 7, 9), Step((10,), None, 11)]
  text = {5: "a", 6: "<b>", 7: "c", 9: "d", 10: "e", 11: "</s>"}.get
  page = visualize.steps_html(steps, text, title="x & y")
  assert page.count('class="spec-accepted"') == 3
  assert page.count('class="spec-rejected"') == 1
  assert page.count('class="spec-correction"') == 2
  assert "&lt;b&gt;" in page and "&lt;/s&gt;" in page and "<b>x &amp; y</b>" in page
  assert "<b>" not in page.replace("<b>x &amp; y</b>", "")
  # The second line starts with the first call's output (without the rejected draft) uncoloured.
  assert "<div>a&lt;b&gt;d<span" in page
  legend = visualize.legend_html()
  assert all(f'class="spec-{kind}"' in legend for kind in visualize.COLORS)


def test_piece_text_shows_word_marker_as_space():
  vocabulary = seqio.SentencePieceVocabulary(str(SENTENCEPIECE_MODEL))
  text = visualize.piece_text(vocabulary)
  pieces = [text(t) for t in vocabulary.encode("Hello world")]
  assert "".join(pieces) == " Hello world"
  assert text(EOS) == "</s>"
  assert text(vocabulary.tokenizer.get_piece_size()).startswith("<id ")


def test_bad_traces_are_named():
  with pytest.raises(ValueError, match="return_trace"):
    visualize.trace_steps({"drafts": np.zeros((1, 2, 3))}, 0)
  with pytest.raises(ValueError, match="outside"):
    visualize.trace_steps(_trace(([5, 6, 7], 2, 9, 3)), 1)
