r"""Where the speculative loop's time goes: XLA's own per-thunk timings, by kind and by stage.

Runs the compiled speculative decode of a saved (target, drafter) pair under `jax.profiler` with
a Perfetto trace, then sums the duration of every executed XLA thunk (fusions, dots, copies,
reductions, conds...) and reports them per decode call and per loop iteration (= target call):
- by kind. On XLA:CPU the network's matmuls run as XNNPACK fusions ('ynn_fusion') or dots;
- by stage of the iteration, from the named scopes the loop puts on them
  (`draft_shapes.STAGE_SCOPES`: the drafter's proposal and the features it observes, the target's
  call, the verification), read from the compiled program's metadata; the rest is the loop's own
  work (writes, statistics, control flow). A while loop's own thunk spans the thunks of its body,
  which are counted instead.
It prints the unprofiled wall time per call beside them. On XLA:CPU independent thunks run at once
on the cores, so the thunk times can add up to more than the wall time, and a stage's share of
thunk time is not its share of the wall time. What the drafter adds to the wall time is the
benchmark's `c in loop` (`step_costs.DecodeCosts.c_in_loop`).

  python benchmarks/profile_loop.py [--pair_dir=demo_models] [--drafter=feature_drafter_128x1]
    [--gamma=3] [--temperature=0]
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
import time

from absl import flags
from absl import logging

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

import jax
import numpy as np
import seqio

from speculative_t5x import draft_shapes
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.text import input_data
from speculative_t5x.weights import pairs

REPO = pathlib.Path(__file__).resolve().parents[1]
EOS_ID = 1
INPUT_LENGTH = 24
_PAIR_DIR = flags.DEFINE_string("pair_dir", str(REPO / "demo_models"), "A save_pair directory.")
_DRAFTER = flags.DEFINE_string(
    "drafter",
    "feature_drafter_128x1",
    "The drafter's subdirectory of --pair_dir (scripts/demo.py's default drafts with "
    "feature_drafter_128x1 and its sources' ids, feature_drafter_128x1+source there).",
)
_GAMMA = flags.DEFINE_integer("gamma", 3, "Drafts per target call.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_STEPS = flags.DEFINE_integer("max_decode_steps", 32, "Tokens decoded per call.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Profiled decode calls.")
_TOP = flags.DEFINE_integer("top", 12, "Thunk kinds to list.")
# Trace events that are not XLA thunks (Python, dispatch, waiting, the executors themselves).
_NOT_THUNK = re.compile(r"^\$|ThunkExecutor|Await|Pjit|Execute|stage|ParseArguments|^end: ")
# Thunks that run other thunks (a while loop's body, a conditional's branch), which are traced too.
_CONTAINERS = ("while", "conditional")
LOOP = "loop"  # the stage of a thunk in the loop under none of its named scopes
OUTSIDE = "outside the loop"  # the prefill (encoders, caches) and the outputs' sort


def thunk_events(trace_dir: str) -> list[dict]:
  """The trace's XLA thunk events (complete events, name = the HLO instruction), containers
  (while loops, conditionals) left out."""
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))
  if not files:
    raise FileNotFoundError(f"no Perfetto trace under {trace_dir}: jax.profiler wrote none.")
  with gzip.open(files[-1]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return [
      event
      for event in events
      if event.get("ph") == "X"
      and not _NOT_THUNK.search(event["name"])
      and _kind(event["name"]) not in _CONTAINERS
  ]


def _kind(name: str) -> str:
  """'ynn_fusion.8' -> 'ynn_fusion', 'while.3.clone' -> 'while'."""
  return re.sub(r"(\.clone|[._]\d+)+$", "", name)


def thunk_times(trace_dir: str) -> tuple[collections.Counter, collections.Counter]:
  """Total microseconds and counts of XLA thunk kinds ('ynn_fusion.8' -> 'ynn_fusion')."""
  total, count = collections.Counter(), collections.Counter()
  for event in thunk_events(trace_dir):
    kind = _kind(event["name"])
    total[kind] += event.get("dur", 0)
    count[kind] += 1
  return total, count


def _closing(text: str, opening: int) -> int:
  """The index of the parenthesis closing the one at text[opening]."""
  depth = 0
  for index in range(opening, len(text)):
    depth += {"(": 1, ")": -1}.get(text[index], 0)
    if depth == 0:
      return index
  raise ValueError(f"unbalanced parentheses in {text[:200]!r}")


def _operands(line: str) -> list[str]:
  """The instruction names an HLO instruction line reads: '%a = f32[2] add(%b, %c), ...' ->
  ['b', 'c'] (its shape, a tuple's parentheses included, skipped)."""
  rest = line.split(" = ", 1)[1]
  shape_end = _closing(rest, 0) if rest.startswith("(") else 0
  opening = rest.index("(", shape_end + 1)
  return re.findall(r"%([\w.\-]+)", rest[opening : _closing(rest, opening)])


def instruction_stages(hlo_text: str, scopes=draft_shapes.STAGE_SCOPES) -> dict[str, str]:
  """Instruction name -> its stage: OUTSIDE for the instructions no while loop runs; in a loop,
  the first of `scopes` on the path of its op_name metadata or of the instructions of the
  computations it calls (a fusion's carry the metadata), LOOP where those name none. XLA's own
  instructions (layout copies, some dots) carry no op_name: they take the stage the instructions
  they read agree on, else the one those that read them agree on, else LOOP."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      match = re.match(r"(?:ENTRY )?%?([\w.\-]+)", line)
      current = match.group(1) if match else None
      computations[current] = []
    elif current is not None and line.startswith("  "):
      computations[current].append(line)

  def scope_of(line: str, depth: int = 0) -> str | None:
    """The first scope on an op_name path of the line (or its callees'), LOOP where they name
    none, None where there is no op_name at all. A fusion holding a matmul is the matmul's (XLA
    fuses the target's logits layer with the softmax of the verification that reads it)."""
    callees = [
        inner
        for callee in (re.findall(r"calls=%?([\w.\-]+)", line) if depth < 3 else ())
        for inner in computations.get(callee, ())
    ]
    matmuls = [inner for inner in callees if " dot(" in inner or " convolution(" in inner]
    stage = None
    for inner in matmuls:
      stage = scope_of(inner, depth + 1)
      if stage not in (None, LOOP):
        return stage
    for op_name in re.findall(r'op_name="([^"]*)"', line):
      parts = op_name.split("/")
      found = [scope for scope in scopes if scope in parts]
      if found:
        return min(found, key=parts.index)
      stage = LOOP
    for inner in callees:
      inner_stage = scope_of(inner, depth + 1)
      if inner_stage not in (None, LOOP):
        return inner_stage
      stage = stage or inner_stage
    return stage

  # The computations loops run: while bodies and conditions, and conditionals' branches in them.
  in_loop = {
      name
      for lines in computations.values()
      for line in lines
      if " while(" in line
      for name in re.findall(r"(?:condition|body)=%?([\w.\-]+)", line)
  }
  for name in list(in_loop):
    for line in computations.get(name, ()):
      for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
        in_loop.update(re.findall(r"%?([\w.\-]+)", branches))
  stages, reads = {}, {}
  for computation, lines in computations.items():
    for line in lines:
      match = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = ", line)
      if match:
        name = match.group(1)
        stages[name] = scope_of(line) if computation in in_loop else OUTSIDE
        reads[name] = _operands(line) if computation in in_loop else []
  readers = collections.defaultdict(list)
  for name, operands in reads.items():
    for operand in operands:
      readers[operand].append(name)
  for neighbours in (reads, readers):  # operands first, then readers, each to a fixed point
    changed = True
    while changed:
      changed = False
      for name, stage in stages.items():
        if stage is None:
          known = {stages[n] for n in neighbours.get(name, ()) if stages.get(n) in scopes}
          if len(known) == 1:
            stages[name] = known.pop()
            changed = True
  return {name: stage or LOOP for name, stage in stages.items()}


def stage_times(events: list[dict], stages: dict[str, str]) -> collections.Counter:
  """Total microseconds of the thunk events by stage (`instruction_stages`); events of other
  programs (names not in `stages`) are left out."""
  total = collections.Counter()
  for event in events:
    if event["name"] in stages:
      total[stages[event["name"]]] += event.get("dur", 0)
  return total


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = pairs.PairConfig.from_pair_dir(_PAIR_DIR.value, drafter_member=_DRAFTER.value)
  pair = pairs.load_pair(config, EOS_ID)
  vocab = seqio.PassThroughVocabulary(pair.target_config.vocab_size, eos_id=EOS_ID)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(pair.target_config), pair.drafter, vocab, vocab, gamma=_GAMMA.value
  )
  decoder_params = {"temperature": _TEMPERATURE.value, "max_decode_steps": _STEPS.value}
  batch = {
      "encoder_input_tokens": input_data.random_inputs(
          pair.target_config.vocab_size, 1, INPUT_LENGTH, eos_id=EOS_ID
      ),
      "decoder_input_tokens": np.zeros((1, 2 * _STEPS.value), np.int32),
  }
  params = pair.params
  key = jax.random.PRNGKey(0)
  # The temperature a constant, as jit_predict compiles a greedy one (a traced one at T > 0 gives
  # the same program up to that constant).
  compiled = (
      jax.jit(lambda p, b, k: model.predict_batch_with_aux(p, b, k, decoder_params=decoder_params))
      .lower(params, batch, key)
      .compile()
  )
  stages = instruction_stages(compiled.as_text())
  _, aux = jax.block_until_ready(compiled(params, batch, key))
  iterations = int(aux["speculative_stats"]["target_calls"][0])
  walls = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(compiled(params, batch, key))
    walls.append(time.perf_counter() - start)
  wall_ms = float(np.median(walls)) * 1e3
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    for _ in range(_REPEATS.value):
      jax.block_until_ready(compiled(params, batch, key))
    jax.profiler.stop_trace()
    total, count = thunk_times(trace_dir)
    by_stage = stage_times(thunk_events(trace_dir), stages)
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
  print(
      f"wall time (unprofiled, median of {_REPEATS.value} calls): {wall_ms:.2f} ms per call = "
      f"{wall_ms / iterations:.3f} ms per iteration. Thunks run concurrently on the cores, so their "
      "sum can exceed the wall time: the shares below are of thunk time, not of wall time."
  )
  print("| thunk kind | ms per call | per iteration (ms) | count per call |")
  print("|---|---|---|---|")
  for kind, ms in sorted(per_call.items(), key=lambda kv: -kv[1])[: _TOP.value]:
    print(f"| {kind} | {ms:.3f} | {ms / iterations:.4f} | {count[kind] / _REPEATS.value:.0f} |")
  in_loop = sum(v for k, v in by_stage.items() if k != OUTSIDE)
  print("\n| stage | ms per call | per iteration (ms) | share of the loop's thunk time |")
  print("|---|---|---|---|")
  for stage in (*draft_shapes.STAGE_SCOPES, LOOP, OUTSIDE):
    ms = by_stage[stage] / _REPEATS.value / 1e3
    share = f"{by_stage[stage] / in_loop:.1%}" if stage != OUTSIDE and in_loop else "-"
    print(f"| {stage} | {ms:.3f} | {ms / iterations:.4f} | {share} |")


if __name__ == "__main__":
  gin_utils.run(main)
