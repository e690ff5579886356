"""Partitioning: T5X's rules, meshes, bad input, gin; sharded decoding on 8 simulated devices.

Tests in this process see one CPU device. The sharded tests read the results of
tests/sharded_check.py, run once in a subprocess with 8 simulated CPU devices: greedy decodes on
meshes 1x8, 2x4 and 8x1 equal the unsharded decode token for token, with equal statistics;
sampling gives valid sequences with the statistics' shapes; each device holds 1/N of every
mlp-sharded kernel (N = the 'model' axis size) and all of every replicated drafter kernel; inside
the compiled loop the caches are split like the parameters that write them.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
from jax.sharding import PartitionSpec as P

from conftest import flat, tiny_config
from speculative_t5x import drafters, models, network, table_drafters
from speculative_t5x.running import partitioning

HERE = pathlib.Path(__file__).resolve().parent
MESHES = {"1x8": 8, "2x4": 4, "8x1": 1}  # mesh name -> size of the 'model' axis
TINY = tiny_config(
    64, emb_dim=16, num_heads=8, head_dim=4, mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1
)


@pytest.fixture(scope="module")
def sharded():
  """{mesh name: results} from tests/sharded_check.py on 8 simulated CPU devices."""
  # XLA_FLAGS as conftest sets it (FAST_COMPILE); sharded_check.py adds the 8 devices itself.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run(
      [sys.executable, str(HERE / "sharded_check.py")],
      capture_output=True,
      text=True,
      env=env,
      timeout=600,
      check=False,
  )
  assert run.returncode == 0, f"sharded_check.py failed:\n{run.stderr[-4000:]}"
  return json.loads(run.stdout)


# --- rules ----------------------------------------------------------------------------------------
def test_standard_rules_are_t5x_model_parallelism():
  rules = dict(partitioning.standard_logical_axis_rules())
  assert rules["batch"] == "data"
  for name in ("mlp", "heads", "joined_kv", "vocab"):
    assert rules[name] == "model"
  for name in ("embed", "kv", "length", "relpos_buckets"):
    assert rules[name] is None


def test_data_parallel_rules_replicate_every_parameter_axis():
  rules = dict(partitioning.data_parallel_logical_axis_rules())
  assert rules.pop("batch") == "data"
  assert set(rules.values()) == {None}


def test_every_parameter_axis_has_a_standard_rule():
  mesh = partitioning.make_mesh()
  shardings = partitioning.param_shardings(TINY, mesh, partitioning.standard_logical_axis_rules())
  mlp = shardings["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert mlp.spec == P(None, "model")
  assert shardings["token_embedder"]["embedding"].spec == P("model", None)
  assert shardings["decoder"]["relpos_bias"]["rel_embedding"].spec == P("model", None)


def test_logical_to_spec_first_free_rule_wins():
  rules = (("heads", "model"), ("joined_kv", "model"), ("kv", None))
  # heads takes 'model'; joined_kv's only rule names a used axis, so it is replicated (flax).
  assert partitioning.logical_to_spec(("heads", "joined_kv"), rules) == P("model", None)


def test_state_axes_by_rank():
  cache = {
      "encoder_valid": np.zeros((2, 5), bool),
      "layers_0": {"self_key": np.zeros((2, 7, 8, 4))},
      "length": np.zeros((2,)),
  }
  assert partitioning.state_axes(cache) == {
      "encoder_valid": ("batch", "length"),
      "layers_0": {"self_key": ("batch", "length", "heads", "kv")},
      "length": ("batch",),
  }


# --- feeding batches from several processes --------------------------------------------------------
def test_one_process_feeds_every_row_as_shard_0_of_1():
  assert partitioning.Partitioner().get_data_layout(4) == partitioning.DataLayout(4, 0, 1, True)


@pytest.mark.parametrize(
    "rows_by_process, expected",
    [
        # 2 processes x 2 devices, data axis 4: a block of rows each.
        (
            {0: {(0, 1), (1, 2)}, 1: {(2, 3), (3, 4)}},
            [partitioning.DataLayout(2, 0, 2, True), partitioning.DataLayout(2, 1, 2, True)],
        ),
        # The 'model' axis over all 4 devices: both processes feed every row, one replica set.
        (
            {0: {(0, 4)}, 1: {(0, 4)}},
            [partitioning.DataLayout(4, 0, 1, True), partitioning.DataLayout(4, 0, 1, False)],
        ),
        # 4 processes x 1 device, mesh (2, 2): processes 0, 1 and 2, 3 share rows.
        (
            {0: {(0, 2)}, 1: {(0, 2)}, 2: {(2, 4)}, 3: {(2, 4)}},
            [
                partitioning.DataLayout(2, 0, 2, True),
                partitioning.DataLayout(2, 0, 2, False),
                partitioning.DataLayout(2, 1, 2, True),
                partitioning.DataLayout(2, 1, 2, False),
            ],
        ),
        # Rows not in one block (devices interleaved across processes) still work.
        (
            {0: {(0, 1), (2, 3)}, 1: {(1, 2), (3, 4)}},
            [partitioning.DataLayout(2, 0, 2, True), partitioning.DataLayout(2, 1, 2, True)],
        ),
    ],
)
def test_data_layout_of_each_process(rows_by_process, expected):
  assert [partitioning.data_layout(rows_by_process, p, 4) for p in rows_by_process] == expected


def test_rows_that_overlap_without_being_the_same_are_refused():
  # 2 processes x 3 devices, num_partitions 2: mesh (3, 2), row 1 split between the processes.
  with pytest.raises(
      ValueError,
      match=re.escape(
          "processes 0 and 1 hold rows [(0, 1), (1, 2)] and [(1, 2), (2, 3)] (start, stop) of a "
          "batch of 3, which overlap without being the same, so neither can feed its rows alone: "
          "give NUM_PARTITIONS (the 'model' axis) dividing the local device count"
      ),
  ):
    partitioning.data_layout({0: {(0, 1), (1, 2)}, 1: {(1, 2), (2, 3)}}, 0, 3)


def test_processes_holding_different_numbers_of_rows_are_refused():
  with pytest.raises(
      ValueError, match=re.escape("different numbers of rows of a batch of 3 ({0: 2, 1: 1})")
  ):
    partitioning.data_layout({0: {(0, 1), (1, 2)}, 1: {(2, 3)}}, 1, 3)


# --- bad input ------------------------------------------------------------------------------------
def test_num_partitions_that_does_not_divide_the_devices():
  with pytest.raises(ValueError, match=r"num_partitions=2 does not divide the 1 available"):
    partitioning.make_mesh(num_partitions=2)


def test_mesh_shape_that_does_not_fit_the_devices():
  with pytest.raises(ValueError, match=r"mesh_shape \(2, 4\) does not fit the 1 available"):
    partitioning.Partitioner(mesh_shape=(2, 4))


def test_num_partitions_and_mesh_shape_together():
  with pytest.raises(ValueError, match="not both"):
    partitioning.make_mesh(num_partitions=1, mesh_shape=(1, 1))


def test_logical_axis_with_no_rule():
  rules = tuple(r for r in partitioning.standard_logical_axis_rules() if r[0] != "mlp")
  with pytest.raises(
      ValueError,
      match=r"logical axis 'mlp' of parameter " r"decoder/layers_0/mlp/wi_0/kernel has no rule",
  ):
    partitioning.param_shardings(TINY, partitioning.make_mesh(), rules)


def test_rule_naming_a_missing_mesh_axis():
  with pytest.raises(ValueError, match="names mesh axis 'tensor'"):
    partitioning.Partitioner(logical_axis_rules=(("batch", "data"), ("mlp", "tensor")))


def test_malformed_rule():
  with pytest.raises(ValueError, match="is not a"):
    partitioning.standard_logical_axis_rules(additional_rules=[("mlp",)])


def test_state_of_unknown_rank():
  mesh = partitioning.make_mesh()
  with pytest.raises(ValueError, match="decoding state x has rank 3"):
    partitioning.state_shardings(
        {"x": np.zeros((2, 3, 4))}, mesh, partitioning.standard_logical_axis_rules()
    )


def test_dimension_not_divisible_by_the_mesh():
  devices = jax.devices() * 3  # only counted: the error comes before any placement
  mesh = jax.sharding.Mesh(np.array(devices[:3]).reshape(1, 3), partitioning.MESH_AXES)
  with pytest.raises(
      ValueError,
      match=r"key/kernel has shape \(16, 32\): dimension 1 "
      r"\(joined_kv, size 32\) is not divisible by the 3 devices",
  ):
    partitioning.param_shardings(TINY, mesh, partitioning.standard_logical_axis_rules())


def test_shared_encoder_drafter_shardings_follow_its_param_axes():
  """Its cross-attention keys and values read the target's width (16, its own 8): [16, H*D]."""
  drafter = drafters.SharedEncoderDrafter(TINY.replace(emb_dim=8, num_heads=4), TINY.emb_dim)
  rules = partitioning.standard_logical_axis_rules()
  shardings = partitioning.drafter_shardings(drafter, partitioning.make_mesh(), rules)
  abstract = jax.eval_shape(lambda: drafter.init_params(jax.random.PRNGKey(0), {}))
  assert jax.tree.structure(shardings) == jax.tree.structure(abstract)
  cross = shardings["decoder"]["layers_0"]["encoder_decoder_attention"]
  assert cross["key"]["kernel"].spec == P(None, "model")
  assert cross["out"]["kernel"].spec == P("model", None)
  devices = jax.devices() * 3  # only counted: the error comes before any placement
  mesh = jax.sharding.Mesh(np.array(devices[:3]).reshape(1, 3), partitioning.MESH_AXES)
  with pytest.raises(
      ValueError, match=r"encoder_decoder_attention/key/kernel has shape \(16, 16\): dimension 1"
  ):
    partitioning.drafter_shardings(drafter, mesh, rules)


