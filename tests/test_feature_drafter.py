"""The feature-level drafter: what it reads, its cache across rollbacks, training-time test, format.

Its exactness in whole decodes (goodness of fit, greedy equality, NaN weights) is tested with the
other drafters in tests/test_decoding.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from speculative_t5x import checkpoints
from speculative_t5x import distillation
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import sampling

from conftest import tiny_config

V = 40
TARGET = tiny_config(V, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, num_decoder_layers=2)
HEAD = tiny_config(V, emb_dim=12, num_heads=2, head_dim=6, mlp_dim=24, num_decoder_layers=1)
DRAFT_VOCAB = tuple(range(0, V, 2))
GAMMA = 3


@functools.lru_cache(maxsize=None)
def _setup(width=None):
  """-> (drafter, params, target params) with the target's embedding and head copied in."""
  target_params = network.init_params(TARGET, jax.random.PRNGKey(0))
  drafter = feature_drafter.FeatureDrafter(HEAD, TARGET.emb_dim, DRAFT_VOCAB)
  if width is not None:
    drafter = _NoRebuild(HEAD, TARGET.emb_dim, DRAFT_VOCAB)
  params = drafter.init_from_target(drafter.init_params(jax.random.PRNGKey(1), {}), target_params)
  return drafter, params, target_params


class _NoRebuild(feature_drafter.FeatureDrafter):
  """The bug the official EAGLE code avoids and vLLM #14649 measured: after a rollback the
  proposal feeds only the newest position, so entries written from predicted features stay."""

  def _rebuild(self, params, folded, state, sequences, length, width):
    return super()._rebuild(params, folded, state, sequences, length, 1)


def _target_outputs(target_params, encoder_tokens, sequences):
  """-> (encoded, logits [B, L, V], features [B, L, E]) teacher-forced on `sequences`."""
  model = network.Transformer(TARGET)
  encoded = model.apply({"params": target_params}, encoder_tokens, method=model.encode)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
  logits, features = model.apply(
      {"params": target_params},
      encoded,
      encoder_tokens,
      inputs,
      jnp.ones_like(inputs),
      return_features=True,
      method=model.teacher_forced,
  )
  return encoded, logits, features


def _proposals_match_teacher_forcing(
    drafter, params, target_params, seed, proposal_params=None
) -> float:
  """Runs proposals at T = 1 with random acceptances (rollbacks), handing the drafter the true
  features of each verified block, and returns the largest difference between a proposal's q
  and the unrolled teacher-forced q on the same prefix and drafts. The proposals read
  proposal_params (default: params)."""
  proposal_params = params if proposal_params is None else proposal_params
  rng = np.random.default_rng(seed)
  batch, length = 2, 14
  encoder_tokens = jnp.asarray(rng.integers(1, V, (batch, 5)), jnp.int32)
  sequences = jnp.zeros((batch, length + GAMMA + 1), jnp.int32)
  decoded = np.zeros(batch, np.int32)
  encoded, _, _ = _target_outputs(target_params, encoder_tokens, sequences)
  state = drafter.init_state(params, encoder_tokens, length + GAMMA + 2, target_encoded=encoded)
  standardize = sampling.Standardizer(1.0)
  worst = 0.0
  for _ in range(5):
    u = jnp.asarray(rng.random((batch, GAMMA)), jnp.float32)
    lengths = jnp.asarray(decoded)
    drafts, q, state = drafter.propose(
        proposal_params, state, sequences, lengths, GAMMA, u, standardize
    )
    block = np.array(sequences)
    for b in range(batch):
      block[b, decoded[b] : decoded[b] + GAMMA] = np.asarray(drafts[b])
    block = jnp.asarray(block)
    _, _, features = _target_outputs(target_params, encoder_tokens, block)
    inputs = jnp.pad(block[:, :-1], ((0, 0), (1, 0)))
    _, unrolled = drafter.unrolled(params, encoder_tokens, inputs, encoded, features, GAMMA)
    for b in range(batch):
      for j in range(GAMMA):
        expected = feature_drafter.scatter_draft_logits(
            unrolled[j, b, decoded[b] + j], DRAFT_VOCAB, V
        )
        worst = max(worst, float(jnp.max(jnp.abs(standardize(expected) - q[b, j]))))
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
    state = drafter.observe_features(state, window, start)
    decoded = np.minimum(decoded + accepted + 1, length - 1)
  return worst


