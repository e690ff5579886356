"""Loading a target and its drafter (speculative_t5x/weights/pairs.py): every drafter kind through the
one protocol (checkpoint, fitted, no weights, random with a seed), and configuration errors
raised before anything loads, naming the macro; a pair exported from training runs, and the greedy
check of a loaded pair against its target alone."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest
import seqio

from conftest import SMALL_CONFIG, assert_trees_equal, bf16, tiny_config
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import table_drafters
from speculative_t5x.text import demo_data
from speculative_t5x.training import training
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs
from speculative_t5x.weights import t5x_checkpoints

VOCAB = 13
EOS = 1
TARGET = tiny_config(VOCAB)
DRAFTER = tiny_config(VOCAB, emb_dim=8, head_dim=4, num_decoder_layers=1)
FIT_TARGETS = [np.array([5, 5, 7, EOS, 0, 0], np.int32), np.array([7, 9, EOS, 0, 0, 0], np.int32)]


def _leaves_equal(actual, expected, dtype):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    assert a.dtype == dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e).astype(dtype))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A pair written by pairs.save_pair -> (directory, target params, drafter params)."""
  directory = tmp_path_factory.mktemp("pair")
  target = network.init_params(TARGET, jax.random.PRNGKey(1))
  drafter = network.init_params(DRAFTER, jax.random.PRNGKey(2))
  pairs.save_pair(directory, target, TARGET, drafter, drafters.T5Drafter(DRAFTER))
  return directory, target, drafter


def _never():
  raise AssertionError("fit_targets was called for a drafter that is not fitted")


def test_t5_drafter_from_checkpoints(saved):
  directory, target, drafter = saved
  config = pairs.PairConfig(
      TARGET,
      drafters.T5Drafter(DRAFTER),
      str(directory / "target"),
      str(directory / "drafter"),
      restore_dtype="bfloat16",
  )
  pair = pairs.load_pair(config, EOS, fit_targets=_never)
  _leaves_equal(pair.params["target"], target, np.dtype("bfloat16"))
  _leaves_equal(pair.params["drafter"], drafter, np.dtype("bfloat16"))
  assert pair.params == {"target": pair.target_params, "drafter": pair.drafter_params}
  assert pair.sources == {
      "target": f"checkpoint {directory / 'target'}",
      "drafter": f"checkpoint {directory / 'drafter'}",
  }
  assert not pair.random_weights
  assert pair.drafter.config == DRAFTER and pair.drafter.eos_id == EOS
  assert pair.target_config == TARGET


def test_from_pair_dir(saved, tmp_path, monkeypatch):
  directory, target, drafter = saved
  monkeypatch.chdir(directory.parent)  # a relative directory resolves against the working one
  config = pairs.PairConfig.from_pair_dir(directory.name)
  assert (config.target_config, config.drafter.config) == (TARGET, DRAFTER)
  assert (config.checkpoint_path, config.drafter_checkpoint_path, config.restore_dtype) == (
      str(directory / "target"),
      str(directory / "drafter"),
      "float32",  # TARGET's compute dtype, read from target/config.json
  )
  pair = pairs.load_pair(config, EOS)
  _leaves_equal(pair.params["drafter"], drafter, np.dtype("float32"))
  assert pairs.PairConfig.from_pair_dir(directory, "bfloat16").restore_dtype == "bfloat16"
  (tmp_path / "lonely" / "target").mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="drafter does not exist: .*save_pair"):
    pairs.PairConfig.from_pair_dir(tmp_path / "lonely")


def test_a_pair_comes_back_exactly_with_every_config_field(tmp_path):
  """A drafter config unlike the target's in every kind of field (relu MLP, tied logits, another
  compute dtype): from_pair_dir gives back both configs, load_pair the parameters bit for bit."""
  drafter_config = DRAFTER.replace(
      mlp_activations=("relu",), logits_via_embedding=True, dtype="bfloat16"
  )
  target = jax.tree.map(np.asarray, network.init_params(TARGET, jax.random.PRNGKey(1)))
  drafter = jax.tree.map(np.asarray, network.init_params(drafter_config, jax.random.PRNGKey(2)))
  pairs.save_pair(tmp_path, target, TARGET, drafter, drafters.T5Drafter(drafter_config))
  config = pairs.PairConfig.from_pair_dir(tmp_path)
  assert (config.target_config, config.drafter.config) == (TARGET, drafter_config)
  pair = pairs.load_pair(config, EOS)
  _leaves_equal(pair.params["target"], target, np.dtype("float32"))
  _leaves_equal(pair.params["drafter"], drafter, np.dtype("float32"))


