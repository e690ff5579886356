"""Tests of the T5 1.1 network: T5X parity, k-token cached decoding with rollback, tree attention
and cache compaction, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization, traverse_util

from conftest import FIXTURE_CONFIG, fixture_path, tiny_config
from speculative_t5x import layers, network, trees

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
  layers.relative_position_bucket(np.arange(-9, 10), True, 4, 3)  # The smallest buckets work.


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


# ----------------------------------------------------------------------------------------------
# Tree attention: one call scores a static draft tree; `move_cache_slots` compacts a path.
# ----------------------------------------------------------------------------------------------
# Shapes shared with the tests above (batch 3, encoder length 9, cache length 19), so the cache
# set-up and the chain decodes reuse their compiled functions.
_TREE_CACHE_LENGTH = 19
_ROOT_SLOT = np.array([2, 0, 1], np.int32)  # ragged cache_index: the prefix length of each row
# A tree that is no full branching: the root has 3 children, they have 2, 0 and 1, and so on.
_GENERAL_TREE = trees.DraftTree((0, 0, 0, 1, 1, 3, 4, 6, 6))


@functools.partial(jax.jit, static_argnames=("tree", "slots"))
def _tree_decode(params, tokens, cache, cache_index, tree, slots=None):
  model = network.Transformer(TINY)
  return model.apply(
      {"params": params}, tokens, cache, cache_index, tree=tree, slots=slots, method=model.decode
  )


@jax.jit
def _teacher_forced(params, enc, dec_inputs):
  return network.teacher_forced_logits(TINY, params, enc, dec_inputs)


_move_cache_slots = jax.jit(network.move_cache_slots)


@functools.lru_cache(maxsize=None)
def _tree_setup():
  """-> (encoder tokens [3, 9], decoder inputs [3, 8] (BOS, random), a cache holding each row's
  prefix inputs[b, :_ROOT_SLOT[b]] and garbage after it, written by two chain decodes)."""
  rng = np.random.default_rng(1)
  enc = rng.integers(1, TINY.vocab_size, (3, 9)).astype(np.int32)
  enc[1, 5:] = 0
  inputs = rng.integers(1, TINY.vocab_size, (3, 8)).astype(np.int32)
  inputs[:, 0] = 0
  params = _tiny_params()
  cache = _init_cache(params, enc, _TREE_CACHE_LENGTH)
  written = rng.integers(1, TINY.vocab_size, (3, 10)).astype(np.int32)
  prefix = np.arange(10)[None] < _ROOT_SLOT[:, None]
  written[prefix] = np.pad(inputs, ((0, 0), (0, 2)))[prefix]
  for start in (0, 5):
    _, cache = _decode(params, written[:, start : start + 5], cache, np.full(3, start, np.int32))
  return enc, inputs, cache


def _tree_block(tree, seed):
  """-> tokens [3, tree.width]: each row's root (its input at _ROOT_SLOT) and random drafts."""
  _, inputs, _ = _tree_setup()
  drafts = np.random.default_rng(seed).integers(0, TINY.vocab_size, (3, tree.num_nodes))
  roots = inputs[np.arange(3), _ROOT_SLOT]
  return np.concatenate([roots[:, None], drafts], axis=1).astype(np.int32)


def _teacher_forced_at(sequences, rows, positions):
  """sequences: decoder inputs of rows of the setup's batch -> logits [n, V] at `positions`.

  One compiled shape: the sequences are padded to 8 tokens and 64 rows (later tokens cannot
  change earlier logits)."""
  enc, _, _ = _tree_setup()
  n = len(sequences)
  dec = np.ones((64, 8), np.int32)
  for i, seq in enumerate(sequences):
    dec[i, : len(seq)] = seq
  enc_rows = enc[np.pad(np.asarray(rows), (0, 64 - n))]
  logits = np.asarray(_teacher_forced(_tiny_params(), enc_rows, dec))
  return logits[np.arange(n), positions]


def _path_inputs(tree, block, row, slot):
  """The decoder inputs up to block slot `slot` of `row`: prefix, root, the drafts on its path."""
  _, inputs, _ = _tree_setup()
  path = tree.paths[slot, : tree.depths[slot]]
  return np.concatenate([inputs[row, : _ROOT_SLOT[row] + 1], block[row, path]])


def test_chain_tree_equals_chain_decode():
  params = _tiny_params()
  _, _, cache = _tree_setup()
  tokens = np.random.default_rng(2).integers(1, TINY.vocab_size, (3, 5)).astype(np.int32)
  chain_logits, chain_cache = _decode(params, tokens, cache, _ROOT_SLOT)
  tree_logits, tree_cache = _tree_decode(
      params, tokens, cache, _ROOT_SLOT, tree=trees.DraftTree.chain(4)
  )
  np.testing.assert_allclose(tree_logits, chain_logits, atol=1e-6, rtol=0)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), tree_cache, chain_cache
  )


