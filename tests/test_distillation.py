"""Tests of speculative_t5x/training/distillation.py: each divergence against its formula on small
distributions, finite gradients where p = q and where p or q has zeros, the law of generated data,
the data sources, the settings' errors, and a tiny end-to-end distillation that raises alpha on
held-out inputs."""

import math

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from conftest import SEQIO_TEST_VOCABULARY, TRANSLATION_PAIRS, chisquare_pvalue, tiny_config
from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import table_drafters
from speculative_t5x.text import tasks
from speculative_t5x.training import distillation
from speculative_t5x.training import training
from speculative_t5x.weights import checkpoints

EOS = 1
# Two distributions over three tokens, and their logits.
P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.25, 0.25, 0.5])
SOFT_DIVERGENCES = ("forward_kl", "reverse_kl", "jsd", "tvd")


def random_params(init_fn, seed: int) -> dict:
  """Random parameters of the shapes `init_fn()` returns, drawn with numpy (nothing compiled, as
  flax's initializers would be): normal / sqrt(fan-in), and RMSNorm scales of 1."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    if path[-1].key == "scale":
      return np.ones(leaf.shape, np.float32)
    fan_in = leaf.shape[0] if len(leaf.shape) > 1 else 1
    return (rng.normal(size=leaf.shape) / np.sqrt(fan_in)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(init_fn))


def t5_params(config: network.T5Config, seed: int) -> dict:
  return random_params(lambda: network.init_params(config, jax.random.PRNGKey(0)), seed)


def divergence(name, p_logits, q_logits, targets=None, temperature=1.0) -> np.ndarray:
  """`distillation.token_divergence` of logits [..., V] given as [B=1, L, V] -> numpy [L]."""
  value = distillation.token_divergence(
      name,
      jnp.asarray(p_logits, jnp.float32)[None],
      jnp.asarray(q_logits, jnp.float32)[None],
      None if targets is None else jnp.asarray(targets)[None],
      temperature,
  )
  return np.asarray(value[0], np.float64)


def softmax64(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
  scaled = np.asarray(logits, np.float64) / temperature
  scaled = np.exp(scaled - scaled.max(-1, keepdims=True))
  return scaled / scaled.sum(-1, keepdims=True)


def test_divergences_equal_the_hand_computed_values():
  logits = np.log(np.stack([P, Q]))  # position 0: (p, q) = (P, Q); position 1: (Q, P).
  p_logits, q_logits = logits, logits[::-1]
  log = math.log
  forward = 0.5 * log(0.5 / 0.25) + 0.3 * log(0.3 / 0.25) + 0.2 * log(0.2 / 0.5)
  backward = 0.25 * log(0.25 / 0.5) + 0.25 * log(0.25 / 0.3) + 0.5 * log(0.5 / 0.2)
  m = [0.375, 0.275, 0.35]
  jsd = 0.5 * sum(a * log(a / c) for a, c in zip(P, m)) + 0.5 * sum(
      b * log(b / c) for b, c in zip(Q, m)
  )
  expected = {
      "forward_kl": [forward, backward],
      "reverse_kl": [backward, forward],
      "jsd": [jsd, jsd],
      "tvd": [0.3, 0.3],  # (0.25 + 0.05 + 0.3) / 2, and 1 - sum min(p, q) = 1 - 0.7.
  }
  for name, values in expected.items():
    np.testing.assert_allclose(
        divergence(name, p_logits, q_logits), values, rtol=1e-5, err_msg=name
    )
  # Hard labels: -log q(y_t), whatever p is.
  np.testing.assert_allclose(
      divergence("cross_entropy", p_logits, q_logits, targets=[2, 0]),
      [-log(0.5), -log(0.5)],
      rtol=1e-6,
  )


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_divergences_take_p_and_q_at_the_divergence_temperature(temperature):
  rng = np.random.default_rng(0)
  p_logits, q_logits = rng.normal(size=(2, 4, 7)) * 3
  p, q = softmax64(p_logits, temperature), softmax64(q_logits, temperature)
  m = (p + q) / 2
  expected = {
      "forward_kl": np.sum(p * np.log(p / q), -1),
      "reverse_kl": np.sum(q * np.log(q / p), -1),
      "jsd": 0.5 * np.sum(p * np.log(p / m), -1) + 0.5 * np.sum(q * np.log(q / m), -1),
      "tvd": 0.5 * np.sum(np.abs(p - q), -1),
  }
  for name, values in expected.items():
    got = divergence(name, p_logits, q_logits, temperature=temperature)
    np.testing.assert_allclose(got, values, rtol=1e-4, atol=1e-6, err_msg=name)
  targets = np.array([0, 3, 6, 2])
  np.testing.assert_allclose(
      divergence("cross_entropy", p_logits, q_logits, targets, temperature),
      -np.log(q[np.arange(4), targets]),
      rtol=1e-5,
  )


def test_divergences_are_finite_where_p_or_q_is_zero():
  # p = (1, 0, 0) by -inf logits, then by float32 underflow (exp(-200) is 0); q = (1/2, 1/2, 0).
  q_logits = [math.log(0.5), math.log(0.5), -np.inf]
  for p_logits in ([0.0, -np.inf, -np.inf], [0.0, -200.0, -200.0]):
    logits = (np.array([p_logits]), np.array([q_logits]))
    np.testing.assert_allclose(divergence("forward_kl", *logits), [math.log(2)], rtol=1e-6)
    np.testing.assert_allclose(divergence("tvd", *logits), [0.5], rtol=1e-6)
    jsd = 0.5 * math.log(1 / 0.75) + 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2))
    np.testing.assert_allclose(divergence("jsd", *logits), [jsd], rtol=1e-5)
    # KL(q || p): log p(1) is -200 in log space (0.5 log 0.5 + 0.5 (log 0.5 + 200)); where
    # p(1) = 0 exactly it is infinite: a large finite number, not NaN.
    reverse = divergence("reverse_kl", *logits)
    if np.isfinite(p_logits[1]):
      np.testing.assert_allclose(reverse, [math.log(0.5) + 100], rtol=1e-6)
    else:
      assert np.all(np.isfinite(reverse)) and reverse[0] > 1e6, reverse


@pytest.mark.parametrize("name", SOFT_DIVERGENCES)
def test_gradients_are_finite_where_p_equals_q_and_with_zeros(name):
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 5)), jnp.float32)
  grad = jax.grad(lambda q: jnp.sum(distillation.token_divergence(name, logits, q)))
  at_equal = np.asarray(grad(logits))
  assert np.all(np.isfinite(at_equal)), at_equal
  np.testing.assert_allclose(at_equal, 0.0, atol=1e-5)  # p = q is every divergence's minimum.
  # Zeros in both: -inf logits, and logits whose probabilities underflow to exactly 0.
  zeros = jnp.asarray([0.0, -jnp.inf, -1e30, 0.0, -300.0])
  p_logits, q_logits = logits + zeros, logits + zeros[::-1]
  for p_side, q_side in ((p_logits, q_logits), (p_logits, p_logits), (logits, q_logits)):
    value = distillation.token_divergence(name, p_side, q_side)
    gradient = jax.grad(lambda q, p=p_side: jnp.sum(distillation.token_divergence(name, p, q)))(
        q_side
    )
    assert np.all(np.isfinite(value)) and np.all(np.isfinite(gradient)), (value, gradient)


def test_divergence_names_and_hard_labels_are_checked():
  logits = jnp.zeros((1, 2, 3))
  with pytest.raises(ValueError, match="unknown divergence 'kl'"):
    distillation.token_divergence("kl", logits, logits)
  with pytest.raises(ValueError, match="needs the targets"):
    distillation.token_divergence("cross_entropy", logits, logits)


# ----------------------------------------------------------------------------------------------
# Generated data
# ----------------------------------------------------------------------------------------------
def test_targets_become_draft_vocabulary_indices_and_the_rest_is_marked():
  indices, in_vocab = distillation.draft_vocab_targets(jnp.asarray([[3, 0, 5]]), (0, 3), 6)
  np.testing.assert_array_equal(indices, [[1, 0, 0]])
  np.testing.assert_array_equal(in_vocab, [[1.0, 1.0, 0.0]])
  same, everywhere = distillation.draft_vocab_targets(jnp.asarray([[3, 0, 5]]), (), 6)
  np.testing.assert_array_equal(same, [[3, 0, 5]])
  np.testing.assert_array_equal(everywhere, [[1.0, 1.0, 1.0]])


V = 6
SMALL = tiny_config(V, num_decoder_layers=1)


def test_the_loss_is_the_mean_divergence_over_real_positions_with_the_targets_encoding():
  """data='references': the loss and its metrics against float64 numpy on both models'
  teacher-forced logits, a shared-encoder drafter reading the target's encoder output; a row
  whose input is all padding (an eval set's filler) weighs nothing."""
  target_config = tiny_config(V)
  target_params = t5_params(target_config, 1)
  drafter = drafters.SharedEncoderDrafter(
      tiny_config(V, emb_dim=8, head_dim=4, num_decoder_layers=1), encoder_emb_dim=16
  )
  params = random_params(lambda: drafter.init_params(jax.random.PRNGKey(0), {}), 2)
  encoder_tokens = jnp.array([[2, 3, 1, 0], [4, 5, 3, 1], [0, 0, 0, 0]], jnp.int32)
  targets = jnp.array([[3, 4, 1, 0, 0], [2, 1, 0, 0, 0], [5, 1, 0, 0, 0]], jnp.int32)
  inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  batch = {"encoder_input_tokens": encoder_tokens, "decoder_target_tokens": targets}
  settings = distillation.Distillation(
      "/runs/target/model", divergence="forward_kl", data="references"
  )
  distiller = distillation.Distiller(settings, drafter, target_config, EOS)
  loss, metrics = jax.jit(distiller.loss_fn)(params, target_params, batch, jax.random.PRNGKey(0))

  @jax.jit
  def both_logits():
    encoded = network.Transformer(target_config).apply(
        {"params": target_params}, encoder_tokens, method=network.Transformer.encode
    )
    return (
        network.teacher_forced_logits(target_config, target_params, encoder_tokens, inputs),
        drafter.teacher_forced_logits(params, encoder_tokens, inputs, target_encoded=encoded),
    )

  p, q = (softmax64(logits) for logits in both_logits())
  weights = np.asarray(targets > 0, np.float64) * [[1], [1], [0]]
  mean = lambda x: np.sum(x * weights) / np.sum(weights)
  np.testing.assert_allclose(loss, mean(np.sum(p * np.log(p / q), -1)), rtol=1e-5)
  np.testing.assert_allclose(metrics["beta"], mean(np.sum(np.minimum(p, q), -1)), rtol=1e-5)
  agreement = np.argmax(p, -1) == np.argmax(q, -1)
  np.testing.assert_allclose(metrics["agreement"], mean(agreement), rtol=1e-6)
  assert float(metrics["tokens"]) == 5.0


def test_drafter_generated_data_follow_its_teacher_forced_law():
  """Two-token samples at temperature 0.7 against the exact law q(y_1) q(y_2 | y_1) from the
  teacher-forced logits; a row ending in EOS at y_1 is (EOS, 0)."""
  drafter = drafters.T5Drafter(SMALL)
  params = t5_params(SMALL, 3)
  params["decoder"]["logits_dense"]["kernel"] *= 4.0  # a law far from uniform.
  temperature, rows = 0.7, 4000
  encoder_tokens = jnp.tile(jnp.array([[2, 3, 4, EOS]], jnp.int32), (rows, 1))
  samples = jax.jit(
      lambda rng: distillation.generate(drafter, params, encoder_tokens, 2, temperature, rng, EOS)
  )(jax.random.PRNGKey(0))
  prefixes = jnp.stack([jnp.zeros(V, jnp.int32), jnp.arange(V, dtype=jnp.int32)], axis=1)
  logits = jax.jit(drafter.teacher_forced_logits)(params, encoder_tokens[:V], prefixes)
  law = softmax64(np.asarray(logits), temperature)  # [y_1, position, y]
  expected = np.zeros((V, V))
  expected[:, :] = law[0, 0][:, None] * law[:, 1]
  expected[EOS] = 0.0
  expected[EOS, 0] = law[0, 0][EOS]
  observed = np.zeros((V, V))
  np.add.at(observed, (np.asarray(samples[:, 0]), np.asarray(samples[:, 1])), 1)
  assert chisquare_pvalue(observed.ravel(), expected.ravel()) > 1e-3


def test_greedy_target_data_are_the_targets_greedy_decodes():
  """data='target' at temperature 0 (the distill_from shorthand) trains on what the baseline
  decoding loop decodes greedily, cut after EOS the same way."""
  config = tiny_config(V)
  params = t5_params(config, 11)
  vocabulary = seqio.PassThroughVocabulary(V, eos_id=EOS)
  model = models.EncoderDecoderModel(network.Transformer(config), vocabulary, vocabulary)
  encoder_tokens = jnp.array([[2, 3, 1, 0], [4, 1, 0, 0], [5, 5, 2, 1], [3, 1, 0, 0]], jnp.int32)
  batch = {"encoder_input_tokens": encoder_tokens, "decoder_input_tokens": jnp.zeros((4, 8), int)}
  expected, _ = model.jit_predict()(params, batch, jax.random.PRNGKey(0), 0.0)
  generated = jax.jit(
      lambda: distillation.generate(
          drafters.T5Drafter(config), params, encoder_tokens, 8, 0.0, jax.random.PRNGKey(5), EOS
      )
  )()
  np.testing.assert_array_equal(generated, expected)
  assert np.any(np.asarray(generated)[:, :-1] == EOS)  # some row is cut after its EOS.


def test_mixed_batches_pick_their_source_deterministically():
  keys = jax.vmap(lambda step: jax.random.fold_in(jax.random.PRNGKey(0), step))(jnp.arange(400))
  picks = jax.vmap(lambda key: distillation.picks_on_policy(key, 0.3))
  first = np.asarray(picks(keys))
  np.testing.assert_array_equal(first, np.asarray(picks(keys)))
  assert abs(first.mean() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 400), first.mean()
  for fraction in (0.0, 1.0):
    always = jax.vmap(lambda key, f=fraction: distillation.picks_on_policy(key, f))(keys)
    assert np.all(np.asarray(always) == bool(fraction))

  # A mixed batch is exactly the batch of the source it picked.
  target_config = tiny_config(V)
  target_params = t5_params(target_config, 1)
  drafter = drafters.T5Drafter(SMALL)
  params = t5_params(SMALL, 2)
  encoder_tokens = jnp.array([[2, 3, 1, 0], [4, 5, 3, 1]], jnp.int32)

  @jax.jit
  def sample(rng):
    encoded = distillation.target_encode(target_config, target_params, encoder_tokens)
    results = {}
    for data in ("mixed", "drafter", "target"):
      settings = distillation.Distillation("/runs/target/model", data=data)
      distiller = distillation.Distiller(settings, drafter, target_config, EOS)
      results[data] = distiller.sample_data(params, target_params, encoder_tokens, encoded, 6, rng)
    return results

  picked = []
  for seed in range(8):
    results = sample(jax.random.PRNGKey(seed))
    mixed, on_policy = results["mixed"]
    picked.append(bool(on_policy))
    np.testing.assert_array_equal(mixed, results["drafter" if on_policy else "target"][0])
  assert True in picked and False in picked, picked


# ----------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"target_dir": ""}, "target_dir is '': give the frozen target's checkpoints.save_model"),
        ({"target_dir": None}, "target_dir is None"),
        ({"divergence": "kl"}, r"divergence is 'kl': use one of \('forward_kl'"),
        ({"data": "teacher"}, r"data is 'teacher': use one of \('references'"),
        ({"data_temperature": -1.0}, "data_temperature is -1.0: give a temperature >= 0"),
        ({"data_temperature": float("nan")}, "data_temperature is nan: give a finite number"),
        ({"divergence_temperature": 0.0}, "divergence_temperature is 0.0: give tau > 0"),
        ({"divergence_temperature": "1"}, "divergence_temperature is '1': give a finite number"),
        ({"data": "mixed", "mix_fraction": 1.5}, r"mix_fraction is 1.5: give a probability in"),
        ({"mix_fraction": 0.2}, "mix_fraction is 0.2 but data is 'drafter'.*data='mixed' only"),
        (
            {"data": "references", "data_temperature": 0.0},
            "data_temperature is 0.0 but data is 'references': nothing is sampled",
        ),
        (
            {"divergence": "cross_entropy"},
            "divergence is 'cross_entropy' with data='drafter'.*zero expected gradient",
        ),
        (
            {"divergence": "cross_entropy", "data": "mixed"},
            "divergence is 'cross_entropy' with data='mixed'.*use data='target' or 'references'",
        ),
    ],
)
def test_bad_settings_name_the_problem_and_the_fix(changes, message):
  settings = {"target_dir": "/runs/target/model", **changes}
  with pytest.raises(gin_utils.ConfigError, match=f"Distillation.{message}"):
    distillation.Distillation(**settings)