def test_from_pair_dir_restores_a_bfloat16_pair_in_its_compute_dtype(saved, tmp_path):
  """A pair stored in bfloat16 (as demo_models/ is) comes back in the float32 its configs
  compute in, not as stored."""
  _, target, drafter = saved
  target, drafter = jax.tree.map(lambda x: np.asarray(x, jax.numpy.bfloat16), (target, drafter))
  pairs.save_pair(tmp_path, target, TARGET, drafter, drafters.T5Drafter(DRAFTER))
  assert checkpoints.stored_dtypes(tmp_path / "target") == {"bfloat16"}
  pair = pairs.load_pair(pairs.PairConfig.from_pair_dir(tmp_path), EOS)
  for member in ("target", "drafter"):
    assert {x.dtype for x in jax.tree.leaves(pair.params[member])} == {np.dtype("float32")}


def test_shared_encoder_drafter_from_pair_dir(saved, tmp_path):
  """from_pair_dir gives back the drafter kind save_pair wrote (its config.json records it)."""
  directory, target, _ = saved
  drafter = drafters.SharedEncoderDrafter(DRAFTER, TARGET.emb_dim)
  params = drafter.init_params(jax.random.PRNGKey(3), {})
  pairs.save_pair(tmp_path, target, TARGET, params, drafter)
  config = pairs.PairConfig.from_pair_dir(tmp_path)
  assert type(config.drafter) is drafters.SharedEncoderDrafter  # pylint: disable=unidiomatic-typecheck
  assert (config.drafter.config, config.drafter.encoder_emb_dim) == (DRAFTER, TARGET.emb_dim)
  pair = pairs.load_pair(config, EOS)
  _leaves_equal(pair.params["drafter"], params, np.dtype("float32"))
  assert pair.drafter.eos_id == EOS and not pair.random_weights
  half = pairs.load_pair(pairs.PairConfig.from_pair_dir(tmp_path, "bfloat16"), EOS)
  _leaves_equal(half.params["drafter"], params, np.dtype("bfloat16"))


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda text: text[: len(text) // 2], ValueError, "is not valid JSON"),
        (
            lambda text: "[1, 2]",
            ValueError,
            "holds a JSON list, not the object of T5Config fields",
        ),
        (
            lambda text: text.replace('"shared_encoder"', '"medusa"'),
            ValueError,
            r"records a drafter of kind 'medusa', which no imported module reads \(known: .*"
            r"'shared_encoder'.*\): import the module that defines it",
        ),
        (
            lambda text: text.replace('"encoder_emb_dim": 16', '"encoder_emb_dim": "16"'),
            ValueError,
            r"(?s)drafter entry .* cannot be read \(SharedEncoderDrafter\.encoder_emb_dim must be "
            r"an integer >= 1, got '16'\..*\): save the drafter again",
        ),
        (
            lambda text: text.replace('"encoder_emb_dim": 16', '"encoder_emb_dim": 12'),
            gin_utils.ConfigError,
            r"DRAFTER \(SharedEncoderDrafter\) does not fit TARGET_CONFIG: .*its encoder_emb_dim "
            r"12 != the target's emb_dim 16",
        ),
        (
            lambda text: text.replace('"emb_dim": 8', '"emb_dim": 0'),
            ValueError,
            "emb_dim must be >= 1",
        ),
    ],
)
def test_a_damaged_or_mismatched_drafter_config_is_refused(saved, tmp_path, damage, error, message):
  _, target, _ = saved
  drafter = drafters.SharedEncoderDrafter(DRAFTER, TARGET.emb_dim)
  params = drafter.init_params(jax.random.PRNGKey(3), {})
  pairs.save_pair(tmp_path, target, TARGET, params, drafter)
  config_file = tmp_path / "drafter" / "config.json"
  config_file.write_text(damage(config_file.read_text()))
  with pytest.raises(error, match=message):
    pairs.load_pair(pairs.PairConfig.from_pair_dir(tmp_path), EOS)


