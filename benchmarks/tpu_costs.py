"""XLA:TPU's COST MODEL of the programs one speculative iteration runs: a compiler's estimate, not
a measurement.

libtpu's compiler estimates, for a compiled program, the bytes it moves through HBM, its FLOPs and
`optimal_seconds`, the time of its bottleneck on that TPU generation (`compiled.cost_analysis()`).
Nothing here runs. For batch 1 in bfloat16 (T5X's inference dtype) on one chip it compiles:
  - a model's cached decode of k tokens (`decode_cost`): the target's verification at k = gamma + 1
    and a single-token step at k = 1, for T5 1.1 targets and drafters, and for drafters that
    cross-attend to the target's encoder output (`drafters.SharedEncoderDrafter`);
  - Algorithm 1 on [1, gamma, V] distributions (`verifier_cost`, `speculative.TokenVerifier`).
From these, `verify_cost(k) = optimal_seconds(k) / optimal_seconds(1)` and a drafter's
c = its step's optimal_seconds over the target's (the paper's c, Section 3.2), as XLA:TPU models
them.

Compile options: `xla_max_cross_program_prefetches=0`. Compiled alone, a decode step lets XLA:TPU
prefetch one weight into on-chip memory across executions of the program (copy-start with
`cross_program_prefetch_index`), and on v4 (megacore), v5e and v6e the cost model then counts
that weight's bytes five times (84 MB -> 420 MB for a [k, 4096] x [4096, 10240] matmul from
k = 8 on; `benchmarks/tests/test_tpu_costs.py`). Inside the decode loop no step is a program of its own, so
the prefetch, and its bytes, do not exist there; without it the count is the weight's bytes once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from speculative_t5x import drafters as drafters_lib
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x.tpu import aot
from speculative_t5x.tpu import tpu_topology

COMPILER_OPTIONS = {"xla_max_cross_program_prefetches": 0}


@dataclasses.dataclass(frozen=True)
class Cost:
  """One compiled program's cost model: bytes accessed, FLOPs, optimal_seconds (the roofline
  bottleneck's time on that chip), and compile seconds."""

  bytes_accessed: float
  flops: float
  optimal_seconds: float

  @classmethod
  def of(cls, compiled) -> "Cost":
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per device program
      analysis = analysis[0]
    return cls(
        float(analysis.get("bytes accessed", 0.0)),
        float(analysis.get("flops", 0.0)),
        float(analysis.get("optimal_seconds", 0.0)),
    )

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def _abstract(tree: Any, device) -> Any:
  """bfloat16 ShapeDtypeStructs on `device` (T5X's inference dtype)."""
  return aot.as_abstract(tree, SingleDeviceSharding(device), jnp.bfloat16)


def compile_cost(fn, args: tuple, compiler_options: dict | None = None) -> Cost:
  """`jax.jit(fn)` compiled for the abstract `args` -> its `Cost`."""
  options = COMPILER_OPTIONS if compiler_options is None else compiler_options
  with tpu_topology.without_compilation_cache():
    return Cost.of(jax.jit(fn).lower(*args).compile(compiler_options=options))


def drafter_state_shapes(
    drafter: drafters_lib.Drafter,
    params: Any,
    encoder_length: int,
    cache_length: int,
    target_emb_dim: int | None = None,
) -> Any:
  """The abstract state of `drafter.init_state` at batch 1 (a target's own cache for a
  `drafters.T5Drafter` of the target's config); target_emb_dim: the width of the target's encoder
  output, for a drafter that reads it."""
  tokens = jax.ShapeDtypeStruct((1, encoder_length), jnp.int32)
  encoded = None
  if target_emb_dim is not None:
    encoded = jax.ShapeDtypeStruct((1, encoder_length, target_emb_dim), jnp.bfloat16)
  return jax.eval_shape(
      lambda p, t, e: drafter.init_state(p, t, cache_length, e), params, tokens, encoded
  )


def decode_cost(
    drafter: drafters_lib.Drafter,
    k: int,
    device,
    encoder_length: int,
    context_length: int,
    target_emb_dim: int | None = None,
) -> Cost:
  """The cost model of the cached decode of k tokens [1, k] by a cached-decoder drafter's module
  (a `drafters.T5Drafter` stands for any T5 1.1, the target included) at position
  `context_length`, its cache holding context_length + k positions and the cross-attention keys
  and values of `encoder_length`."""
  params = jax.eval_shape(lambda: drafter.init_params(jax.random.PRNGKey(0), {}))
  state = drafter_state_shapes(drafter, params, encoder_length, context_length + k, target_emb_dim)
  module = drafter.module

  def step(params, tokens, cache, index):
    return module.apply({"params": params}, tokens, cache, index, method=module.decode)

  args = (
      _abstract(params, device),
      jax.ShapeDtypeStruct((1, k), jnp.int32, sharding=SingleDeviceSharding(device)),
      _abstract(state.cache, device),
      jax.ShapeDtypeStruct((1,), jnp.int32, sharding=SingleDeviceSharding(device)),
  )
  return compile_cost(step, args)


def verifier_cost(gamma: int, vocab_size: int, device) -> Cost:
  """Algorithm 1 (`speculative.TokenVerifier`) on p [1, gamma + 1, V] and q [1, gamma, V]
  float32, drafts [1, gamma] and uniforms [1, gamma + 1], at temperature 1."""
  verifier = speculative.TokenVerifier()
  standardize = sampling.Standardizer(1.0, 0, 0.0)
  sharding = SingleDeviceSharding(device)

  def verify(p_logits, q, drafts, u):
    return verifier.verify(standardize(p_logits), q, drafts, u)

  args = (
      jax.ShapeDtypeStruct((1, gamma + 1, vocab_size), jnp.float32, sharding=sharding),
      jax.ShapeDtypeStruct((1, gamma, vocab_size), jnp.float32, sharding=sharding),
      jax.ShapeDtypeStruct((1, gamma), jnp.int32, sharding=sharding),
      jax.ShapeDtypeStruct((1, gamma + 1), jnp.float32, sharding=sharding),
  )
  return compile_cost(verify, args)


def target_drafter(config: network.T5Config) -> drafters_lib.T5Drafter:
  """A T5 1.1 model as a `drafters.T5Drafter`: its single-token and k-token cached decodes are
  the ones `decode_cost` compiles, for a target as for a drafter."""
  return drafters_lib.T5Drafter(config)
