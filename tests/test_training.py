"""Tests of speculative_t5x/training/training.py (and the shipped demo pair): a tiny model on a tiny corpus
learns, a resumed run equals an uninterrupted one, a run starts from init_from, distill_from is the
cross-entropy distillation shorthand through the same loop, conflicting settings stop a run before
anything is built, and demo_models/ decodes greedily the same with and without speculation.
(speculative_t5x/training/distillation.py itself: tests/test_distillation.py.)"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from conftest import SEQIO_TEST_VOCABULARY, TRANSLATION_PAIRS, tiny_config
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks
from speculative_t5x.training import distillation
from speculative_t5x.training import training
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO_PAIR = REPO_ROOT / "demo_models"
TASK = "demo_ende_training_test"
LENGTHS = {"inputs": 24, "targets": 16}
TINY = tiny_config(26, num_decoder_layers=1)


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
  """The demo task's pipeline on an 8-pair corpus, tokenized with seqio's 26-piece test model."""
  data_dir = tmp_path_factory.mktemp("corpus")
  for split in demo_data.DEMO_SPLITS:
    (data_dir / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in TRANSLATION_PAIRS))
  return tasks.register_demo_task(data_dir, tasks.get_vocabulary(str(SEQIO_TEST_VOCABULARY)), TASK)


@pytest.fixture(autouse=True)
def tiny_optimizer():
  """A constant learning rate high enough for a tiny model to learn in a few steps; no other
  test's gin bindings."""
  gin.clear_config()
  gin.bind_parameter("training.make_optimizer.learning_rate", 3e-2)
  gin.bind_parameter("training.make_optimizer.schedule", "constant")
  yield
  gin.clear_config()


def run(model_dir, num_steps, **kwargs):
  settings = dict(
      model_config=TINY,
      mixture_or_task_name=TASK,
      task_feature_lengths=LENGTHS,
      batch_size=4,
      num_steps=num_steps,
      pack=True,
      eval_period=0,
      checkpoint_period=4,
      log_period=1,
      progress=False,
  )
  return training.train(model_dir, **dict(settings, **kwargs))


def test_training_lowers_the_loss_and_resumes_exactly(tiny_task, tmp_path):
  del tiny_task
  straight = run(tmp_path / "straight", 16, eval_period=16, eval_examples=4)
  losses = [h["train_loss"] for h in straight["history"] if "train_loss" in h]
  assert straight["steps"] == 16
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
  assert 0.0 <= straight["eval"]["bleu"] <= 100.0 and straight["eval"]["eval_loss"] > 0

  interrupted = tmp_path / "interrupted"
  assert run(interrupted, 8)["steps"] == 8
  resumed = run(interrupted, 16)
  assert resumed["steps"] == 16
  assert [h["step"] for h in resumed["history"]] == list(range(1, 17))
  manager = training.checkpoint_manager(interrupted)
  assert manager.latest_step() == 16
  manager.close()
  expected, _ = checkpoints.restore_model(tmp_path / "straight" / training.EXPORT_DIR)
  actual, config = checkpoints.restore_model(interrupted / training.EXPORT_DIR)
  assert config == TINY
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

  # init_from: a fresh run starts from the trained model (its first batch is straight's first).
  trained = tmp_path / "straight" / training.EXPORT_DIR
  continued = run(tmp_path / "continued", 1, init_from=trained)
  assert continued["init_from"] == str(trained)
  assert continued["history"][0]["train_loss"] < 0.8 * losses[0], (continued, losses)


