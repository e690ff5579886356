"""`aot.compile_decode` for XLA:TPU: every speculative configuration compiled for one TPU v4 chip
(libtpu's compile-only devices, `tpu_topology`) with its optimized HLO checked for what the loop
must not do per iteration (`hlo_report`), and a program that does not fit reported with its size.

Shapes are tiny but TPU-shaped (bfloat16, heads of 64, widths of 128): with XLA:TPU's (8, 128)
tiles, widths like 3 or 8 make layouts no real model has. Skipped only where libtpu is not
installed (it comes with the test extras).
"""

import jax
import jax.numpy as jnp
import pytest
import seqio
from jax.sharding import SingleDeviceSharding

from conftest import requires_libtpu
from conftest import tiny_config
from speculative_t5x import draft_length
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x.running import partitioning
from speculative_t5x.tpu import aot
from speculative_t5x.tpu import hlo_report
from speculative_t5x.tpu import tpu_topology

pytestmark = requires_libtpu

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
    "tree": (lambda: _model(draft_tree=(2, 1)), {}),
    "block_verifier_topp": (lambda: _model(verifier=speculative.BlockVerifier()), {"topp": 0.9}),
    "lenient_verifier_topk": (
        lambda: _model(verifier=speculative.LenientVerifier(0.5)),
        {"topk": 8},
    ),
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
    "feature_drafter": {"cache copy", "weight copy"},
}


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


def test_a_program_that_does_not_fit_is_reported_with_its_size(partitioner):
  device = partitioner.mesh.devices.flat[0]
  weight = jax.ShapeDtypeStruct(  # 40 GiB of bfloat16 on a 32 GiB chip
      (20 * 2**10, 2**20), jnp.bfloat16, sharding=SingleDeviceSharding(device)
  )
  with pytest.raises(Exception) as raised, tpu_topology.without_compilation_cache():
    jax.jit(lambda w: (w * 2).sum()).lower(weight).compile()
  oom = aot.out_of_memory(raised.value)
  assert oom is not None, str(raised.value)[:500]
  assert oom["used_bytes"] > 32 * 2**30 > oom["capacity_bytes"] > 16 * 2**30
  assert aot.out_of_memory(ValueError("shapes do not match")) is None
