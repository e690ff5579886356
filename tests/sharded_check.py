"""Sharded decoding on 8 simulated CPU devices; run by tests/test_partitioning.py in a subprocess.

A process fixes its device count when JAX starts, and the other tests keep one device, so this
script runs alone: `python tests/sharded_check.py` (it sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 itself). It decodes a tiny target/drafter pair
unsharded and then on each mesh of MESHES (target model-parallel by the standard rules, drafter
replicated by the data-parallel rules), and prints one JSON object with what the test asserts:
{mesh name: {check: value}, 'unsharded': reference statistics, 'loop_carry': the per-device shapes
of the compiled decode loop's carry on mesh LOOP_MESH, 'feature_drafter': a FeatureDrafter's
decodes on LOOP_MESH}. On each mesh it also places the target
restored lazily from a checkpoint (`t5x_checkpoints.LazyArray`s, `place_params_per_process`)
and reports whether that gives the arrays `place_params` gives, and how many times each slice
was read.
"""

import collections
import dataclasses
import json
import os
import shutil
import sys
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import seqio  # noqa: E402

# tests/ is this script's sys.path[0].
from conftest import tiny_config  # noqa: E402
from speculative_t5x import feature_drafter, models, network
from speculative_t5x.running import partitioning  # noqa: E402
from speculative_t5x.weights import checkpoints  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

MESHES = ((1, 8), (2, 4), (8, 1))
LOOP_MESH = "2x4"  # the mesh whose compiled loop carry is reported
BATCH, INPUT_LENGTH, DECODE_LENGTH, GAMMA, EOS = 8, 6, 10, 3, 1
# Every model-parallel dimension divides 8: heads 8, joined_kv 8 * 4, mlp 64, vocab 64.
TARGET = tiny_config(
    64, emb_dim=16, num_heads=8, head_dim=4, mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1
)
NOISE = 0.3  # the drafter is the target with noise on every weight: ragged acceptance per row.


def _perturb(params, rng):
  """Each weight plus NOISE times its own standard deviation of Gaussian noise."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(rng, len(leaves))
  return jax.tree.unflatten(
      treedef,
      [x + NOISE * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)],
  )


def _setup():
  vocab = seqio.PassThroughVocabulary(TARGET.vocab_size, eos_id=EOS)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET), network.Transformer(TARGET), vocab, vocab, gamma=GAMMA
  )
  target = jax.jit(network.init_params, static_argnums=0)(TARGET, jax.random.PRNGKey(0))
  drafter = jax.jit(_perturb)(target, jax.random.PRNGKey(1))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (BATCH, INPUT_LENGTH), 2, TARGET.vocab_size)
  batch = {
      "encoder_input_tokens": tokens.at[::3, -2:].set(0),  # some rows padded
      "decoder_input_tokens": jnp.zeros((BATCH, DECODE_LENGTH), jnp.int32),
      "decoder_target_tokens": jnp.ones((BATCH, DECODE_LENGTH), jnp.int32),
  }
  return model, {"target": target, "drafter": drafter}, batch


def _valid(decodes: np.ndarray) -> bool:
  """Token ids in the vocabulary, and only padding after a row's first EOS."""
  if decodes.min() < 0 or decodes.max() >= TARGET.vocab_size:
    return False
  for row in decodes:
    eos = np.flatnonzero(row == EOS)
    if eos.size and np.any(row[eos[0] + 1 :] != 0):
      return False
  return True


def _shard_fractions(arrays, shardings_axes, name: str) -> list:
  """[(path, shard size / global size)] for every device shard of arrays whose logical axes hold
  `name`."""
  out = []
  flat_axes = dict(
      jax.tree_util.tree_flatten_with_path(shardings_axes, is_leaf=lambda x: isinstance(x, tuple))[
          0
      ]
  )
  for path, array in jax.tree_util.tree_flatten_with_path(arrays)[0]:
    if name in flat_axes[path]:
      out += [
          (jax.tree_util.keystr(path), shard.data.size / array.size)
          for shard in array.addressable_shards
      ]
  return out


def _lazy_placement(partitioner, model, params, placed, saved: str) -> dict:
  """Places the target restored lazily from `saved` (and the drafter's arrays) with
  `place_params_per_process` -> {'equal': whether every array is `placed`'s (values, dtype,
  sharding), 'reads': {parameter: [times each slice was read]}}."""
  reads = collections.defaultdict(collections.Counter)

  def counted(leaf):
    def reader(index):
      reads[leaf.name][tuple(s.indices(n) for s, n in zip(index, leaf.shape))] += 1
      return leaf.reader(index)

    return dataclasses.replace(leaf, reader=reader)

  lazy = checkpoints.restore_params(TARGET, saved, dtype="float32", lazy=True)
  lazy_placed = partitioner.place_params_per_process(
      model, {"target": jax.tree.map(counted, lazy), "drafter": params["drafter"]}
  )
  equal = jax.tree.map(
      lambda a, b: a.dtype == b.dtype
      and a.sharding.is_equivalent_to(b.sharding, a.ndim)
      and np.array_equal(a, b),
      lazy_placed,
      placed,
  )
  return {
      "equal": all(jax.tree.leaves(equal)),
      "reads": {name: sorted(counts.values()) for name, counts in reads.items()},
  }


def _loop_carry_shapes(predict, *args) -> str:
  """The per-device array shapes of the compiled decode's outer `while` (its largest carry)."""
  loops = [
      line for line in predict.lower(*args).compile().as_text().splitlines() if " while(" in line
  ]
  return max(loops, key=len).split(" while(")[0]