TREES = [
    trees.DraftTree.from_branching((3, 2)),
    trees.DraftTree.from_branching((2, 2, 1)),
    trees.DraftTree.from_branching((4, 1, 1, 1)),
    _GENERAL_TREE,
]


@pytest.mark.parametrize("tree", TREES, ids=[str(t.parents) for t in TREES])
def test_tree_logits_equal_teacher_forcing_of_each_path(tree):
  """Slot b's logits are the target's at prefix + root + the drafts on b's path, in every row
  (ragged prefixes; stale garbage after each prefix must stay masked)."""
  _, _, cache = _tree_setup()
  block = _tree_block(tree, seed=3)
  logits, _ = _tree_decode(_tiny_params(), block, cache, _ROOT_SLOT, tree=tree)
  rows, slots = np.divmod(np.arange(3 * tree.width), tree.width)
  expected = _teacher_forced_at(
      [_path_inputs(tree, block, r, s) for r, s in zip(rows, slots)],
      rows,
      _ROOT_SLOT[rows] + tree.depths[slots],
  )
  np.testing.assert_allclose(
      np.asarray(logits).reshape(-1, TINY.vocab_size), expected, atol=1e-5, rtol=0
  )


def test_tree_fed_level_by_level_equals_one_call():
  """A drafter's use: one call per depth, earlier depths' keys read back from the cache (the
  slots after each depth hold garbage until it is fed)."""
  tree = TREES[0]  # (3, 2): its whole-tree call is compiled for the test above too
  params = _tiny_params()
  _, _, cache = _tree_setup()
  block = _tree_block(tree, seed=4)
  whole_logits, whole_cache = _tree_decode(params, block, cache, _ROOT_SLOT, tree=tree)
  level_logits = []
  for start, stop in tree.levels:
    logits, cache = _tree_decode(
        params, block[:, start:stop], cache, _ROOT_SLOT, tree=tree, slots=(start, stop)
    )
    level_logits.append(logits)
  np.testing.assert_allclose(np.concatenate(level_logits, axis=1), whole_logits, atol=1e-5, rtol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), cache, whole_cache)


def test_moving_an_accepted_path_makes_the_cache_a_chain():
  """After the move, decoding the next token after a depth-3 leaf, a depth-2 node and the root
  (no draft accepted) matches teacher forcing of prefix + root + path + that token."""
  tree = _GENERAL_TREE
  params = _tiny_params()
  _, _, cache = _tree_setup()
  block = _tree_block(tree, seed=5)
  _, cache = _tree_decode(params, block, cache, _ROOT_SLOT, tree=tree)
  accepted = np.array([9, 6, 0])
  assert list(tree.depths[accepted]) == [3, 2, 0]
  moved = _move_cache_slots(cache, _ROOT_SLOT + 1, _ROOT_SLOT[:, None] + tree.paths[accepted])
  for name in ("cross_key", "cross_value"):
    np.testing.assert_array_equal(moved["layers_1"][name], cache["layers_1"][name])
  np.testing.assert_array_equal(moved["encoder_valid"], cache["encoder_valid"])
  index = _ROOT_SLOT + tree.depths[accepted] + 1
  token = np.array([[7], [11], [13]], np.int32)
  logits, _ = _decode(params, token, moved, index.astype(np.int32))
  expected = _teacher_forced_at(
      [np.append(_path_inputs(tree, block, r, s), token[r]) for r, s in enumerate(accepted)],
      np.arange(3),
      index,
  )
  np.testing.assert_allclose(logits[:, 0], expected, atol=1e-5, rtol=0)