def test_a_bfloat16_stored_target_is_restored_in_its_compute_dtype(tmp_path):
  """demo_models/target is stored in bfloat16 and computes in float32: the frozen target comes
  back in float32, with the stored values."""
  config = tiny_config(V)
  stored = jax.tree.map(lambda x: np.asarray(x, jnp.bfloat16), t5_params(config, 0))
  checkpoints.save_model(tmp_path / "target", stored, config)
  params, restored_config = distillation.Distillation(tmp_path / "target").restore_target()
  assert restored_config == config and config.dtype == "float32"
  for restored, original in zip(jax.tree.leaves(params), jax.tree.leaves(stored), strict=True):
    assert restored.dtype == np.float32
    np.testing.assert_array_equal(restored, np.asarray(original, np.float32))


def test_the_drafter_and_the_target_are_checked_before_anything_is_built(tmp_path):
  target_config = tiny_config(V)
  checkpoints.save_model(tmp_path / "target", t5_params(target_config, 0), target_config)
  settings = distillation.Distillation(tmp_path / "target")
  assert settings.target_dir == str(tmp_path / "target")
  shapes = {"encoder_input_tokens": (1, 4), "decoder_input_tokens": (1, 4)}
  check = lambda drafter, vocabulary_size=V: distillation.checked_drafter(
      settings, drafter, vocabulary_size, EOS, shapes
  )
  drafter, eos_id = check(drafters.T5Drafter(SMALL))
  assert drafter.eos_id == eos_id == EOS
  with pytest.raises(gin_utils.ConfigError, match="is not a directory written by save_model"):
    distillation.Distillation(str(tmp_path / "missing")).target_config()
  with pytest.raises(gin_utils.ConfigError, match="vocab_size 6 < the task vocabulary's 9"):
    check(drafters.T5Drafter(SMALL), vocabulary_size=9)
  with pytest.raises(gin_utils.ConfigError, match="drafter vocab_size 7 != target vocab_size 6"):
    check(drafters.T5Drafter(tiny_config(7)))
  with pytest.raises(gin_utils.ConfigError, match="PromptLookupDrafter has no checkpoint format"):
    check(table_drafters.PromptLookupDrafter())
  with pytest.raises(gin_utils.ConfigError, match="UnigramDrafter has no checkpoint format"):
    check(table_drafters.UnigramDrafter())
  with pytest.raises(gin_utils.ConfigError, match="has no parameters to distil"):
    distillation.check_trainable(table_drafters.PromptLookupDrafter(), {})
  with pytest.raises(gin_utils.ConfigError, match="non-floating array"):
    distillation.check_trainable(
        table_drafters.BigramDrafter(V), table_drafters.BigramDrafter(V).fit([], V)
    )