def test_distill_from_is_the_distillation_shorthand_and_resumes_exactly(
    tiny_task, tmp_path, monkeypatch
):
  """--distill_from: Distillation(teacher, 'cross_entropy', data='target') at the teacher's
  temperature, through the shared loop; an interrupted run keeps its history up to its last
  checkpoint and resumes to the uninterrupted one."""
  del tiny_task
  teacher_dir = tmp_path / "teacher" / training.EXPORT_DIR
  checkpoints.save_model(teacher_dir, network.init_params(TINY, jax.random.PRNGKey(7)), TINY)
  with pytest.raises(ValueError, match="training.train.pack = False"):
    run(tmp_path / "packed", 1, distill_from=str(teacher_dir))
  distill = dict(pack=False, distill_from=str(teacher_dir), checkpoint_period=2)
  straight = run(tmp_path / "straight", 4, **distill)
  assert straight["steps"] == 4 and straight["drafter"] == "T5Drafter"
  assert straight["distillation"] == {
      "target_dir": str(teacher_dir),
      "divergence": "cross_entropy",
      "data": "target",
      "data_temperature": 0.0,
      "divergence_temperature": 1.0,
      "mix_fraction": 0.5,
      "unroll_steps": 1,
      "step_decay": 0.8,
      "feature_loss_weight": 0.0,
      "feature_noise": 0.0,
  }
  assert np.isfinite(straight["train"]["loss"]) and 0 <= straight["train"]["beta"] <= 1
  assert straight["train"]["on_policy"] == 0.0

  # A run killed before its step-4 checkpoint: it leaves checkpoint 2 and the summary written with
  # it (the history up to step 2), and no export.
  interrupted = tmp_path / "interrupted"
  save_state = training.save_state

  def killed_at_step_4(manager, state):
    if int(state.step) == 4:
      raise KeyboardInterrupt
    save_state(manager, state)

  monkeypatch.setattr(training, "save_state", killed_at_step_4)
  with pytest.raises(KeyboardInterrupt):
    run(interrupted, 4, **distill)
  monkeypatch.undo()
  left = json.loads((interrupted / training.SUMMARY_FILE).read_text())
  assert left["steps"] == 2 and [h["step"] for h in left["history"]] == [1, 2]
  assert not (interrupted / training.EXPORT_DIR).exists()
  resumed = run(interrupted, 4, **distill)
  assert [h["step"] for h in resumed["history"]] == [1, 2, 3, 4]
  assert resumed["history"][:2] == left["history"]
  expected, _ = checkpoints.restore_model(tmp_path / "straight" / training.EXPORT_DIR)
  actual, config = checkpoints.restore_model(interrupted / training.EXPORT_DIR)
  assert config == TINY
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_copy_source_drafter_starts_from_a_checkpoint_saved_without_it(tmp_path):
  """init_from a feature drafter saved without copy_source, trained on with it: the trainee
  restores the checkpoint's weights and adds the target's logits kernel as 'source_head'."""
  target_config = tiny_config(26, emb_dim=16, num_heads=2, head_dim=8, num_decoder_layers=1)
  target_params = network.init_params(target_config, jax.random.PRNGKey(0))
  checkpoints.save_model(tmp_path / "target", target_params, target_config)
  head = tiny_config(26, emb_dim=8, num_heads=1, head_dim=8, num_decoder_layers=1)
  plain = feature_drafter.FeatureDrafter(head, 16, tuple(range(2, 26, 2)))
  params = plain.init_from_target(plain.init_params(jax.random.PRNGKey(1), {}), target_params)
  checkpoints.save_drafter_params(plain, tmp_path / "plain", params)
  copying = dataclasses.replace(plain, copy_source=True)
  settings = distillation.Distillation(str(tmp_path / "target"), divergence="tvd", data="target")
  trainee = training.distillation_trainee(settings, copying, 1, LENGTHS, None)
  restored = trainee.restore_params(str(tmp_path / "plain"))
  kernel = target_params["decoder"]["logits_dense"]["kernel"]
  np.testing.assert_array_equal(restored.pop("source_head"), kernel)
  jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_train_refuses_conflicting_settings_before_building_anything(tiny_task, tmp_path):
  del tiny_task
  target = distillation.Distillation(tmp_path / "target")
  cases = [
      (
          dict(distill_from="/runs/target", distillation=target),
          "both distill_from and distillation",
      ),
      (dict(distill_temperature=1.0), "distill_temperature = 1.0 without distill_from"),
      (dict(drafter=drafters.T5Drafter(TINY)), "drafter is trained by distillation only"),
      (dict(model_config=None), "needs model_config"),
      (dict(distillation=target, pack=False, label_smoothing=0.1), "label_smoothing = 0.1"),
      (
          dict(distillation=target, pack=False, drafter=drafters.T5Drafter(tiny_config(26))),
          "both a drafter \\(T5Drafter\\) and a model_config it does not run",
      ),
      (dict(distillation=target, pack=False), "is not a directory written by save_model"),
  ]
  for settings, message in cases:
    with pytest.raises(gin_utils.ConfigError, match=message):
      run(tmp_path / "run", 1, **settings)
  assert not (tmp_path / "run").exists()


def test_make_optimizer_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
    training.make_optimizer(10, name="sgd")
  with pytest.raises(ValueError, match="unknown learning-rate schedule"):
    training.make_optimizer(10, schedule="linear")


