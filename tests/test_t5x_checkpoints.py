"""Tests of reading T5X checkpoints without T5X (speculative_t5x/weights/t5x_checkpoints.py): T5X's own
files, files written here in its layouts, and missing or damaged files refused with errors that
name the array and the file."""

import os
import re
import shutil

import flax.serialization
import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from flax import traverse_util

from conftest import FIXTURE_CONFIG, SMALL_CONFIG, assert_trees_equal, bf16, fixture_path, flat
from speculative_t5x import network
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import t5x_checkpoints

# Row 0 of the optimizer state's kernel in T5X's tiny_t5 fixture (fixtures/t5x/README.md).
KERNEL_ROW_0 = [0.15038408, 0.70071733, 0.50233229, 0.6763428, 0.41820543]


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
  for name, value in flat(target).items():
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


# ----------------------------------------------------------------------------------------------
# T5X's own files.
# ----------------------------------------------------------------------------------------------
def test_tiny_msgpack_checkpoint_has_t5x_param_tree():
  ckpt = t5x_checkpoints.load_t5x_checkpoint(fixture_path("test_t5_tiny.checkpoint_0"))
  target = flat(ckpt["target"])
  expected = flat(network.param_shapes(FIXTURE_CONFIG))
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
  ckpt = t5x_checkpoints.load_t5x_checkpoint(fixture_path(where), step=step)
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
  legacy = t5x_checkpoints.load_t5x_checkpoint(fixture_path("tiny_t5/checkpoint_1"))
  with pytest.raises(ValueError, match=r"state/param_states/\w+' at .*_optimizer.state.*template="):
    t5x_checkpoints.load_t5x_checkpoint(fixture_path("tiny_orbax/1"))
  ckpt = t5x_checkpoints.load_t5x_checkpoint(fixture_path("tiny_orbax/1"), template=legacy)
  assert_trees_equal(ckpt["state"], legacy["state"])
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
  latest = t5x_checkpoints.load_t5x_checkpoint(tmp_path)
  assert_trees_equal(latest["target"], bf16(jax.tree.map(lambda x: -x, small_params)))
  assert int(latest["state"]["step"]) == 10
  np.testing.assert_array_equal(
      flat(latest["state"])["param_states/decoder/decoder_norm/scale/v"], 0.5
  )
  params = checkpoints.restore_params(SMALL_CONFIG, tmp_path, step=5, dtype="float32")
  assert_trees_equal(params, jax.tree.map(lambda x: x.astype(np.float32), bf16(small_params)))


def test_t5x_layout_with_pre_0_1_14_tensorstore_spec(tmp_path, small_params):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, zarray=False, top_level_path=True)
  assert_trees_equal(t5x_checkpoints.load_t5x_checkpoint(ckpt_dir)["target"], bf16(small_params))


def test_restore_dtype_casts_only_the_target(tmp_path, small_params):
  _write_t5x_checkpoint(tmp_path, 1, small_params)
  ckpt = t5x_checkpoints.load_t5x_checkpoint(tmp_path, restore_dtype="float32")
  assert {v.dtype for v in flat(ckpt["target"]).values()} == {np.dtype(np.float32)}
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
  ckpt = t5x_checkpoints.load_t5x_checkpoint(path)
  assert_trees_equal(ckpt["target"], {"big": big, "half": half})
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
  ckpt = t5x_checkpoints.load_t5x_checkpoint(tmp_path)
  assert_trees_equal(ckpt["target"], small_params)
  assert int(ckpt["state"]["step"]) == 4
  assert_trees_equal(
      checkpoints.restore_params(SMALL_CONFIG, tmp_path / "checkpoint_4"), small_params
  )


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors naming the path and the parameter, never zeros or partial models.
# ----------------------------------------------------------------------------------------------
def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint at .*nowhere"):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path / "nowhere")
  (tmp_path / "empty" / "junk").mkdir(parents=True)
  (tmp_path / "empty" / "junk" / "x").write_text("")
  with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path / "empty")


def test_missing_step(tmp_path, small_params):
  _write_t5x_checkpoint(tmp_path, 3, small_params)
  with pytest.raises(FileNotFoundError, match=r"no checkpoint_7 .*steps found: \[3\]"):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path, step=7)