def _with_feature_drafter(saved, directory, member):
  """The saved pair copied into `directory`, a FeatureDrafter of its target added as `member` ->
  (that drafter, its params)."""
  shutil.copytree(saved[0], directory, dirs_exist_ok=True)
  drafter = feature_drafter.FeatureDrafter(DRAFTER, TARGET.emb_dim, draft_vocab=(1, 5, 9))
  params = drafter.init_params(jax.random.PRNGKey(4), {})
  checkpoints.save_drafter_params(drafter, directory / member, params)
  return drafter, params


def test_from_pair_dir_reads_a_second_drafter_of_the_same_target(saved, tmp_path):
  """A directory may hold several drafters of one target (demo_models/ holds drafter/ and
  feature_drafter/): drafter_member picks one, of whatever kind its config.json records."""
  _, params = _with_feature_drafter(saved, tmp_path, "feature_drafter")
  config = pairs.PairConfig.from_pair_dir(tmp_path, drafter_member="feature_drafter")
  assert type(config.drafter) is feature_drafter.FeatureDrafter  # pylint: disable=unidiomatic-typecheck
  assert config.drafter.draft_vocab == (1, 5, 9)
  assert config.drafter_checkpoint_path == str(tmp_path / "feature_drafter")
  _leaves_equal(pairs.load_pair(config, EOS).params["drafter"], params, np.dtype("float32"))
  assert type(pairs.PairConfig.from_pair_dir(tmp_path).drafter) is drafters.T5Drafter  # pylint: disable=unidiomatic-typecheck
  with pytest.raises(FileNotFoundError, match="needs target/ and spare/"):
    pairs.PairConfig.from_pair_dir(tmp_path, drafter_member="spare")


def test_a_drafter_copying_its_source_restores_a_checkpoint_saved_without(saved, tmp_path):
  """`drafters.FeatureDrafter.copy_source = True` (gin) on a drafter trained without it: its
  checkpoint restores as that drafter's, plus the target's logits kernel as 'source_head'. One
  saved with it restores as saved."""
  plain, params = _with_feature_drafter(saved, tmp_path, "plain")
  target = saved[1]
  config = pairs.PairConfig.from_pair_dir(tmp_path, drafter_member="plain")
  copying = dataclasses.replace(plain, copy_source=True)
  loaded = pairs.load_pair(dataclasses.replace(config, drafter=copying), EOS)
  assert loaded.drafter.copy_source
  restored = dict(loaded.drafter_params)
  kernel = target["decoder"]["logits_dense"]["kernel"]
  np.testing.assert_array_equal(restored.pop("source_head"), kernel)
  _leaves_equal(restored, params, np.dtype("float32"))
  # Saved with it (another kernel than the target's): restored as saved.
  _, with_source = feature_drafter.copying_source(plain, params, target)
  with_source["source_head"] = with_source["source_head"] + 1.0
  checkpoints.save_drafter_params(copying, tmp_path / "copying", with_source)
  config = pairs.PairConfig.from_pair_dir(tmp_path, drafter_member="copying")
  assert config.drafter.copy_source
  _leaves_equal(pairs.load_pair(config, EOS).drafter_params, with_source, np.dtype("float32"))
  with pytest.raises(ValueError, match="needs the target's parameters"):
    checkpoints.restore_drafter_with_target(copying, tmp_path / "plain", None)