def test_wsd_schedule_holds_the_peak_then_decays_linearly_to_zero():
  """Warmup 100, peak 1e-2, 3,000 cooldown steps ending at step 10,000: by hand, the rate is
  1e-2 * (s + 1) / 100 in warmup, 1e-2 until step 7,000, then 1e-2 * (10,000 - s) / 3,000."""
  rate = training.learning_rate_schedule(10_000, 1e-2, 100, "wsd", 3_000)
  for step, expected in [
      (0, 1e-4),
      (49, 5e-3),
      (99, 1e-2),
      (6_999, 1e-2),
      (7_000, 1e-2),
      (8_500, 5e-3),
      (9_700, 1e-3),
      (9_999, 1e-2 / 3_000),
      (10_000, 0.0),
  ]:
    np.testing.assert_allclose(float(rate(step)), expected, rtol=1e-5, atol=1e-12)


def test_make_optimizer_refuses_a_cooldown_it_would_not_run():
  cases = [
      (dict(schedule="constant", cooldown_steps=100), "cooldown_steps is 100 with schedule 'const"),
      (dict(schedule="wsd"), "cooldown_steps is 0 with schedule 'wsd'"),
      (dict(schedule="wsd", warmup_steps=10, cooldown_steps=95), "more than the 90 steps after"),
      (dict(schedule="wsd", cooldown_steps=-1), "cooldown_steps"),
  ]
  for settings, message in cases:
    with pytest.raises(gin_utils.ConfigError, match=message):
      training.make_optimizer(100, **settings)


