"""The feature-level drafter: what it reads, its cache across rollbacks, training-time test, format.

Its exactness in whole decodes (goodness of fit, greedy equality, NaN weights) is tested with the
other drafters in tests/test_decoding.py.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import layers
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x.text import draft_vocab
from speculative_t5x.training import distillation
from speculative_t5x.weights import checkpoints

from conftest import tiny_config

V = 40
TARGET = tiny_config(V, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, num_decoder_layers=2)
HEAD = tiny_config(V, emb_dim=12, num_heads=2, head_dim=6, mlp_dim=24, num_decoder_layers=1)
DRAFT_VOCAB = tuple(range(0, V, 2))
GAMMA = 3


# The target's layer 0 read beside its final feature (EAGLE-3's multi-layer features): F = 2E.
LAYERS = (0,)


def _setup(width=None, layers=(), copy_source=False, kind=None):
  """-> (drafter, params, target params) with the target's embedding and head copied in; the
  drafter reads the target's decoder layers `layers` beside its final feature, and with
  copy_source drafts its sources' ids too. kind: a FeatureDrafter subclass (width 1: _NoRebuild).
  One per setting, however it is spelled (`_built`)."""
  return _built(width, tuple(layers), copy_source, kind)


@functools.lru_cache(maxsize=None)
def _built(width, layers, copy_source, kind):
  target_params = network.init_params(TARGET, jax.random.PRNGKey(0))
  kind = kind or (feature_drafter.FeatureDrafter if width is None else _NoRebuild)
  drafter = kind(
      HEAD, TARGET.emb_dim, DRAFT_VOCAB, target_feature_layers=layers, copy_source=copy_source
  )
  params = drafter.init_from_target(drafter.init_params(jax.random.PRNGKey(1), {}), target_params)
  return drafter, params, target_params


class _NoRebuild(feature_drafter.FeatureDrafter):
  """The bug the official EAGLE code avoids and vLLM #14649 measured: after a rollback the
  proposal feeds only the newest position, so entries written from predicted features stay."""

  def _rebuild(self, params, folded, state, sequences, length, width):
    return super()._rebuild(params, folded, state, sequences, length, 1)


@functools.partial(jax.jit, static_argnames=("layers", "config"))
def _target_outputs(target_params, encoder_tokens, sequences, layers=(), config=TARGET):
  """-> (encoded, logits [B, L, V], features [B, L, E (1 + len(layers))]) of the target (of
  `config`) teacher-forced on `sequences`."""
  model = network.Transformer(config)
  encoded = model.apply({"params": target_params}, encoder_tokens, method=model.encode)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  logits, features = model.apply(
      {"params": target_params},
      encoded,
      encoder_tokens,
      inputs,
      jnp.ones_like(inputs),
      return_features=True,
      feature_layers=layers,
      method=model.teacher_forced,
  )
  return encoded, logits, features


def _example(target_params, layers=()):
  """One fixed example -> (encoder tokens [1, 3], sequences [1, 5], the target's encoder output and
  features on them (`_target_outputs`), the decoder inputs [1, 5]: the sequences shifted right)."""
  encoder_tokens = jnp.asarray([[3, 4, 5]], jnp.int32)
  sequences = jnp.asarray([[7, 8, 9, 10, 11]], jnp.int32)
  encoded, _, features = _target_outputs(target_params, encoder_tokens, sequences, layers)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  return encoder_tokens, sequences, encoded, features, inputs


def _proposals_match_teacher_forcing(
    drafter, params, target_params, seed, proposal_params=None
) -> float:
  """Runs proposals at T = 1 with random acceptances (rollbacks), handing the drafter the true
  features of each verified block, and returns the largest difference between a proposal's q
  and the unrolled teacher-forced q on the same prefix and drafts (over the vocabulary of
  `FeatureDrafter.vocabulary_logits`). The proposals read proposal_params (default: params)."""
  proposal_params = params if proposal_params is None else proposal_params
  rng = np.random.default_rng(seed)
  batch, length = 2, 14
  encoder_tokens = jnp.asarray(rng.integers(1, V, (batch, 5)), jnp.int32)
  sequences = jnp.zeros((batch, length + GAMMA + 1), jnp.int32)
  decoded = np.zeros(batch, np.int32)
  layers = drafter.target_feature_layers
  encoded, _, _ = _target_outputs(target_params, encoder_tokens, sequences, layers)
  state = drafter.init_state(params, encoder_tokens, length + GAMMA + 2, target_encoded=encoded)
  standardize = sampling.Standardizer(1.0)
  # Jitted as the loop runs them (op by op, the check spent 40 s dispatching small programs).
  propose = jax.jit(drafter.propose, static_argnums=(4, 6))
  observe = jax.jit(drafter.observe_features)
  unrolled_fn = jax.jit(drafter.unrolled, static_argnums=5)
  worst = 0.0
  for _ in range(5):
    u = jnp.asarray(rng.random((batch, GAMMA)), jnp.float32)
    lengths = jnp.asarray(decoded)
    drafts, q, state = propose(proposal_params, state, sequences, lengths, GAMMA, u, standardize)
    block = np.array(sequences)
    for b in range(batch):
      block[b, decoded[b] : decoded[b] + GAMMA] = np.asarray(drafts[b])
    block = jnp.asarray(block)
    _, _, features = _target_outputs(target_params, encoder_tokens, block, layers)
    inputs = jnp.pad(block[:, :-1], ((0, 0), (1, 0)))
    predicted, unrolled = unrolled_fn(params, encoder_tokens, inputs, encoded, features, GAMMA)
    for j in range(GAMMA):
      logits = drafter.vocabulary_logits(params, encoder_tokens, predicted[j], unrolled[j])
      for b in range(batch):
        expected = standardize(logits[b, decoded[b] + j])
        worst = max(worst, float(jnp.max(jnp.abs(expected - q[b, j]))))
    # The verifier's outcome: n accepted drafts, then a token of the target's (random here).
    accepted = rng.integers(0, GAMMA + 1, batch)
    new = np.array(sequences)
    for b in range(batch):
      new[b, decoded[b] : decoded[b] + accepted[b]] = np.asarray(drafts[b, : accepted[b]])
      new[b, decoded[b] + accepted[b]] = rng.integers(1, V)
    sequences = jnp.asarray(new)
    start = jnp.asarray(decoded)
    window = jnp.take_along_axis(
        features, (start[:, None] + jnp.arange(GAMMA + 1)[None])[..., None], axis=1
    )
    state = observe(state, window, start)
    decoded = np.minimum(decoded + accepted + 1, length - 1)
  return worst


@pytest.mark.parametrize("layers, copy_source", [((), False), (LAYERS, False), ((), True)])
def test_proposals_equal_teacher_forcing_across_rollbacks(layers, copy_source):
  drafter, params, target_params = _setup(layers=layers, copy_source=copy_source)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, seed=0) < 1e-5


class _SourceLeftOutOfProposals(feature_drafter.FeatureDrafter):
  """Proposes from the draft vocabulary alone, though it reports copying the source."""

  def _logits(self, folded, hidden, state):
    logits = jnp.dot(hidden.astype(jnp.float32), folded["logits"])
    return feature_drafter.scatter_draft_logits(logits, self.draft_vocab, self.vocab_size)


def test_proposals_that_leave_out_the_source_fail_the_same_check():
  drafter, params, target_params = _setup(copy_source=True, kind=_SourceLeftOutOfProposals)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, seed=0) > 1e-3


def test_a_row_scores_its_own_source_ids_with_the_targets_logits_kernel():
  """Teacher-forced, copy_source keeps the draft vocabulary's logits and adds, for each row, the
  ids of its source outside it: f^[:E] times the target's logits kernel column there (computed
  here from the target's parameters); every other id keeps MASK_VALUE. Padding (0) adds
  nothing."""
  copying, params, target_params = _setup(copy_source=True)
  plain = dataclasses.replace(copying, copy_source=False)
  plain_params = {k: v for k, v in params.items() if k != "source_head"}
  encoder_tokens = jnp.asarray([[3, 4, 5, 0], [7, 7, 9, 11]], jnp.int32)
  sequences = jnp.asarray([[7, 8, 9, 10, 11], [2, 3, 4, 5, 6]], jnp.int32)
  encoded, _, features = _target_outputs(target_params, encoder_tokens, sequences)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  got = np.asarray(copying.teacher_forced_logits(params, encoder_tokens, inputs, encoded, features))
  base = np.asarray(
      plain.teacher_forced_logits(plain_params, encoder_tokens, inputs, encoded, features)
  )
  predicted, _ = plain.unrolled(plain_params, encoder_tokens, inputs, encoded, features, 1)
  kernel = np.asarray(target_params["decoder"]["logits_dense"]["kernel"], np.float32)
  scores = np.asarray(predicted[0], np.float64) @ kernel  # [B, L, V]
  draft = np.isin(np.arange(V), DRAFT_VOCAB)
  for b, added in enumerate([(3, 5), (7, 9, 11)]):
    np.testing.assert_array_equal(got[b][:, draft], base[b][:, draft])
    np.testing.assert_allclose(got[b][:, list(added)], scores[b][:, list(added)], rtol=1e-4)
    others = ~draft & ~np.isin(np.arange(V), added)
    assert np.all(got[b][:, others] == layers.MASK_VALUE)


@pytest.mark.parametrize("layers", [(), LAYERS])
def test_keeping_predicted_features_after_a_rollback_fails_the_same_check(layers):
  drafter, params, target_params = _setup(width=1, layers=layers)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, seed=0) > 1e-3


class _WrongFold(feature_drafter.FeatureDrafter):
  """Folds only the final feature's part of W_out into W_fuse: the lower layers' predicted
  features (or, with none, the final one) never reach the next draft."""

  def decode_params(self, params):
    if isinstance(params, feature_drafter.DecodeParams):
      return params
    folded = feature_drafter.fold(params, self.feature_dim)
    out = params["feature_out"]["kernel"]
    part = self.feature_dim if self.target_feature_layers else 0
    wrong = {**folded, "feature_fuse": out[:, :part] @ params["fuse"]["kernel"][:part]}
    return feature_drafter.DecodeParams(params, wrong)


@pytest.mark.parametrize("layers", [(), LAYERS])
def test_the_folded_form_proposes_what_the_parameters_do(layers):
  drafter, params, target_params = _setup(layers=layers)
  folded = drafter.decode_params(params)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, 1, folded) < 1e-5
  wrong = _WrongFold(HEAD, TARGET.emb_dim, DRAFT_VOCAB, target_feature_layers=layers)
  wrong_folded = wrong.decode_params(params)
  assert _proposals_match_teacher_forcing(wrong, params, target_params, 1, wrong_folded) > 1e-3


def test_lower_layer_features_are_that_layer_under_the_final_norm():
  """Layer 0's feature equals the final feature of the same target cut to its first layer, in
  teacher forcing and in the cached decode the loop runs."""
  _, _, target_params = _setup()
  cut = TARGET.replace(num_decoder_layers=1)
  decoder = dict(target_params["decoder"])
  del decoder["layers_1"]
  cut_params = {**target_params, "decoder": decoder}
  encoder_tokens = jnp.asarray([[3, 4, 5, 6]], jnp.int32)
  sequences = jnp.asarray([[7, 8, 9, 10, 11]], jnp.int32)
  _, logits, features = _target_outputs(target_params, encoder_tokens, sequences, LAYERS)
  _, full_logits, final = _target_outputs(target_params, encoder_tokens, sequences)
  encoded, _, layer0 = _target_outputs(cut_params, encoder_tokens, sequences, config=cut)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  e = TARGET.emb_dim
  assert features.shape == (1, 5, 2 * e)
  np.testing.assert_array_equal(features[..., :e], final)
  np.testing.assert_allclose(features[..., e:], layer0, atol=1e-6)
  np.testing.assert_array_equal(logits, full_logits)
  assert float(jnp.max(jnp.abs(layer0 - final))) > 1e-2
  # The cached decode, all five positions in one call, yields the same features.
  target = network.Transformer(TARGET)
  cache = target.apply(
      {"params": target_params}, encoded, encoder_tokens, 8, method=target.init_decode_cache
  )
  _, decoded, _ = target.apply(
      {"params": target_params},
      inputs,
      cache,
      jnp.zeros((1,), jnp.int32),
      return_features=True,
      feature_layers=LAYERS,
      method=target.decode,
  )
  np.testing.assert_allclose(decoded, features, atol=1e-5)


def test_position_t_reads_the_feature_of_t_minus_1_and_predicts_y_t():
  """The one-position shift (EAGLE #317, SpecForge #885): the output at t depends on f_{t-1},
  not on f_t, and its logits are the first draft after x_t (position 0 reads no feature)."""
  drafter, params, target_params = _setup()
  encoder_tokens, sequences, encoded, features, inputs = _example(target_params)
  logits = lambda f: drafter.teacher_forced_logits(  # noqa: E731
      params, encoder_tokens, inputs, target_encoded=encoded, target_features=f
  )
  base = logits(features)
  changed = logits(features.at[:, 2].add(1.0))
  np.testing.assert_array_equal(base[:, :3], changed[:, :3])
  assert float(jnp.max(jnp.abs(base[:, 3] - changed[:, 3]))) > 1e-4


def test_loss_supervises_the_first_position_and_only_reachable_steps():
  """Step j supervises positions t >= j - 1: with weight only at position 0, step 1 has a
  positive divergence and later steps none (their chains would start before BOS)."""
  drafter, params, target_params = _setup()
  settings = distillation.Distillation(
      "unused", divergence="forward_kl", data="references", unroll_steps=3
  )
  distiller = distillation.Distiller(settings, drafter, TARGET, eos_id=1)
  batch = {
      "encoder_input_tokens": jnp.asarray([[3, 4, 5]], jnp.int32),
      "decoder_target_tokens": jnp.asarray([[7, 8, 9, 1]], jnp.int32),
      "decoder_loss_weights": jnp.asarray([[1.0, 0.0, 0.0, 0.0]]),
  }
  loss, metrics = distiller.loss_fn(params, target_params, batch, jax.random.PRNGKey(0))
  assert float(metrics["step1_divergence"]) > 0
  assert float(metrics["step2_divergence"]) == 0 == float(metrics["step3_divergence"])
  assert np.isfinite(float(loss))


def test_cross_entropy_is_the_mean_minus_log_q_over_targets_the_draft_vocabulary_holds():
  """A head on a draft vocabulary (the even ids) puts q = 0 on the odd ones: the hard-label loss
  averages -log q_t(y_t) over the positions whose y_t it holds (here 8 and 10 of 7, 8, 9, 10, 11)
  and reports their share."""
  drafter, params, target_params = _setup()
  encoder_tokens, sequences, encoded, features, inputs = _example(target_params)
  settings = distillation.Distillation("unused", divergence="cross_entropy", data="references")
  distiller = distillation.Distiller(settings, drafter, TARGET, eos_id=1)
  batch = {"encoder_input_tokens": encoder_tokens, "decoder_target_tokens": sequences}
  _, metrics = distiller.loss_fn(params, target_params, batch, jax.random.PRNGKey(0))
  logits = drafter.teacher_forced_logits(
      params, encoder_tokens, inputs, target_encoded=encoded, target_features=features
  )
  log_q = np.asarray(jax.nn.log_softmax(logits[0]))
  expected = -(log_q[1, 8] + log_q[3, 10]) / 2
  np.testing.assert_allclose(float(metrics["step1_divergence"]), expected, rtol=1e-5)
  assert float(metrics["targets_in_draft_vocab"]) == pytest.approx(2 / 5)


class _FirstRowsSource(feature_drafter.FeatureDrafter):
  """A wrong variant: every row's drafted ids are the first row's (its p restricted so)."""

  def drafted_ids(self, encoder_input_tokens):
    ids = super().drafted_ids(encoder_input_tokens)
    return jnp.broadcast_to(ids[:1], ids.shape)


def _copy_source_loss(kind, divergence):
  """A copy_source drafter's distillation loss on two rows whose sources add different ids
  (odd ids 3, 9 / 11, 13 to the even draft vocabulary) -> (metrics, grads, q [B, L, V] teacher
  forced, p [B, L, V] the target's, drafted [B, V] computed here from the sources)."""
  plain, params, target_params = _setup(copy_source=True)
  drafter = kind(HEAD, TARGET.emb_dim, DRAFT_VOCAB, copy_source=True)
  encoder_tokens = jnp.asarray([[3, 9, 4, 0], [13, 11, 13, 6]], jnp.int32)
  sequences = jnp.asarray([[7, 8, 9, 10, 3], [11, 8, 13, 12, 9]], jnp.int32)
  settings = distillation.Distillation("unused", divergence=divergence, data="references")
  distiller = distillation.Distiller(settings, drafter, TARGET, eos_id=1)
  batch = {
      "encoder_input_tokens": encoder_tokens,
      "decoder_target_tokens": sequences,
      "decoder_loss_weights": jnp.ones(sequences.shape),
  }
  grads, metrics = jax.jit(jax.grad(distiller.loss_fn, has_aux=True))(
      params, target_params, batch, jax.random.PRNGKey(0)
  )
  encoded, p, features = _target_outputs(target_params, encoder_tokens, sequences)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  q = plain.teacher_forced_logits(
      params, encoder_tokens, inputs, target_encoded=encoded, target_features=features
  )
  drafted = np.zeros((2, V), bool)
  drafted[:, DRAFT_VOCAB] = True
  drafted[0, [3, 9]] = drafted[1, [11, 13]] = True
  return metrics, grads, np.asarray(q), np.asarray(p), drafted


def test_a_copy_source_loss_compares_q_with_p_on_each_rows_own_ids():
  """With copy_source the training loss is what decoding drafts from: q teacher-forced with the
  row's source columns, against p restricted to the draft vocabulary and that row's own source
  ids and renormalized (TVD, the mean over the 10 positions). Gradients stop at 'source_head'
  and reach the layers through the source's columns. A variant that restricts every row's p to
  the first row's ids fails."""
  metrics, grads, q, p, drafted = _copy_source_loss(feature_drafter.FeatureDrafter, "tvd")
  plain, _, _ = _setup()
  vocabulary_only = np.broadcast_to(np.isin(np.arange(V), DRAFT_VOCAB), (2, V))
  np.testing.assert_array_equal(plain.drafted_ids(jnp.ones((2, 4), jnp.int32)), vocabulary_only)
  q_probs = np.exp(q - q.max(-1, keepdims=True))
  q_probs /= q_probs.sum(-1, keepdims=True)
  assert np.all(q_probs[~np.broadcast_to(drafted[:, None], q.shape)] == 0)
  p_kept = np.where(drafted[:, None], np.exp(p - p.max(-1, keepdims=True)), 0.0)
  p_kept /= p_kept.sum(-1, keepdims=True)
  expected = np.mean(0.5 * np.abs(p_kept - q_probs).sum(-1))
  np.testing.assert_allclose(float(metrics["step1_divergence"]), expected, rtol=1e-5)
  assert not np.any(np.asarray(grads["source_head"]))
  assert np.any(np.asarray(grads["feature_out"]["kernel"]))
  wrong, _, _, _, _ = _copy_source_loss(_FirstRowsSource, "tvd")
  assert abs(float(wrong["step1_divergence"]) - expected) > 1e-3


def test_a_copy_source_cross_entropy_scores_targets_the_row_may_draft():
  """Hard labels: y_t counts where the draft vocabulary (even ids) or the row's own source holds
  it: 8, 9, 10 and 3 of row 0 (sources 3, 9), 11, 8, 13 and 12 of row 1 (sources 13, 11)."""
  metrics, _, q, _, _ = _copy_source_loss(feature_drafter.FeatureDrafter, "cross_entropy")
  log_q = (
      q
      - np.log(np.exp(q - q.max(-1, keepdims=True)).sum(-1, keepdims=True))
      - q.max(-1, keepdims=True)
  )
  held = [
      (0, 1, 8),
      (0, 2, 9),
      (0, 3, 10),
      (0, 4, 3),
      (1, 0, 11),
      (1, 1, 8),
      (1, 2, 13),
      (1, 3, 12),
  ]
  expected = -np.mean([log_q[b, t, y] for b, t, y in held])
  np.testing.assert_allclose(float(metrics["step1_divergence"]), expected, rtol=1e-5)
  assert float(metrics["targets_in_draft_vocab"]) == pytest.approx(8 / 10)


def test_feature_settings_are_refused_for_a_drafter_without_features(tmp_path):
  _, _, target_params = _setup()
  checkpoints.save_model(tmp_path, target_params, TARGET)
  settings = distillation.Distillation(
      str(tmp_path), divergence="forward_kl", data="references", unroll_steps=2
  )
  with pytest.raises(gin_utils.ConfigError, match="does not: leave them at"):
    distillation.checked_drafter(
        settings, drafters.T5Drafter(HEAD), V, 1, {"encoder_input_tokens": (1, 4)}
    )


def test_a_widened_head_computes_what_it_did_until_trained():
  """`widen_features`: a head trained on the final feature, given lower layers' features too,
  drafts exactly as before (zero weights on the new ones)."""
  drafter, params, target_params = _setup()
  wide, _, _ = _setup(layers=LAYERS)
  widened = feature_drafter.widen_features(params, TARGET.emb_dim, 2)
  wide.check_params(widened)
  encoder_tokens, sequences, encoded, features, inputs = _example(target_params, LAYERS)
  e = TARGET.emb_dim
  before = drafter.unrolled(params, encoder_tokens, inputs, encoded, features[..., :e], 3)
  after = wide.unrolled(widened, encoder_tokens, inputs, encoded, features, 3)
  np.testing.assert_allclose(after[1], before[1], atol=1e-5)
  np.testing.assert_allclose(after[0][..., :e], before[0], atol=1e-5)
  np.testing.assert_array_equal(after[0][..., e:], 0.0)
  with pytest.raises(ValueError, match="reads 2 features already"):
    feature_drafter.widen_features(widened, e, 1)


def test_a_widened_body_computes_what_it_did_until_trained():
  """`widen_body`: more heads and MLP units, drawn at random, whose outputs are read by zero rows:
  the unrolled drafts and a proposal's q are as before; the new weights are not all zero."""
  drafter, params, target_params = _setup()
  wide = dataclasses.replace(drafter, config=dataclasses.replace(HEAD, num_heads=3, mlp_dim=40))
  widened = feature_drafter.widen_body(params, HEAD, 3, 40)
  wide.check_params(widened)
  assert np.abs(widened["layers_0"]["mlp"]["wi_0"]["kernel"][:, 24:]).min() > 0
  assert np.abs(widened["layers_0"]["self_attention"]["query"]["kernel"][:, 12:]).min() > 0
  encoder_tokens, sequences, encoded, features, inputs = _example(target_params)
  before = drafter.unrolled(params, encoder_tokens, inputs, encoded, features, 3)
  after = wide.unrolled(widened, encoder_tokens, inputs, encoded, features, 3)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5), after, before)

  def proposal(d, p):
    state = d.init_state(p, encoder_tokens, 8, encoded)
    state = d.observe_features(state, features[:, :4], jnp.zeros((1,), jnp.int32))
    u = jnp.full((1, GAMMA), 0.5)
    return d.propose(p, state, sequences, jnp.asarray([3]), GAMMA, u, sampling.Standardizer(1.0))[
        :2
    ]

  jax.tree.map(
      functools.partial(np.testing.assert_allclose, atol=1e-5),
      proposal(wide, widened),
      proposal(drafter, params),
  )
  with pytest.raises(ValueError, match="adds heads or MLP units"):
    feature_drafter.widen_body(params, HEAD, 1, 40)


