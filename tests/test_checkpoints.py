"""Tests of checkpoint reading (T5X's own files, and files written here in its layouts) and
orbax."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import flax.serialization
import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from flax import traverse_util

from conftest import FIXTURE_CONFIG, REPO_ROOT, fixture_path, tiny_config
from speculative_t5x import checkpoints
from speculative_t5x import drafters
from speculative_t5x import hf_weights
from speculative_t5x import network

# KERNEL_ROW_0 depends on every dimension: all of them are spelled out.
SMALL = tiny_config(
    40, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=12, num_encoder_layers=1, num_decoder_layers=2
)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
KERNEL_ROW_0 = [0.15038408, 0.70071733, 0.50233229, 0.6763428, 0.41820543]


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def _assert_trees_equal(actual, expected):
  actual, expected = _flat(actual), _flat(expected)
  assert actual.keys() == expected.keys()
  for key, value in expected.items():
    assert actual[key].dtype == np.asarray(value).dtype, key
    np.testing.assert_array_equal(actual[key], value, err_msg=key)


@pytest.fixture(scope="module")
def small_params():
  params = network.init_params(SMALL, jax.random.PRNGKey(0))
  return jax.tree.map(np.asarray, params)


def _write_t5x_checkpoint(
    model_dir, step, target, *, zarray=True, driver="file", top_level_path=False, compressor="gzip"
):
  """Writes a checkpoint in T5X's legacy layout: target arrays in bfloat16 zarr (`compressor`
  'gzip' as T5X, or 'zstd') with relative paths (in `kvstore`, or at the top level as
  tensorstore < 0.1.14 wrote them), an inline int32 step and inline float32 optimizer state, the
  msgpack written by flax."""
  ckpt_dir = os.path.join(model_dir, f"checkpoint_{step}")
  os.makedirs(ckpt_dir)
  specs = {}
  for name, value in _flat(target).items():
    relative = "target." + name.replace("/", ".")
    chunks = [d // 2 if d % 2 == 0 else d for d in value.shape]  # Several chunks per array.
    spec = {
        "driver": "zarr",
        "dtype": "bfloat16",
        "kvstore": {"driver": driver, "path": relative + "/"},
        "metadata": {
            "chunks": chunks,
            "compressor": {"id": compressor, "level": 1},
            "shape": list(value.shape),
        },
    }
    if driver == "gcs":
      spec["kvstore"]["bucket"] = "t5x-dummy-bucket"
    written = dict(spec, kvstore={"driver": "file", "path": os.path.join(ckpt_dir, relative)})
    store = ts.open(written, create=True).result()
    store.write(value.astype(ml_dtypes.bfloat16)).result()
    if not zarray:
      os.remove(os.path.join(ckpt_dir, relative, ".zarray"))
    if top_level_path:
      spec["path"] = spec["kvstore"].pop("path")
    specs[name] = spec
  norm_state = {"scale": {"v": np.full(8, 0.5, np.float32)}}
  state = {"step": np.int32(step), "param_states": {"decoder": {"decoder_norm": norm_state}}}
  contents = {
      "version": 3,
      "optimizer": {"target": traverse_util.unflatten_dict(specs, sep="/"), "state": state},
  }
  with open(os.path.join(ckpt_dir, "checkpoint"), "wb") as f:
    f.write(flax.serialization.msgpack_serialize(contents))
  return ckpt_dir


def _bf16(tree):
  return jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16), tree)


# ----------------------------------------------------------------------------------------------
# T5X's own files.
# ----------------------------------------------------------------------------------------------
def test_tiny_msgpack_checkpoint_has_t5x_param_tree():
  ckpt = checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))
  target = _flat(ckpt["target"])
  expected = _flat(network.param_shapes(FIXTURE_CONFIG))
  assert {k: v.shape for k, v in target.items()} == expected
  assert {v.dtype for v in target.values()} == {np.dtype(np.float32)}
  assert int(ckpt["state"]["step"]) == 0
  assert set(ckpt["state"]["param_states"]["decoder"]["decoder_norm"]["scale"]) == {
      "m",
      "v",
      "v_col",
      "v_row",
  }


def test_tiny_checkpoint_reproduces_t5x_logits():
  params = checkpoints.restore_params(FIXTURE_CONFIG, fixture_path("test_t5_tiny.checkpoint_0"))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))  # on device, not numpy
  ref = np.load(fixture_path("t5x_tiny_reference.npz"))
  logits = network.Transformer(FIXTURE_CONFIG).apply(
      {"params": params},
      ref["encoder_input_tokens"],
      ref["decoder_input_tokens"],
      ref["decoder_target_tokens"],
  )
  np.testing.assert_allclose(np.asarray(logits)[..., :2048], ref["logits_first_2048"], atol=1e-5)


def test_config_from_params_reads_the_architecture_off_the_shapes():
  ckpt = checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))
  assert checkpoints.config_from_params(ckpt["target"]) == FIXTURE_CONFIG
  assert checkpoints.config_from_params(ckpt["target"], dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.parametrize(
    "where, step",
    [
        ("tiny_t5", None),
        ("tiny_t5", 1),
        ("tiny_t5/checkpoint_1", None),
        ("tiny_t5/checkpoint_1/checkpoint", None),
    ],
)
def test_tiny_t5_tensorstore_checkpoint_gives_readme_values(where, step):
  ckpt = checkpoints.load_t5x_checkpoint(fixture_path(where), step=step)
  states = ckpt["state"]["param_states"]
  np.testing.assert_array_equal(states["bias"], np.ones(5, np.float32))
  assert states["bias"].dtype == np.float32
  assert states["kernel"].dtype == np.float64 and states["kernel"].shape == (10, 5)
  np.testing.assert_allclose(states["kernel"][0], KERNEL_ROW_0, rtol=1e-7)
  assert states["step"].dtype == np.int32 and int(states["step"]) == 1
  assert ckpt["state"]["step"].dtype == np.int32 and int(ckpt["state"]["step"]) == 1
  assert ckpt["target"] == {}


def test_old_orbax_placeholder_checkpoint_loads():
  # Its zarr directories have no .zarray, so shapes and dtypes come from a template: the same
  # optimizer state in T5X's legacy layout (tiny_t5), whose values it must then reproduce.
  legacy = checkpoints.load_t5x_checkpoint(fixture_path("tiny_t5/checkpoint_1"))
  with pytest.raises(ValueError, match=r"state/param_states/\w+' at .*_optimizer.state.*template="):
    checkpoints.load_t5x_checkpoint(fixture_path("tiny_orbax/1"))
  ckpt = checkpoints.load_t5x_checkpoint(fixture_path("tiny_orbax/1"), template=legacy)
  _assert_trees_equal(ckpt["state"], legacy["state"])
  assert ckpt["target"] == {}


# ----------------------------------------------------------------------------------------------
# Checkpoints written here in T5X's layouts.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zarray", [True, False], ids=["with_zarray", "no_zarray"])
@pytest.mark.parametrize("driver", ["file", "gfile", "gcs"])
def test_t5x_tensorstore_layout_loads(tmp_path, small_params, zarray, driver):
  _write_t5x_checkpoint(tmp_path, 5, small_params, zarray=zarray, driver=driver)
  _write_t5x_checkpoint(
      tmp_path, 10, jax.tree.map(lambda x: -x, small_params), zarray=zarray, driver=driver
  )
  latest = checkpoints.load_t5x_checkpoint(tmp_path)
  _assert_trees_equal(latest["target"], _bf16(jax.tree.map(lambda x: -x, small_params)))
  assert int(latest["state"]["step"]) == 10
  np.testing.assert_array_equal(
      _flat(latest["state"])["param_states/decoder/decoder_norm/scale/v"], 0.5
  )
  params = checkpoints.restore_params(SMALL, tmp_path, step=5, dtype="float32")
  _assert_trees_equal(params, jax.tree.map(lambda x: x.astype(np.float32), _bf16(small_params)))


def test_t5x_layout_with_pre_0_1_14_tensorstore_spec(tmp_path, small_params):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, zarray=False, top_level_path=True)
  _assert_trees_equal(checkpoints.load_t5x_checkpoint(ckpt_dir)["target"], _bf16(small_params))


def test_restore_dtype_casts_only_the_target(tmp_path, small_params):
  _write_t5x_checkpoint(tmp_path, 1, small_params)
  ckpt = checkpoints.load_t5x_checkpoint(tmp_path, restore_dtype="float32")
  assert {v.dtype for v in _flat(ckpt["target"]).values()} == {np.dtype(np.float32)}
  assert ckpt["state"]["step"].dtype == np.int32


def test_chunked_msgpack_arrays_decode(tmp_path, monkeypatch):
  big = np.arange(300, dtype=np.float32).reshape(3, 100)
  half = (np.arange(50) / 7).astype(ml_dtypes.bfloat16)
  monkeypatch.setattr(flax.serialization, "MAX_CHUNK_SIZE", 64)  # T5X's limit is 2**30 bytes.
  data = flax.serialization.msgpack_serialize(
      {
          "version": 3,
          "optimizer": {"target": {"big": big, "half": half}, "state": {"step": np.int32(7)}},
      }
  )
  assert b"__msgpack_chunked_array__" in data
  path = tmp_path / "checkpoint"
  path.write_bytes(data)
  ckpt = checkpoints.load_t5x_checkpoint(path)
  _assert_trees_equal(ckpt["target"], {"big": big, "half": half})
  assert int(ckpt["state"]["step"]) == 7


def test_t5x_orbax_layout_loads(tmp_path, small_params):
  state = {
      "target": small_params,
      "state": {
          "step": np.int32(4),
          "param_states": {"encoder": {"encoder_norm": {"scale": {"v": np.ones(8, np.float32)}}}},
      },
  }
  ocp.PyTreeCheckpointer().save(tmp_path / "checkpoint_4" / "state", state)
  ckpt = checkpoints.load_t5x_checkpoint(tmp_path)
  _assert_trees_equal(ckpt["target"], small_params)
  assert int(ckpt["state"]["step"]) == 4
  _assert_trees_equal(checkpoints.restore_params(SMALL, tmp_path / "checkpoint_4"), small_params)


# ----------------------------------------------------------------------------------------------
# The project's own orbax checkpoints.
# ----------------------------------------------------------------------------------------------
def test_orbax_model_round_trip_is_exact(tmp_path, small_params):
  checkpoints.save_model(tmp_path / "m", small_params, SMALL)
  params, config = checkpoints.restore_model(tmp_path / "m")
  assert config == SMALL
  _assert_trees_equal(params, small_params)
  half, _ = checkpoints.restore_model(tmp_path / "m", dtype="bfloat16")
  _assert_trees_equal(half, _bf16(small_params))
  with pytest.raises(FileExistsError, match="overwrite=True"):
    checkpoints.save_model(tmp_path / "m", small_params, SMALL)


def test_stored_dtypes_reads_the_storage_dtype_and_bfloat16_restores_as_float32(
    tmp_path, small_params
):
  checkpoints.save_model(tmp_path / "f32", small_params, SMALL)
  assert checkpoints.stored_dtypes(tmp_path / "f32") == {"float32"}
  half = jax.tree.map(lambda x: jax.numpy.asarray(x, jax.numpy.bfloat16), small_params)
  checkpoints.save_model(tmp_path / "bf16", half, SMALL)
  assert checkpoints.stored_dtypes(tmp_path / "bf16") == {"bfloat16"}
  restored, config = checkpoints.restore_model(tmp_path / "bf16", dtype="float32")
  assert config == SMALL
  expected = {  # Rounded to bfloat16 and back by numpy and ml_dtypes alone.
      name: np.asarray(value, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
      for name, value in _flat(small_params).items()
  }
  assert any(not np.array_equal(expected[k], v) for k, v in _flat(small_params).items())
  _assert_trees_equal(restored, traverse_util.unflatten_dict(expected, sep="/"))
  with pytest.raises(FileNotFoundError, match="not a directory written by save_model"):
    checkpoints.stored_dtypes(tmp_path)


# A shared-encoder drafter for SMALL: its own width 6, reading SMALL's encoder output (width 8).
SHARED_DRAFTER = drafters.SharedEncoderDrafter(
    tiny_config(40, emb_dim=6, num_heads=2, head_dim=4, mlp_dim=12, num_decoder_layers=1),
    SMALL.emb_dim,
)


@pytest.fixture(scope="module")
def shared_params():
  params = jax.jit(lambda rng: SHARED_DRAFTER.init_params(rng, {}))(jax.random.PRNGKey(2))
  return jax.tree.map(np.asarray, params)


def test_save_pair_writes_each_member_in_its_format(tmp_path, small_params, shared_params):
  """target/ as save_model writes it; drafter/ as the drafter's save_params does, its kind in
  config.json (pairs reads a pair back: tests/test_pairs.py)."""
  checkpoints.save_pair(tmp_path, small_params, SMALL, shared_params, SHARED_DRAFTER)
  fields = json.loads((tmp_path / "drafter" / "config.json").read_text())
  assert fields.pop("drafter") == {"kind": "shared_encoder", "encoder_emb_dim": 8}
  assert fields == json.loads(checkpoints.config_to_json(SHARED_DRAFTER.config))
  target_params, target_config = checkpoints.restore_model(tmp_path / "target")
  assert target_config == SMALL
  _assert_trees_equal(target_params, small_params)
  _assert_trees_equal(SHARED_DRAFTER.restore_params(tmp_path / "drafter"), shared_params)
  half = SHARED_DRAFTER.restore_params(tmp_path / "drafter", dtype="bfloat16")
  _assert_trees_equal(half, _bf16(shared_params))
  assert checkpoints.read_drafter_entry(tmp_path / "drafter")[0] == SHARED_DRAFTER.config
  with pytest.raises(
      ValueError, match="describes a drafter without an encoder .*drafters.read_drafter"
  ):
    checkpoints.restore_model(tmp_path / "drafter")


def test_save_pair_writes_a_t5_drafter_as_save_model_does(tmp_path, small_params):
  checkpoints.save_pair(tmp_path, small_params, SMALL, small_params, drafters.T5Drafter(SMALL))
  assert checkpoints.read_drafter_entry(tmp_path / "drafter") == (SMALL, None)
  drafter_params, drafter_config = checkpoints.restore_model(tmp_path / "drafter")
  assert drafter_config == SMALL
  _assert_trees_equal(drafter_params, small_params)


def test_save_pair_refuses_a_drafter_or_params_that_do_not_fit_before_writing(
    tmp_path, small_params, shared_params
):
  wide = dataclasses.replace(SHARED_DRAFTER, encoder_emb_dim=12)
  with pytest.raises(ValueError, match="encoder_emb_dim 12 != the target's emb_dim 8"):
    checkpoints.save_pair(tmp_path, small_params, SMALL, {}, wide)
  with pytest.raises(ValueError, match=r"drafter must be a drafters\.Drafter .* got 'small'"):
    checkpoints.save_pair(tmp_path, small_params, SMALL, {}, "small")
  with pytest.raises(
      ValueError,
      match=r"got a network\.T5Config: pass drafters\.T5Drafter\(config\) for a T5 drafter",
  ):
    checkpoints.save_pair(tmp_path, small_params, SMALL, small_params, SMALL)
  with pytest.raises(
      ValueError,
      match=r"^save_pair's drafter_params are not this SharedEncoderDrafter's parameters \(40 "
      r"problem\(s\); the first: decoder/decoder_norm/scale is \(8,\), the SharedEncoderDrafter "
      r"needs \(6,\)\)",
  ):
    checkpoints.save_pair(tmp_path, small_params, SMALL, small_params, SHARED_DRAFTER)
  assert not os.listdir(tmp_path)  # refused before anything is written


def test_config_json_with_unknown_field_is_rejected():
  text = checkpoints.config_to_json(SMALL).replace('"vocab_size"', '"rotary": 1, "vocab_size"')
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
            "--dtype=float32",
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
  expected = checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))["target"]
  params, config = checkpoints.restore_model(tmp_path / "orbax2")
  assert config == FIXTURE_CONFIG
  _assert_trees_equal(params, expected)
  hf_params, _ = hf_weights.load_hf(tmp_path / "hf")
  _assert_trees_equal(hf_params, expected)


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors naming the path and the parameter, never zeros or partial models.
# ----------------------------------------------------------------------------------------------
def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint at .*nowhere"):
    checkpoints.load_t5x_checkpoint(tmp_path / "nowhere")
  (tmp_path / "empty" / "junk").mkdir(parents=True)
  (tmp_path / "empty" / "junk" / "x").write_text("")
  with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
    checkpoints.load_t5x_checkpoint(tmp_path / "empty")


def test_missing_step(tmp_path, small_params):
  _write_t5x_checkpoint(tmp_path, 3, small_params)
  with pytest.raises(FileNotFoundError, match=r"no checkpoint_7 .*steps found: \[3\]"):
    checkpoints.load_t5x_checkpoint(tmp_path, step=7)


@pytest.mark.parametrize("zarray", [True, False], ids=["with_zarray", "no_zarray"])
def test_missing_array_directory(tmp_path, small_params, zarray):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, zarray=zarray)
  shutil.rmtree(os.path.join(ckpt_dir, "target.decoder.decoder_norm.scale"))
  with pytest.raises(
      ValueError,
      match=r"'target/decoder/decoder_norm/scale' from "
      r".*target.decoder.decoder_norm.scale.*missing",
  ):
    checkpoints.load_t5x_checkpoint(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "delete_chunk"])
def test_damaged_chunk(tmp_path, small_params, damage):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, zarray=False)
  chunk = os.path.join(ckpt_dir, "target.token_embedder.embedding", "1.1")
  data = open(chunk, "rb").read()
  if damage == "delete_chunk":
    os.remove(chunk)
  else:
    with open(chunk, "wb") as f:
      f.write(
          data[: len(data) // 2]
          if damage == "truncate"
          else data[:10] + bytes(b ^ 0xFF for b in data[10:])
      )
  with pytest.raises(ValueError, match=r"'target/token_embedder/embedding' from .*embedding"):
    checkpoints.load_t5x_checkpoint(tmp_path)


def test_truncated_msgpack_file(tmp_path):
  data = open(fixture_path("test_t5_tiny.checkpoint_0"), "rb").read()
  (tmp_path / "checkpoint").write_bytes(data[: len(data) // 3])
  with pytest.raises(ValueError, match="truncated or corrupted"):
    checkpoints.load_t5x_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize(
    "contents",
    [
        {"version": 1, "optimizer": {}},
        {"version": 0},
        {"version": 99, "optimizer": {}},
        {"target": {}},
    ],
)
def test_unsupported_version(tmp_path, contents):
  (tmp_path / "checkpoint").write_bytes(flax.serialization.msgpack_serialize(contents))
  with pytest.raises(ValueError, match="version"):
    checkpoints.load_t5x_checkpoint(tmp_path)


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
    checkpoints.save_model(tmp_path, small_params, SMALL.replace(vocab_size=41))
  assert not (tmp_path / "params").exists()


def test_gs_paths_map_to_the_gcs_kvstore():
  # GCS is not reachable here; this checks the one place where gs:// and local paths differ.
  location = checkpoints._Location  # pylint: disable=protected-access
  assert location.of("gs://my-bucket/t5x/t5_1_1_xl/").join("checkpoint_1000000").kvstore_spec() == {
      "driver": "gcs",
      "bucket": "my-bucket",
      "path": "t5x/t5_1_1_xl/checkpoint_1000000/",
  }
  assert location.of("gs://my-bucket").kvstore_spec() == {
      "driver": "gcs",
      "bucket": "my-bucket",
      "path": "",
  }


# ----------------------------------------------------------------------------------------------
# Damaged weights: NaN or inf refused by default, naming the parameter; unreadable chunks named.
# ----------------------------------------------------------------------------------------------
def _nan_bits(data: bytes, values: np.ndarray, index: int) -> bytes:
  """`data` with the bits of element `index` of `values` (stored verbatim in `data`) that are 0
  in a quiet NaN flipped to 1: the flipped bits a damaged copy could hold."""
  start = data.find(values.tobytes())
  assert start >= 0, "the array is not stored verbatim"
  bits = np.frombuffer(values.tobytes(), np.dtype(f"u{values.itemsize}")).copy()
  bits[index] |= 0x7FC0 if values.itemsize == 2 else 0x7FC00000
  return data[:start] + bits.tobytes() + data[start + values.nbytes :]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_orbax_model_holding_nan_or_inf_is_refused(tmp_path, small_params, bad):
  params = jax.tree.map(np.copy, small_params)
  params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"][3, 5] = bad
  checkpoints.save_model(tmp_path / "m", params, SMALL)
  kind = "1 NaN and 0 inf" if np.isnan(bad) else "0 NaN and 1 inf"
  with pytest.raises(
      checkpoints.NonFiniteWeightsError,
      match=rf"checkpoint .*m holds NaN or inf in 1 parameter\(s\):\n"
      rf"  target/decoder/layers_1/mlp/wo/kernel \(12, 8\): {kind} of 96 values, the first at "
      r"index \(3, 5\)\n.*check_finite=False",
  ):
    checkpoints.restore_model(tmp_path / "m")
  restored, _ = checkpoints.restore_model(tmp_path / "m", check_finite=False)
  _assert_trees_equal(restored, params)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_restore_dtype_overflowing_to_inf_is_refused(tmp_path, small_params):
  params = jax.tree.map(np.copy, small_params)
  params["encoder"]["encoder_norm"]["scale"][0] = 1e6  # float16's largest value is 65504.
  checkpoints.save_model(tmp_path / "m", params, SMALL)
  checkpoints.restore_model(tmp_path / "m")
  with pytest.raises(
      checkpoints.NonFiniteWeightsError, match=r"target/encoder/encoder_norm/scale \(8,\): 0 NaN"
  ):
    checkpoints.restore_params(SMALL, tmp_path / "m", dtype="float16")


def test_msgpack_inline_array_with_flipped_bits_is_refused(tmp_path, small_params):
  data = flax.serialization.msgpack_serialize(
      {"version": 3, "optimizer": {"target": small_params, "state": {"step": np.int32(1)}}}
  )
  embedding = small_params["token_embedder"]["embedding"]
  (tmp_path / "checkpoint").write_bytes(_nan_bits(data, embedding, 8 * 7 + 2))
  with pytest.raises(
      checkpoints.NonFiniteWeightsError,
      match=r"target/token_embedder/embedding \(40, 8\): 1 NaN and 0 inf of 320 values, the "
      r"first at index \(7, 2\)",
  ):
    checkpoints.restore_params(SMALL, tmp_path)
  with pytest.raises(checkpoints.NonFiniteWeightsError, match="target/token_embedder/embedding"):
    checkpoints.load_t5x_checkpoint(tmp_path / "checkpoint")
  loaded = checkpoints.load_t5x_checkpoint(tmp_path, check_finite=False)
  assert np.isnan(loaded["target"]["token_embedder"]["embedding"][7, 2])


def test_nan_in_the_optimizer_state_is_refused(tmp_path, small_params):
  state = {"step": np.int32(4), "param_states": {"encoder_norm": {"v": np.ones(8, np.float32)}}}
  state["param_states"]["encoder_norm"]["v"][1] = np.nan
  ocp.PyTreeCheckpointer().save(
      tmp_path / "checkpoint_4" / "state", {"target": small_params, "state": state}
  )
  with pytest.raises(
      checkpoints.NonFiniteWeightsError, match=r"state/param_states/encoder_norm/v \(8,\)"
  ):
    checkpoints.load_t5x_checkpoint(tmp_path)
  restored = checkpoints.restore_params(SMALL, tmp_path)  # Only the target is read.
  _assert_trees_equal(restored, small_params)


def test_zstd_chunk_with_flipped_bits_is_refused(tmp_path, small_params):
  # zstd stores incompressible data (random bfloat16 values) verbatim and without a checksum:
  # only the values can tell a flipped bit.
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, compressor="zstd")
  chunk = os.path.join(ckpt_dir, "target.token_embedder.embedding", "0.1")
  values = small_params["token_embedder"]["embedding"][:20, 4:].astype(ml_dtypes.bfloat16)
  with open(chunk, "rb") as f:
    data = f.read()
  with open(chunk, "wb") as f:
    f.write(_nan_bits(data, values, 5))  # Row 1, column 5 of the array.
  with pytest.raises(
      checkpoints.NonFiniteWeightsError,
      match=r"target/token_embedder/embedding \(40, 8\): 1 NaN .* index \(1, 5\)",
  ):
    checkpoints.restore_params(SMALL, tmp_path, dtype="float32")


@pytest.mark.parametrize("compressor", ["gzip", "zstd"])
def test_chunk_failing_its_compressor_checks_names_the_array_and_the_file(
    tmp_path, small_params, compressor
):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, compressor=compressor)
  chunk = os.path.join(ckpt_dir, "target.decoder.logits_dense.kernel", "0.1")
  with open(chunk, "rb") as f:
    data = bytearray(f.read())
  # gzip: a byte of the deflate stream (its CRC-32 fails); zstd: the frame header descriptor.
  data[len(data) // 2 if compressor == "gzip" else 4] ^= 0x08
  with open(chunk, "wb") as f:
    f.write(data)
  with pytest.raises(
      ValueError,
      match=r"cannot read array 'target/decoder/logits_dense/kernel' from "
      r".*target.decoder.logits_dense.kernel: .*target.decoder.logits_dense.kernel/0.1.*"
      r"copy the checkpoint again",
  ):
    checkpoints.load_t5x_checkpoint(tmp_path)


def test_t5x_msgpack_file_with_flipped_bits_is_refused(tmp_path):
  fixture = fixture_path("test_t5_tiny.checkpoint_0")
  target = checkpoints.load_t5x_checkpoint(fixture)["target"]
  wo = target["decoder"]["layers_1"]["mlp"]["wo"]["kernel"]
  (tmp_path / "checkpoint").write_bytes(_nan_bits(fixture.read_bytes(), wo, 17))
  with pytest.raises(
      checkpoints.NonFiniteWeightsError,
      match=r"target/decoder/layers_1/mlp/wo/kernel \(16, 8\): 1 NaN .* index \(2, 1\)",
  ):
    checkpoints.restore_params(FIXTURE_CONFIG, tmp_path / "checkpoint")


def test_t5x_gzip_chunk_with_a_flipped_byte_is_named(tmp_path):
  shutil.copytree(fixture_path("tiny_t5"), tmp_path / "tiny_t5")
  chunk = tmp_path / "tiny_t5" / "checkpoint_1" / "state.param_states.kernel" / "0.0"
  data = bytearray(chunk.read_bytes())
  data[len(data) // 2] ^= 0x01
  chunk.write_bytes(bytes(data))
  with pytest.raises(
      ValueError,
      match=r"cannot read array 'state/param_states/kernel' from .*state.param_states.kernel: "
      r".*state.param_states.kernel/0.0",
  ):
    checkpoints.load_t5x_checkpoint(tmp_path / "tiny_t5")


def test_orbax_chunk_failing_its_decompression_is_named(tmp_path, small_params):
  """Every zstd frame of the orbax data files, damaged in turn (its reserved header bit set):
  restoring names the array whose chunk it held, or says the tree metadata is unreadable, or (a
  frame orbax no longer references) restores the saved values; never a wrong value or an
  unexplained error. (Which file holds which chunk varies from run to run.)"""
  checkpoints.save_model(tmp_path / "m", small_params, SMALL)
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
      assert _flat(jax.device_get(restored)).keys() == _flat(small_params).keys()
      for name, value in _flat(small_params).items():
        np.testing.assert_array_equal(_flat(jax.device_get(restored))[name], value, err_msg=name)
  assert len(named) >= 2 and unread_metadata <= 1, (named, unread_metadata, len(frames))