# ----------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------
HELD_OUT_PAIRS = [
    ("close window", "fenster schliessen"),
    ("new file", "neue datei"),
    ("save window", "fenster sichern"),
    ("open help", "hilfe offen"),
]


@pytest.fixture(scope="module")
def held_out_task(tmp_path_factory):
  """The demo task's pipeline on 8 training pairs and 4 held-out validation pairs, tokenized with
  seqio's 26-piece test model."""
  data_dir = tmp_path_factory.mktemp("corpus")
  for split, pairs in (("train", TRANSLATION_PAIRS), ("validation", HELD_OUT_PAIRS)):
    (data_dir / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in pairs))
  (data_dir / "test.tsv").write_text((data_dir / "validation.tsv").read_text())
  vocabulary = tasks.get_vocabulary(str(SEQIO_TEST_VOCABULARY))
  return tasks.register_demo_task(data_dir, vocabulary, "distillation_test")


def test_tvd_distillation_on_drafter_data_raises_alpha_on_held_out_inputs(held_out_task, tmp_path):
  """A tiny drafter distilled for 20 steps against a tiny random target (its output layer scaled
  up, so p is far from uniform) with TVD on its own samples: Table 3's alpha on the held-out
  inputs rises at T = 0 and T = 1; the run exports the drafter and records its settings."""
  target_config = tiny_config(26, num_decoder_layers=1)
  target_params = network.init_params(target_config, jax.random.PRNGKey(7))
  target_params["decoder"]["logits_dense"]["kernel"] *= 8.0
  checkpoints.save_model(tmp_path / "target", target_params, target_config)
  drafter_config = tiny_config(26, emb_dim=8, head_dim=4, mlp_dim=16, num_decoder_layers=1)
  settings = distillation.Distillation(tmp_path / "target", divergence="tvd", data="drafter")
  gin.clear_config()
  gin.bind_parameter("training.make_optimizer.learning_rate", 3e-2)
  gin.bind_parameter("training.make_optimizer.schedule", "constant")
  try:
    summary = training.train(
        tmp_path / "drafter",
        model_config=drafter_config,
        mixture_or_task_name=held_out_task,
        task_feature_lengths={"inputs": 24, "targets": 16},
        batch_size=4,
        num_steps=20,
        pack=False,
        eval_period=20,
        eval_examples=4,
        checkpoint_period=20,
        log_period=5,
        distillation=settings,
        eval_before_training=True,
        progress=False,
    )
  finally:
    gin.clear_config()
  before, after = [h for h in summary["history"] if "alpha_t1" in h]
  assert (before["step"], after["step"]) == (0, 20)
  assert after["alpha_t1"] > before["alpha_t1"] + 0.1, (before, after)
  assert after["alpha_t0"] > before["alpha_t0"] + 0.2, (before, after)
  assert after["eval_beta"] > before["eval_beta"] + 0.2, (before, after)
  assert after["eval_loss"] < before["eval_loss"]
  assert summary["distillation"] == {
      "target_dir": str(tmp_path / "target"),
      "divergence": "tvd",
      "data": "drafter",
      "data_temperature": 1.0,
      "divergence_temperature": 1.0,
      "mix_fraction": 0.5,
      "unroll_steps": 1,
      "step_decay": 0.8,
      "feature_loss_weight": 0.0,
      "feature_noise": 0.0,
  }
  assert summary["drafter"] == "T5Drafter" and summary["train"]["on_policy"] == 1.0
  _, config = checkpoints.restore_model(tmp_path / "drafter" / training.EXPORT_DIR)
  assert config == drafter_config  # T5Drafter.save_params wrote a checkpoints.save_model dir.


@pytest.mark.parametrize("name", distillation.DIVERGENCES)
@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_a_divergence_temperature_that_is_not_positive_and_finite_is_refused(name, temperature):
  """At temperature 0 every divergence was NaN (logits / 0); now each refuses it, by name."""
  logits = np.log(np.stack([P, Q]))
  with pytest.raises(
      ValueError, match=r"divergence temperature tau is .*: give a finite number > 0"
  ):
    divergence(name, logits, logits[::-1], targets=[2, 0], temperature=temperature)
  # A traced temperature is not checked; a positive one gives the values of the tests above.
  traced = jax.jit(
      lambda t: distillation.token_divergence(
          name, jnp.asarray(logits)[None], jnp.asarray(logits[::-1])[None], jnp.array([[2, 0]]), t
      )
  )(1.0)
  np.testing.assert_allclose(traced[0], divergence(name, logits, logits[::-1], [2, 0]), rtol=1e-6)