def test_bad_tree_blocks_name_the_problem():
  params = _tiny_params()
  model = network.Transformer(TINY)
  _, _, cache = _tree_setup()
  tree = _GENERAL_TREE  # width 10

  def decode(width, index=_ROOT_SLOT, **kwargs):
    tokens = np.ones((3, width), np.int32)
    model.apply({"params": params}, tokens, cache, index, method=model.decode, **kwargs)

  for slots in ((0, 11), (2, 2), (-1, 1), (4, 3)):
    with pytest.raises(ValueError, match=r"slots \(.*\) must satisfy 0 <= start < stop <= "):
      decode(1, tree=tree, slots=slots)
  for slots in ((1,), (0.0, 2), "01", (True, 2)):
    with pytest.raises(ValueError, match="slots must be a .start, stop. pair of static ints"):
      decode(1, tree=tree, slots=slots)
  with pytest.raises(ValueError, match=r"holds 2 tokens per row but slots \(1, 4\) name 3 block"):
    decode(2, tree=tree, slots=(1, 4))
  with pytest.raises(ValueError, match="tree must be a trees.DraftTree or None, got .2, 1."):
    decode(7, tree=(2, 1))
  with pytest.raises(ValueError, match="slots=.0, 2. picks block slots of a draft tree"):
    decode(2, slots=(0, 2))
  with pytest.raises(ValueError, match="tree block slots 0..9 at cache_index 10 needs 20 cache"):
    decode(10, np.array([10, 0, 0], np.int32), tree=tree)
  with pytest.raises(ValueError, match="up to slot 19 does not fit a cache of length 19"):
    decode(20, tree=trees.DraftTree.chain(19))
  with pytest.raises(ValueError, match=r"destination \[batch\] = \(3,\) and sources"):
    network.move_cache_slots(cache, np.zeros((3, 1), np.int32), np.zeros((3, 2), np.int32))
  with pytest.raises(ValueError, match=r"writes up to slot 19, but the cache has slots 0..18"):
    network.move_cache_slots(cache, np.array([17, 0, 0]), np.zeros((3, 3), np.int32))
  with pytest.raises(ValueError, match=r"reads slots -1..0"):
    network.move_cache_slots(cache, np.zeros(3, np.int32), -np.eye(3, 2, dtype=np.int32))


# ----------------------------------------------------------------------------------------------
# SharedEncoderDecoder: a decoder reading another model's encoder output, of another width.
# ----------------------------------------------------------------------------------------------
SHARED = tiny_config(61, emb_dim=12, num_heads=3, head_dim=4, mlp_dim=24, num_decoder_layers=2)
E_TARGET = 20  # the encoder output's width, != SHARED.emb_dim
_SHARED_CACHE_LENGTH = 20


def test_shared_encoder_decoder_tree_is_a_t5_without_the_encoder():
  """A T5's token_embedder and decoder, path for path and shape for shape, but for the
  cross-attention key and value kernels, which read the encoder output: [E_target, H*D]."""
  shapes = traverse_util.flatten_dict(network.shared_encoder_param_shapes(SHARED, E_TARGET))
  t5 = traverse_util.flatten_dict(network.param_shapes(SHARED))
  assert set(shapes) == {path for path in t5 if path[0] != "encoder"}
  cross_kv = {("encoder_decoder_attention", name) for name in ("key", "value")}
  reads_encoder = {path for path in shapes if path[2:4] in cross_kv}
  assert len(reads_encoder) == 2 * SHARED.num_decoder_layers
  assert {shapes[p] for p in reads_encoder} == {(E_TARGET, 12)}
  assert {p: shapes[p] for p in shapes if p not in reads_encoder} == {
      p: t5[p] for p in shapes if p not in reads_encoder
  }
  axes = traverse_util.flatten_dict(network.shared_encoder_param_axes(SHARED, E_TARGET))
  t5_axes = traverse_util.flatten_dict(network.param_axes(SHARED))
  assert axes == {p: t5_axes[p] for p in axes}
  # It has no encoder: num_encoder_layers changes nothing.
  assert network.shared_encoder_param_shapes(
      SHARED.replace(num_encoder_layers=5), E_TARGET
  ) == network.shared_encoder_param_shapes(SHARED, E_TARGET)


_shared_teacher_forced = jax.jit(network.shared_encoder_teacher_forced_logits, static_argnums=0)


@functools.lru_cache(maxsize=None)
def _shared_setup():
  """-> (params, encoder tokens [2, 6] (ragged), their encoder output [2, 6, E_TARGET], decoder
  inputs [2, 12] (BOS, random), teacher-forced logits [2, 12, V])."""
  rng = np.random.default_rng(7)
  init = jax.jit(network.shared_encoder_init_params, static_argnums=(0, 1))
  params = init(SHARED, E_TARGET, jax.random.PRNGKey(5))
  enc = rng.integers(1, SHARED.vocab_size, (2, 6)).astype(np.int32)
  enc[1, 4:] = 0
  encoded = rng.normal(size=(2, 6, E_TARGET)).astype(np.float32)
  inputs = rng.integers(1, SHARED.vocab_size, (2, 12)).astype(np.int32)
  inputs[:, 0] = 0
  expected = _shared_teacher_forced(SHARED, params, encoded, enc, inputs)
  return params, enc, encoded, inputs, np.asarray(expected)


@functools.partial(jax.jit, static_argnames=("tree",))
def _shared_decode(params, tokens, cache, cache_index, tree=None):
  model = network.SharedEncoderDecoder(SHARED)
  return model.apply({"params": params}, tokens, cache, cache_index, tree=tree, method=model.decode)


