"""Inference end to end (speculative_t5x/running/inference.py and scripts/infer.py) with tiny random models,
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
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow_datasets as tfds

from conftest import tiny_config
from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import table_drafters
from speculative_t5x.measuring import auto_shape
from speculative_t5x.measuring import stopwatch
from speculative_t5x.running import inference
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TEST_VOCABULARY = (
    pathlib.Path(seqio.__file__).parent / "test_data" / "sentencepiece" / "sentencepiece.model"
)
SUFFIX = "_infer_test"
VOCAB_SIZE = 32  # covers the 26 pieces; ids 26..31 decode as UNK.
LENGTHS = {"inputs": 16, "targets": 8}
TINY = tiny_config(VOCAB_SIZE, emb_dim=8, head_dim=4, mlp_dim=16, num_decoder_layers=1)
STAT_KEYS = {
    "target_calls",
    "drafter_calls",
    "accepted_tokens",
    "drafted_tokens",
    "beta_sum",
    "beta_count",
}


@pytest.fixture(scope="module")
def wmt_task():
  """WMT En-De with the test vocabulary, reading 5 TFDS mock examples a split."""
  wmt, _ = tasks.register_tasks(tasks.get_vocabulary(str(TEST_VOCABULARY)), suffix=SUFFIX)
  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=5):
    yield wmt


def _pair(**overrides):
  fields = dict(
      target_config=TINY,
      drafter=drafters.T5Drafter(TINY),
      checkpoint_path=None,
      random_init_seed=0,
      restore_dtype="float32",
  )
  return pairs.PairConfig(**{**fields, **overrides})


def _config(output_dir, task, pair=None, **overrides):
  fields = dict(
      mixture_or_task_name=task,
      task_feature_lengths=LENGTHS,
      output_dir=str(output_dir),
      pair=pair or _pair(),
      batch_size=2,
      gamma=3,
  )
  return inference.InferConfig(**{**fields, **overrides})


def _lines(output_dir):
  return [
      json.loads(line)
      for line in (pathlib.Path(output_dir) / inference.PREDICTIONS_FILE).read_text().splitlines()
  ]


def _fixed_costs(self, *args):
  """Auto.measure's result without timing (a tiny network's steps drown in a loaded suite's
  noise; tests/test_auto_shape.py times real ones): verifying 2 and 3 tokens 1.2 and 1.3 target
  steps, a draft 0.1."""
  del self, args
  ms = lambda value: stopwatch.Timing(value, value, value, 0.0, 3)  # noqa: E731
  return auto_shape.Costs(ms(1.0), {1: ms(1.2), 2: ms(1.3)}, 2, iteration=ms(1.5)), 0.0, 0.0, 3


def test_speculative_and_baseline_greedy_predictions_are_identical(tmp_path, wmt_task, monkeypatch):
  # The baseline reads the target from a checkpoint of the weights the speculative run draws
  # from RANDOM_INIT_SEED=0, so it also covers the project's own orbax directories. Its pair keeps
  # a drafter, which the baseline must neither load nor fit.
  checkpoints.save_model(
      tmp_path / "target", network.init_params(TINY, jax.random.PRNGKey(0)), TINY
  )
  runs = {
      "speculative": _config(tmp_path / "speculative", wmt_task),
      "baseline": _config(
          tmp_path / "baseline",
          wmt_task,
          decoder="baseline",
          pair=_pair(
              drafter=table_drafters.BigramDrafter(),
              checkpoint_path=str(tmp_path / "target"),
              random_init_seed=None,
          ),
      ),
  }
  # The draft shape chosen on this machine (GAMMA 'auto', chains of 1-2 drafts): whatever it
  # chooses, the greedy output is the baseline's.
  monkeypatch.setattr(auto_shape.Auto, "measure", _fixed_costs)
  runs["auto"] = _config(
      tmp_path / "auto", wmt_task, gamma="auto", auto=auto_shape.Auto(max_gamma=2, budget_s=0)
  )
  results = {name: inference.infer(config) for name, config in runs.items()}
  choice = results["auto"]["auto_shape"]
  assert [p["label"] for p in choice["predictions"]] == ["gamma 1", "gamma 2"]
  chosen = results["auto"]["settings"]["draft_shape"]
  assert (chosen is None) == (choice["chosen"]["shape"] is None)
  assert chosen is None or chosen == choice["chosen"]["shape"]
  assert results["speculative"]["auto_shape"] is None
  lines = {name: _lines(config.output_dir) for name, config in runs.items()}

  for name in ("speculative", "auto"):
    assert [line["prediction"] for line in lines[name]] == [
        line["prediction"] for line in lines["baseline"]
    ]
  truncated = tasks.count_truncated(wmt_task, "test", LENGTHS)
  for name, result in results.items():
    assert result == json.loads((tmp_path / name / inference.METRICS_FILE).read_text())
    assert result["examples"] == len(lines[name]) == 5
    assert set(result["metrics"]) == {"bleu"}
    assert result["truncated"] == {"examples": 5, **truncated.truncated}
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == [
        "metrics.json",
        "predictions.jsonl",
    ]
  assert results["baseline"]["weights"] == {"target": f"checkpoint {tmp_path / 'target'}"}
  assert not results["baseline"]["random_weights"] and results["speculative"]["random_weights"]
  assert results["speculative"]["weights"] == {
      "target": "RANDOM weights (seed 0), not a trained model",
      "drafter": "RANDOM weights (seed 1), not a trained model",
  }
  settings = {name: result["settings"] for name, result in results.items()}
  assert (settings["speculative"]["drafter"], settings["speculative"]["gamma"]) == ("T5Drafter", 3)
  assert settings["speculative"]["drafter_repr"] == repr(drafters.T5Drafter(TINY, eos_id=1))
  assert (
      settings["baseline"]["drafter"],
      settings["baseline"]["drafter_repr"],
      settings["baseline"]["gamma"],
  ) == (None, None, None)

  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=5):
    examples = list(
        tasks.get_task(wmt_task)
        .get_dataset(None, split="test", shuffle=False, try_in_mem_cache=False)
        .as_numpy_iterator()
    )
  for line, example in zip(lines["speculative"], examples):
    assert line["inputs"] == example["inputs_pretokenized"].decode()
    assert line["targets"] == example["targets_pretokenized"].decode()
    assert set(line["stats"]) == STAT_KEYS
    assert line["stats"]["beta_count"] <= line["stats"]["drafted_tokens"]
  speculative = results["speculative"]["decoding"]
  assert speculative["target_calls"] == sum(
      line["stats"]["target_calls"] for line in lines["speculative"]
  )
  assert 0 <= speculative["alpha"] <= 1 and speculative["tokens_per_target_call"] >= 1
  # The baseline calls the target once per generated token.
  assert [set(line["stats"]) for line in lines["baseline"]] == [{"target_calls"}] * 5
  assert all(1 <= line["stats"]["target_calls"] <= LENGTHS["targets"] for line in lines["baseline"])


def test_an_example_decodes_the_same_in_any_batch_and_row(tmp_path, wmt_task):
  # Each example's random stream is fold_in(PRNGKey(decode_seed), its index in the split): at
  # T = 1, batches of 2 (rows 0-1, 2-3, 4 and padding) and of 3 (rows 0-2, 3-4 and padding) put
  # examples in other batches and rows, and must give the same tokens.
  runs = {
      batch_size: _config(
          tmp_path / f"b{batch_size}", wmt_task, batch_size=batch_size, temperature=1.0
      )
      for batch_size in (2, 3)
  }
  lines = {}
  for key, config in runs.items():
    inference.infer(config)
    lines[key] = _lines(config.output_dir)
  counts = {"target_calls", "drafter_calls", "drafted_tokens", "accepted_tokens", "beta_count"}

  def integers(run):
    return [(line["prediction"], {k: line["stats"][k] for k in counts}) for line in lines[run]]

  assert integers(2) == integers(3)
  # beta_sum adds float32 probabilities, rounded differently at another batch shape.
  assert [line["stats"]["beta_sum"] for line in lines[2]] == pytest.approx(
      [line["stats"]["beta_sum"] for line in lines[3]], rel=1e-5
  )


def test_the_per_example_keys_depend_on_the_seed_and_index_alone():
  keys = np.asarray(inference.example_keys(np.uint32(5), jnp.array([0, 3, -1, 3])))
  assert (keys[1] == keys[3]).all() and (keys[2] == keys[0]).all()  # padding rows reuse index 0
  expected = jax.random.fold_in(jax.random.PRNGKey(5), 3)
  assert (keys[1] == np.asarray(expected)).all()
  other_seed = np.asarray(inference.example_keys(np.uint32(6), jnp.array([0, 3, -1, 3])))
  assert not (other_seed[1] == keys[1]).all()


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
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"MIXTURE_OR_TASK_NAME: unknown task or "
      r"mixture 'wmt_t2t_ende_v03'.*did you mean 'wmt_t2t_ende_v003'",
  ):
    inference.infer(_config(tmp_path, "wmt_t2t_ende_v03"))
  with pytest.raises(gin_utils.ConfigError, match="SPLIT 'dev' is not a split"):
    inference.get_task(_config(tmp_path, "demo_ende", split="dev"))
  small = TINY.replace(vocab_size=16)
  with pytest.raises(
      gin_utils.ConfigError,
      match="TARGET_CONFIG vocab_size 16 < the 26 pieces "
      f"of {wmt_task}'s vocabulary: set VOCAB_SIZE to cover it",
  ):
    inference.get_task(
        _config(
            tmp_path, wmt_task, pair=_pair(target_config=small, drafter=drafters.T5Drafter(small))
        )
    )
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "pair_overrides, overrides, message",
    [
        (
            {"checkpoint_path": None, "random_init_seed": None},
            {},
            "CHECKPOINT_PATH and " "DRAFTER_CHECKPOINT_PATH not set",
        ),
        (
            {"drafter": None},
            {},
            "DECODER 'speculative' needs a DRAFTER: include a configs/drafters/ " "file",
        ),
        (
            {"drafter": drafters.T5Drafter(TINY.replace(vocab_size=64))},
            {},
            r"DRAFTER \(T5Drafter\) vocab_size 64 != TARGET_CONFIG vocab_size 32",
        ),
        ({"drafter": "trigram"}, {}, "DRAFTER must be a drafters.Drafter.*got 'trigram'"),
        ({}, {"pair": "ende_small"}, "InferConfig.pair must be a pairs.PairConfig"),
        ({}, {"decoder": "beam"}, "DECODER 'beam'"),
        ({}, {"task_feature_lengths": {"inputs": 16}}, "exactly 'inputs' and 'targets'"),
        ({}, {"gamma": 0}, "GAMMA must be an integer >= 1 or 'auto', got 0"),
        ({}, {"gamma": "two"}, "GAMMA must be an integer >= 1 or 'auto', got 'two'"),
        ({}, {"auto": auto_shape.Auto()}, "InferConfig.auto is set but GAMMA is 3: set GAMMA"),
        ({}, {"gamma": "auto", "auto": 4}, "InferConfig.auto must be an @auto_shape.Auto"),
        ({}, {"ngram_fit_examples": 0}, "ngram_fit_examples must be an integer >= 1"),
    ],
)
def test_bad_settings_name_the_macro(tmp_path, pair_overrides, overrides, message):
  with pytest.raises(gin_utils.ConfigError, match=message):
    fields = {"pair": _pair(**pair_overrides), **overrides}
    _config(tmp_path, "wmt_t2t_ende_v003", **fields)


def test_baseline_needs_no_drafter(tmp_path):
  target_alone = _pair(
      drafter=None, checkpoint_path="gs://bucket/checkpoint_1", random_init_seed=None
  )
  config = _config(tmp_path, "wmt_t2t_ende_v003", decoder="baseline", pair=target_alone)
  assert config.loaded_pair == config.pair
  with_drafter = _config(tmp_path, "wmt_t2t_ende_v003", decoder="baseline")
  assert with_drafter.pair.drafter is not None and with_drafter.loaded_pair.drafter is None
  assert with_drafter.loaded_pair.target_config == TINY


@pytest.fixture
def clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_infer_gin_binds_macros_and_names_missing_ones(clear_gin):
  files = [
      "configs/runs/infer.gin",
      "configs/drafters/t5.gin",
      "configs/models/t5_1_1_tiny.gin",
      "configs/tasks/wmt_ende.gin",
  ]
  bindings = [
      "TARGET_CONFIG = %T5_1_1_TINY",
      "CHECKPOINT_PATH = None",
      "RANDOM_INIT_SEED = 3",
      "DRAFTER_CONFIG = %T5_1_1_TINY",
      "DRAFTER_CHECKPOINT_PATH = None",
      "GAMMA = 5",
      "TEMPERATURE = 1.0",
  ]
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"gin macro\(s\) INFER_OUTPUT_DIR are "
      r"%gin.REQUIRED but not set: bind them, e.g. --gin.INFER_OUTPUT_DIR=",
  ):
    gin_utils.parse_gin_flags(files, bindings)
  # Parsed without parse_gin_flags's check, the unset macro still stops InferConfig.
  with pytest.raises(gin_utils.ConfigError, match=r"\['output_dir'\] are %gin.REQUIRED"):
    inference.InferConfig()
  gin.clear_config()
  gin_utils.parse_gin_flags(files, bindings + ["INFER_OUTPUT_DIR = '/tmp/out'"])
  config = inference.InferConfig()
  assert (
      config.mixture_or_task_name,
      config.output_dir,
      config.gamma,
      config.temperature,
      config.split,
      config.decoder,
  ) == ("wmt_t2t_ende_v003", "/tmp/out", 5, 1.0, "test", "speculative")
  pair = config.pair
  assert (
      pair.random_init_seed,
      pair.restore_dtype,
      pair.checkpoint_path,
      pair.drafter_checkpoint_path,
  ) == (3, "bfloat16", None, None)
  assert pair.target_config.emb_dim == 8 and config.task_feature_lengths == {
      "inputs": 64,
      "targets": 64,
  }
  assert isinstance(pair.drafter, drafters.T5Drafter) and pair.drafter.config.emb_dim == 8


_TINY_RUN = [
    "configs/runs/infer.gin",
    "configs/models/t5_1_1_tiny.gin",
    "configs/tasks/wmt_ende.gin",
]
_TINY_BINDINGS = [
    "TARGET_CONFIG = %T5_1_1_TINY",
    "CHECKPOINT_PATH = '/ckpt/target'",
    "INFER_OUTPUT_DIR = '/tmp/out'",
]


def test_a_baseline_run_needs_no_drafter_file(clear_gin):
  gin_utils.parse_gin_flags(_TINY_RUN + ["configs/runs/baseline.gin"], _TINY_BINDINGS)
  config = inference.InferConfig()
  assert (config.decoder, config.pair.drafter, config.pair.checkpoint_path) == (
      "baseline",
      None,
      "/ckpt/target",
  )
  gin.clear_config()
  with pytest.raises(
      gin_utils.ConfigError, match=r"gin macro\(s\) DRAFTER are %gin.REQUIRED.*" "configs/drafters/"
  ):
    gin_utils.parse_gin_flags(_TINY_RUN, _TINY_BINDINGS)
  gin.clear_config()
  gin_utils.parse_gin_flags(_TINY_RUN, _TINY_BINDINGS + ["DRAFTER = None"])
  with pytest.raises(gin_utils.ConfigError, match="DECODER 'speculative' needs a DRAFTER"):
    inference.InferConfig()


def test_baseline_gin_drops_the_drafter_of_a_run(clear_gin):
  """configs/runs/baseline.gin after a run with a T5 drafter: no drafter and no drafter
  checkpoint left to give."""
  gin_utils.parse_gin_flags(
      _TINY_RUN[:1] + ["configs/drafters/t5.gin"] + _TINY_RUN[1:] + ["configs/runs/baseline.gin"],
      _TINY_BINDINGS + ["DRAFTER_CONFIG = %T5_1_1_TINY"],
  )
  config = inference.InferConfig()
  assert (config.decoder, config.pair.drafter, config.pair.drafter_checkpoint_path) == (
      "baseline",
      None,
      None,
  )


def _start_script(*flags, env=None) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, str(REPO_ROOT / "scripts" / "infer.py"), *flags],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=REPO_ROOT,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu", **(env or {})),
  )


def test_script_writes_outputs_and_stops_on_configuration_errors(tmp_path):
  # Both runs at once: most of each is importing jax, TensorFlow and seqio.
  bad = tmp_path / "bad"
  bad_run = _start_script(
      "--gin_file=configs/runs/infer.gin",
      "--gin_file=configs/tasks/wmt_ende.gin",
      "--gin_file=configs/drafters/t5.gin",
      "--gin_file=configs/models/t5_1_1_tiny.gin",
      "--gin.TARGET_CONFIG=%T5_1_1_TINY",
      "--gin.DRAFTER_CONFIG=%T5_1_1_TINY",
      "--gin.CHECKPOINT_PATH=None",
      "--gin.DRAFTER_CHECKPOINT_PATH=None",
      "--gin.RANDOM_INIT_SEED=0",
      "--gin.MIXTURE_OR_TASK_NAME='wmt_ende'",
      f"--gin.INFER_OUTPUT_DIR='{bad}'",
  )
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  pairs = [("Open file", "Datei öffnen"), ("Close", "Schließen"), ("Save", "Speichern")]
  for split in demo_data.DEMO_SPLITS:
    (corpus / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in pairs))
  shutil.copy(TEST_VOCABULARY, corpus / demo_data.DEMO_VOCABULARY_FILE)
  out = tmp_path / "out"
  run = _start_script(
      "--gin_file=configs/runs/infer.gin",
      "--gin_file=configs/models/t5_1_1_tiny.gin",
      "--gin_file=configs/tasks/demo_ende.gin",
      "--gin_file=configs/drafters/unigram.gin",
      "--gin.TARGET_CONFIG=%T5_1_1_TINY",
      f"--gin.VOCAB_SIZE={VOCAB_SIZE}",
      "--gin.CHECKPOINT_PATH=None",
      "--gin.RANDOM_INIT_SEED=0",
      "--gin.RESTORE_DTYPE='float32'",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
      "--gin.BATCH_SIZE=2",
      "--gin.TEMPERATURE=1.0",
      f"--gin.INFER_OUTPUT_DIR='{out}'",
      # Bindings of what the run builds after its early check of unused bindings: the
      # partitioner, and the model with what its bindings name.
      "--gin.partitioning.Partitioner.num_partitions=1",
      "--gin.SpeculativeEncoderDecoderModel.draft_stop=@draft_length.ConfidenceStop()",
      "--gin.draft_length.ConfidenceStop.threshold=0.1",
      env={demo_data.DEMO_DATA_ENV: str(corpus)},
  )
  _, stderr = run.communicate(timeout=300)
  assert run.returncode == 0, stderr
  assert sorted(p.name for p in out.iterdir()) == [
      "config.gin",
      "metrics.json",
      "predictions.jsonl",
  ]
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["examples"] == 3 and "bleu" in metrics["metrics"]
  assert metrics["weights"] == {
      "target": "RANDOM weights (seed 0), not a trained model",
      "drafter": "UnigramDrafter fitted on 3 targets",
  }
  assert metrics["random_weights"] and metrics["settings"]["temperature"] == 1.0
  assert metrics["settings"]["drafter"] == "UnigramDrafter"
  assert metrics["settings"]["drafter_repr"] == repr(
      table_drafters.UnigramDrafter(vocab_size=VOCAB_SIZE, eos_id=1)
  )
  assert [line["targets"] for line in _lines(out)] == [de for _, de in pairs]
  assert all(set(line["stats"]) == STAT_KEYS for line in _lines(out))
  config = (out / "config.gin").read_text()
  assert "DRAFTER = @drafters.UnigramDrafter()" in config
  assert "ConfidenceStop.threshold = 0.1" in config

  _, stderr = bad_run.communicate(timeout=300)
  assert bad_run.returncode == 1
  assert (
      stderr.strip()
      .splitlines()[-1]
      .startswith(
          "infer.py: configuration error: MIXTURE_OR_TASK_NAME: unknown task or mixture 'wmt_ende'"
      )
  )
  assert not bad.exists()
