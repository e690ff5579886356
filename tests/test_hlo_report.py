"""`hlo_report` on XLA:TPU's optimized HLO: wrong variants that its checks must catch (the chain
drafter as it was before its fix, and hand-made decode loops with T5X's parameter names), beside
the right ones. The real loop of every configuration, the fixed chain drafter's included, is
checked in tests/test_aot.py."""

import jax
import jax.numpy as jnp
import pytest
import seqio
from jax.sharding import SingleDeviceSharding

from conftest import requires_libtpu
from conftest import tiny_config
from speculative_t5x import drafters
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.running import partitioning
from speculative_t5x.tpu import aot
from speculative_t5x.tpu import hlo_report
from speculative_t5x.tpu import tpu_topology

pytestmark = requires_libtpu

VOCAB = 256
LENGTHS = {"inputs": 16, "targets": 8}
CONFIG = tiny_config(VOCAB, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256, dtype="bfloat16")
VOCABULARY = seqio.PassThroughVocabulary(VOCAB, eos_id=1)


@pytest.fixture(scope="module")
def partitioner():
  return partitioning.Partitioner(devices=tpu_topology.devices("v4-8")[:1])


def _model(drafter):
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(CONFIG), drafter, VOCABULARY, VOCABULARY, gamma=3
  )


class _BlockCatchUpDrafter(drafters.T5Drafter):
  """The chain drafter before docs/tpu.md's fix, deliberately: after a full acceptance its first
  step fed the two-token block [x_{length-1}, x_length] (under a lax.cond), so the cache and the
  attention kernels had two uses of different shapes, and XLA:TPU re-laid both out per call."""

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    module = self.module
    decode = lambda tokens, cache, index: module.apply(  # noqa: E731
        {"params": params}, tokens, cache, index, method=module.decode
    )

    def first_logits(width):
      start = jnp.maximum(length - width + 1, 0)
      block = drafters.decoder_inputs(sequences, start[:, None] + jnp.arange(width)[None])
      logits, cache = decode(block, state.cache, start)
      return jnp.take_along_axis(logits, (length - start)[:, None, None], axis=1), cache

    logits, cache = jax.lax.cond(
        jnp.all(state.written >= length), lambda: first_logits(1), lambda: first_logits(2)
    )
    drafts, q, cache, steps = drafters.draft_chain(
        logits,
        lambda cache, token, i: decode(token[:, None], cache, length + i),
        cache,
        gamma,
        u,
        standardize,
        stop,
    )
    return drafts, q, drafters.T5DrafterState(cache, length + steps)


def test_the_old_block_catch_up_fails_the_same_check(partitioner):
  result = aot.compile_decode(_model(_BlockCatchUpDrafter(CONFIG)), partitioner, LENGTHS)
  kinds = {f.kind for f in hlo_report.analyze(result.compiled.as_text()).problems}
  assert "cache copy" in kinds, kinds


# Hand-made decode loops over a [1, L, H, D] cache with T5X's parameter names: the right one and
# two wrong ones, for the checks that the real loop passes and so cannot exercise.
E, H, D, L, LE = 128, 2, 64, 16, 8


def _loop(variant):
  def decode(params, encoded, steps):
    layer = params["decoder"]["layers_0"]
    project = lambda block, name, x: (x @ layer[block][name]["kernel"]).reshape(  # noqa: E731
        x.shape[0], x.shape[1] if x.ndim == 3 else 1, H, D
    )
    cross_key = project("encoder_decoder_attention", "key", encoded)
    cross_value = project("encoder_decoder_attention", "value", encoded)
    cache = jnp.zeros((1, L, H, D), jnp.bfloat16)

    def body(i, carry):
      x, cache, kept = carry
      query = project("self_attention", "query", x)
      key = project("self_attention", "key", x)
      keys, values = cross_key, cross_value
      if variant == "cross_kv_per_step":  # from the encoder output again (0 * x: not hoisted)
        fresh = encoded + 0 * x[:, None, :]
        keys = project("encoder_decoder_attention", "key", fresh)
        values = project("encoder_decoder_attention", "value", fresh)
      new = jax.lax.dynamic_update_slice_in_dim(cache, key, i, axis=1)
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, new).sum()
      scores += jnp.einsum("bqhd,bkhd->bhqk", query, keys).sum() + values.sum()
      # "rollback_by_copy" keeps last step's cache beside the new one, to restore on rejection.
      kept = cache if variant == "rollback_by_copy" else kept
      return x + scores.astype(x.dtype), new, kept

    x, _, kept = jax.lax.fori_loop(0, steps, body, (encoded[:, 0], cache, cache))
    return x, kept

  return decode


def _loop_report(variant, device):
  sharding = SingleDeviceSharding(device)
  array = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)  # noqa: E731
  params = {
      "decoder": {
          "layers_0": {
              block: {name: {"kernel": array(E, H * D)} for name in ("query", "key", "value")}
              for block in ("self_attention", "encoder_decoder_attention")
          }
      }
  }
  steps = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding)
  with tpu_topology.without_compilation_cache():
    compiled = jax.jit(_loop(variant)).lower(params, array(1, LE, E), steps).compile()
  return hlo_report.analyze(compiled.as_text())


def test_hand_made_loops_right_and_wrong(partitioner):
  device = partitioner.mesh.devices.flat[0]
  assert _loop_report("right", device).problems == []
  cross = _loop_report("cross_kv_per_step", device).problems
  assert {f.kind for f in cross} == {"cross-attention K/V in the loop"}
  assert all("encoder_decoder_attention" in f.reads for f in cross)
  copies = _loop_report("rollback_by_copy", device).problems
  assert [f.kind for f in copies] == ["cache copy"]
  assert copies[0].shape.startswith(f"bf16[1,{L},{H},{D}]")
