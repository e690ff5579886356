"""Tests of the project's own checkpoints (speculative_t5x/weights/checkpoints.py): orbax params and
config.json round trips, pairs, stored dtypes, checks against a model config, damaged files
refused, and the convert script. Reading T5X's files: test_t5x_checkpoints.py."""

import os
import re
import shutil
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import traverse_util

from conftest import (
    FIXTURE_CONFIG,
    REPO_ROOT,
    SMALL_CONFIG,
    assert_trees_equal,
    bf16,
    fixture_path,
    flat,
)
from speculative_t5x import param_checks
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import hf_weights
from speculative_t5x.weights import t5x_checkpoints

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


# ----------------------------------------------------------------------------------------------
# Reading the model config off a T5X parameter tree.
# ----------------------------------------------------------------------------------------------
def test_config_from_params_reads_the_architecture_off_the_shapes():
  ckpt = t5x_checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))
  assert param_checks.config_from_params(ckpt["target"]) == FIXTURE_CONFIG
  assert param_checks.config_from_params(ckpt["target"], dtype="bfloat16").dtype == "bfloat16"


# ----------------------------------------------------------------------------------------------
# The project's own orbax checkpoints.
# ----------------------------------------------------------------------------------------------
def test_orbax_model_round_trip_is_exact(tmp_path, small_params):
  checkpoints.save_model(tmp_path / "m", small_params, SMALL_CONFIG)
  params, config = checkpoints.restore_model(tmp_path / "m")
  assert config == SMALL_CONFIG
  assert_trees_equal(params, small_params)
  half, _ = checkpoints.restore_model(tmp_path / "m", dtype="bfloat16")
  assert_trees_equal(half, bf16(small_params))
  with pytest.raises(FileExistsError, match="overwrite=True"):
    checkpoints.save_model(tmp_path / "m", small_params, SMALL_CONFIG)


def test_stored_dtypes_reads_the_storage_dtype_and_bfloat16_restores_as_float32(
    tmp_path, small_params
):
  checkpoints.save_model(tmp_path / "f32", small_params, SMALL_CONFIG)
  assert checkpoints.stored_dtypes(tmp_path / "f32") == {"float32"}
  half = jax.tree.map(lambda x: jax.numpy.asarray(x, jax.numpy.bfloat16), small_params)
  checkpoints.save_model(tmp_path / "bf16", half, SMALL_CONFIG)
  assert checkpoints.stored_dtypes(tmp_path / "bf16") == {"bfloat16"}
  restored, config = checkpoints.restore_model(tmp_path / "bf16", dtype="float32")
  assert config == SMALL_CONFIG
  expected = {  # Rounded to bfloat16 and back by numpy and ml_dtypes alone.
      name: np.asarray(value, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
      for name, value in flat(small_params).items()
  }
  assert any(not np.array_equal(expected[k], v) for k, v in flat(small_params).items())
  assert_trees_equal(restored, traverse_util.unflatten_dict(expected, sep="/"))
  with pytest.raises(FileNotFoundError, match="not a directory written by save_model"):
    checkpoints.stored_dtypes(tmp_path)


def test_config_json_with_unknown_field_is_rejected():
  text = checkpoints.config_to_json(SMALL_CONFIG).replace(
      '"vocab_size"', '"rotary": 1, "vocab_size"'
  )
  with pytest.raises(ValueError, match=r"\['rotary'\]"):
    checkpoints.config_from_json(text)


def test_convert_script_t5x_to_orbax_to_hf_and_back(tmp_path):
  script = str(REPO_ROOT / "scripts" / "convert_checkpoint.py")
  steps = [
      ("t5x_to_orbax", fixture_path("test_t5_tiny.checkpoint_0"), tmp_path / "orbax"),
      ("orbax_to_hf", tmp_path / "orbax", tmp_path / "hf"),
      ("hf_to_orbax", tmp_path / "hf", tmp_path / "orbax2"),
  ]
  for mode, source, output in steps:
    subprocess.run(
        [
            sys.executable,
            script,
            f"--mode={mode}",
            f"--input={source}",
            f"--output={output}",
            *(["--dtype=float32"] if mode.endswith("_to_orbax") else []),
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
  expected = t5x_checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))[
      "target"
  ]
  params, config = checkpoints.restore_model(tmp_path / "orbax2")
  assert config == FIXTURE_CONFIG
  assert_trees_equal(params, expected)
  hf_params, _ = hf_weights.load_hf(tmp_path / "hf")
  assert_trees_equal(hf_params, expected)


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors naming the path and the parameter, never zeros or partial models.
# ----------------------------------------------------------------------------------------------
def test_config_mismatch_lists_every_parameter():
  wrong = FIXTURE_CONFIG.replace(mlp_dim=32, num_decoder_layers=3, logits_via_embedding=True)
  with pytest.raises(ValueError) as info:
    checkpoints.restore_params(wrong, fixture_path("test_t5_tiny.checkpoint_0"))
  message = str(info.value)
  assert "test_t5_tiny.checkpoint_0" in message
  assert "missing: decoder/layers_2/self_attention/query/kernel (8, 12)" in message
  assert "extra: decoder/logits_dense/kernel (8, 32128)" in message
  assert (
      "wrong shape: encoder/layers_1/mlp/wo/kernel is (16, 8), the config needs (32, 8)" in message
  )


def test_save_model_rejects_params_that_do_not_fit_the_config(tmp_path, small_params):
  with pytest.raises(ValueError, match="wrong shape: token_embedder/embedding"):
    checkpoints.save_model(tmp_path, small_params, SMALL_CONFIG.replace(vocab_size=41))
  assert not (tmp_path / "params").exists()


# ----------------------------------------------------------------------------------------------
# Damaged weights: NaN or inf refused by default, naming the parameter; unreadable chunks named.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_orbax_model_holding_nan_or_inf_is_refused(tmp_path, small_params, bad):
  params = jax.tree.map(np.copy, small_params)
  params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"][3, 5] = bad
  checkpoints.save_model(tmp_path / "m", params, SMALL_CONFIG)
  kind = "1 NaN and 0 inf" if np.isnan(bad) else "0 NaN and 1 inf"
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
      match=rf"checkpoint .*m holds NaN or inf in 1 parameter\(s\):\n"
      rf"  target/decoder/layers_1/mlp/wo/kernel \(12, 8\): {kind} of 96 values, the first at "
      r"index \(3, 5\)\n.*check_finite=False",
  ):
    checkpoints.restore_model(tmp_path / "m")
  restored, _ = checkpoints.restore_model(tmp_path / "m", check_finite=False)
  assert_trees_equal(restored, params)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_restore_dtype_overflowing_to_inf_is_refused(tmp_path, small_params):
  params = jax.tree.map(np.copy, small_params)
  params["encoder"]["encoder_norm"]["scale"][0] = 1e6  # float16's largest value is 65504.
  checkpoints.save_model(tmp_path / "m", params, SMALL_CONFIG)
  checkpoints.restore_model(tmp_path / "m")
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
      match=r"target/encoder/encoder_norm/scale \(8,\): 0 NaN",
  ):
    checkpoints.restore_params(SMALL_CONFIG, tmp_path / "m", dtype="float16")


