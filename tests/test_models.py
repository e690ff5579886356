"""The T5X-style model classes (speculative_t5x/models.py): the training and scoring side of the
interface (loss_fn, eval_fn, score_batch, get_initial_variables), prefill and jit_predict. The
decoding loops' exactness is tested in tests/test_decoding.py through these classes; the refusals
of bad input in tests/test_bad_inputs.py.

Expected values are computed here from the network's logits with numpy, not by the code under
test."""

import jax
import numpy as np
import pytest
import seqio

from conftest import tiny_config

from speculative_t5x import decoding
from speculative_t5x import drafters
from speculative_t5x import models
from speculative_t5x import network

CONFIG = tiny_config(24)
VOCAB = seqio.PassThroughVocabulary(CONFIG.vocab_size, eos_id=1)
TARGET = network.Transformer(CONFIG)
PARAMS = network.init_params(CONFIG, jax.random.PRNGKey(0))


def _batch(weights: bool = False) -> dict:
  """Two rows; the second's targets end after 3 tokens (then padding)."""
  targets = np.array([[5, 9, 3, 7, 1], [4, 8, 1, 0, 0]], np.int32)
  inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
  batch = {
      "encoder_input_tokens": np.array([[6, 7, 8, 1], [9, 1, 0, 0]], np.int32),
      "decoder_input_tokens": inputs,
      "decoder_target_tokens": targets,
  }
  if weights:
    batch["decoder_loss_weights"] = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0]], np.float32)
  return batch


def _log_softmax(batch: dict) -> np.ndarray:
  """log p(.) [B, L, V] from the network's own teacher-forced logits, normalized with numpy."""
  logits = np.asarray(
      TARGET.apply(
          {"params": PARAMS},
          batch["encoder_input_tokens"],
          batch["decoder_input_tokens"],
          batch["decoder_target_tokens"],
      ),
      np.float64,
  )
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), logits


def _target_log_probs(batch: dict) -> tuple[np.ndarray, np.ndarray]:
  log_probs, logits = _log_softmax(batch)
  targets = batch["decoder_target_tokens"]
  return np.take_along_axis(log_probs, targets[..., None], -1)[..., 0], logits


@pytest.mark.parametrize("weights", [False, True], ids=["padding", "loss_weights"])
def test_loss_fn_is_the_weighted_mean_cross_entropy(weights):
  batch = _batch(weights)
  token_log_probs, logits = _target_log_probs(batch)
  w = batch.get("decoder_loss_weights", (batch["decoder_target_tokens"] > 0).astype(np.float32))
  model = models.EncoderDecoderModel(TARGET, VOCAB, VOCAB)
  loss, metrics = model.loss_fn(PARAMS, batch, dropout_rng=None)
  expected = -(token_log_probs * w).sum() / w.sum()
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
  correct = (logits.argmax(-1) == batch["decoder_target_tokens"]) * w
  np.testing.assert_allclose(metrics["accuracy"], correct.sum() / w.sum(), rtol=1e-6)
  assert float(metrics["tokens"]) == w.sum() and float(metrics["z_loss"]) == 0.0
  eval_loss, _ = model.eval_fn(PARAMS, batch)
  np.testing.assert_allclose(eval_loss, loss, rtol=1e-6)


def test_z_loss_label_smoothing_and_a_fixed_normalizer():
  batch = _batch()
  log_probs, logits = _log_softmax(batch)
  targets = batch["decoder_target_tokens"]
  w = (targets > 0).astype(np.float64)
  vocab, smoothing, z_loss, normalizer = CONFIG.vocab_size, 0.1, 1e-3, 7.0
  confidence, low = 1.0 - smoothing, smoothing / (vocab - 1)
  soft = np.full(logits.shape, low)
  np.put_along_axis(soft, targets[..., None], confidence, -1)
  # Cross-entropy against the smoothed labels, less its minimum (the labels' own entropy), as T5X.
  entropy = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low))
  log_z = np.log(np.exp(logits).sum(-1))
  per_token = -(soft * log_probs).sum(-1) - entropy + z_loss * log_z**2
  model = models.EncoderDecoderModel(
      TARGET,
      VOCAB,
      VOCAB,
      label_smoothing=smoothing,
      z_loss=z_loss,
      loss_normalizing_factor=normalizer,
  )
  loss, metrics = model.loss_fn(PARAMS, batch, dropout_rng=None)
  np.testing.assert_allclose(loss, (per_token * w).sum() / normalizer, rtol=1e-4)
  np.testing.assert_allclose(
      metrics["z_loss"], (z_loss * log_z**2 * w).sum() / normalizer, rtol=1e-4
  )


def test_dropout_needs_a_rng_and_changes_the_loss():
  config = CONFIG.replace(dropout_rate=0.5)
  model = models.EncoderDecoderModel(network.Transformer(config), VOCAB, VOCAB)
  batch = _batch()
  plain, _ = model.loss_fn(PARAMS, batch, dropout_rng=None)
  dropped, _ = model.loss_fn(PARAMS, batch, dropout_rng=jax.random.PRNGKey(1))
  again, _ = model.loss_fn(PARAMS, batch, dropout_rng=jax.random.PRNGKey(1))
  assert float(dropped) != float(plain) and float(again) == float(dropped)