def test_shared_encoder_decoder_cached_chain_and_tree_equal_teacher_forcing():
  """Blocks of 1..3 tokens at ragged per-row positions (after garbage written and rolled back),
  then a draft tree at each row's position: every logit is teacher forcing's."""
  params, enc, encoded, inputs, expected = _shared_setup()
  model = network.SharedEncoderDecoder(SHARED)
  cache = model.apply(
      {"params": params}, encoded, enc, _SHARED_CACHE_LENGTH, method=model.init_decode_cache
  )
  garbage = np.random.default_rng(8).integers(1, SHARED.vocab_size, (2, 2)).astype(np.int32)
  _, cache = _shared_decode(params, inputs[:, :2], cache, np.zeros(2, np.int32))
  # Garbage where row 0 rolls back to (slots 1, 2) and ahead of row 1 (slots 5, 6).
  _, cache = _shared_decode(params, garbage, cache, np.array([1, 5], np.int32))
  index = np.array([1, 2], np.int32)
  errors = []
  for k in (1, 3, 2):
    positions = index[:, None] + np.arange(k)[None]
    logits, cache = _shared_decode(
        params, np.take_along_axis(inputs, positions, axis=1), cache, index
    )
    errors.append(np.abs(logits - np.take_along_axis(expected, positions[..., None], axis=1)))
    index = index + k
  assert max(float(e.max()) for e in errors) < 1e-5

  tree = trees.DraftTree.from_branching((2, 2, 1))
  drafts = np.random.default_rng(9).integers(1, SHARED.vocab_size, (2, tree.num_nodes))
  block = np.concatenate([inputs[np.arange(2), index][:, None], drafts], axis=1).astype(np.int32)
  logits, _ = _shared_decode(params, block, cache, index, tree=tree)
  # Teacher forcing of prefix + root + the drafts on each slot's path, one row per (row, slot).
  rows, slots = np.divmod(np.arange(2 * tree.width), tree.width)
  paths = np.zeros((len(rows), inputs.shape[1]), np.int32)
  for i, (row, slot) in enumerate(zip(rows, slots)):
    path = block[row, tree.paths[slot, : tree.depths[slot]]]
    sequence = np.concatenate([inputs[row, : index[row] + 1], path])
    paths[i, : len(sequence)] = sequence
  forced = _shared_teacher_forced(SHARED, params, encoded[rows], enc[rows], paths)
  forced = np.asarray(forced)[np.arange(len(rows)), index[rows] + tree.depths[slots]]
  assert np.abs(np.asarray(logits).reshape(forced.shape) - forced).max() < 1e-5


def test_shared_encoder_decoder_refuses_an_encoder_output_of_other_tokens():
  params, enc, encoded, inputs, _ = _shared_setup()
  model = network.SharedEncoderDecoder(SHARED)
  for bad in (encoded[0], encoded[:, :5], encoded[:1]):
    with pytest.raises(ValueError, match="encoded must be the encoder output"):
      model.apply({"params": params}, bad, enc, 8, method=model.init_decode_cache)
    with pytest.raises(ValueError, match="encoded must be the encoder output"):
      model.apply({"params": params}, bad, enc, inputs, inputs)
  with pytest.raises(ValueError, match="encoder_emb_dim must be >= 1"):
    network.shared_encoder_param_shapes(SHARED, 0)


def test_a_skipped_layer_that_adds_nothing_leaves_the_logits():
  """`without_decoder_layers`: with decoder layer 1's writes to the residual stream zeroed (its
  attentions' and MLP's output kernels), the model without layer 1 computes the same logits; with
  them as trained, it does not."""
  config = TINY.replace(num_decoder_layers=3)
  params = network.init_params(config, jax.random.PRNGKey(3))
  enc = jnp.asarray([[5, 6, 7, 8]], jnp.int32)
  dec = jnp.asarray([[0, 9, 10, 11, 12]], jnp.int32)
  short_config, short = network.without_decoder_layers(config, params, (1,))
  assert short_config.num_decoder_layers == 2
  skipped = network.teacher_forced_logits(short_config, short, enc, dec)
  full = network.teacher_forced_logits(config, params, enc, dec)
  assert np.abs(np.asarray(full - skipped)).max() > 1e-3
  silent = jax.tree.map(lambda x: x, params)
  layer = silent["decoder"]["layers_1"]
  for path in (("self_attention", "out"), ("encoder_decoder_attention", "out"), ("mlp", "wo")):
    layer[path[0]][path[1]]["kernel"] = jnp.zeros_like(layer[path[0]][path[1]]["kernel"])
  np.testing.assert_allclose(
      network.teacher_forced_logits(config, silent, enc, dec), skipped, atol=1e-5
  )
  for bad in ((), (3,), (0, 1, 2), (1, 1)):
    with pytest.raises(ValueError, match="distinct decoder layers"):
      network.without_decoder_layers(config, params, bad)
