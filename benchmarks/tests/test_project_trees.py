"""benchmarks/project_trees.py: its flags reach `projection`, its files hold what it returns."""

import json
import os
import pathlib
import subprocess
import sys

import projection
from speculative_t5x.projections import roofline

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "benchmarks" / "project_trees.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(*flags):
  completed = subprocess.run(
      [sys.executable, SCRIPT, *flags], env=ENV, capture_output=True, text=True, timeout=300
  )
  assert completed.returncode == 0, completed.stderr[-4000:]
  return completed.stdout


def test_writes_the_projection_its_flags_ask_for(tmp_path):
  out = _run(
      f"--output_dir={tmp_path}",
      "--max_nodes=16",
      "--c_source=paper",
      "--context_length=64",
      "--encoder_length=256",
      "--sibling_ratios=0.5",
      "--measured_tree=2,1",
      "--measured_depth_acceptance=0.75,0.5",
  )
  projector = projection.Projector(roofline.TPU_V4, context_length=64, encoder_length=256)
  expected = projection.project_table(projector, 16, "paper", (0.5,), ((2, 1), (0.75, 0.5)))
  assert (tmp_path / "project_trees.md").read_text() == out == projection.markdown(expected)
  # JSON turns the verify_cost keys (tokens per call) into strings.
  result = json.loads((tmp_path / "project_trees.json").read_text())
  assert result == json.loads(json.dumps(expected))


def test_refuses_bad_flags(tmp_path):
  """Each bad flag exits non-zero with its reason, before anything is written; run at once."""
  # Three of the script's checks, one per kind (a range, a parse, flags that go together): each
  # case is a process importing TensorFlow, so the suite keeps them few.
  cases = {
      "--max_nodes=15": "--max_nodes=15 must be >= 16",
      "--sibling_ratios=x": "--sibling_ratios=x",
      "--measured_tree=2,1 --measured_depth_acceptance=0.5": "has depth 2",
  }
  runs = {
      flags: subprocess.Popen(
          [sys.executable, SCRIPT, f"--output_dir={tmp_path / 'out'}", *flags.split()],
          env=ENV,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for flags in cases
  }
  for flags, process in runs.items():
    _, stderr = process.communicate(timeout=300)
    assert process.returncode != 0, flags
    assert cases[flags] in stderr, (flags, stderr[-2000:])
  assert not (tmp_path / "out").exists()