@pytest.mark.parametrize("zarray", [True, False], ids=["with_zarray", "no_zarray"])
def test_missing_array_directory(tmp_path, small_params, zarray):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, zarray=zarray)
  shutil.rmtree(os.path.join(ckpt_dir, "target.decoder.decoder_norm.scale"))
  with pytest.raises(
      ValueError,
      match=r"'target/decoder/decoder_norm/scale' from "
      r".*target.decoder.decoder_norm.scale.*missing",
  ):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path)


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
    t5x_checkpoints.load_t5x_checkpoint(tmp_path)


def test_truncated_msgpack_file(tmp_path):
  data = open(fixture_path("test_t5_tiny.checkpoint_0"), "rb").read()
  (tmp_path / "checkpoint").write_bytes(data[: len(data) // 3])
  with pytest.raises(ValueError, match="truncated or corrupted"):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path / "checkpoint")


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
    t5x_checkpoints.load_t5x_checkpoint(tmp_path)


def test_gs_paths_map_to_the_gcs_kvstore():
  # GCS is not reachable here; this checks the one place where gs:// and local paths differ.
  location = t5x_checkpoints._Location  # pylint: disable=protected-access
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


def test_msgpack_inline_array_with_flipped_bits_is_refused(tmp_path, small_params):
  data = flax.serialization.msgpack_serialize(
      {"version": 3, "optimizer": {"target": small_params, "state": {"step": np.int32(1)}}}
  )
  embedding = small_params["token_embedder"]["embedding"]
  (tmp_path / "checkpoint").write_bytes(_nan_bits(data, embedding, 8 * 7 + 2))
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
      match=r"target/token_embedder/embedding \(40, 8\): 1 NaN and 0 inf of 320 values, the "
      r"first at index \(7, 2\)",
  ):
    checkpoints.restore_params(SMALL_CONFIG, tmp_path)
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError, match="target/token_embedder/embedding"
  ):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path / "checkpoint")
  loaded = t5x_checkpoints.load_t5x_checkpoint(tmp_path, check_finite=False)
  assert np.isnan(loaded["target"]["token_embedder"]["embedding"][7, 2])


def test_nan_in_the_optimizer_state_is_refused(tmp_path, small_params):
  state = {"step": np.int32(4), "param_states": {"encoder_norm": {"v": np.ones(8, np.float32)}}}
  state["param_states"]["encoder_norm"]["v"][1] = np.nan
  ocp.PyTreeCheckpointer().save(
      tmp_path / "checkpoint_4" / "state", {"target": small_params, "state": state}
  )
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError, match=r"state/param_states/encoder_norm/v \(8,\)"
  ):
    t5x_checkpoints.load_t5x_checkpoint(tmp_path)
  restored = checkpoints.restore_params(SMALL_CONFIG, tmp_path)  # Only the target is read.
  assert_trees_equal(restored, small_params)


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
      t5x_checkpoints.NonFiniteWeightsError,
      match=r"target/token_embedder/embedding \(40, 8\): 1 NaN .* index \(1, 5\)",
  ):
    checkpoints.restore_params(SMALL_CONFIG, tmp_path, dtype="float32")


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
    t5x_checkpoints.load_t5x_checkpoint(tmp_path)


def test_t5x_msgpack_file_with_flipped_bits_is_refused(tmp_path):
  fixture = fixture_path("test_t5_tiny.checkpoint_0")
  target = t5x_checkpoints.load_t5x_checkpoint(fixture)["target"]
  wo = target["decoder"]["layers_1"]["mlp"]["wo"]["kernel"]
  (tmp_path / "checkpoint").write_bytes(_nan_bits(fixture.read_bytes(), wo, 17))
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
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
    t5x_checkpoints.load_t5x_checkpoint(tmp_path / "tiny_t5")


# ----------------------------------------------------------------------------------------------
# Lazy reading (load_checkpoint(..., lazy=True)): each parameter read by the slice, in the
# restore dtype, refused where the slice read holds NaN or inf.
# ----------------------------------------------------------------------------------------------
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _lazy_target(path, restore_dtype="float32", check_finite=True) -> dict:
  return t5x_checkpoints.load_checkpoint(
      path, None, restore_dtype, {}, only_target=True, check_finite=check_finite, lazy=True
  )["target"]


