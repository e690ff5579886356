"""Every speculative configuration compiled by XLA:TPU for one TPU v4 chip (libtpu's compile-only
devices, `tpu_topology`), with the optimized HLO checked for what the loop must not do per
iteration (`hlo_report`); and wrong variants that the same check must catch.

Shapes are tiny but TPU-shaped (bfloat16, heads of 64, widths of 128): with XLA:TPU's (8, 128)
tiles, widths like 3 or 8 make layouts no real model has. Skipped only where libtpu is not
installed (it comes with the test extras); a libtpu of another version than jax pins fails.
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
from jax.sharding import SingleDeviceSharding

from conftest import tiny_config
from speculative_t5x import aot
from speculative_t5x import draft_length
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import hlo_report
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import partitioning
from speculative_t5x import speculative
from speculative_t5x import tpu_topology

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[test]' installs it)",
)

VOCAB = 256
LENGTHS = {"inputs": 16, "targets": 8}
TARGET = tiny_config(VOCAB, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256, dtype="bfloat16")
DRAFTER = tiny_config(
    VOCAB,
    emb_dim=128,
    num_heads=2,
    head_dim=64,
    mlp_dim=256,
    num_decoder_layers=1,
    dtype="bfloat16",
)
VOCABULARY = seqio.PassThroughVocabulary(VOCAB, eos_id=1)


@pytest.fixture(scope="module")
def partitioner():
  return partitioning.Partitioner(devices=tpu_topology.devices("v4-8")[:1])


def _model(drafter=None, **kwargs):
  kwargs.setdefault("gamma", None if "draft_tree" in kwargs else 3)
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET),
      drafters.T5Drafter(DRAFTER) if drafter is None else drafter,
      VOCABULARY,
      VOCABULARY,
      **kwargs,
  )


CONFIGURATIONS = {
    "chain": (lambda: _model(), {}),
    "chain_greedy": (lambda: _model(), {"greedy": True}),
    "chain_topk": (lambda: _model(), {"topk": 8}),
    "chain_topp": (lambda: _model(), {"topp": 0.9}),
    "tree": (lambda: _model(draft_tree=(2, 1)), {}),
    "tree_greedy": (lambda: _model(draft_tree=(2, 1)), {"greedy": True}),
    "block_verifier": (lambda: _model(verifier=speculative.BlockVerifier()), {}),
    "lenient_verifier": (lambda: _model(verifier=speculative.LenientVerifier(0.5)), {}),
    "adaptive_length": (lambda: _model(draft_stop=draft_length.ConfidenceStop(0.5)), {}),
    "feature_drafter": (
        lambda: _model(feature_drafter.FeatureDrafter(DRAFTER, TARGET.emb_dim)),
        {},
    ),
    "shared_encoder_drafter": (
        lambda: _model(drafters.SharedEncoderDrafter(DRAFTER, TARGET.emb_dim)),
        {"greedy": True},
    ),
}


# What XLA:TPU still does per iteration in two configurations (docs/tpu.md, "Open findings"):
# the tree loop re-lays out cache-shaped state, and the feature drafter, which rebuilds its cache
# from a gamma + 1 block and then drafts in single-token steps, re-lays out its own cache and
# head kernels. Pinned here so that a fix, or anything more, changes the test.
KNOWN_FINDINGS = {
    "tree": {"cache copy"},
    "tree_greedy": {"cache copy"},
    "feature_drafter": {"cache copy", "weight copy"},
}


def test_libtpu_is_the_version_jax_pins():
  assert tpu_topology.libtpu_problem() is None


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_every_configuration_compiles_for_tpu_v4_and_its_loop_is_checked(name, partitioner):
  make, kwargs = CONFIGURATIONS[name]
  result = aot.compile_decode(make(), partitioner, LENGTHS, **kwargs)
  assert result.module_problems == []
  assert 0 < result.memory_sizes()["peak"] < tpu_topology.get_slice("v4-8").hbm_bytes
  text = result.compiled.as_text()
  assert "TPU" in str(partitioner.mesh.devices.flat[0].device_kind)
  report = hlo_report.analyze(text)
  assert report.loops, "the decode has no while loop"
  assert report.counts.get("dynamic-update-slice", 0) > 0  # caches written in place
  kinds = {f.kind for f in report.problems}
  assert kinds == KNOWN_FINDINGS.get(name, set()), hlo_report.markdown(report.as_dict())
  weights = {f.reads for f in report.problems if f.kind == "weight copy"}
  assert all(w.startswith("params['drafter']") for w in weights), weights


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
  result = aot.compile_decode(_model(_BlockCatchUpDrafter(DRAFTER)), partitioner, LENGTHS)
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


def test_a_program_that_does_not_fit_is_reported_with_its_size(partitioner):
  device = partitioner.mesh.devices.flat[0]
  weight = jax.ShapeDtypeStruct(  # 40 GiB of bfloat16 on a 32 GiB chip
      (20 * 2**10, 2**20), jnp.bfloat16, sharding=SingleDeviceSharding(device)
  )
  with pytest.raises(Exception) as raised:
    jax.jit(lambda w: (w * 2).sum()).lower(weight).compile()
  oom = aot.out_of_memory(raised.value)
  assert oom is not None, str(raised.value)[:500]
  assert oom["used_bytes"] > 32 * 2**30 > oom["capacity_bytes"] > 16 * 2**30
  assert aot.out_of_memory(ValueError("shapes do not match")) is None


def test_slices_have_their_chips_and_hosts():
  v4_16 = tpu_topology.devices("v4-16")
  assert len(v4_16) == 8 and {d.device_kind for d in v4_16} == {"TPU v4"}
  assert sorted({d.process_index for d in v4_16}) == [0, 1]
  assert tpu_topology.get_slice("v4-16").hosts == 2
  assert len(tpu_topology.devices("v5litepod-1")) == 1
  with pytest.raises(ValueError, match="unknown TPU slice 'v4-9'.*v4-8"):
    tpu_topology.get_slice("v4-9")


def test_a_missing_or_mismatched_libtpu_names_the_install_command(monkeypatch):
  monkeypatch.setattr(tpu_topology.importlib.util, "find_spec", lambda name: None)
  problem = tpu_topology.libtpu_problem()
  assert "libtpu is not installed" in problem and "pip install" in problem
  monkeypatch.undo()
  versions = {"jax": "0.10.2", "libtpu": "0.0.40.1"}
  monkeypatch.setattr(tpu_topology.importlib.metadata, "version", versions.__getitem__)
  problem = tpu_topology.libtpu_problem()
  assert "libtpu 0.0.40.1 does not match jax 0.10.2" in problem
  assert 'pip install "libtpu==0.0.42.*"' in problem
  with pytest.raises(RuntimeError, match="does not match"):
    tpu_topology.devices("v4-8")
  assert np.isfinite(tpu_topology.get_slice("v6e-4").hbm_bandwidth)