def test_a_head_without_a_layer_that_writes_nothing_drafts_as_before():
  """`without_layers`: a two-layer head whose second layer writes zeros to the residual stream
  (its attention 'out' and MLP 'wo' rows zero) drafts as the cut one-layer head; with that layer
  as initialized it does not, so the check can fail."""
  _, _, target_params = _setup()
  deep = feature_drafter.FeatureDrafter(
      dataclasses.replace(HEAD, num_decoder_layers=2), TARGET.emb_dim, DRAFT_VOCAB
  )
  params = deep.init_from_target(deep.init_params(jax.random.PRNGKey(2), {}), target_params)
  layer = dict(params["layers_1"])
  for name in ("self_attention", "encoder_decoder_attention"):
    layer[name] = {**layer[name], "out": {"kernel": jnp.zeros_like(layer[name]["out"]["kernel"])}}
  layer["mlp"] = {**layer["mlp"], "wo": {"kernel": jnp.zeros_like(layer["mlp"]["wo"]["kernel"])}}
  silent = {**params, "layers_1": layer}
  config, cut = feature_drafter.without_layers(silent, deep.config, (1,))
  shallow = dataclasses.replace(deep, config=config)
  assert config.num_decoder_layers == 1
  shallow.check_params(cut)
  encoder_tokens, sequences, encoded, features, inputs = _example(target_params)

  def drafts(drafter, p):
    return drafter.unrolled(p, encoder_tokens, inputs, encoded, features, 3)

  jax.tree.map(
      functools.partial(np.testing.assert_allclose, atol=1e-5),
      drafts(shallow, cut),
      drafts(deep, silent),
  )
  _, cut_trained = feature_drafter.without_layers(params, deep.config, (1,))
  with pytest.raises(AssertionError):
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, atol=1e-5),
        drafts(shallow, cut_trained),
        drafts(deep, params),
    )
  with pytest.raises(ValueError, match="keep at least one"):
    feature_drafter.without_layers(params, deep.config, (0, 1))


