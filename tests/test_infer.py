"""Inference end to end (speculative_t5x/inference.py and scripts/infer.py) with tiny random models,
on TFDS mock data and seqio's 26-piece test vocabulary.

The library runs in this process; the script runs once in a subprocess, as users run it (importing
it here would register its absl flags beside those of other scripts), on a demo_ende corpus written
here, since TFDS mocking does not reach a subprocess.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import gin
import jax
import pytest
import seqio
import tensorflow_datasets as tfds

from speculative_t5x import checkpoints
from speculative_t5x import inference
from speculative_t5x import network
from speculative_t5x import tasks

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TEST_VOCABULARY = (pathlib.Path(seqio.__file__).parent / "test_data" / "sentencepiece" /
                   "sentencepiece.model")
SUFFIX = "_infer_test"
VOCAB_SIZE = 32  # covers the 26 pieces; ids 26..31 decode as UNK.
LENGTHS = {"inputs": 16, "targets": 8}
TINY = network.T5Config(vocab_size=VOCAB_SIZE, emb_dim=8, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, head_dim=4, mlp_dim=16,
                        mlp_activations=("gelu", "linear"), dropout_rate=0.0)
STAT_KEYS = {"target_calls", "drafter_calls", "accepted_tokens", "drafted_tokens", "beta_sum",
             "beta_count"}


@pytest.fixture(scope="module")
def wmt_task():
  """WMT En-De with the test vocabulary, reading 5 TFDS mock examples a split."""
  wmt, _ = tasks.register_tasks(tasks.get_vocabulary(str(TEST_VOCABULARY)), suffix=SUFFIX)
  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=5):
    yield wmt


def _config(output_dir, task, **overrides):
  fields = dict(mixture_or_task_name=task, task_feature_lengths=LENGTHS,
                output_dir=str(output_dir), target_config=TINY, checkpoint_path=None,
                drafter_config=TINY, random_init_seed=0, restore_dtype="float32", batch_size=2,
                gamma=3)
  return inference.InferConfig(**{**fields, **overrides})


def _lines(output_dir):
  return [json.loads(line) for line in
          (pathlib.Path(output_dir) / inference.PREDICTIONS_FILE).read_text().splitlines()]


def test_speculative_and_baseline_greedy_predictions_are_identical(tmp_path, wmt_task):
  # The baseline reads the target from a checkpoint of the weights the speculative run draws
  # from RANDOM_INIT_SEED=0, so it also covers the project's own orbax directories.
  checkpoints.save_model(tmp_path / "target", network.init_params(TINY, jax.random.PRNGKey(0)),
                         TINY)
  runs = {
      "speculative": _config(tmp_path / "speculative", wmt_task),
      "baseline": _config(tmp_path / "baseline", wmt_task, decoder="baseline",
                          checkpoint_path=str(tmp_path / "target"), random_init_seed=None),
  }
  results = {name: inference.infer(config) for name, config in runs.items()}
  lines = {name: _lines(config.output_dir) for name, config in runs.items()}

  assert [line["prediction"] for line in lines["speculative"]] == [
      line["prediction"] for line in lines["baseline"]]
  truncated = tasks.count_truncated(wmt_task, "test", LENGTHS)
  for name, result in results.items():
    assert result == json.loads((tmp_path / name / inference.METRICS_FILE).read_text())
    assert result["examples"] == len(lines[name]) == 5
    assert set(result["metrics"]) == {"bleu"}
    assert result["truncated"] == {"examples": 5, **truncated.truncated}
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["metrics.json",
                                                                   "predictions.jsonl"]
  assert results["baseline"]["weights"] == {"target": f"checkpoint {tmp_path / 'target'}"}
  assert not results["baseline"]["random_weights"] and results["speculative"]["random_weights"]
  assert results["speculative"]["weights"]["drafter"].startswith("RANDOM weights")

  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=5):
    examples = list(tasks.get_task(wmt_task).get_dataset(
        None, split="test", shuffle=False, try_in_mem_cache=False).as_numpy_iterator())
  for line, example in zip(lines["speculative"], examples):
    assert line["inputs"] == example["inputs_pretokenized"].decode()
    assert line["targets"] == example["targets_pretokenized"].decode()
    assert set(line["stats"]) == STAT_KEYS
    assert line["stats"]["beta_count"] <= line["stats"]["drafted_tokens"]
  speculative = results["speculative"]["decoding"]
  assert speculative["target_calls"] == sum(line["stats"]["target_calls"]
                                            for line in lines["speculative"])
  assert 0 <= speculative["alpha"] <= 1 and speculative["tokens_per_target_call"] >= 1
  # The baseline calls the target once per generated token.
  assert [set(line["stats"]) for line in lines["baseline"]] == [{"target_calls"}] * 5
  assert all(1 <= line["stats"]["target_calls"] <= LENGTHS["targets"]
             for line in lines["baseline"])


def test_an_interrupted_write_leaves_no_file(tmp_path):
  path = tmp_path / "predictions.jsonl"
  with pytest.raises(KeyboardInterrupt):
    with inference.atomic_writer(path) as f:
      f.write("{half")
      raise KeyboardInterrupt
  assert list(tmp_path.iterdir()) == []
  with inference.atomic_writer(path) as f:
    f.write("done\n")
  assert path.read_text() == "done\n" and list(tmp_path.iterdir()) == [path]


def test_unknown_task_names_close_matches(tmp_path, wmt_task):
  with pytest.raises(inference.ConfigError, match=r"MIXTURE_OR_TASK_NAME: unknown task or mixture "
                     r"'wmt_t2t_ende_v03'.*did you mean 'wmt_t2t_ende_v003'"):
    inference.infer(_config(tmp_path, "wmt_t2t_ende_v03"))
  with pytest.raises(inference.ConfigError, match="SPLIT 'dev' is not a split"):
    inference.get_task(_config(tmp_path, "demo_ende", split="dev"))
  with pytest.raises(inference.ConfigError, match="vocab_size 16 < the 26 pieces"):
    inference.get_task(_config(tmp_path, wmt_task, target_config=TINY.replace(vocab_size=16),
                               drafter_config=TINY.replace(vocab_size=16)))
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides, message", [
    ({"checkpoint_path": None, "random_init_seed": None}, "CHECKPOINT_PATH and "
     "DRAFTER_CHECKPOINT_PATH not set"),
    ({"drafter_config": None}, "needs DRAFTER_CONFIG"),
    ({"drafter_config": TINY.replace(vocab_size=64)}, "DRAFTER_CONFIG vocab_size 64 != "
     "TARGET_CONFIG vocab_size 32"),
    ({"decoder": "beam"}, "DECODER 'beam'"),
    ({"drafter_kind": "trigram"}, "DRAFTER_KIND 'trigram'"),
    ({"task_feature_lengths": {"inputs": 16}}, "exactly 'inputs' and 'targets'"),
    ({"gamma": 0}, "GAMMA must be an integer >= 1"),
])
def test_bad_settings_name_the_macro(tmp_path, overrides, message):
  with pytest.raises(inference.ConfigError, match=message):
    _config(tmp_path, "wmt_t2t_ende_v003", **overrides)


def test_baseline_needs_no_drafter(tmp_path):
  config = _config(tmp_path, "wmt_t2t_ende_v003", decoder="baseline", drafter_config=None,
                   checkpoint_path="gs://bucket/checkpoint_1", random_init_seed=None)
  assert not config.uses_t5_drafter


def test_infer_gin_binds_macros_and_names_missing_ones():
  files = ["configs/runs/infer.gin", "configs/models/t5_1_1_tiny.gin",
           "configs/tasks/wmt_ende.gin"]
  bindings = ["TARGET_CONFIG = %T5_1_1_TINY", "CHECKPOINT_PATH = None", "RANDOM_INIT_SEED = 3",
              "DRAFTER_CONFIG = %T5_1_1_TINY", "DRAFTER_CHECKPOINT_PATH = None", "GAMMA = 5",
              "TEMPERATURE = 1.0"]
  gin.clear_config()
  try:
    with pytest.raises(inference.ConfigError, match=r"gin macro\(s\) INFER_OUTPUT_DIR are "
                       r"%gin.REQUIRED but not set: bind them, e.g. --gin.INFER_OUTPUT_DIR="):
      inference.parse_gin(files, bindings)
    # Parsed without parse_gin's check, the unset macro still stops InferConfig.
    with pytest.raises(inference.ConfigError, match=r"\['output_dir'\] are %gin.REQUIRED"):
      inference.InferConfig()
    gin.clear_config()
    config = inference.parse_gin(files, bindings + ["INFER_OUTPUT_DIR = '/tmp/out'"])
  finally:
    gin.clear_config()
  assert (config.mixture_or_task_name, config.output_dir, config.gamma, config.temperature,
          config.random_init_seed, config.restore_dtype, config.split, config.decoder) == (
              "wmt_t2t_ende_v003", "/tmp/out", 5, 1.0, 3, "bfloat16", "test", "speculative")
  assert config.target_config.emb_dim == 8 and config.task_feature_lengths == {"inputs": 64,
                                                                                 "targets": 64}


def test_rewrite_gin_args():
  assert inference.rewrite_gin_args(["infer.py", "--gin.GAMMA=3", "--gin_file=a.gin"]) == [
      "infer.py", "--gin_bindings=GAMMA = 3", "--gin_file=a.gin"]
  with pytest.raises(inference.ConfigError, match="--gin.GAMMA has no value"):
    inference.rewrite_gin_args(["--gin.GAMMA"])


def _start_script(*flags, env=None) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "infer.py"), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu",
                                   **(env or {})))


def test_script_writes_outputs_and_stops_on_configuration_errors(tmp_path):
  # Both runs at once: most of each is importing jax, TensorFlow and seqio.
  bad = tmp_path / "bad"
  bad_run = _start_script(
      "--gin_file=configs/runs/infer.gin", "--gin_file=configs/tasks/wmt_ende.gin",
      "--gin_file=configs/models/t5_1_1_tiny.gin", "--gin.TARGET_CONFIG=%T5_1_1_TINY",
      "--gin.DRAFTER_CONFIG=%T5_1_1_TINY", "--gin.CHECKPOINT_PATH=None",
      "--gin.DRAFTER_CHECKPOINT_PATH=None", "--gin.RANDOM_INIT_SEED=0",
      "--gin.MIXTURE_OR_TASK_NAME='wmt_ende'", f"--gin.INFER_OUTPUT_DIR='{bad}'")
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  pairs = [("Open file", "Datei öffnen"), ("Close", "Schließen"), ("Save", "Speichern")]
  for split in tasks.DEMO_SPLITS:
    (corpus / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in pairs))
  shutil.copy(TEST_VOCABULARY, corpus / tasks.DEMO_VOCABULARY_FILE)
  out = tmp_path / "out"
  run = _start_script(
      "--gin_file=configs/runs/infer.gin", "--gin_file=configs/models/t5_1_1_tiny.gin",
      "--gin_file=configs/tasks/demo_ende.gin", "--gin.TARGET_CONFIG=%T5_1_1_TINY",
      "--gin.DRAFTER_CONFIG=None", "--gin.DRAFTER_CHECKPOINT_PATH=None",
      f"--gin.VOCAB_SIZE={VOCAB_SIZE}", "--gin.CHECKPOINT_PATH=None", "--gin.RANDOM_INIT_SEED=0",
      "--gin.RESTORE_DTYPE='float32'", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
      "--gin.BATCH_SIZE=2", "--gin.DRAFTER_KIND='unigram'", "--gin.TEMPERATURE=1.0",
      f"--gin.INFER_OUTPUT_DIR='{out}'", env={tasks.DEMO_DATA_ENV: str(corpus)})
  _, stderr = run.communicate(timeout=300)
  assert run.returncode == 0, stderr
  assert sorted(p.name for p in out.iterdir()) == ["config.gin", "metrics.json",
                                                   "predictions.jsonl"]
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["examples"] == 3 and "bleu" in metrics["metrics"]
  assert metrics["weights"] == {
      "target": "RANDOM weights (RANDOM_INIT_SEED=0), not a trained model",
      "drafter": "unigram table fit on 3 train targets"}
  assert metrics["random_weights"] and metrics["settings"]["temperature"] == 1.0
  assert [line["targets"] for line in _lines(out)] == [de for _, de in pairs]
  assert all(set(line["stats"]) == STAT_KEYS for line in _lines(out))
  assert "DRAFTER_KIND = 'unigram'" in (out / "config.gin").read_text()

  _, stderr = bad_run.communicate(timeout=300)
  assert bad_run.returncode == 1
  assert stderr.strip().splitlines()[-1].startswith(
      "infer.py: configuration error: MIXTURE_OR_TASK_NAME: unknown task or mixture 'wmt_ende'")
  assert not bad.exists()