@pytest.mark.parametrize("kind", [table_drafters.UnigramDrafter, table_drafters.BigramDrafter])
def test_fitted_drafters(kind):
  calls = []

  def fit_targets():
    calls.append(1)
    return iter(FIT_TARGETS)

  config = pairs.PairConfig(TARGET, kind(), random_init_seed=0, restore_dtype="float32")
  pair = pairs.load_pair(config, EOS, fit_targets=fit_targets)
  assert calls == [1]
  assert (pair.drafter.vocab_size, pair.drafter.eos_id) == (VOCAB, EOS)  # the target's
  expected = kind.fit(FIT_TARGETS, VOCAB)
  assert set(pair.drafter_params) == set(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(np.asarray(pair.drafter_params[name]), value)
  assert pair.sources["drafter"] == f"{kind.__name__} fitted on 2 targets"
  assert pair.sources["target"] == "RANDOM weights (seed 0), not a trained model"

  with pytest.raises(
      gin_utils.ConfigError,
      match=f"the {kind.__name__} is fitted on target " "sequences, and this run has none",
  ):
    pairs.load_pair(config, EOS)
  with pytest.raises(
      gin_utils.ConfigError, match=f"no target sequences to fit the " f"{kind.__name__} on"
  ):
    pairs.load_pair(config, EOS, fit_targets=lambda: [])


def test_prompt_lookup_has_no_weights():
  config = pairs.PairConfig(TARGET, table_drafters.PromptLookupDrafter(ngram=3), random_init_seed=0)
  pair = pairs.load_pair(config, EOS, fit_targets=_never)
  assert pair.drafter_params == {}
  assert pair.sources["drafter"] == "PromptLookupDrafter (nothing to restore or fit)"
  assert (pair.drafter.vocab_size, pair.drafter.eos_id, pair.drafter.ngram) == (VOCAB, EOS, 3)


def test_random_weights_from_the_seed():
  config = pairs.PairConfig(
      TARGET, drafters.T5Drafter(DRAFTER), random_init_seed=3, restore_dtype=None
  )
  pair = pairs.load_pair(config, EOS, fit_targets=_never)
  _leaves_equal(
      pair.target_params, network.init_params(TARGET, jax.random.PRNGKey(3)), np.dtype("float32")
  )
  _leaves_equal(
      pair.drafter_params, network.init_params(DRAFTER, jax.random.PRNGKey(4)), np.dtype("float32")
  )
  assert pair.sources == {
      "target": "RANDOM weights (seed 3), not a trained model",
      "drafter": "RANDOM weights (seed 4), not a trained model",
  }
  assert pair.random_weights
  alone = pairs.load_pair(dataclasses.replace(config, drafter=None), EOS)
  assert alone.drafter is None and alone.params is alone.target_params
  assert set(alone.sources) == {"target"}


@pytest.mark.parametrize(
    "drafter, checkpoint, drafter_checkpoint, message",
    [
        (
            drafters.T5Drafter(DRAFTER),
            None,
            None,
            "CHECKPOINT_PATH and DRAFTER_CHECKPOINT_PATH not set",
        ),
        (drafters.T5Drafter(DRAFTER), "/ckpt/target", None, "^DRAFTER_CHECKPOINT_PATH not set"),
        (table_drafters.BigramDrafter(), None, None, "^CHECKPOINT_PATH not set"),
        (None, None, "/ckpt/drafter", "^CHECKPOINT_PATH not set"),
    ],
)
def test_a_missing_checkpoint_without_a_seed_names_the_macro(
    drafter, checkpoint, drafter_checkpoint, message
):
  with pytest.raises(gin_utils.ConfigError, match=message + r".*or set RANDOM_INIT_SEED"):
    pairs.PairConfig(TARGET, drafter, checkpoint, drafter_checkpoint)


def test_a_bigram_drafter_needs_no_checkpoint():
  config = pairs.PairConfig(TARGET, table_drafters.BigramDrafter(), "/ckpt/target")
  assert config.drafter_checkpoint_path is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"target_config": None}, "TARGET_CONFIG must be a network.T5Config"),
        (
            {"drafter": "bigram"},
            r"DRAFTER must be a drafters.Drafter, e.g. @drafters.T5Drafter\(\) "
            r"\(include a configs/drafters/ file\), got 'bigram'",
        ),
        (
            {"drafter": drafters.T5Drafter(tiny_config(64))},
            "DRAFTER \\(T5Drafter\\) vocab_size 64 "
            f"!= TARGET_CONFIG vocab_size {VOCAB}: speculative decoding needs one vocabulary",
        ),
        (
            {"drafter": table_drafters.BigramDrafter(vocab_size=99)},
            "DRAFTER \\(BigramDrafter\\) " f"vocab_size 99 != TARGET_CONFIG vocab_size {VOCAB}",
        ),
        (
            {"drafter": drafters.SharedEncoderDrafter(DRAFTER, 32)},
            r"DRAFTER \(SharedEncoderDrafter\) does not fit TARGET_CONFIG: SharedEncoderDrafter "
            r"cannot serve this target: its encoder_emb_dim 32 != the target's emb_dim 16: .* "
            "set encoder_emb_dim = 16",
        ),
    ],
)
def test_bad_settings_name_the_macro(fields, message):
  with pytest.raises(gin_utils.ConfigError, match=message):
    pairs.PairConfig(**{"target_config": TARGET, "random_init_seed": 0, **fields})


