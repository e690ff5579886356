r"""Where the speculative loop's time goes: XLA's own per-thunk timings, grouped by kind.

Runs the compiled speculative decode of a saved (target, drafter) pair under `jax.profiler` with
a Perfetto trace, then sums the duration of every executed XLA thunk (fusions, dots, copies,
reductions, conds...) by kind and reports them per decode call and per loop iteration (= target
call). On XLA:CPU the network's matmuls run as XNNPACK fusions ('ynn_fusion'); everything else
is the loop's own overhead (standardization, the accept step, writes, control flow).

  python scripts/profile_loop.py [--pair_dir=demo_models] [--gamma=2] [--temperature=0]
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import pathlib
import re
import tempfile

from absl import flags
from absl import logging

import speculative_t5x  # noqa: F401  (first: TensorFlow, which seqio imports, is imported quietly)
import jax
import numpy as np
import seqio

from speculative_t5x import benchmark
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import pairs

REPO = pathlib.Path(__file__).resolve().parents[1]
EOS_ID = 1
INPUT_LENGTH = 24
_PAIR_DIR = flags.DEFINE_string("pair_dir", str(REPO / "demo_models"), "A save_pair directory.")
_GAMMA = flags.DEFINE_integer("gamma", 2, "Drafts per target call.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_STEPS = flags.DEFINE_integer("max_decode_steps", 32, "Tokens decoded per call.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Profiled decode calls.")
_TOP = flags.DEFINE_integer("top", 12, "Thunk kinds to list.")
# Trace events that are not XLA thunks (Python, dispatch, waiting, the executors themselves).
_NOT_THUNK = re.compile(r"^\$|ThunkExecutor|Await|Pjit|Execute|stage|ParseArguments|^end: ")


def thunk_times(trace_dir: str) -> tuple[collections.Counter, collections.Counter]:
  """Total microseconds and counts of XLA thunk kinds ('ynn_fusion.8' -> 'ynn_fusion')."""
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))
  if not files:
    raise FileNotFoundError(f"no Perfetto trace under {trace_dir}: jax.profiler wrote none.")
  with gzip.open(files[-1]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  total, count = collections.Counter(), collections.Counter()
  for event in events:
    if event.get("ph") == "X" and not _NOT_THUNK.search(event["name"]):
      kind = re.sub(r"(\.clone|[._]\d+)+$", "", event["name"])
      total[kind] += event.get("dur", 0)
      count[kind] += 1
  return total, count


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  pair = pairs.load_pair(pairs.PairConfig.from_pair_dir(_PAIR_DIR.value), EOS_ID)
  vocab = seqio.PassThroughVocabulary(pair.target_config.vocab_size, eos_id=EOS_ID)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(pair.target_config), pair.drafter, vocab, vocab, gamma=_GAMMA.value
  )
  predict = model.jit_predict(max_decode_steps=_STEPS.value)
  batch = {
      "encoder_input_tokens": benchmark.random_inputs(
          pair.target_config.vocab_size, 1, INPUT_LENGTH, eos_id=EOS_ID
      ),
      "decoder_input_tokens": np.zeros((1, 2 * _STEPS.value), np.int32),
  }
  params = pair.params
  key = jax.random.PRNGKey(0)
  _, aux = jax.block_until_ready(predict(params, batch, key, _TEMPERATURE.value))
  iterations = int(aux["speculative_stats"]["target_calls"][0])
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    for _ in range(_REPEATS.value):
      jax.block_until_ready(predict(params, batch, key, _TEMPERATURE.value))
    jax.profiler.stop_trace()
    total, count = thunk_times(trace_dir)
  per_call = {k: v / _REPEATS.value / 1e3 for k, v in total.items()}  # ms
  network_ms = sum(v for k, v in per_call.items() if k.startswith("ynn_fusion") or k == "dot")
  all_ms = sum(per_call.values())
  print(
      f"gamma {_GAMMA.value}, temperature {_TEMPERATURE.value:g}: {iterations} loop iterations "
      f"per call, {sum(count.values()) / _REPEATS.value:.0f} thunks per call; thunk time "
      f"{all_ms:.2f} ms per call = {all_ms / iterations:.3f} ms per iteration, of which matmul "
      f"fusions and dots {network_ms / iterations:.3f} ms and the rest "
      f"{(all_ms - network_ms) / iterations:.3f} ms"
  )
  print("| thunk kind | ms per call | per iteration (ms) | count per call |")
  print("|---|---|---|---|")
  for kind, ms in sorted(per_call.items(), key=lambda kv: -kv[1])[: _TOP.value]:
    print(f"| {kind} | {ms:.3f} | {ms / iterations:.4f} | {count[kind] / _REPEATS.value:.0f} |")


if __name__ == "__main__":
  gin_utils.run(main)