# --- gin ------------------------------------------------------------------------------------------
def test_partitioning_gin():
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(
        [str(HERE.parent / "configs/runs/partitioning.gin")], ["NUM_PARTITIONS = 1"]
    )
    partitioner = partitioning.Partitioner()
  finally:
    gin.clear_config()
  assert dict(partitioner.mesh.shape) == {"data": 1, "model": 1}
  assert partitioner.rules == partitioning.standard_logical_axis_rules()
  assert partitioner.drafter_rules == partitioning.data_parallel_logical_axis_rules()


# --- one device -----------------------------------------------------------------------------------
def test_partitioned_table_drafter_matches_jit_predict():
  vocab = seqio.PassThroughVocabulary(TINY.vocab_size, eos_id=1)
  drafter = table_drafters.BigramDrafter(vocab_size=TINY.vocab_size)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), drafter, vocab, vocab, gamma=2
  )
  tokens = np.random.RandomState(0).randint(2, TINY.vocab_size, size=(2, 5)).astype(np.int32)
  params = {
      "target": network.init_params(TINY, jax.random.PRNGKey(0)),
      "drafter": table_drafters.BigramDrafter.fit(tokens, TINY.vocab_size, top=4),
  }
  batch = {
      "encoder_input_tokens": tokens,
      "decoder_input_tokens": jnp.zeros((2, 6), jnp.int32),
      "decoder_target_tokens": jnp.ones((2, 6), jnp.int32),
  }
  partitioner = partitioning.Partitioner()
  assert partitioner.params_shardings(model)["drafter"] == partitioner.replicated
  expected = model.jit_predict()(params, batch, jax.random.PRNGKey(1), 0.0)
  got = partitioner.partition_predict(model)(
      partitioner.place_params(model, params),
      partitioner.place_batch(batch),
      jax.random.PRNGKey(1),
      0.0,
  )
  np.testing.assert_array_equal(got[0], expected[0])
  jax.tree.map(np.testing.assert_array_equal, got[1], expected[1])


