"""benchmarks/device_init.py and hf_device.py: random parameters drawn on the device a leaf at a
time, the truncated shared-encoder drafter, and the same arrays as a Hugging Face T5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
import device_init
from speculative_t5x import network

# Three decoder layers (HF sizes its decoder cache by num_layers, the encoder's: as many).
CONFIG = tiny_config(64, num_encoder_layers=3, num_decoder_layers=3)


def test_random_params_have_the_networks_tree_dtype_and_scales():
  params = device_init.random_params_on_device(CONFIG, 0, jnp.bfloat16)
  assert jax.tree.map(lambda x: tuple(x.shape), params) == network.param_shapes(CONFIG)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  reference = network.init_params(CONFIG, jax.random.PRNGKey(0))
  mlp = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"].astype(jnp.float32)
  assert float(jnp.std(mlp)) == pytest.approx(
      float(jnp.std(reference["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"])), rel=0.2
  )
  assert float(jnp.min(params["encoder"]["encoder_norm"]["scale"])) == 1.0
  abstract = device_init.abstract_params(CONFIG)
  assert device_init.tree_bytes(abstract) == device_init.tree_bytes(params)
  assert device_init.tree_bytes(params) == 2 * sum(x.size for x in jax.tree.leaves(params))


def test_truncated_shared_encoder_is_the_targets_own_arrays():
  params = device_init.random_params_on_device(CONFIG, 1, jnp.float32)
  drafter, drafter_params = device_init.truncated_shared_encoder(CONFIG, params, 2)
  assert drafter.config.num_decoder_layers == 2 and drafter.encoder_emb_dim == CONFIG.emb_dim
  assert jax.tree.map(lambda x: tuple(x.shape), drafter_params) == drafter.param_shapes()
  assert drafter_params["decoder"]["layers_1"] is params["decoder"]["layers_1"]
  assert "layers_2" not in drafter_params["decoder"]
  with pytest.raises(ValueError, match="num_layers"):
    device_init.truncated_shared_encoder(CONFIG, params, 4)


def test_copy_bandwidth_is_positive():
  measured = device_init.copy_bandwidth(megabytes=1.0, repeats=2)
  assert measured["bytes"] == 2**20 and measured["bytes_per_s"] > 0


def test_hf_model_on_device_reproduces_our_logits():
  torch = pytest.importorskip("torch", reason="needs torch (the test extras)")
  pytest.importorskip("transformers", reason="needs transformers (the test extras)")
  import hf_device  # pylint: disable=g-import-not-at-top

  params = device_init.random_params_on_device(CONFIG, 2, jnp.float32)
  model = hf_device.to_hf_model_on_device(params, CONFIG, torch.float32)
  assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()  # untied head
  tokens = np.array([[5, 9, 3, 17, 1]], np.int32)
  decoder = np.array([[0, 7, 8]], np.int32)
  ours = network.teacher_forced_logits(CONFIG, params, jnp.asarray(tokens), jnp.asarray(decoder))
  with torch.inference_mode():
    theirs = model(
        input_ids=torch.from_numpy(tokens).long(),
        decoder_input_ids=torch.from_numpy(decoder).long(),
    ).logits.numpy()
  np.testing.assert_allclose(theirs, np.asarray(ours), atol=1e-4)