def test_proposals_equal_teacher_forcing_across_rollbacks():
  drafter, params, target_params = _setup()
  assert _proposals_match_teacher_forcing(drafter, params, target_params, seed=0) < 1e-5


def test_keeping_predicted_features_after_a_rollback_fails_the_same_check():
  drafter, params, target_params = _setup(width=1)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, seed=0) > 1e-3


class _WrongFold(feature_drafter.FeatureDrafter):
  """Folds W_out into the token half of W_fuse instead of the feature half."""

  def decode_params(self, params):
    if isinstance(params, feature_drafter.DecodeParams):
      return params
    folded = feature_drafter.fold(params, self.feature_dim)
    out = params["feature_out"]["kernel"]
    wrong = {**folded, "feature_fuse": out @ params["fuse"]["kernel"][self.feature_dim :]}
    return feature_drafter.DecodeParams(params, wrong)


def test_the_folded_form_proposes_what_the_parameters_do():
  drafter, params, target_params = _setup()
  folded = drafter.decode_params(params)
  assert _proposals_match_teacher_forcing(drafter, params, target_params, 1, folded) < 1e-5
  wrong = _WrongFold(HEAD, TARGET.emb_dim, DRAFT_VOCAB)
  wrong_folded = wrong.decode_params(params)
  assert _proposals_match_teacher_forcing(wrong, params, target_params, 1, wrong_folded) > 1e-3


def test_position_t_reads_the_feature_of_t_minus_1_and_predicts_y_t():
  """The one-position shift (EAGLE #317, SpecForge #885): the output at t depends on f_{t-1},
  not on f_t, and its logits are the first draft after x_t (position 0 reads no feature)."""
  drafter, params, target_params = _setup()
  encoder_tokens = jnp.asarray([[3, 4, 5]], jnp.int32)
  sequences = jnp.asarray([[7, 8, 9, 10, 11]], jnp.int32)
  encoded, _, features = _target_outputs(target_params, encoder_tokens, sequences)
  inputs = jnp.pad(sequences[:, :-1], ((0, 0), (1, 0)))
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


def test_save_and_read_back(tmp_path):
  drafter, params, _ = _setup()
  drafter.save_params(tmp_path / "drafter", params)
  read = drafters.read_drafter(tmp_path / "drafter")
  assert type(read) is feature_drafter.FeatureDrafter  # pylint: disable=unidiomatic-typecheck
  assert (read.config, read.feature_dim, read.draft_vocab) == (HEAD, 16, DRAFT_VOCAB)
  restored = read.restore_params(tmp_path / "drafter")
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
    assert feature_drafter.frequent_tokens(name, 2) == (1, 3)
    assert feature_drafter.frequent_tokens(name, 3) == (1, 3, 5)  # 5 and 7 tie: the lower id
    assert feature_drafter.frequent_tokens(name, 5) == (1, 3, 5, 7, 9)
    assert feature_drafter.frequent_tokens(name, 6) == (
        1,
        2,
        3,
        5,
        7,
        9,
    )  # unseen: lowest id, not 0
    assert reads == ["train"]  # one pass over the split, whatever the sizes asked
    with pytest.raises(ValueError, match="frequent_tokens.size 13 > the vocabulary's 12 pieces"):
      feature_drafter.frequent_tokens(name, 13)
  finally:
    seqio.TaskRegistry.remove(name)
