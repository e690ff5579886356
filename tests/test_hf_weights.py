"""Tests of the Hugging Face T5 weight mapping: exact round trips, file formats, errors, parity."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from flax import traverse_util

from conftest import FIXTURE_CONFIG, fixture_path, tiny_config
from speculative_t5x import network
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import hf_weights
from speculative_t5x.weights import t5x_checkpoints

T5_1_1 = tiny_config(48, head_dim=4, mlp_dim=24, num_encoder_layers=2, num_decoder_layers=3)
# T5 1.0-style: one relu `wi` and the head tied to the embedding (rescaled by emb_dim**-0.5).
T5_1_0 = T5_1_1.replace(mlp_activations=("relu",), logits_via_embedding=True)


def _params(config, seed=0):
  return jax.tree.map(np.asarray, network.init_params(config, jax.random.PRNGKey(seed)))


def _assert_trees_equal(actual, expected):
  actual = traverse_util.flatten_dict(actual, sep="/")
  expected = traverse_util.flatten_dict(expected, sep="/")
  assert actual.keys() == expected.keys()
  for key, value in expected.items():
    assert actual[key].dtype == value.dtype, key
    np.testing.assert_array_equal(actual[key], value, err_msg=key)


def test_state_dict_has_hf_keys_and_layouts():
  params = _params(T5_1_1)
  state = hf_weights.params_to_hf_state_dict(params, T5_1_1)
  assert len(state) == 1 + 2 * (1 + 1) + 2 * 9 + 3 * 14 + 1  # shared, relpos+norm, layers, head
  np.testing.assert_array_equal(
      state["lm_head.weight"], params["decoder"]["logits_dense"]["kernel"].T
  )
  np.testing.assert_array_equal(state["shared.weight"], params["token_embedder"]["embedding"])
  np.testing.assert_array_equal(
      state["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
      params["encoder"]["relpos_bias"]["rel_embedding"].T,
  )
  np.testing.assert_array_equal(
      state["decoder.block.2.layer.1.EncDecAttention.o.weight"],
      params["decoder"]["layers_2"]["encoder_decoder_attention"]["out"]["kernel"].T,
  )
  np.testing.assert_array_equal(
      state["decoder.block.1.layer.2.DenseReluDense.wi_1.weight"],
      params["decoder"]["layers_1"]["mlp"]["wi_1"]["kernel"].T,
  )
  assert "encoder.block.1.layer.1.DenseReluDense.wi.weight" in (
      hf_weights.params_to_hf_state_dict(_params(T5_1_0), T5_1_0)
  )


@pytest.mark.parametrize("config", [T5_1_1, T5_1_0], ids=["t5_1_1", "t5_1_0"])
def test_state_dict_round_trip_is_exact(config):
  params = _params(config)
  _assert_trees_equal(
      hf_weights.params_from_hf_state_dict(
          hf_weights.params_to_hf_state_dict(params, config), config
      ),
      params,
  )


def test_safetensors_directory_round_trip_is_exact(tmp_path):
  params = _params(T5_1_1)
  hf_weights.save_hf(tmp_path, params, T5_1_1)
  assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
  restored, config = hf_weights.load_hf(tmp_path)
  assert config == T5_1_1
  _assert_trees_equal(restored, params)


def test_pytorch_bin_in_bfloat16_loads(tmp_path):
  params = _params(T5_1_1)
  state = hf_weights.params_to_hf_state_dict(params, T5_1_1)
  torch.save(
      {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in state.items()},
      tmp_path / "pytorch_model.bin",
  )
  (tmp_path / "config.json").write_text(json.dumps(hf_weights.hf_config_dict(T5_1_1)))
  restored, _ = hf_weights.load_hf(tmp_path)
  _assert_trees_equal(
      restored, jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), params)
  )


def test_sharded_safetensors_with_embed_tokens_aliases(tmp_path):
  params = _params(T5_1_1)
  state = hf_weights.params_to_hf_state_dict(params, T5_1_1)
  state["encoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] = state.pop(
      "shared.weight"
  )
  keys = sorted(state)
  shards = {
      "model-00001-of-00002.safetensors": keys[:20],
      "model-00002-of-00002.safetensors": keys[20:],
  }
  for name, shard_keys in shards.items():
    safetensors.numpy.save_file({k: state[k] for k in shard_keys}, tmp_path / name)
  weight_map = {k: name for name, shard_keys in shards.items() for k in shard_keys}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  _assert_trees_equal(
      hf_weights.params_from_hf_state_dict(hf_weights.load_hf_state_dict(tmp_path), T5_1_1), params
  )


def test_hf_config_round_trip_and_the_transformers_5_tie_trap():
  hf_dict = hf_weights.hf_config_dict(T5_1_1)
  assert hf_dict["feed_forward_proj"] == "gated-gelu" and hf_dict["tie_word_embeddings"] is False
  assert hf_weights.t5_config_from_hf(hf_dict) == T5_1_1
  assert hf_weights.t5_config_from_hf(hf_weights.hf_config_dict(T5_1_0)) == T5_1_0
  # transformers 5.x writes tie_word_embeddings=True even for an untied T5 1.1 head.
  written_by_5x = transformers.T5Config(**hf_dict).to_dict()
  assert hf_weights.t5_config_from_hf(written_by_5x, dtype="bfloat16") == T5_1_1.replace(
      dtype="bfloat16"
  )


def test_unsupported_hf_config():
  with pytest.raises(ValueError, match="feed_forward_proj 'gelu'"):
    hf_weights.t5_config_from_hf(dict(hf_weights.hf_config_dict(T5_1_1), feed_forward_proj="gelu"))
  with pytest.raises(ValueError, match="no HF T5 equivalent"):
    hf_weights.hf_config_dict(T5_1_1.replace(mlp_activations=("gelu",)))


def test_bad_state_dict_lists_every_key():
  state = hf_weights.params_to_hf_state_dict(_params(T5_1_1), T5_1_1)
  del state["decoder.block.2.layer.0.SelfAttention.q.weight"]
  state["lm_head.weight"] = state["lm_head.weight"][:, :8]
  state["encoder.block.9.layer.0.layer_norm.weight"] = np.ones(16, np.float32)
  with pytest.raises(ValueError) as info:
    hf_weights.params_from_hf_state_dict(state, T5_1_1)
  message = str(info.value)
  assert "missing: decoder.block.2.layer.0.SelfAttention.q.weight (8, 16)" in message
  assert "wrong shape: lm_head.weight is (48, 8), the config needs (48, 16)" in message
  assert "extra: encoder.block.9.layer.0.layer_norm.weight" in message


def test_disagreeing_embedding_aliases_are_rejected():
  state = hf_weights.params_to_hf_state_dict(_params(T5_1_1), T5_1_1)
  state["decoder.embed_tokens.weight"] = state["shared.weight"] + 1
  with pytest.raises(ValueError, match="decoder.embed_tokens.weight differs from shared.weight"):
    hf_weights.params_from_hf_state_dict(state, T5_1_1)


def test_missing_hf_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf_weights.load_hf_state_dict(tmp_path)
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_weights.load_hf(tmp_path)


def _hf_logits(model, encoder_tokens, decoder_input_tokens):
  with torch.no_grad():
    return model(
        input_ids=torch.from_numpy(encoder_tokens),
        attention_mask=torch.from_numpy(encoder_tokens > 0),
        decoder_input_ids=torch.from_numpy(decoder_input_tokens),
    ).logits.numpy()


@pytest.mark.parametrize("config", [T5_1_1, T5_1_0], ids=["t5_1_1", "t5_1_0"])
def test_transformers_gives_our_logits(config):
  params = _params(config, seed=3)
  rng = np.random.default_rng(0)
  encoder_tokens = rng.integers(2, config.vocab_size, (3, 9)).astype(np.int32)
  encoder_tokens[1, 6:] = 0  # Padding.
  targets = rng.integers(2, config.vocab_size, (3, 7)).astype(np.int32)
  decoder_inputs = np.concatenate([np.zeros((3, 1), np.int32), targets[:, :-1]], axis=1)
  ours = network.Transformer(config).apply(
      {"params": params}, encoder_tokens, decoder_inputs, targets
  )
  model = hf_weights.to_hf_model(params, config)
  assert (model.lm_head.weight is model.shared.weight) == config.logits_via_embedding
  np.testing.assert_allclose(
      _hf_logits(model, encoder_tokens, decoder_inputs), np.asarray(ours), atol=1e-4
  )


def test_transformers_reproduces_t5x_on_the_tiny_checkpoint():
  params = checkpoints.restore_params(FIXTURE_CONFIG, fixture_path("test_t5_tiny.checkpoint_0"))
  ref = np.load(fixture_path("t5x_tiny_reference.npz"))
  logits = _hf_logits(
      hf_weights.to_hf_model(params, FIXTURE_CONFIG),
      ref["encoder_input_tokens"],
      ref["decoder_input_tokens"],
  )
  np.testing.assert_allclose(logits[..., :2048], ref["logits_first_2048"], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Damaged files: refused with the file named; NaN or inf refused by default with the key named.
# ----------------------------------------------------------------------------------------------
_WO = "decoder.block.1.layer.2.DenseReluDense.wo.weight"  # [emb_dim 16, mlp_dim 24]


def _with_nan_bits(data: bytes, values: np.ndarray, index: int) -> bytes:
  """`data` with bits of float32 element `index` of `values` (stored verbatim in `data`) flipped
  to make it a NaN, as a damaged copy could."""
  start = data.find(values.tobytes())
  assert start >= 0, "the tensor is not stored verbatim"
  bits = np.frombuffer(values.tobytes(), np.uint32).copy()
  bits[index] |= 0x7FC00000
  return data[:start] + bits.tobytes() + data[start + values.nbytes :]


def test_safetensors_file_with_flipped_bits_is_refused(tmp_path):
  params = _params(T5_1_1)
  hf_weights.save_hf(tmp_path, params, T5_1_1)
  wo = hf_weights.params_to_hf_state_dict(params, T5_1_1)[_WO]
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(_with_nan_bits(weights.read_bytes(), wo, 24 * 2 + 7))
  with pytest.raises(
      t5x_checkpoints.NonFiniteWeightsError,
      match=rf"HF checkpoint {tmp_path} holds NaN or inf in 1 parameter\(s\):\n  {_WO} \(16, 24\): "
      r"1 NaN and 0 inf of 384 values, the first at index \(2, 7\)",
  ):
    hf_weights.load_hf(tmp_path)
  restored, _ = hf_weights.load_hf(tmp_path, check_finite=False)
  assert np.isnan(restored["decoder"]["layers_1"]["mlp"]["wo"]["kernel"][7, 2])


def test_state_dict_with_inf_and_tied_nan_embeddings_is_refused():
  state = hf_weights.params_to_hf_state_dict(_params(T5_1_1), T5_1_1)
  state["shared.weight"][3, 0] = np.nan
  state["encoder.embed_tokens.weight"] = state["shared.weight"]  # A tied copy: NaN where it is.
  state["lm_head.weight"] = torch.from_numpy(state["lm_head.weight"]).to(torch.bfloat16)
  state["lm_head.weight"][0, 1] = -float("inf")
  with pytest.raises(t5x_checkpoints.NonFiniteWeightsError) as info:
    hf_weights.params_from_hf_state_dict(state, T5_1_1)
  message = str(info.value)
  assert message.startswith("HF state dict holds NaN or inf in 2 parameter(s)")
  assert "  shared.weight (48, 16): 1 NaN and 0 inf" in message
  assert "  lm_head.weight (48, 16): 0 NaN and 1 inf" in message
  assert "differs" not in message
  params = hf_weights.params_from_hf_state_dict(state, T5_1_1, check_finite=False)
  assert np.isnan(params["token_embedder"]["embedding"][3, 0])


def test_pytorch_bin_with_a_flipped_byte_fails_its_crc(tmp_path):
  params = _params(T5_1_1)
  state = hf_weights.params_to_hf_state_dict(params, T5_1_1)
  (tmp_path / "config.json").write_text(json.dumps(hf_weights.hf_config_dict(T5_1_1)))
  weights = tmp_path / "pytorch_model.bin"
  torch.save({k: torch.from_numpy(v) for k, v in state.items()}, weights)
  data = bytearray(weights.read_bytes())
  data[data.find(state[_WO].tobytes()) + 5] ^= 0x01  # Finite, but no longer the weight saved.
  weights.write_bytes(bytes(data))
  with pytest.raises(
      ValueError, match=r"pytorch_model.bin is damaged: its record '[\w/]+/data/\d+' fails its CRC"
  ):
    hf_weights.load_hf(tmp_path)


@pytest.mark.parametrize(
    "damage",
    ["safetensors_header", "safetensors_truncated", "bin_truncated", "bin_not_a_torch_file"],
)
def test_unreadable_hf_files_are_named(tmp_path, damage):
  params = _params(T5_1_1)
  state = hf_weights.params_to_hf_state_dict(params, T5_1_1)
  if damage.startswith("safetensors"):
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(state, path)
  else:
    path = tmp_path / "pytorch_model.bin"
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)
  data = path.read_bytes()
  if damage == "safetensors_header":
    data = data[:8] + b"[" + data[9:]  # The header's JSON no longer parses.
  elif damage == "bin_not_a_torch_file":
    data = b"not a zip archive" + data
  else:
    data = data[: len(data) - 100]
  path.write_bytes(data)
  kind = "safetensors" if damage.startswith("safetensors") else "(torch|zip)"
  with pytest.raises(
      ValueError, match=rf"HF checkpoint file {path} (is not a readable {kind}|is a damaged {kind})"
  ):
    hf_weights.load_hf_state_dict(tmp_path)