def test_copying_source_adds_the_targets_kernel_to_a_trained_drafter():
  plain, params, target_params = _setup()
  # Trained on from an earlier target: its copies of the head differ from the target's now.
  params = dict(params, head=params["head"] + 1.0)
  copying, copying_params = feature_drafter.copying_source(plain, params, target_params)
  assert copying.copy_source and not plain.copy_source
  copying.check_params(copying_params)
  kernel = target_params["decoder"]["logits_dense"]["kernel"]
  np.testing.assert_array_equal(copying_params.pop("source_head"), kernel)
  jax.tree.map(np.testing.assert_array_equal, copying_params, params)


@pytest.mark.parametrize("layers, copy_source", [((), False), (LAYERS, False), ((), True)])
def test_save_and_read_back(tmp_path, layers, copy_source):
  drafter, params, _ = _setup(layers=layers, copy_source=copy_source)
  checkpoints.save_drafter_params(drafter, tmp_path / "drafter", params)
  read = checkpoints.read_drafter(tmp_path / "drafter")
  assert type(read) is feature_drafter.FeatureDrafter  # pylint: disable=unidiomatic-typecheck
  assert (read.config, read.feature_dim, read.draft_vocab) == (HEAD, 16, DRAFT_VOCAB)
  assert (read.target_feature_layers, read.copy_source) == (layers, copy_source)
  restored = checkpoints.restore_drafter_params(read, tmp_path / "drafter")
  jax.tree.map(np.testing.assert_array_equal, restored, params)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: feature_drafter.FeatureDrafter(HEAD, 0), "feature_dim must be an integer >= 1"),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, (4, 2)),
            "distinct token ids in \\[0, 40\\) in ascending order",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, (0, V)),
            "distinct token ids",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 8).check_target(TARGET),
            "feature_dim 8 != the target's emb_dim 16",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16).init_state(
                {}, jnp.ones((1, 3), jnp.int32), 8
            ),
            "needs target_encoded",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, target_feature_layers=(0, 0)),
            "target_feature_layers must be distinct target decoder layer indices",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, target_feature_layers=(-1,)),
            "target_feature_layers must be distinct",
        ),
        (
            # TARGET has 2 decoder layers: layer 1's output is the final feature already.
            lambda: feature_drafter.FeatureDrafter(
                HEAD, 16, target_feature_layers=(1,)
            ).check_target(TARGET),
            "target_feature_layers: feature_layers \\(1,\\) must be distinct decoder layer "
            "indices in \\[0, 1\\)",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, copy_source=True),
            "copy_source adds each source's ids to a draft vocabulary, but draft_vocab is \\(\\)",
        ),
        (
            lambda: feature_drafter.FeatureDrafter(HEAD, 16, DRAFT_VOCAB, copy_source="yes"),
            "copy_source must be True or False, got 'yes'",
        ),
    ],
)
def test_bad_settings_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_frequent_tokens_counts_a_split_once_and_breaks_ties_to_the_lower_id():
  reads = []
  targets = [[5, 3, 3, 1], [7, 5, 3, 1], [9, 7, 1, 0]]  # 3 and 1: 3 times; 5, 7: twice; 9 once

  def dataset(split, shuffle_files):
    del shuffle_files
    reads.append(split)
    return tf.data.Dataset.from_tensor_slices({"targets": tf.constant(targets, tf.int32)})

  name = "frequent_tokens_test_task"
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      seqio.FunctionDataSource(dataset, splits=("train",)),
      output_features={
          "targets": seqio.Feature(seqio.PassThroughVocabulary(12, eos_id=1), add_eos=False)
      },
  )
  try:
    assert draft_vocab.frequent_tokens(name, 2) == (1, 3)
    assert draft_vocab.frequent_tokens(name, 3) == (1, 3, 5)  # 5 and 7 tie: the lower id
    assert draft_vocab.frequent_tokens(name, 5) == (1, 3, 5, 7, 9)
    assert draft_vocab.frequent_tokens(name, 6) == (
        1,
        2,
        3,
        5,
        7,
        9,
    )  # unseen: lowest id, not 0
    assert reads == ["train"]  # one pass over the split, whatever the sizes asked
    with pytest.raises(ValueError, match="frequent_tokens.size 13 > the vocabulary's 12 pieces"):
      draft_vocab.frequent_tokens(name, 13)
  finally:
    seqio.TaskRegistry.remove(name)


def test_only_a_feature_drafter_with_a_draft_vocabulary_can_copy_the_source():
  """`feature_drafter.can_copy_source`, which the demo asks before `copying_source`: a draft
  vocabulary is what the source ids are added to."""
  head = tiny_config(vocab_size=32, num_decoder_layers=1)
  can_copy = feature_drafter.can_copy_source
  assert can_copy(feature_drafter.FeatureDrafter(head, feature_dim=16, draft_vocab=(2, 3)))
  assert not can_copy(feature_drafter.FeatureDrafter(head, feature_dim=16))
  assert not can_copy(drafters.T5Drafter(head))
  assert not can_copy(drafters.SharedEncoderDrafter(head, encoder_emb_dim=16))