def _feature_drafter_check(target, batch, rng, mesh_shape) -> dict:
  """The demo's kind of drafter, a FeatureDrafter drafting its sources' ids too (its state holds
  [B, S, F] features and [B, d, Le] source columns), decoding on `mesh_shape` -> {'greedy_equal',
  'stats_equal': against unsharded, 'sample_valid'}."""
  head = tiny_config(TARGET.vocab_size, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16)
  drafter = feature_drafter.FeatureDrafter(
      head, TARGET.emb_dim, tuple(range(2, TARGET.vocab_size, 2)), copy_source=True
  )
  vocab = seqio.PassThroughVocabulary(TARGET.vocab_size, eos_id=EOS)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET), drafter, vocab, vocab, gamma=GAMMA
  )
  params = {
      "target": target,
      "drafter": drafter.init_from_target(drafter.init_params(rng, {}), target),
  }
  greedy = jax.device_get(model.jit_predict()(params, batch, rng, 0.0))
  partitioner = partitioning.Partitioner(mesh_shape=mesh_shape)
  predict = partitioner.partition_predict(model)
  placed, placed_batch = partitioner.place_params(model, params), partitioner.place_batch(batch)
  sharded = jax.device_get(predict(placed, placed_batch, rng, 0.0))
  sampled = jax.device_get(predict(placed, placed_batch, rng, 1.0))
  stats, ref_stats = sharded[1]["speculative_stats"], greedy[1]["speculative_stats"]
  return {
      "greedy_equal": bool(np.array_equal(sharded[0], greedy[0])),
      "stats_equal": all(np.array_equal(stats[k], ref_stats[k]) for k in ref_stats),
      "accepted": np.asarray(ref_stats["accepted_tokens"]).tolist(),
      "sample_valid": _valid(np.asarray(sampled[0])),
  }


def main():
  assert jax.device_count() == 8, f"expected 8 simulated devices, got {jax.device_count()}"
  model, params, batch = _setup()
  rng = jax.random.PRNGKey(3)
  greedy = jax.device_get(model.jit_predict()(params, batch, rng, 0.0))
  sampled = jax.device_get(model.jit_predict()(params, batch, rng, 1.0))
  module = model.module
  encoded = module.apply(
      {"params": params["target"]}, batch["encoder_input_tokens"], method=module.encode
  )
  cache = module.apply(
      {"params": params["target"]},
      encoded,
      batch["encoder_input_tokens"],
      DECODE_LENGTH + GAMMA + 1,
      method=module.init_decode_cache,
  )
  axes = network.param_axes(TARGET)
  results = {
      "unsharded": {"stats": {k: v.tolist() for k, v in greedy[1]["speculative_stats"].items()}}
  }
  saved = tempfile.mkdtemp()
  checkpoints.save_model(saved, params["target"], TARGET)
  for mesh_shape in MESHES:
    partitioner = partitioning.Partitioner(
        mesh_shape=mesh_shape,
        drafter_logical_axis_rules=partitioning.data_parallel_logical_axis_rules(),
    )
    placed = partitioner.place_params(model, params)
    placed_batch = partitioner.place_batch(batch)
    predict = partitioner.partition_predict(model)
    out_greedy = predict(placed, placed_batch, rng, 0.0)
    out_greedy_sharding = out_greedy[0].sharding.spec
    out_greedy = jax.device_get(out_greedy)
    out_sampled = jax.device_get(predict(placed, placed_batch, rng, 1.0))
    placed_cache = jax.device_put(
        cache, partitioning.state_shardings(cache, partitioner.mesh, partitioner.rules)
    )
    stats, ref_stats = out_greedy[1]["speculative_stats"], greedy[1]["speculative_stats"]
    name = "x".join(map(str, mesh_shape))
    if name == LOOP_MESH:  # one compile more: where XLA placed the caches inside the loop
      results["loop_carry"] = _loop_carry_shapes(predict, placed, placed_batch, rng, 0.0)
    results[name] = {
        "greedy_equal": bool(np.array_equal(out_greedy[0], greedy[0])),
        "stats_equal": all(np.array_equal(stats[k], ref_stats[k]) for k in ref_stats),
        "sample_valid": _valid(np.asarray(out_sampled[0])),
        "sample_shape": list(np.shape(out_sampled[0])),
        "sample_stats_shapes": {
            k: list(np.shape(v)) for k, v in out_sampled[1]["speculative_stats"].items()
        },
        "unsharded_sample_stats_shapes": {
            k: list(np.shape(v)) for k, v in sampled[1]["speculative_stats"].items()
        },
        "output_sharding": str(out_greedy_sharding),
        "mlp_shard_fractions": _shard_fractions(placed["target"], axes, "mlp"),
        "drafter_mlp_shard_fractions": _shard_fractions(placed["drafter"], axes, "mlp"),
        "self_key_shard_shape": list(
            placed_cache["layers_0"]["self_key"].addressable_shards[0].data.shape
        ),
        "self_key_shape": list(placed_cache["layers_0"]["self_key"].shape),
        "lazy": _lazy_placement(partitioner, model, params, placed, saved),
    }
  shutil.rmtree(saved)
  results["feature_drafter"] = _feature_drafter_check(
      params["target"], batch, rng, tuple(map(int, LOOP_MESH.split("x")))
  )
  json.dump(results, sys.stdout)


if __name__ == "__main__":
  main()