def test_load_errors_name_the_macro(saved, tmp_path):
  directory, _, _ = saved
  config = pairs.PairConfig(TARGET, table_drafters.BigramDrafter(eos_id=5), random_init_seed=0)
  with pytest.raises(
      gin_utils.ConfigError,
      match="DRAFTER: drafter eos_id 5 != the output " "vocabulary's eos_id 1",
  ):
    pairs.load_pair(config, EOS, fit_targets=lambda: FIT_TARGETS)
  wrong = pairs.PairConfig(
      tiny_config(VOCAB, emb_dim=32), checkpoint_path=str(directory / "target")
  )
  with pytest.raises(gin_utils.ConfigError, match=f"CHECKPOINT_PATH '{directory / 'target'}': "):
    pairs.load_pair(wrong, EOS)
  missing = pairs.PairConfig(
      TARGET, drafters.T5Drafter(DRAFTER), str(directory / "target"), str(tmp_path / "nowhere")
  )
  with pytest.raises(
      gin_utils.ConfigError, match=f"DRAFTER_CHECKPOINT_PATH " f"'{tmp_path / 'nowhere'}': "
  ):
    pairs.load_pair(missing, EOS)


def test_weights_holding_nan_or_inf_are_refused_naming_the_macro(tmp_path):
  target = jax.tree.map(np.array, network.init_params(TARGET, jax.random.PRNGKey(1)))
  drafter = jax.tree.map(np.array, network.init_params(DRAFTER, jax.random.PRNGKey(2)))
  drafter["decoder"]["logits_dense"]["kernel"][2, 4] = np.nan
  pairs.save_pair(tmp_path / "nan_drafter", target, TARGET, drafter, drafters.T5Drafter(DRAFTER))
  target["encoder"]["relpos_bias"]["rel_embedding"][1, 0] = np.inf
  pairs.save_pair(tmp_path / "inf_target", target, TARGET, drafter, drafters.T5Drafter(DRAFTER))
  for name, macro, parameter in (
      ("nan_drafter", "DRAFTER_CHECKPOINT_PATH", r"decoder/logits_dense/kernel \(8, 13\): 1 NaN"),
      (
          "inf_target",
          "CHECKPOINT_PATH",
          r"encoder/relpos_bias/rel_embedding \(2, 32\): 0 NaN and 1",
      ),
  ):
    member = "drafter" if macro.startswith("DRAFTER") else "target"
    with pytest.raises(
        gin_utils.ConfigError,
        match=rf"^{macro} '{tmp_path / name / member}': checkpoint .* holds NaN or inf in 1 "
        rf"parameter\(s\):\n  target/{parameter}",
    ) as info:
      pairs.load_pair(pairs.PairConfig.from_pair_dir(tmp_path / name), EOS)
    assert isinstance(info.value.__cause__, t5x_checkpoints.NonFiniteWeightsError)


def test_cast_changes_only_floating_leaves():
  tree = {"w": np.ones((2,), np.float32), "ids": np.arange(3, dtype=np.int32)}
  cast = pairs.cast(tree, "bfloat16")
  assert (cast["w"].dtype, cast["ids"].dtype) == (np.dtype("bfloat16"), np.dtype("int32"))
  assert pairs.cast(tree, None) is tree


@pytest.mark.parametrize(
    "dtype, problem",
    [
        ("int8", "is not a floating type"),
        ("int32", "is not a floating type"),
        ("nope", "is not a dtype"),
    ],
)
def test_a_restore_dtype_that_is_not_floating_is_refused_before_anything_is_read(
    dtype, problem, tmp_path
):
  """int8 or int32 would truncate every weight; an unknown name was numpy's TypeError. Every
  entry point that takes a dtype name refuses it first: the paths here do not exist."""
  fix = r": use 'float32' or 'bfloat16' \(or None to keep the stored dtypes\)"
  with pytest.raises(gin_utils.ConfigError, match=f"^RESTORE_DTYPE '{dtype}' {problem}{fix}"):
    pairs.PairConfig(TARGET, random_init_seed=0, restore_dtype=dtype)
  with pytest.raises(gin_utils.ConfigError, match=f"restore_dtype '{dtype}' {problem}{fix}"):
    pairs.PairConfig.from_pair_dir(tmp_path / "nowhere", restore_dtype=dtype)
  nowhere = tmp_path / "nowhere"
  for restore in (
      lambda: checkpoints.restore_params(TARGET, nowhere, dtype=dtype),
      lambda: checkpoints.restore_model(nowhere, dtype=dtype),
      lambda: t5x_checkpoints.load_t5x_checkpoint(nowhere, restore_dtype=dtype),
      lambda: pairs.cast({"w": np.ones(2, np.float32)}, dtype),
  ):
    with pytest.raises(ValueError, match=f"^restore dtype '{dtype}' {problem}{fix}"):
      restore()