def test_orbax_chunk_failing_its_decompression_is_named(tmp_path, small_params):
  """Every zstd frame of the orbax data files, damaged in turn (its reserved header bit set):
  restoring names the array whose chunk it held, or says the tree metadata is unreadable, or (a
  frame orbax no longer references) restores the saved values; never a wrong value or an
  unexplained error. (Which file holds which chunk varies from run to run.)"""
  checkpoints.save_model(tmp_path / "m", small_params, SMALL_CONFIG)
  frames = []
  for path in sorted((tmp_path / "m" / "params").rglob("d/*")):
    data = path.read_bytes()
    start = data.find(_ZSTD_MAGIC)
    while start >= 0:
      frames.append((path.relative_to(tmp_path / "m"), start))
      start = data.find(_ZSTD_MAGIC, start + 1)
  named, unread_metadata = [], 0
  for i, (relative, start) in enumerate(frames):
    copy = tmp_path / f"copy{i}"
    shutil.copytree(tmp_path / "m", copy)
    data = bytearray((copy / relative).read_bytes())
    data[start + 4] ^= 0x08
    (copy / relative).write_bytes(bytes(data))
    try:
      restored, _ = checkpoints.restore_model(copy)
    except ValueError as error:
      message = str(error)
      assert "cannot restore the orbax checkpoint at" in message, message
      assert "copy the checkpoint again" in message, message
      array = re.search(r"Error reading \"((encoder|decoder|token_embedder)\.[\w.]+)/", message)
      assert array or "tree metadata cannot be read" in message, message
      named += [array.group(1)] if array else []
      unread_metadata += not array
    else:
      assert flat(jax.device_get(restored)).keys() == flat(small_params).keys()
      for name, value in flat(small_params).items():
        np.testing.assert_array_equal(flat(jax.device_get(restored))[name], value, err_msg=name)
  assert len(named) >= 2 and unread_metadata <= 1, (named, unread_metadata, len(frames))
