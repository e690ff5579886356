"""`tpu_costs`: XLA:TPU's cost model of the step programs, and the cross-program prefetch that the
cost model counts five times over when a matmul is compiled as a program of its own."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from conftest import requires_libtpu
from conftest import tiny_config
from speculative_t5x import drafters
import tpu_costs
from speculative_t5x.tpu import tpu_topology

pytestmark = requires_libtpu

WEIGHT_BYTES = 4096 * 10240 * 2  # a bf16 [4096, 10240] kernel, T5-XXL's wi


@pytest.fixture(scope="module")
def v4():
  return tpu_topology.devices("v4-8")[0]


def _matmul_args(device, k):
  sharding = SingleDeviceSharding(device)
  return (
      jax.ShapeDtypeStruct((k, 4096), jnp.bfloat16, sharding=sharding),
      jax.ShapeDtypeStruct((4096, 10240), jnp.bfloat16, sharding=sharding),
  )


def test_cross_program_prefetch_is_what_counts_a_weight_five_times(v4):
  matmul = lambda x, w: x @ w  # noqa: E731
  with_prefetch = tpu_costs.compile_cost(matmul, _matmul_args(v4, 8), compiler_options={})
  without = tpu_costs.compile_cost(matmul, _matmul_args(v4, 8))
  one_token = tpu_costs.compile_cost(matmul, _matmul_args(v4, 1), compiler_options={})
  assert with_prefetch.bytes_accessed == pytest.approx(5 * WEIGHT_BYTES, rel=0.01)
  assert without.bytes_accessed == pytest.approx(WEIGHT_BYTES, rel=0.01)
  assert one_token.bytes_accessed == pytest.approx(WEIGHT_BYTES, rel=0.01)
  assert without.flops == pytest.approx(2 * 8 * 4096 * 10240, rel=0.01)


def test_decode_and_verifier_costs_grow_with_what_they_compute(v4):
  config = tiny_config(256, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256, dtype="bfloat16")
  target = tpu_costs.target_drafter(config)
  one, eight = (tpu_costs.decode_cost(target, k, v4, 16, 8) for k in (1, 8))
  assert 0 < one.bytes_accessed <= eight.bytes_accessed
  assert eight.flops > 2 * one.flops
  shared = drafters.SharedEncoderDrafter(tiny_config(256, emb_dim=128, dtype="bfloat16"), 128)
  assert tpu_costs.decode_cost(shared, 1, v4, 16, 8, target_emb_dim=128).bytes_accessed > 0
  small, large = (tpu_costs.verifier_cost(gamma, 256, v4) for gamma in (3, 7))
  assert 0 < small.bytes_accessed < large.bytes_accessed