def _run(directory, save, steps):
  """A scripts/train.py model dir: `save(export_dir)` writes its model, plus its summary."""
  save(directory / training.EXPORT_DIR)
  (directory / training.SUMMARY_FILE).write_text(json.dumps({"steps": steps}))
  return directory


@pytest.mark.parametrize(
    "drafter, storage_dtype",
    [
        (drafters.T5Drafter(DRAFTER), "float32"),
        (drafters.SharedEncoderDrafter(DRAFTER, TARGET.emb_dim), "bfloat16"),
    ],
)
def test_export_pair_writes_two_runs_as_a_pair_in_the_storage_dtype(
    saved, tmp_path, drafter, storage_dtype
):
  """Both drafter kinds, stored as float32 or at half the size; the configs keep their float32
  compute dtype, which from_pair_dir restores the stored values in."""
  _, target, _ = saved
  drafter_params = drafter.init_params(jax.random.PRNGKey(3), {})
  target_run = _run(tmp_path / "target_run", lambda d: checkpoints.save_model(d, target, TARGET), 7)
  drafter_run = _run(
      tmp_path / "drafter_run",
      lambda d: checkpoints.save_drafter_params(drafter, d, drafter_params),
      9,
  )
  pair_dir = tmp_path / "pair"
  training.export_pair(pair_dir, target_run, drafter_run, storage_dtype)
  assert {path.name for path in pair_dir.iterdir()} == {"target", "drafter", "sentencepiece.model"}
  vocabulary = (demo_data.demo_data_dir() / demo_data.DEMO_VOCABULARY_FILE).read_bytes()
  assert (pair_dir / demo_data.DEMO_VOCABULARY_FILE).read_bytes() == vocabulary
  for member, steps in zip(pairs.MEMBERS, (7, 9)):
    assert json.loads((pair_dir / member / training.SUMMARY_FILE).read_text()) == {"steps": steps}
    assert checkpoints.stored_dtypes(pair_dir / member) == {storage_dtype}
    assert json.loads((pair_dir / member / "config.json").read_text())["dtype"] == "float32"
  config = pairs.PairConfig.from_pair_dir(pair_dir)
  assert type(config.drafter) is type(drafter)  # pylint: disable=unidiomatic-typecheck
  pair = pairs.load_pair(config, EOS)
  stored = pairs.cast((target, drafter_params), storage_dtype)
  _leaves_equal(pair.target_params, stored[0], np.dtype("float32"))
  _leaves_equal(pair.drafter_params, stored[1], np.dtype("float32"))

  with pytest.raises(FileExistsError, match="choose a new directory or pass overwrite=True"):
    training.export_pair(pair_dir, target_run, drafter_run, storage_dtype)
  training.export_pair(pair_dir, target_run, drafter_run, "float32", overwrite=True)
  assert checkpoints.stored_dtypes(pair_dir / "target") == {"float32"}


@pytest.mark.parametrize(
    "drafter", [drafters.T5Drafter(DRAFTER), drafters.SharedEncoderDrafter(DRAFTER, TARGET.emb_dim)]
)
def test_greedy_check_counts_rows_identical_to_the_baseline(drafter):
  """Random weights of either drafter kind: greedy speculative decoding is the target's greedy
  decoding at every gamma, on the first `rows` rows (the third is padding) or all of them."""
  pair = pairs.load_pair(
      pairs.PairConfig(TARGET, drafter, random_init_seed=0, restore_dtype=None), EOS
  )
  tokens = np.array(jax.random.randint(jax.random.PRNGKey(5), (3, 8), 2, VOCAB), np.int32)
  tokens[:, 6:] = 0
  tokens[2] = 0
  batch = {"encoder_input_tokens": tokens, "decoder_input_tokens": np.zeros((3, 6), np.int32)}
  vocabulary = seqio.PassThroughVocabulary(VOCAB, eos_id=EOS)
  results = pairs.greedy_check(pair, batch, vocabulary, [1, 3], rows=2)
  assert list(results) == [1, 3]
  for result in results.values():
    assert result["identical_rows"] == result["rows"] == 2
    assert 0.0 <= result["alpha"] <= 1.0 and result["tokens_per_target_call"] >= 1.0
  result = pairs.greedy_check(pair, batch, vocabulary, [2])[2]
  assert result["identical_rows"] == result["rows"] == 3