def test_demo_pair_greedy_speculative_equals_baseline():
  """The shipped pair (stored in bfloat16, restored in the float32 it computes in), loaded as the
  scripts load it: a target and the drafter its config.json records (the shared-encoder
  drafter)."""
  vocabulary = tasks.get_vocabulary(str(DEMO_PAIR / demo_data.DEMO_VOCABULARY_FILE))
  pair = pairs.load_pair(pairs.PairConfig.from_pair_dir(DEMO_PAIR), vocabulary.eos_id)
  assert pair.config.restore_dtype == "float32"
  assert isinstance(pair.drafter, drafters.SharedEncoderDrafter)
  sentences = ["Open file", "The file could not be saved.", "Show hidden files", "Invalid argument"]
  inputs = np.zeros((len(sentences), 48), np.int32)
  for i, sentence in enumerate(sentences):
    ids = list(vocabulary.encode(demo_data.TRANSLATE_EN_DE_PREFIX + sentence)) + [vocabulary.eos_id]
    inputs[i, : len(ids)] = ids
  batch = {"encoder_input_tokens": inputs, "decoder_input_tokens": np.zeros((4, 32), np.int32)}
  target = network.Transformer(pair.target_config)
  baseline = models.EncoderDecoderModel(target, vocabulary, vocabulary).jit_predict()
  expected, _ = baseline(pair.target_params, batch, jax.random.PRNGKey(0), 0.0)
  speculative = models.SpeculativeEncoderDecoderModel(
      target, pair.drafter, vocabulary, vocabulary, gamma=4
  ).jit_predict()
  decodes, aux = speculative(pair.params, batch, jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(decodes, expected)
  texts = training.detokenize(vocabulary, decodes, vocabulary.eos_id)
  assert all(texts), texts  # a trained target translates every sentence into something.
  assert np.all(np.asarray(aux["speculative_stats"]["accepted_tokens"]) > 0)


class _Checked(Exception):
  """Raised by a test's on_checked to stop train right after its checks."""


def test_train_calls_on_checked_after_its_checks_and_before_any_work(tiny_task, tmp_path):
  del tiny_task
  calls = []

  def on_checked():
    calls.append((tmp_path / "run").exists())
    raise _Checked

  with pytest.raises(_Checked):
    run(tmp_path / "run", 1, on_checked=on_checked)
  assert calls == [False]  # nothing was built or written before it
  for settings in (dict(batch_size=0), dict(log_period=0), dict(mixture_or_task_name="no_task")):
    with pytest.raises(gin_utils.ConfigError):
      run(tmp_path / "run", 1, on_checked=on_checked, **settings)
  assert calls == [False] and not (tmp_path / "run").exists()


def test_a_train_script_run_that_fails_after_its_checks_writes_nothing(tmp_path):
  """config.gin is written with the run's outputs, not before the work: a run that passed its
  checks and failed after (here init_from is a directory but not a checkpoint, found only when it
  is read) leaves model_dir as it was, here absent (a refused run: tests/test_bad_inputs.py)."""
  model_dir = tmp_path / "run"
  result = subprocess.run(
      [
          sys.executable,
          str(REPO_ROOT / "scripts" / "train.py"),
          "--gin_file=configs/runs/train.gin",
          "--gin_file=configs/models/t5_1_1_tiny.gin",
          "--gin.MODEL_CONFIG=%T5_1_1_TINY",
          "--gin.training.train.eval_period=0",
          f"--gin.training.train.init_from='{REPO_ROOT / 'configs'}'",
          f"--model_dir={model_dir}",
      ],
      capture_output=True,
      text=True,
      cwd=REPO_ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      timeout=300,
  )
  assert result.returncode == 1 and "holds no checkpoint" in result.stderr, result.stderr[-2000:]
  assert not model_dir.exists()


def _recorded_run(model_dir, step, config=TINY, exported=True):
  """model_dir as a run of `config` at checkpoint `step` leaves it (the files resume reads)."""
  (model_dir / training.CHECKPOINTS_DIR / str(step)).mkdir(parents=True)
  summary = {"model_config": json.loads(checkpoints.config_to_json(config)), "steps": step}
  (model_dir / training.SUMMARY_FILE).write_text(json.dumps(summary))
  (model_dir / training.CONFIG_FILE).write_text("NUM_STEPS = 4\n")
  if exported:
    (model_dir / training.EXPORT_DIR).mkdir()
  return {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            dict(num_steps=2),
            r"training.train.num_steps \(NUM_STEPS\) = 2 is below step 4, the latest checkpoint "
            r"in .*: give NUM_STEPS >= 4 to resume that run \(NUM_STEPS = 4: it is complete\), or "
            "a new model_dir for a run of 2 steps",
        ),
        (
            dict(num_steps=8, model_config=dataclasses.replace(TINY, emb_dim=32)),
            r"holds a run of another model \(step 4\): emb_dim 16 vs 32 \(recorded in its "
            r"train_summary.json vs this run's\)",
        ),
    ],
    ids=["fewer steps than the checkpoint", "another emb_dim"],
)
def test_a_resume_that_does_not_fit_the_recorded_run_is_refused_before_writing(
    tiny_task, tmp_path, settings, message
):
  del tiny_task
  before = _recorded_run(tmp_path, 4)
  with pytest.raises(gin_utils.ConfigError, match=message):
    run(tmp_path, **settings)
  assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_checkpoints_without_a_summary_are_refused(tiny_task, tmp_path):
  del tiny_task
  (tmp_path / training.CHECKPOINTS_DIR / "4").mkdir(parents=True)
  with pytest.raises(gin_utils.ConfigError, match="holds checkpoints .* but no train_summary.json"):
    run(tmp_path, 8)


def test_a_rerun_of_a_complete_run_writes_nothing(tiny_task, tmp_path):
  del tiny_task
  before = _recorded_run(tmp_path, 4)
  summary = run(tmp_path, 4)
  assert summary["already_complete"] and summary["steps"] == 4
  assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_a_model_dir_that_cannot_be_written_is_refused(tiny_task, tmp_path):
  del tiny_task
  (tmp_path / "file").write_text("")
  with pytest.raises(
      gin_utils.ConfigError, match="model_dir .*/file/run is under .*file, which is a file"
  ):
    run(tmp_path / "file" / "run", 1)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(z_loss="x"), r"training.train.z_loss must be a finite number >= 0 .*got 'x' \(str\)"),
        (dict(label_smoothing=[1]), r"training.train.label_smoothing must be a finite number"),
        (dict(label_smoothing=1.5), r"label_smoothing must be .*<= 0.99 .*got 1.5"),
        (dict(distill_from=5), "training.train.distill_from must be a checkpoints.save_model"),
        (dict(task_feature_lengths=16), "training.train.task_feature_lengths must be a non-empty"),
    ],
)
def test_train_refuses_a_setting_of_another_type_before_building_anything(
    tiny_task, tmp_path, settings, message
):
  del tiny_task
  with pytest.raises(gin_utils.ConfigError, match=message):
    run(tmp_path / "run", 1, **settings)
  assert not (tmp_path / "run").exists()
