"""Tests of speculative_t5x/training.py (and the shipped demo pair): a tiny model on a tiny corpus
learns, a resumed run equals an uninterrupted one, and demo_models/ decodes greedily the same with
and without speculation."""

import pathlib

import gin
import jax
import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import checkpoints
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import tasks
from speculative_t5x import training

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO_PAIR = REPO_ROOT / "demo_models"
TEST_VOCABULARY_PATH = (
    pathlib.Path(seqio.__file__).parent / "test_data" / "sentencepiece" / "sentencepiece.model"
)
TASK = "demo_ende_training_test"
LENGTHS = {"inputs": 24, "targets": 16}
PAIRS = [
    ("open file", "datei offen"),
    ("save file", "datei sichern"),
    ("close", "schliessen"),
    ("open window", "fenster offen"),
    ("quit", "beenden"),
    ("help", "hilfe"),
    ("new window", "neues fenster"),
    ("save as", "sichern als"),
]
TINY = tiny_config(26, num_decoder_layers=1)


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
  """The demo task's pipeline on an 8-pair corpus, tokenized with seqio's 26-piece test model."""
  data_dir = tmp_path_factory.mktemp("corpus")
  for split in tasks.DEMO_SPLITS:
    (data_dir / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in PAIRS))
  return tasks.register_demo_task(data_dir, tasks.get_vocabulary(str(TEST_VOCABULARY_PATH)), TASK)


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


def test_distillation_trains_on_the_teachers_greedy_decodes(tiny_task, tmp_path):
  teacher_dir = tmp_path / "teacher" / training.EXPORT_DIR
  teacher_params = network.init_params(TINY, jax.random.PRNGKey(7))
  checkpoints.save_model(teacher_dir, teacher_params, TINY)
  vocabulary = tasks.get_vocabulary(str(TEST_VOCABULARY_PATH))
  relabel = training.make_teacher_targets(teacher_dir, vocabulary, temperature=0.0, seed=0)
  batch = training.eval_set(tiny_task, "train", LENGTHS, batch_size=4).batches[0]
  relabeled = relabel(batch, 0)
  teacher = models.EncoderDecoderModel(network.Transformer(TINY), vocabulary, vocabulary)
  expected, _ = teacher.jit_predict()(teacher_params, batch, jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(relabeled["decoder_target_tokens"], expected)
  np.testing.assert_array_equal(relabeled["decoder_input_tokens"][:, 1:], expected[:, :-1])
  np.testing.assert_array_equal(relabeled["decoder_input_tokens"][:, 0], 0)
  np.testing.assert_array_equal(relabeled["encoder_input_tokens"], batch["encoder_input_tokens"])

  with pytest.raises(ValueError, match="training.train.pack = False"):
    run(tmp_path / "packed", 1, distill_from=str(teacher_dir))
  distilled = run(tmp_path / "student", 2, pack=False, distill_from=str(teacher_dir))
  assert distilled["steps"] == 2 and distilled["distill_from"] == str(teacher_dir)
  assert np.isfinite(distilled["train"]["loss"])


def test_make_optimizer_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
    training.make_optimizer(10, name="sgd")
  with pytest.raises(ValueError, match="unknown learning-rate schedule"):
    training.make_optimizer(10, schedule="linear")


def test_demo_pair_greedy_speculative_equals_baseline():
  (target_params, target_config), (drafter_params, drafter_config) = checkpoints.restore_pair(
      DEMO_PAIR
  )
  assert target_config.vocab_size == drafter_config.vocab_size
  vocabulary = tasks.get_vocabulary(str(DEMO_PAIR / tasks.DEMO_VOCABULARY_FILE))
  sentences = ["Open file", "The file could not be saved.", "Show hidden files", "Invalid argument"]
  inputs = np.zeros((len(sentences), 48), np.int32)
  for i, sentence in enumerate(sentences):
    ids = list(vocabulary.encode(tasks.TRANSLATE_EN_DE_PREFIX + sentence)) + [vocabulary.eos_id]
    inputs[i, : len(ids)] = ids
  batch = {"encoder_input_tokens": inputs, "decoder_input_tokens": np.zeros((4, 32), np.int32)}
  target = network.Transformer(target_config)
  baseline = models.EncoderDecoderModel(target, vocabulary, vocabulary).jit_predict()
  expected, _ = baseline(target_params, batch, jax.random.PRNGKey(0), 0.0)
  speculative = models.SpeculativeEncoderDecoderModel(
      target, network.Transformer(drafter_config), vocabulary, vocabulary, gamma=4
  ).jit_predict()
  params = {"target": target_params, "drafter": drafter_params}
  decodes, aux = speculative(params, batch, jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(decodes, expected)
  texts = training.detokenize(vocabulary, decodes, vocabulary.eos_id)
  assert all(texts), texts  # a trained target translates every sentence into something.
  assert np.all(np.asarray(aux["speculative_stats"]["accepted_tokens"]) > 0)
