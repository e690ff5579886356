"""benchmarks/profile_loop.py: XLA thunk times of the speculative loop, grouped by kind and by the
iteration's stage."""

import gzip
import json
import os
import pathlib
import subprocess
import sys

from bench_conftest import load_bench

REPO = pathlib.Path(__file__).resolve().parents[2]


def _profile_loop():
  """The script as a module, loaded once a process."""
  return load_bench("profile_loop")


def test_thunk_times_groups_kinds_and_skips_non_thunks(tmp_path):
  profile_loop = _profile_loop()
  events = [
      {"ph": "X", "name": "ynn_fusion.8", "dur": 5},
      {"ph": "X", "name": "ynn_fusion", "dur": 1},
      {"ph": "X", "name": "cond.9.clone.1", "dur": 2},
      {"ph": "X", "name": "while.3", "dur": 50},  # spans its body's thunks, traced too
      {"ph": "X", "name": "$api.py:1 f", "dur": 100},
      {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 100},
      {"ph": "i", "name": "dot"},
  ]
  (tmp_path / "a").mkdir()
  with gzip.open(tmp_path / "a" / "x.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  total, count = profile_loop.thunk_times(str(tmp_path))
  assert total == {"ynn_fusion": 6, "cond": 2} and count == {"ynn_fusion": 2, "cond": 1}


# A compiled program's text, cut to what the attribution reads: the entry runs a while loop whose
# body scores under the 'target' scope, verifies under 'verifier' (a fusion holding the target's
# logits matmul and the verifier's softmax), drafts in a nested loop under 'drafter', copies
# without metadata, and writes outside every scope.
HLO = """\
%fused_logits (param_0: f32[4,8], param_1: f32[8,16]) -> f32[4,16] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[8,16]{1,0} parameter(1)
  %dot.1 = f32[4,16]{1,0} dot(%param_0, %param_1), metadata={op_name="jit(f)/while/body/target/Transformer.decode/logits_dense/dot_general"}
  ROOT %exp.1 = f32[4,16]{1,0} exponential(%dot.1), metadata={op_name="jit(f)/while/body/verifier/exp"}
}

%fused_softmax (param_0.1: f32[4,16]) -> f32[4,16] {
  %param_0.1 = f32[4,16]{1,0} parameter(0)
  ROOT %div.1 = f32[4,16]{1,0} divide(%param_0.1, %param_0.1), metadata={op_name="jit(f)/while/body/verifier/div"}
}

%draft_body (p.2: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p.2 = (s32[], f32[4,8]{1,0}) parameter(0)
  %gte.5 = f32[4,8]{1,0} get-tuple-element(%p.2), index=1
  %draft_step = f32[4,8]{1,0} add(%gte.5, %gte.5), metadata={op_name="jit(f)/while/body/drafter/while/body/add"}
  ROOT %t.2 = (s32[], f32[4,8]{1,0}) tuple(%gte.5, %draft_step)
}

%draft_cond (p.3: (s32[], f32[4,8])) -> pred[] {
  %p.3 = (s32[], f32[4,8]{1,0}) parameter(0)
  ROOT %c.3 = pred[] constant(true)
}

%body (p: (s32[], f32[4,8], f32[8,16])) -> (s32[], f32[4,8], f32[8,16]) {
  %p = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) parameter(0)
  %gte.1 = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %gte.2 = f32[8,16]{1,0} get-tuple-element(%p), index=2
  %draft_loop = (s32[], f32[4,8]{1,0}) while((s32[], f32[4,8]{1,0}) %gte.1), condition=%draft_cond, body=%draft_body, metadata={op_name="jit(f)/while/body/drafter/while"}
  %hidden = f32[4,8]{1,0} multiply(%gte.1, %gte.1), metadata={op_name="jit(f)/while/body/target/Transformer.decode/mul"}
  %layout_copy = f32[4,8]{0,1} copy(%hidden)
  %logits_fusion = f32[4,16]{1,0} fusion(%layout_copy, %gte.2), kind=kCustom, calls=%fused_logits, metadata={op_name="jit(f)/while/body/verifier/reduce_max"}
  %probs = f32[4,16]{1,0} fusion(%logits_fusion), kind=kLoop, calls=%fused_softmax
  %write = f32[4,8]{1,0} add(%gte.1, %gte.1), metadata={op_name="jit(f)/while/body/add"}
  ROOT %t = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) tuple(%gte.1, %write, %gte.2)
}

%cond (p.1: (s32[], f32[4,8], f32[8,16])) -> pred[] {
  %p.1 = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) parameter(0)
  ROOT %go = pred[] constant(true), metadata={op_name="jit(f)/while/cond/not"}
}

ENTRY %main (a: f32[4,8], w: f32[8,16]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %w = f32[8,16]{1,0} parameter(1)
  %encoded = f32[4,8]{1,0} add(%a, %a), metadata={op_name="jit(f)/Transformer.prefill/add"}
  %init = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) tuple(%encoded, %encoded, %w)
  %loop = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) while((s32[], f32[4,8]{1,0}, f32[8,16]{1,0}) %init), condition=%cond, body=%body
  ROOT %out = f32[4,8]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_instruction_stages_reads_scopes_matmuls_and_neighbours():
  profile_loop = _profile_loop()
  stages = profile_loop.instruction_stages(HLO)
  loop, outside = profile_loop.LOOP, profile_loop.OUTSIDE
  expected = {
      "hidden": "target",
      "logits_fusion": "target",  # its matmul's, not its root's (the verifier's exp)
      "probs": "verifier",  # from its fused computation's metadata
      "layout_copy": "target",  # no metadata: the stage of what it reads
      "draft_step": "drafter",  # in the nested loop
      "draft_loop": "drafter",
      "write": loop,  # in the loop, under no scope
      "go": loop,
      "gte.1": loop,  # no metadata and nothing staged to read: what reads it is split
      "encoded": outside,
      "loop": outside,
  }
  assert {name: stages[name] for name in expected} == expected
  events = [{"name": name, "dur": 1} for name in ("hidden", "probs", "write", "encoded", "zz")]
  assert profile_loop.stage_times(events, stages) == {
      "target": 1,
      "verifier": 1,
      loop: 1,
      outside: 1,
  }


def test_profile_loop_runs_on_the_demo_pair():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  completed = subprocess.run(
      [
          sys.executable,
          str(REPO / "benchmarks" / "profile_loop.py"),
          "--repeats=1",
          "--max_decode_steps=8",
      ],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert "loop iterations per call" in completed.stdout
  assert "ms per iteration. Thunks run concurrently" in completed.stdout
  assert "| ynn_fusion |" in completed.stdout or "| dot |" in completed.stdout
  for stage in ("drafter", "target", "verifier", "loop", "outside the loop"):
    assert f"| {stage} | " in completed.stdout, stage