# --- 8 simulated devices --------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_sharded_greedy_equals_unsharded(sharded, mesh):
  assert sharded[mesh]["greedy_equal"]
  assert sharded[mesh]["stats_equal"]
  assert sharded[mesh]["output_sharding"] == "P('data',)"


def test_a_feature_drafter_decodes_sharded_as_unsharded(sharded):
  """The demo's kind of drafter (features [B, S, F] and source columns [B, d, Le] in its state),
  on the 2x4 mesh: the greedy decodes and statistics of one device, and valid samples."""
  result = sharded["feature_drafter"]
  assert result["greedy_equal"] and result["stats_equal"] and result["sample_valid"]
  assert len(set(result["accepted"])) > 1, f"no ragged acceptance: {result['accepted']}"


def test_sharded_reference_has_ragged_acceptance(sharded):
  accepted = sharded["unsharded"]["stats"]["accepted_tokens"]
  assert len(set(accepted)) > 1, f"every row accepted the same number of drafts: {accepted}"


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_sharded_sampling_is_valid(sharded, mesh):
  result = sharded[mesh]
  assert result["sample_valid"]
  assert result["sample_shape"] == [8, 10]
  assert result["sample_stats_shapes"] == result["unsharded_sample_stats_shapes"]


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_mlp_kernels_are_split_over_the_model_axis(sharded, mesh):
  partitions = MESHES[mesh]
  fractions = sharded[mesh]["mlp_shard_fractions"]
  assert len(fractions) == 6 * 8  # wi_0, wi_1, wo of the encoder and decoder layer, 8 devices each
  assert {f for _, f in fractions} == {1 / partitions}
  assert {f for _, f in sharded[mesh]["drafter_mlp_shard_fractions"]} == {1.0}


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_cache_split_over_batch_and_heads(sharded, mesh):
  data, model = map(int, mesh.split("x"))
  batch, length, heads, head_dim = sharded[mesh]["self_key_shape"]
  assert sharded[mesh]["self_key_shard_shape"] == [batch // data, length, heads // model, head_dim]


def test_caches_in_the_compiled_loop_follow_the_parameters(sharded):
  """Mesh 2x4, batch 8, cache length 10 + 3 + 1, 8 heads of 4: the target's self-attention cache
  is split over batch and heads, [4, 14, 2, 4] per device; the replicated drafter's only over the
  batch, [4, 14, 8, 4]; no device carries a whole [8, 14, 8, 4] cache."""
  carry = sharded["loop_carry"]
  assert "f32[4,14,2,4]" in carry and "f32[4,14,8,4]" in carry
  assert "f32[8,14,8,4]" not in carry


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_a_lazily_restored_target_is_placed_as_its_arrays_each_slice_read_once(sharded, mesh):
  # place_params_per_process on LazyArray leaves (the target, from a save_model checkpoint) and
  # on the drafter's arrays gives place_params's arrays: values, dtypes and shardings.
  lazy = sharded[mesh]["lazy"]
  assert lazy["equal"]
  reads = lazy["reads"]
  assert reads.keys() == {f"target/{name}" for name in flat(network.param_shapes(TINY))}
  # Each distinct slice of the 8 devices' is read once: the 'model' axis's slices of an mlp
  # kernel, the whole of a replicated parameter once (not once per device).
  assert reads["target/decoder/layers_0/mlp/wi_0/kernel"] == [1] * MESHES[mesh]
  assert reads["target/decoder/decoder_norm/scale"] == [1]
  assert {count for counts in reads.values() for count in counts} == {1}