def _checkpoint_of_kind(kind: str, directory, params):
  """A checkpoint of `params` in one of the layouts lazy reading covers -> its path."""
  if kind == "t5x_zarr":  # bfloat16 zarr arrays, several chunks each
    _write_t5x_checkpoint(directory, 1, params)
  elif kind == "t5x_orbax":
    ocp.PyTreeCheckpointer().save(
        directory / "checkpoint_4" / "state", {"target": params, "state": {"step": np.int32(4)}}
    )
  elif kind == "project":
    checkpoints.save_model(directory, params, SMALL_CONFIG)
  else:  # arrays inline in the msgpack file: read with the file, whole
    (directory / "checkpoint").write_bytes(
        flax.serialization.msgpack_serialize(
            {"version": 3, "optimizer": {"target": params, "state": {"step": np.int32(1)}}}
        )
    )
  return directory


@pytest.mark.parametrize("restore_dtype", sorted(DTYPES))
@pytest.mark.parametrize("kind", ["t5x_zarr", "t5x_orbax", "project", "msgpack_inline"])
def test_a_lazy_array_reads_the_slice_asked_in_the_restore_dtype(
    tmp_path, small_params, kind, restore_dtype
):
  path = _checkpoint_of_kind(kind, tmp_path, small_params)
  eager = flat(t5x_checkpoints.load_t5x_checkpoint(path, restore_dtype=restore_dtype)["target"])
  lazy = flat(_lazy_target(path, restore_dtype))
  assert lazy.keys() == eager.keys()
  for name, array in eager.items():
    leaf = lazy[name]
    assert (leaf.name, leaf.shape, leaf.dtype) == (f"target/{name}", array.shape, array.dtype)
    assert array.dtype == DTYPES[restore_dtype]
    whole = tuple(slice(None) for _ in array.shape)
    middle = tuple(slice(n // 4, n // 4 + max(1, n // 2)) for n in array.shape)
    corner = tuple(slice(n - 1, n) for n in array.shape)
    for index in (whole, middle, corner):
      values = leaf.read(index)
      assert values.dtype == DTYPES[restore_dtype], (name, index)
      np.testing.assert_array_equal(values, array[index], err_msg=f"{name} {index}")
    np.testing.assert_array_equal(leaf.read(), array, err_msg=name)


def test_a_lazy_array_reads_only_the_chunks_of_its_slice(tmp_path, small_params):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params)  # embedding [40, 8], chunks [20, 4]
  os.remove(os.path.join(ckpt_dir, "target.token_embedder.embedding", "1.1"))  # [20:40, 4:8]
  embedding = _lazy_target(tmp_path)["token_embedder"]["embedding"]
  expected = small_params["token_embedder"]["embedding"].astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(embedding.read((slice(0, 20), slice(0, 8))), expected[:20])
  np.testing.assert_array_equal(embedding.read((slice(20, 40), slice(0, 4))), expected[20:, :4])
  with pytest.raises(
      ValueError, match=r"cannot read array 'target/token_embedder/embedding' from .*embedding"
  ):
    embedding.read((slice(30, 40), slice(3, 5)))


def test_a_lazy_array_refuses_nan_in_the_slice_it_reads(tmp_path, small_params):
  ckpt_dir = _write_t5x_checkpoint(tmp_path, 1, small_params, compressor="zstd")
  chunk = os.path.join(ckpt_dir, "target.token_embedder.embedding", "0.1")  # [0:20, 4:8]
  values = small_params["token_embedder"]["embedding"][:20, 4:].astype(ml_dtypes.bfloat16)
  with open(chunk, "rb") as f:
    data = f.read()
  with open(chunk, "wb") as f:
    f.write(_nan_bits(data, values, 5))  # Row 1, column 5 of the array.
  embedding = _lazy_target(tmp_path)["token_embedder"]["embedding"]
  embedding.read((slice(0, 20), slice(0, 4)))  # the finite chunks
  embedding.read((slice(20, 40), slice(0, 8)))
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
      match=re.escape(
          f"checkpoint {ckpt_dir} holds NaN or inf in 1 parameter(s):\n"
          "  target/token_embedder/embedding (40, 8), its slice [0:10, 2:8]: 1 NaN and 0 inf of "
          "60 values, the first at index (1, 5)\n"
      ),
  ):
    embedding.read((slice(0, 10), slice(2, 8)))
  unchecked = _lazy_target(tmp_path, check_finite=False)["token_embedder"]["embedding"]
  assert np.isnan(unchecked.read((slice(0, 10), slice(2, 8)))[1, 3])