# ----------------------------------------------------------------------------------------------
# save_pair
SHARED_DRAFTER = drafters.SharedEncoderDrafter(
    tiny_config(40, emb_dim=6, num_heads=2, head_dim=4, mlp_dim=12, num_decoder_layers=1),
    SMALL_CONFIG.emb_dim,
)


@pytest.fixture(scope="module")
def shared_params():
  params = jax.jit(lambda rng: SHARED_DRAFTER.init_params(rng, {}))(jax.random.PRNGKey(2))
  return jax.tree.map(np.asarray, params)


def test_save_pair_writes_each_member_in_its_format(tmp_path, small_params, shared_params):
  """target/ as checkpoints.save_model writes it; drafter/ as the drafter's save_params does,
  its kind in config.json."""
  pairs.save_pair(tmp_path, small_params, SMALL_CONFIG, shared_params, SHARED_DRAFTER)
  fields = json.loads((tmp_path / "drafter" / "config.json").read_text())
  assert fields.pop("drafter") == {"kind": "shared_encoder", "encoder_emb_dim": 8}
  assert fields == json.loads(checkpoints.config_to_json(SHARED_DRAFTER.config))
  target_params, target_config = checkpoints.restore_model(tmp_path / "target")
  assert target_config == SMALL_CONFIG
  assert_trees_equal(target_params, small_params)
  assert_trees_equal(
      checkpoints.restore_drafter_params(SHARED_DRAFTER, tmp_path / "drafter"), shared_params
  )
  half = checkpoints.restore_drafter_params(SHARED_DRAFTER, tmp_path / "drafter", dtype="bfloat16")
  assert_trees_equal(half, bf16(shared_params))
  assert checkpoints.read_drafter_entry(tmp_path / "drafter")[0] == SHARED_DRAFTER.config
  with pytest.raises(
      ValueError, match="describes a drafter without an encoder .*checkpoints.read_drafter"
  ):
    checkpoints.restore_model(tmp_path / "drafter")


def test_save_pair_writes_a_t5_drafter_as_save_model_does(tmp_path, small_params):
  pairs.save_pair(
      tmp_path, small_params, SMALL_CONFIG, small_params, drafters.T5Drafter(SMALL_CONFIG)
  )
  assert checkpoints.read_drafter_entry(tmp_path / "drafter") == (SMALL_CONFIG, None)
  drafter_params, drafter_config = checkpoints.restore_model(tmp_path / "drafter")
  assert drafter_config == SMALL_CONFIG
  assert_trees_equal(drafter_params, small_params)


def test_save_pair_refuses_a_drafter_or_params_that_do_not_fit_before_writing(
    tmp_path, small_params, shared_params
):
  wide = dataclasses.replace(SHARED_DRAFTER, encoder_emb_dim=12)
  with pytest.raises(ValueError, match="encoder_emb_dim 12 != the target's emb_dim 8"):
    pairs.save_pair(tmp_path, small_params, SMALL_CONFIG, {}, wide)
  with pytest.raises(ValueError, match=r"drafter must be a drafters\.Drafter .* got 'small'"):
    pairs.save_pair(tmp_path, small_params, SMALL_CONFIG, {}, "small")
  with pytest.raises(
      ValueError,
      match=r"got a network\.T5Config: pass drafters\.T5Drafter\(config\) for a T5 drafter",
  ):
    pairs.save_pair(tmp_path, small_params, SMALL_CONFIG, small_params, SMALL_CONFIG)
  with pytest.raises(
      ValueError,
      match=r"^save_pair's drafter_params are not this SharedEncoderDrafter's parameters \(40 "
      r"problem\(s\); the first: decoder/decoder_norm/scale is \(8,\), the SharedEncoderDrafter "
      r"needs \(6,\)\)",
  ):
    pairs.save_pair(tmp_path, small_params, SMALL_CONFIG, small_params, SHARED_DRAFTER)
  assert not os.listdir(tmp_path)  # refused before anything is written
