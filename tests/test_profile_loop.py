"""scripts/profile_loop.py: XLA thunk times of the speculative loop, grouped by kind."""

import gzip
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_thunk_times_groups_kinds_and_skips_non_thunks(tmp_path):
  spec = importlib.util.spec_from_file_location(
      "profile_loop", REPO / "scripts" / "profile_loop.py"
  )
  profile_loop = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(profile_loop)
  events = [
      {"ph": "X", "name": "ynn_fusion.8", "dur": 5},
      {"ph": "X", "name": "ynn_fusion", "dur": 1},
      {"ph": "X", "name": "cond.9.clone.1", "dur": 2},
      {"ph": "X", "name": "$api.py:1 f", "dur": 100},
      {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 100},
      {"ph": "i", "name": "dot"},
  ]
  (tmp_path / "a").mkdir()
  with gzip.open(tmp_path / "a" / "x.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  total, count = profile_loop.thunk_times(str(tmp_path))
  assert total == {"ynn_fusion": 6, "cond": 2} and count == {"ynn_fusion": 2, "cond": 1}


def test_profile_loop_runs_on_the_demo_pair():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  completed = subprocess.run(
      [
          sys.executable,
          str(REPO / "scripts" / "profile_loop.py"),
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
  assert "| ynn_fusion |" in completed.stdout or "| dot |" in completed.stdout
