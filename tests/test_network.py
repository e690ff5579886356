"""Tests of the T5 1.1 network: T5X parity, k-token cached decoding with rollback, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from conftest import FIXTURE_CONFIG, fixture_path, tiny_config
from speculative_t5x import network

# T5X's minimal T5 1.1 tree (T5X's t5_1_1 network), written out by hand.
_T5X_LAYER_PATHS = {
    "encoder": [
        "pre_attention_layer_norm/scale",
        "attention/query/kernel",
        "attention/key/kernel",
        "attention/value/kernel",
        "attention/out/kernel",
        "pre_mlp_layer_norm/scale",
        "mlp/wi_0/kernel",
        "mlp/wi_1/kernel",
        "mlp/wo/kernel",
    ],
    "decoder": ["pre_self_attention_layer_norm/scale"]
    + [f"self_attention/{p}/kernel" for p in ("query", "key", "value", "out")]
    + ["pre_cross_attention_layer_norm/scale"]
    + [f"encoder_decoder_attention/{p}/kernel" for p in ("query", "key", "value", "out")]
    + ["pre_mlp_layer_norm/scale", "mlp/wi_0/kernel", "mlp/wi_1/kernel", "mlp/wo/kernel"],
}

TINY = tiny_config(61, num_encoder_layers=2)


def _paths(tree, prefix=""):
  out = set()
  for key, value in tree.items():
    path = f"{prefix}{key}"
    out |= _paths(value, path + "/") if isinstance(value, dict) else {path}
  return out


def _expected_t5x_paths(num_layers):
  paths = {
      "token_embedder/embedding",
      "encoder/relpos_bias/rel_embedding",
      "encoder/encoder_norm/scale",
      "decoder/relpos_bias/rel_embedding",
      "decoder/decoder_norm/scale",
      "decoder/logits_dense/kernel",
  }
  for stack, layer_paths in _T5X_LAYER_PATHS.items():
    for i in range(num_layers):
      paths |= {f"{stack}/layers_{i}/{p}" for p in layer_paths}
  return paths


def test_parameter_tree_equals_t5x():
  params = network.param_shapes(FIXTURE_CONFIG)
  assert _paths(params) == _expected_t5x_paths(2)
  assert params["encoder"]["layers_0"]["attention"]["query"]["kernel"] == (8, 12)
  assert params["encoder"]["layers_0"]["attention"]["out"]["kernel"] == (12, 8)
  assert params["decoder"]["logits_dense"]["kernel"] == (8, 32128)
  assert params["encoder"]["relpos_bias"]["rel_embedding"] == (4, 32)


def _fixture_params():
  raw = serialization.msgpack_restore(fixture_path("test_t5_tiny.checkpoint_0").read_bytes())
  return raw["optimizer"]["target"]


def test_fixture_tree_and_logits_match_t5x():
  params = _fixture_params()
  shapes = jax.tree.map(lambda x: tuple(x.shape), params)
  assert shapes == network.param_shapes(FIXTURE_CONFIG)
  ref = np.load(fixture_path("t5x_tiny_reference.npz"))
  logits = network.Transformer(FIXTURE_CONFIG).apply(
      {"params": params},
      ref["encoder_input_tokens"],
      ref["decoder_input_tokens"],
      ref["decoder_target_tokens"],
  )
  logits = np.asarray(logits)
  assert logits.dtype == np.float32
  np.testing.assert_allclose(logits[..., :2048], ref["logits_first_2048"], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(logits.argmax(-1), ref["logits_argmax"])
  np.testing.assert_allclose(jax.nn.logsumexp(logits, -1), ref["logits_logsumexp"], atol=1e-5)


@functools.lru_cache(maxsize=None)
def _tiny_params(seed=0):
  return network.init_params(TINY, jax.random.PRNGKey(seed))


@functools.partial(jax.jit, static_argnums=(2,))
def _init_cache(params, enc_tokens, cache_length):
  model = network.Transformer(TINY)
  encoded = model.apply({"params": params}, enc_tokens, method=model.encode)
  return model.apply(
      {"params": params}, encoded, enc_tokens, cache_length, method=model.init_decode_cache
  )


@jax.jit
def _decode(params, tokens, cache, cache_index):
  model = network.Transformer(TINY)
  return model.apply({"params": params}, tokens, cache, cache_index, method=model.decode)


def test_cached_blocks_with_rollback_match_teacher_forcing():
  """Chunks of 1, 3, 1, 5, 2 at different per-row offsets, with garbage written then rolled back."""
  rng = np.random.default_rng(0)
  batch, length = 3, 14
  params = _tiny_params()
  enc = rng.integers(1, TINY.vocab_size, (batch, 9)).astype(np.int32)
  enc[1, 6:] = 0  # ragged encoder inputs
  enc[2, 3:] = 0
  targets = rng.integers(1, TINY.vocab_size, (batch, length)).astype(np.int32)
  dec_inputs = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], axis=1)
  expected = np.asarray(
      network.Transformer(TINY).apply({"params": params}, enc, dec_inputs, targets)
  )

  cache = _init_cache(params, enc, length + 5)
  index = np.array([0, 2, 1], np.int32)
  # Rows 1 and 2 first get a prefix in one block (rows start at different offsets).
  for b, n in ((1, 2), (2, 1)):
    block = np.zeros((batch, 5), np.int32)
    block[b, :n] = dec_inputs[b, :n]
    _, cache = _decode(params, block, cache, np.where(np.arange(batch) == b, 0, 9).astype(np.int32))
  checked = np.zeros((batch, length), bool)
  schedule = [1, 3, 1, 5, 2]
  step = 0
  while index.min() < length:  # rows past the end keep writing into spare slots, unchecked.
    k = schedule[step % len(schedule)]
    if step == 2:  # write garbage at every row, then roll back: stale slots must be masked.
      garbage = rng.integers(1, TINY.vocab_size, (batch, k)).astype(np.int32)
      _, cache = _decode(params, garbage, cache, index)
    pos = index[:, None] + np.arange(k)[None]
    tokens = np.take_along_axis(dec_inputs, np.minimum(pos, length - 1), axis=1)
    logits, cache = _decode(params, tokens, cache, index)
    logits = np.asarray(logits)
    for b in range(batch):
      for j in range(k):
        if pos[b, j] < length:
          np.testing.assert_allclose(logits[b, j], expected[b, pos[b, j]], atol=1e-5, rtol=0)
          checked[b, pos[b, j]] = True
    index = np.minimum(index + k, length)
    step += 1
  assert checked[:, 2:].all()


def test_decode_logits_equal_in_bfloat16_roughly():
  cfg = TINY.replace(dtype="bfloat16")
  params = _tiny_params()
  model = network.Transformer(cfg)
  enc = jnp.array([[5, 6, 7, 0]], jnp.int32)
  dec = jnp.array([[0, 3, 4]], jnp.int32)
  tgt = jnp.array([[3, 4, 1]], jnp.int32)
  full = model.apply({"params": params}, enc, dec, tgt)
  assert full.dtype == jnp.float32
  encoded = model.apply({"params": params}, enc, method=model.encode)
  assert encoded.dtype == jnp.bfloat16
  cache = model.apply({"params": params}, encoded, enc, 6, method=model.init_decode_cache)
  assert cache["layers_0"]["self_key"].dtype == jnp.bfloat16
  logits, _ = model.apply(
      {"params": params}, dec, cache, jnp.zeros((1,), jnp.int32), method=model.decode
  )
  np.testing.assert_allclose(logits, full, atol=0.1)


def test_relative_position_buckets_match_t5_definition():
  # Hand-derived from T5's definition: causal, 32 buckets, max_exact 16, max_distance 128.
  rel = -np.array([0, 1, 15, 16, 20, 127, 128, 1000])
  np.testing.assert_array_equal(
      network.relative_position_bucket(rel, False, 32, 128), [0, 1, 15, 16, 17, 31, 31, 31]
  )
  # Bidirectional: 16 buckets per sign, future keys offset by 16.
  np.testing.assert_array_equal(
      network.relative_position_bucket(np.array([0, 1, -1, 7, 8]), True, 32, 128),
      [0, 17, 1, 23, 24],
  )


# (field, bad value, what the message must say): each names the field and the value.
BAD_CONFIGS = [
    ("vocab_size", 32.5, r"vocab_size must be an int, got 32\.5 \(float\)"),
    ("vocab_size", "32128", r"vocab_size must be an int, got '32128' \(str\)"),
    ("vocab_size", True, r"vocab_size must be an int, got True \(bool\)"),
    ("vocab_size", 0, r"vocab_size must be >= 1, got 0"),
    ("emb_dim", -8, r"emb_dim must be >= 1, got -8"),
    ("num_heads", 0, r"num_heads must be >= 1, got 0"),
    ("head_dim", 0, r"head_dim must be >= 1, got 0"),
    ("mlp_dim", np.float32(32), r"mlp_dim must be an int, got .*32.* \(float32\)"),
    ("num_encoder_layers", 0, r"num_encoder_layers must be >= 1, got 0"),
    ("num_decoder_layers", None, r"num_decoder_layers must be an int, got None"),
    ("relative_attention_num_buckets", 0, r"relative_attention_num_buckets must be >= 4, got 0"),
    ("relative_attention_num_buckets", 2, r"relative_attention_num_buckets must be >= 4, got 2"),
    ("relative_attention_max_distance", 0, r"relative_attention_max_distance must be >= 1, got 0"),
    (
        "relative_attention_max_distance",
        16,
        r"relative_attention_max_distance must be > relative_attention_num_buckets // 2 = 16, "
        r"got 16",
    ),
    ("dropout_rate", 1.0, r"dropout_rate must be in \[0, 1\), got 1\.0"),
    ("dropout_rate", -0.1, r"dropout_rate must be in \[0, 1\), got -0\.1"),
    ("dropout_rate", float("nan"), r"dropout_rate must be in \[0, 1\), got nan"),
    ("dropout_rate", "0.1", r"dropout_rate must be a number in \[0, 1\), got '0\.1'"),
    ("logits_via_embedding", 1, r"logits_via_embedding must be True or False, got 1 \(int\)"),
    ("float32_attention_logits", "no", r"float32_attention_logits must be True or False, got 'no'"),
    ("dtype", "int8", r"dtype 'int8' is not supported: use one of"),
    ("dtype", 3, r"dtype 3 is not a dtype: use one of"),
    (
        "mlp_activations",
        ("gelu", "swiglu"),
        r"mlp_activations \('gelu', 'swiglu'\) has unknown activation\(s\) \['swiglu'\]",
    ),
    ("mlp_activations", "gelu", r"mlp_activations must be a non-empty tuple .*, got 'gelu'"),
    ("mlp_activations", (), r"mlp_activations must be a non-empty tuple .*, got \(\)"),
]


@pytest.mark.parametrize(
    "field, value, message", BAD_CONFIGS, ids=[f"{f}={v!r}" for f, v, _ in BAD_CONFIGS]
)
def test_bad_config_names_the_field_and_the_value(field, value, message):
  with pytest.raises(ValueError, match=rf"^T5Config\.{message}"):
    TINY.replace(**{field: value})


def test_config_fields_are_normalized():
  config = TINY.replace(
      vocab_size=np.int64(61),
      emb_dim=np.int32(16),
      dropout_rate=np.float32(0.25),
      logits_via_embedding=np.bool_(True),
      mlp_activations=["gelu", "linear"],
      dtype=jnp.bfloat16,
      relative_attention_num_buckets=4,
      relative_attention_max_distance=3,
  )
  assert type(config.vocab_size) is int and type(config.emb_dim) is int  # noqa: E721
  assert type(config.dropout_rate) is float and config.dropout_rate == 0.25  # noqa: E721
  assert config.logits_via_embedding is True
  assert (config.mlp_activations, config.dtype) == (("gelu", "linear"), "bfloat16")
  assert config == TINY.replace(
      dropout_rate=0.25,
      logits_via_embedding=True,
      dtype="bfloat16",
      relative_attention_num_buckets=4,
      relative_attention_max_distance=3,
  )
  network.relative_position_bucket(np.arange(-9, 10), True, 4, 3)  # The smallest buckets work.


def test_bad_tokens_and_blocks():
  params = _tiny_params()
  model = network.Transformer(TINY)
  enc = np.ones((1, 4), np.int32)
  with pytest.raises(ValueError, match="rank-2"):
    model.apply({"params": params}, np.ones((4,), np.int32), method=model.encode)
  with pytest.raises(ValueError, match="integer token ids"):
    model.apply({"params": params}, np.ones((1, 4), np.float32), method=model.encode)
  cache = _init_cache(params, enc, 4)
  with pytest.raises(ValueError, match="does not fit a cache of length 4"):
    model.apply(
        {"params": params},
        np.ones((1, 5), np.int32),
        cache,
        np.zeros((1,), np.int32),
        method=model.decode,
    )
  with pytest.raises(ValueError, match="needs 6 cache slots"):
    model.apply(
        {"params": params},
        np.ones((1, 3), np.int32),
        cache,
        np.array([3], np.int32),
        method=model.decode,
    )
  with pytest.raises(ValueError, match="cache_index must have shape"):
    model.apply(
        {"params": params}, np.ones((1, 1), np.int32), cache, np.int32(0), method=model.decode
    )