def test_score_batch_sums_the_targets_log_probabilities():
  batch = _batch()
  token_log_probs, _ = _target_log_probs(batch)
  expected = (token_log_probs * (batch["decoder_target_tokens"] > 0)).sum(-1)
  for model, params in (
      (models.EncoderDecoderModel(TARGET, VOCAB, VOCAB), PARAMS),
      (
          models.SpeculativeEncoderDecoderModel(TARGET, drafters.T5Drafter(CONFIG), VOCAB, VOCAB),
          {"target": PARAMS, "drafter": PARAMS},
      ),
  ):
    np.testing.assert_allclose(model.score_batch(params, batch), expected, rtol=1e-5)
  with pytest.raises(ValueError, match="return_intermediates=True is not supported"):
    model.score_batch(params, batch, return_intermediates=True)


def test_initial_variables_have_the_networks_shapes():
  shapes = {"encoder_input_tokens": (2, 4), "decoder_input_tokens": (2, 5)}
  baseline = models.EncoderDecoderModel(TARGET, VOCAB, VOCAB)
  params = baseline.get_initial_variables(jax.random.PRNGKey(3), shapes)["params"]
  want = jax.tree.map(lambda x: (x.shape, x.dtype), PARAMS)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == want
  drafter = drafters.T5Drafter(CONFIG.replace(num_decoder_layers=1))
  spec = models.SpeculativeEncoderDecoderModel(TARGET, drafter, VOCAB, VOCAB, gamma=2)
  both = spec.get_initial_variables(jax.random.PRNGKey(3), shapes)["params"]
  assert set(both) == {"target", "drafter"}
  assert jax.tree.map(lambda x: (x.shape, x.dtype), both["target"]) == want
  drafter_want = network.init_params(drafter.config, jax.random.PRNGKey(0))
  assert jax.tree.map(np.shape, both["drafter"]) == jax.tree.map(np.shape, drafter_want)
  # The two halves are drawn from different keys.
  kernel = ("decoder", "logits_dense", "kernel")
  assert not np.array_equal(
      both["target"][kernel[0]][kernel[1]][kernel[2]],
      both["drafter"][kernel[0]][kernel[1]][kernel[2]],
  )


def test_prefill_sizes_the_caches_for_a_block_of_drafts():
  batch = _batch()
  length = batch["decoder_input_tokens"].shape[1]
  baseline = models.EncoderDecoderModel(TARGET, VOCAB, VOCAB)
  cache = baseline.prefill(PARAMS, batch)
  head = (CONFIG.num_heads, CONFIG.head_dim)
  assert cache["layers_0"]["self_key"].shape == (2, length, *head)
  assert cache["layers_0"]["cross_key"].shape == (2, 4, *head)
  np.testing.assert_array_equal(cache["encoder_valid"], batch["encoder_input_tokens"] > 0)
  # A verification block is the last token and the shape's M drafts: 3 for gamma 3, 2 + 2 x 2
  # nodes for the tree (2, 2).
  for shape, drafts in (({"gamma": 3}, 3), ({"draft_tree": (2, 2)}, 6)):
    spec = models.SpeculativeEncoderDecoderModel(
        TARGET, drafters.T5Drafter(CONFIG), VOCAB, VOCAB, **shape
    )
    target_cache, _ = spec.prefill({"target": PARAMS, "drafter": PARAMS}, batch)
    assert target_cache["layers_0"]["self_key"].shape == (2, length + drafts + 1, *head)


def test_jit_predict_matches_predict_batch_with_aux():
  batch = {k: v for k, v in _batch().items() if k != "decoder_target_tokens"}
  rng = jax.random.PRNGKey(5)
  spec = models.SpeculativeEncoderDecoderModel(
      TARGET, drafters.T5Drafter(CONFIG), VOCAB, VOCAB, gamma=2
  )
  params = {"target": PARAMS, "drafter": network.init_params(CONFIG, jax.random.PRNGKey(1))}
  predict = spec.jit_predict()
  for temperature in (0.0, 1.0):
    decodes, aux = predict(params, batch, rng, temperature)
    want, want_aux = spec.predict_batch_with_aux(
        params, batch, rng, decoder_params={"temperature": temperature}
    )
    np.testing.assert_array_equal(decodes, want)
    for name in decoding.STAT_NAMES:  # float sums may differ in the last bit under jit
      np.testing.assert_allclose(
          aux["speculative_stats"][name], want_aux["speculative_stats"][name], rtol=1e-6
      )


def test_jit_predict_runs_the_prefill_as_its_own_program_shared_by_both_loops():
  """The greedy and the traced loops start from `jit_prefill`'s program (compiled once, for the
  one batch shape), so neither compiles the encoder; given that prefill, predict_batch_with_aux
  decodes as it does from its own."""
  batch = {k: v for k, v in _batch().items() if k != "decoder_target_tokens"}
  rng = jax.random.PRNGKey(2)
  for model, params in (
      (models.EncoderDecoderModel(TARGET, VOCAB, VOCAB), PARAMS),
      (
          models.SpeculativeEncoderDecoderModel(
              TARGET, drafters.T5Drafter(CONFIG), VOCAB, VOCAB, gamma=2
          ),
          {"target": PARAMS, "drafter": network.init_params(CONFIG, jax.random.PRNGKey(1))},
      ),
  ):
    predict, prefill = model.jit_predict(), model.jit_prefill()
    assert prefill is model.jit_prefill()
    for temperature in (0.0, 1.0):
      predict(params, batch, rng, temperature)
    assert prefill._cache_size() == 1
    prefilled = prefill(params, batch)
    for temperature in (0.0, 1.0):
      settings = {"temperature": temperature}
      want = model.predict_batch_with_aux(params, batch, rng, decoder_params=settings)[0]
      got = model.predict_batch_with_aux(
          params, batch, rng, decoder_params=settings, prefilled=prefilled
      )[0]
      np.testing.assert_array_equal(got, want)
